package descriptor

import (
	"errors"
	"testing"
)

// FuzzParse checks that no input makes Parse panic, that it either returns a
// file or problems, and that an accepted file holds only well-formed
// resources.
func FuzzParse(f *testing.F) {
	f.Add([]byte(specExample))
	f.Add([]byte(accel("a", "device: l4", "tenancy: shared", "devicesPerReplica: 2")))
	f.Add([]byte("---\n- 1\n---\nresource: [\n"))
	f.Add([]byte("resource: ModelDeployment\nspec: {engine: {memory: 1.5Gi, env: {on: 1}}}\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		file, err := Parse(data)
		if err != nil {
			var perr *Error
			if !errors.As(err, &perr) || len(perr.Problems) == 0 || file != nil {
				t.Fatalf("Parse = %v, %v: want *Error with problems and no file", file, err)
			}
			return
		}
		if len(file.Resources) == 0 {
			t.Fatal("Parse accepted a file with no resources")
		}
		for _, r := range file.Resources {
			if CheckName("metadata.name", r.Name) != nil {
				t.Fatalf("accepted invalid name %q", r.Name)
			}
			if (r.Accelerator == nil) == (r.ModelDeployment == nil) {
				t.Fatalf("resource %s has not exactly one spec", r.Ref())
			}
			if r.Accelerator != nil && len(r.Accelerator.Check()) > 0 {
				t.Fatalf("accepted accelerator %s fails Check: %v", r.Ref(), r.Accelerator.Check())
			}
		}
	})
}
