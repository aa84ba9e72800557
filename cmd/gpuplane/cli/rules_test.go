package cli

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"

	"github.com/gpuplane/gpuplane/cmd/gpuplane/agent"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
	"github.com/gpuplane/gpuplane/rpc"
)

// readmeBadInput returns the README's bad-input example: the command's
// arguments after `gpuplane` and the error line shown under it.
func readmeBadInput(t *testing.T) (args []string, shown string) {
	t.Helper()
	f, err := os.Open("../../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "gpuplane accelerators create wide ") {
			continue
		}
		args = strings.Fields(line)[1:]
		if sc.Scan() {
			shown, _ = strings.CutPrefix(sc.Text(), "# ")
		}
		break
	}
	if args == nil || !strings.HasPrefix(shown, "error: ") {
		t.Fatalf("README has no bad-input example (`gpuplane accelerators create wide ...` followed by `# error: ...`)")
	}
	return args, shown
}

// TestREADMEBadInputReadsAsTheServerSays checks, against a real dev agent,
// the README's bad-input example: the CLI's own check of the README's bad-input example
// prints what the README shows, and that is word for word what the server
// says when the same accelerator reaches it, and what apply -f says of it.
func TestREADMEBadInputReadsAsTheServerSays(t *testing.T) {
	args, shown := readmeBadInput(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	a, err := agent.Start(ctx, agent.Config{
		Dev: true, DataDir: t.TempDir(), NodeName: "rules", SimGPUs: "l4=2",
		APIPort: 0, RaftPort: freePort(t), GossipPort: freePort(t),
	})
	if err != nil {
		t.Fatalf("start agent: %v", err)
	}
	t.Cleanup(func() { a.Close() })

	r := run(t, "", nil, append([]string{"--addr", a.APIURL()}, args...)...)
	if r.code != exitFailure || r.stderr != shown+"\n" {
		t.Errorf("gpuplane %s: exit %d, stderr:\n%s\nwant exit 1 and the README's line:\n%s", strings.Join(args, " "), r.code, r.stderr, shown)
	}

	// The same accelerator sent to the server as is, past the CLI's check.
	client := gpuplanev1connect.NewAcceleratorServiceClient(rpc.HTTPClient(), a.APIURL())
	_, err = client.CreateAccelerator(ctx, connect.NewRequest(&pb.CreateAcceleratorRequest{
		Name: "wide", Spec: &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_SHARED, DevicesPerReplica: 2},
	}))
	vs := violationsOf(err)
	if len(vs) != 1 {
		t.Fatalf("server answered %v, want one violation", err)
	}
	if server := "error: " + violationLine(vs[0]); server != shown {
		t.Errorf("the server says\n%s\nthe CLI says\n%s", server, shown)
	}

	file := writeFile(t, "resource: Accelerator\nresourceVersion: v1\nmetadata: {name: wide}\nspec: {device: l4, tenancy: shared, devicesPerReplica: 2}\n")
	r = run(t, "", nil, "--addr", a.APIURL(), "apply", "-f", file)
	want := fmt.Sprintf("document 1 (accelerator/wide): %s", violationLine(vs[0]))
	if r.code != exitFailure || !strings.Contains(r.stderr, want) {
		t.Errorf("apply -f: exit %d, stderr:\n%s\nwant it to say:\n%s", r.code, r.stderr, want)
	}
	if out := run(t, "", nil, "--addr", a.APIURL(), "accelerators", "list"); strings.Contains(out.stdout, "wide") {
		t.Errorf("a refused accelerator exists:\n%s", out.stdout)
	}
}
