package fsm

import (
	"fmt"
	"regexp"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

var dnsLabel = regexp.MustCompile(`^[a-z0-9]([a-z0-9-]*[a-z0-9])?$`)

// violations collects every problem found while checking one command.
type violations []*pb.Violation

func (v *violations) add(field, format string, args ...any) {
	*v = append(*v, &pb.Violation{Field: field, Description: fmt.Sprintf(format, args...)})
}

// ValidateName checks docs/descriptors.md rule 1: names are DNS labels.
func ValidateName(field, name string) []*pb.Violation {
	var v violations
	switch {
	case name == "":
		v.add(field, "is required")
	case len(name) > 63 || !dnsLabel.MatchString(name):
		v.add(field, "%q must be a DNS label: at most 63 lowercase letters, digits or '-', starting and ending with a letter or digit", name)
	}
	return v
}
