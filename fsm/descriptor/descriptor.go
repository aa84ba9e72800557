package descriptor

import (
	"bytes"
	"fmt"
	"reflect"
	"strings"

	yaml "go.yaml.in/yaml/v3"

	"github.com/gpuplane/gpuplane/internal/strictyaml"
)

// Kind is a resource kind as written in a document's `resource` field.
type Kind string

// The resource kinds a descriptor may hold.
const (
	KindAccelerator     Kind = "Accelerator"
	KindModelDeployment Kind = "ModelDeployment"
)

// ResourceVersion is the only accepted `resourceVersion`.
const ResourceVersion = "v1"

// Lower is the kind as it appears in references: "accelerator/small".
func (k Kind) Lower() string { return strings.ToLower(string(k)) }

// Metadata identifies a resource.
type Metadata struct {
	Name string `json:"name"`
}

// header holds the fields every document has besides its spec.
type header struct {
	Resource        string   `json:"resource"`
	ResourceVersion string   `json:"resourceVersion"`
	Metadata        Metadata `json:"metadata"`
	// Status is what `get -o yaml` prints beside the spec. It is output
	// only: a file may carry it, so that what get prints can be applied
	// back (as kubectl allows), and apply ignores it.
	Status any `json:"status,omitempty"`
}

// The documents as written. Spec is a pointer so that a missing spec can be
// told from an empty one.
type (
	acceleratorDocument struct {
		header
		Spec *AcceleratorSpec `json:"spec"`
	}
	modelDeploymentDocument struct {
		header
		Spec *ModelDeploymentSpec `json:"spec"`
	}
	// unknownDocument is walked when `resource` names no known kind, so
	// that the header is still checked.
	unknownDocument struct {
		header
		Spec any `json:"spec"`
	}
)

// Resource is one parsed document.
type Resource struct {
	// Document is the 1-based position of the document in the file, counting
	// empty documents, so that it matches the file's `---` separators.
	Document int
	Kind     Kind
	Name     string
	// Exactly one of the specs is set, matching Kind.
	Accelerator     *AcceleratorSpec
	ModelDeployment *ModelDeploymentSpec
}

// Ref is the resource's reference as the CLI prints it: "accelerator/small".
func (r Resource) Ref() string { return r.Kind.Lower() + "/" + r.Name }

// Where names the resource in a message: "document 2 (accelerator/small)".
func (r Resource) Where() string { return fmt.Sprintf("document %d (%s)", r.Document, r.Ref()) }

// File is a parsed descriptor file.
type File struct {
	// Resources in the order the file lists them.
	Resources []Resource
}

// ApplyOrder lists the resources in the order `apply` creates them:
// accelerators before the deployments that use them, file order within a kind.
func (f *File) ApplyOrder() []Resource {
	return f.ordered(KindAccelerator, KindModelDeployment)
}

// DeleteOrder lists the resources in the order `delete -f` removes them:
// deployments before the accelerators they use.
func (f *File) DeleteOrder() []Resource {
	return f.ordered(KindModelDeployment, KindAccelerator)
}

func (f *File) ordered(kinds ...Kind) []Resource {
	var out []Resource
	for _, k := range kinds {
		for _, r := range f.Resources {
			if r.Kind == k {
				out = append(out, r)
			}
		}
	}
	return out
}

// Problem is one thing wrong with a descriptor file.
type Problem struct {
	// Document is the 1-based document the problem is in; 0 for the file.
	Document int
	// Ref is "kind/name" (or just "kind") when the document got that far.
	Ref string
	// Field is the path of the offending field (spec.engine.memory), if any.
	Field       string
	Description string
}

func (p Problem) String() string {
	var b strings.Builder
	if p.Document > 0 {
		fmt.Fprintf(&b, "document %d", p.Document)
		if p.Ref != "" {
			fmt.Fprintf(&b, " (%s)", p.Ref)
		}
		b.WriteString(": ")
	}
	if p.Field != "" {
		b.WriteString(p.Field + ": ")
	}
	b.WriteString(p.Description)
	return b.String()
}

// Error is returned by Parse when a file has problems. It holds all of them.
type Error struct {
	Problems []Problem
}

func (e *Error) Error() string {
	lines := make([]string, len(e.Problems))
	for i, p := range e.Problems {
		lines[i] = p.String()
	}
	return strings.Join(lines, "\n")
}

// Parse parses and checks a descriptor file. On any problem it returns an
// *Error listing every problem found; otherwise the file, with defaults
// filled in (see AcceleratorSpec and ModelDeploymentSpec).
func Parse(data []byte) (*File, error) {
	p := &parser{}
	p.parse(data)
	if len(p.problems) > 0 {
		return nil, &Error{Problems: p.problems}
	}
	return &File{Resources: p.resources}, nil
}

type parser struct {
	resources []Resource
	problems  []Problem
}

func (p *parser) parse(data []byte) {
	n, err := strictyaml.Documents(bytes.NewReader(data), func(n int, doc *yaml.Node) {
		if doc.Kind != yaml.MappingNode {
			p.problems = append(p.problems, Problem{Document: n,
				Description: "must be a mapping with resource, resourceVersion, metadata and spec, got " + strictyaml.Describe(doc)})
			return
		}
		p.document(n, doc)
	})
	if err != nil {
		// A syntax error leaves the decoder unusable: it stops there.
		p.problems = append(p.problems, Problem{Document: n, Description: err.Error()})
	}
	if len(p.resources) == 0 && len(p.problems) == 0 {
		p.problems = append(p.problems, Problem{Description: "no resources found"})
	}
	p.checkFile()
}

// document checks one document and, when it is usable, adds its resource.
func (p *parser) document(n int, doc *yaml.Node) {
	kind := text(lookup(doc, "resource"))
	name := text(lookup(lookup(doc, "metadata"), "name"))
	ref := ""
	switch Kind(kind) {
	case KindAccelerator, KindModelDeployment:
		ref = Kind(kind).Lower()
		if name != "" {
			ref += "/" + name
		}
	}
	report := func(field, format string, args ...any) {
		p.problems = append(p.problems, Problem{Document: n, Ref: ref, Field: field, Description: fmt.Sprintf(format, args...)})
	}

	if kind == "" && lookup(doc, "card") != nil && lookup(doc, "models") != nil {
		// A `simulate serve` config has none of a descriptor's fields, so
		// listing each as unknown would only hide what the file is.
		p.problems = append(p.problems, Problem{Document: n,
			Description: "this is a `gpuplane simulate serve` config (it has card and models, no resource): run `gpuplane simulate serve --config FILE`"})
		return
	}
	var target any
	switch Kind(kind) {
	case KindAccelerator:
		target = &acceleratorDocument{}
	case KindModelDeployment:
		target = &modelDeploymentDocument{}
	default:
		target = &unknownDocument{}
	}
	w := &strictyaml.Walker{}
	pruned := w.Walk(doc, reflect.TypeOf(target).Elem(), "")
	for _, e := range w.Problems {
		report(e.Field, "%s", e.Description)
	}
	// The pruned tree holds only values the walk accepted, so converting it
	// cannot fail unless the schema and the walker disagree.
	if err := convert(pruned, target); err != nil {
		report("", "internal error: %v", err)
		return
	}

	// check reports a semantic problem unless the field already has a
	// structural one, which would make the second report noise.
	check := func(field, format string, args ...any) {
		if !w.FailedAt(field) {
			report(field, format, args...)
		}
	}
	var h header
	switch d := target.(type) {
	case *acceleratorDocument:
		h = d.header
	case *modelDeploymentDocument:
		h = d.header
	case *unknownDocument:
		h = d.header
	}
	switch {
	case h.Resource == "":
		check("resource", "required: %s or %s", KindAccelerator, KindModelDeployment)
	case Kind(h.Resource) != KindAccelerator && Kind(h.Resource) != KindModelDeployment:
		check("resource", "must be %s or %s, got %q", KindAccelerator, KindModelDeployment, h.Resource)
	}
	switch h.ResourceVersion {
	case ResourceVersion:
	case "":
		check("resourceVersion", "required: %s", ResourceVersion)
	default:
		check("resourceVersion", "must be %s, got %s", ResourceVersion, h.ResourceVersion)
	}
	if v := CheckName("metadata.name", h.Metadata.Name); v != nil {
		check(v.Field, "%s", v.Description)
	}

	r := Resource{Document: n, Kind: Kind(h.Resource), Name: h.Metadata.Name}
	switch d := target.(type) {
	case *acceleratorDocument:
		if d.Spec == nil {
			check("spec", "required")
			return
		}
		for _, v := range d.Spec.check(w.FailedAt) {
			check(v.Field, "%s", v.Description)
		}
		r.Accelerator = d.Spec
	case *modelDeploymentDocument:
		if d.Spec == nil {
			check("spec", "required")
			return
		}
		for _, v := range d.Spec.check(w.FailedAt) {
			check(v.Field, "%s", v.Description)
		}
		if d.Spec.ServedModelName == "" {
			// Served by its name: the server's rule, said before it is asked.
			for i, a := range d.Spec.Aliases {
				if a == h.Metadata.Name {
					check(fmt.Sprintf("spec.aliases[%d]", i), "%q is the deployment's served model name already", a)
				}
			}
		}
		d.Spec.SetDefaults(h.Metadata.Name)
		r.ModelDeployment = d.Spec
	default:
		return
	}
	p.resources = append(p.resources, r)
}

// checkFile applies the rules that relate documents of one file: unique
// names per kind (rule 1), and a deployment against an accelerator that the
// same file defines (rules 8 and 9). A deployment whose accelerator is not in
// the file is left to the server (rule 7).
func (p *parser) checkFile() {
	seen := make(map[string]int)
	accelerators := make(map[string]*AcceleratorSpec)
	for _, r := range p.resources {
		if first, dup := seen[r.Ref()]; dup {
			p.problems = append(p.problems, Problem{Document: r.Document, Ref: r.Ref(), Field: "metadata.name",
				Description: fmt.Sprintf("%s %q is already defined by document %d", r.Kind.Lower(), r.Name, first)})
			continue
		}
		seen[r.Ref()] = r.Document
		if r.Kind == KindAccelerator {
			accelerators[r.Name] = r.Accelerator
		}
	}
	for _, r := range p.resources {
		if r.Kind != KindModelDeployment {
			continue
		}
		acc, ok := accelerators[r.ModelDeployment.Placement.Accelerator]
		if !ok {
			continue
		}
		for _, v := range r.ModelDeployment.checkAgainst(r.ModelDeployment.Placement.Accelerator, acc) {
			p.problems = append(p.problems, Problem{Document: r.Document, Ref: r.Ref(), Field: v.Field, Description: v.Description})
		}
	}
}

// lookup returns the value of key in a mapping node, or nil.
func lookup(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

// text is a string scalar's text, or "".
func text(n *yaml.Node) string {
	if n == nil || n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		return ""
	}
	return n.Value
}

// convert turns a walked tree into the typed document: encoding/json applies
// the json tags the walk checked against.
func convert(tree *yaml.Node, target any) error {
	return strictyaml.Decode(tree, target)
}
