// Package strictyaml reads the project's YAML files (descriptors, `simulate`
// nodes and workloads, `simulate serve` configs) strictly and alike: a file
// is walked against the Go type it describes (its json tags), every unknown
// field, duplicate key and mismatched type is reported with its line and
// its field's path, and only what passed is decoded. One YAML library
// (go.yaml.in/yaml/v3, whose nodes keep lines) and encoding/json (which
// applies the tags) do the rest. It imports nothing of the project.
package strictyaml

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"reflect"
	"strings"

	yaml "go.yaml.in/yaml/v3"
)

// Problem is one field the walk refused.
type Problem struct {
	Line        int    // 1-based line of the file, 0 when unknown
	Field       string // path of the field: spec.engine.args[1]
	Description string // what is wrong: unknown field, must be a string, …
}

// Error reads "line 4: nodes[0].gpus: unknown field".
func (p Problem) Error() string {
	var b strings.Builder
	if p.Line > 0 {
		fmt.Fprintf(&b, "line %d: ", p.Line)
	}
	if p.Field != "" {
		b.WriteString(p.Field + ": ")
	}
	b.WriteString(p.Description)
	return b.String()
}

// Scalar is implemented (with a pointer receiver) by a field type that takes
// a YAML scalar of its own syntax, such as a quantity "20Gi". CheckYAMLScalar
// gets the scalar's value as YAML reads it (string, int, float64, bool) and
// returns why it is not acceptable, or "".
type Scalar interface {
	CheckYAMLScalar(v any) string
}

// Shaped is implemented (with a pointer receiver) by a field type that takes
// more than one shape, such as a map or a list. YAMLShape returns the type
// that node n is to be checked against, or why n fits no shape.
type Shaped interface {
	YAMLShape(n *yaml.Node) (reflect.Type, string)
}

var (
	scalarType    = reflect.TypeFor[Scalar]()
	shapedType    = reflect.TypeFor[Shaped]()
	unmarshalType = reflect.TypeFor[json.Unmarshaler]()
)

// Walker checks YAML nodes against Go types and collects the problems.
type Walker struct {
	// ListKnown adds the known field names to an unknown field's
	// description: "unknown field (known: name, count)".
	ListKnown bool
	// Problems are the problems found, in the file's order.
	Problems []Problem
}

func (w *Walker) fail(n *yaml.Node, path, format string, args ...any) {
	w.Problems = append(w.Problems, Problem{Line: n.Line, Field: path, Description: fmt.Sprintf(format, args...)})
}

// FailedAt reports whether a problem was found at path, inside it, or at
// one of its ancestors: a later check of that field would only repeat it.
func (w *Walker) FailedAt(path string) bool {
	within := func(inner, outer string) bool {
		return inner == outer || strings.HasPrefix(inner, outer+".") || strings.HasPrefix(inner, outer+"[")
	}
	for _, p := range w.Problems {
		if within(p.Field, path) || within(path, p.Field) {
			return true
		}
	}
	return false
}

// Walk checks n against t at path and returns a copy of n that holds only
// the entries that passed (so decoding it cannot fail on a checked field),
// or nil when n itself is unusable. A null is always usable: it means "not
// set".
func (w *Walker) Walk(n *yaml.Node, t reflect.Type, path string) *yaml.Node {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return nil
		}
		return w.Walk(n.Content[0], t, path)
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if isNull(n) {
		return n
	}
	pt := reflect.PointerTo(t)
	switch {
	case pt.Implements(shapedType):
		shape, msg := reflect.New(t).Interface().(Shaped).YAMLShape(n)
		if msg != "" {
			w.fail(n, path, "%s", msg)
			return nil
		}
		return w.Walk(n, shape, path)
	case pt.Implements(scalarType):
		var v any
		if n.Kind != yaml.ScalarNode || n.Decode(&v) != nil {
			v = describedValue{n}
		}
		if msg := reflect.New(t).Interface().(Scalar).CheckYAMLScalar(v); msg != "" {
			w.fail(n, path, "%s", msg)
			return nil
		}
		return n
	case pt.Implements(unmarshalType):
		return n // its UnmarshalJSON checks it when decoded
	}
	switch t.Kind() {
	case reflect.Struct:
		return w.walkStruct(n, t, path)
	case reflect.Map:
		return w.walkMap(n, t, path)
	case reflect.Slice:
		if n.Kind != yaml.SequenceNode {
			w.fail(n, path, "must be a list, got %s", Describe(n))
			return nil
		}
		out := *n
		out.Content = nil
		for i, item := range n.Content {
			if item := w.Walk(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); item != nil {
				out.Content = append(out.Content, item)
			}
		}
		return &out
	case reflect.String:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!str" && n.Tag != "!!timestamp" {
			hint := ""
			if n.Kind == yaml.ScalarNode {
				hint = " (quote it)"
			}
			w.fail(n, path, "must be a string, got %s%s", Describe(n), hint)
			return nil
		}
		if n.Tag == "!!timestamp" {
			s := *n // a date is text where text is wanted
			s.Tag = "!!str"
			return &s
		}
		return n
	case reflect.Bool:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" {
			w.fail(n, path, "must be true or false, got %s", Describe(n))
			return nil
		}
		return n
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		var v any
		if n.Kind == yaml.ScalarNode && n.Tag == "!!int" && n.Decode(&v) == nil {
			switch v := v.(type) {
			case int, int64:
				return n
			case uint64:
				w.fail(n, path, "must be an integer no larger than %d, got %d", int64(math.MaxInt64), v)
				return nil
			}
		}
		w.fail(n, path, "must be an integer, got %s", Describe(n))
		return nil
	case reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		var v uint64
		if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || n.Decode(&v) != nil {
			w.fail(n, path, "must be an integer ≥ 0, got %s", Describe(n))
			return nil
		}
		return n
	case reflect.Float32, reflect.Float64:
		if n.Kind != yaml.ScalarNode || n.Tag != "!!int" && n.Tag != "!!float" {
			w.fail(n, path, "must be a number, got %s", Describe(n))
			return nil
		}
		return n
	case reflect.Interface:
		return n
	}
	// A schema type the walker does not know is a programming error: say
	// so instead of accepting the value unchecked.
	w.fail(n, path, "cannot be checked: unsupported schema type %s", t)
	return nil
}

func (w *Walker) walkStruct(n *yaml.Node, t reflect.Type, path string) *yaml.Node {
	if n.Kind != yaml.MappingNode {
		w.fail(n, path, "must be a mapping, got %s", Describe(n))
		return nil
	}
	fields, names := jsonFields(t)
	out := *n
	out.Content = nil
	seen := map[string]int{}
	pairs := w.entries(n, path)
	for i := 0; i+1 < len(pairs); i += 2 {
		key, val := pairs[i], pairs[i+1]
		field := Join(path, key.Value)
		if key.Kind != yaml.ScalarNode || key.Tag != "!!str" {
			w.fail(key, Join(path, Describe(key)), "unknown field")
			continue
		}
		if first, dup := seen[key.Value]; dup {
			w.fail(key, field, "set twice, at lines %d and %d", first, key.Line)
			continue
		}
		seen[key.Value] = key.Line
		ft, ok := fields[key.Value]
		if !ok {
			if w.ListKnown {
				w.fail(key, field, "unknown field (known: %s)", strings.Join(names, ", "))
			} else {
				w.fail(key, field, "unknown field")
			}
			continue
		}
		if v := w.Walk(val, ft, field); v != nil {
			out.Content = append(out.Content, key, v)
		}
	}
	return &out
}

func (w *Walker) walkMap(n *yaml.Node, t reflect.Type, path string) *yaml.Node {
	if t.Key().Kind() != reflect.String {
		w.fail(n, path, "cannot be checked: unsupported map key type %s", t.Key())
		return nil
	}
	if n.Kind != yaml.MappingNode {
		w.fail(n, path, "must be a mapping, got %s", Describe(n))
		return nil
	}
	out := *n
	out.Content = nil
	seen := map[string]int{}
	pairs := w.entries(n, path)
	for i := 0; i+1 < len(pairs); i += 2 {
		key, val := pairs[i], pairs[i+1]
		if key.Kind != yaml.ScalarNode || key.Tag != "!!str" {
			w.fail(key, Join(path, Describe(key)), "key must be a string, got %s (quote it)", Describe(key))
			continue
		}
		field := Join(path, key.Value)
		if first, dup := seen[key.Value]; dup {
			w.fail(key, field, "set twice, at lines %d and %d", first, key.Line)
			continue
		}
		seen[key.Value] = key.Line
		if v := w.Walk(val, t.Elem(), field); v != nil {
			out.Content = append(out.Content, key, v)
		}
	}
	return &out
}

// entries are mapping n's keys and values, with those a merge key (<<:
// *defaults) brings in appended where n does not set them itself, as YAML
// merges them: the walk and the decoded value see one flat mapping.
func (w *Walker) entries(n *yaml.Node, path string) []*yaml.Node {
	var own, merged []*yaml.Node
	for i := 0; i+1 < len(n.Content); i += 2 {
		key, val := n.Content[i], n.Content[i+1]
		if key.Tag != "!!merge" {
			own = append(own, key, val)
			continue
		}
		for val.Kind == yaml.AliasNode && val.Alias != nil {
			val = val.Alias
		}
		sources := []*yaml.Node{val}
		if val.Kind == yaml.SequenceNode {
			sources = val.Content
		}
		for _, src := range sources {
			for src.Kind == yaml.AliasNode && src.Alias != nil {
				src = src.Alias
			}
			if src.Kind != yaml.MappingNode {
				w.fail(key, Join(path, key.Value), "must merge a mapping or a list of mappings, got %s", Describe(src))
				continue
			}
			merged = append(merged, w.entries(src, path)...)
		}
	}
	set := map[string]bool{}
	for i := 0; i < len(own); i += 2 {
		set[own[i].Value] = true
	}
	for i := 0; i+1 < len(merged); i += 2 {
		if !set[merged[i].Value] { // the mapping's own keys, then earlier merges, win
			set[merged[i].Value] = true
			own = append(own, merged[i], merged[i+1])
		}
	}
	return own
}

// jsonFields maps the json names of t's fields to their types, inlining
// embedded structs the way encoding/json does, and lists the names in
// declaration order for messages. Fields tagged "-" are not part of the
// schema.
func jsonFields(t reflect.Type) (map[string]reflect.Type, []string) {
	fields := map[string]reflect.Type{}
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			inner, innerNames := jsonFields(f.Type)
			for _, k := range innerNames {
				fields[k] = inner[k]
			}
			names = append(names, innerNames...)
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = f.Type
		names = append(names, name)
	}
	return fields, names
}

// Join appends key to a field's path.
func Join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// Describe names a node's value in a message: a mapping, a list, a quoted
// string or the scalar as written.
func Describe(n *yaml.Node) string {
	for n.Kind == yaml.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return "null"
		}
		return Describe(n.Content[0])
	}
	switch n.Tag {
	case "!!str", "!!timestamp", "!!binary":
		return fmt.Sprintf("%q", n.Value)
	case "!!null":
		return "null"
	}
	return n.Value
}

// describedValue stands for a node that is not a plain scalar when a Scalar
// type is asked about it; it prints as Describe does.
type describedValue struct{ n *yaml.Node }

func (d describedValue) String() string { return Describe(d.n) }

// Decode decodes n, as a walk returned it, into v by v's json tags.
func Decode(n *yaml.Node, v any) error {
	if n == nil {
		return nil
	}
	generic, err := toGeneric(n)
	if err != nil {
		return err
	}
	b, err := json.Marshal(generic)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "json: "))
	}
	return nil
}

// toGeneric turns n into the values encoding/json marshals: mappings with
// string keys, lists, and scalars as YAML resolves them (text stays text).
func toGeneric(n *yaml.Node) (any, error) {
	switch n.Kind {
	case yaml.DocumentNode:
		if len(n.Content) == 0 {
			return nil, nil
		}
		return toGeneric(n.Content[0])
	case yaml.AliasNode:
		return toGeneric(n.Alias)
	case yaml.MappingNode:
		m := make(map[string]any, len(n.Content)/2)
		for i := 0; i+1 < len(n.Content); i += 2 {
			v, err := toGeneric(n.Content[i+1])
			if err != nil {
				return nil, err
			}
			m[n.Content[i].Value] = v
		}
		return m, nil
	case yaml.SequenceNode:
		l := make([]any, 0, len(n.Content))
		for _, item := range n.Content {
			v, err := toGeneric(item)
			if err != nil {
				return nil, err
			}
			l = append(l, v)
		}
		return l, nil
	}
	switch n.Tag {
	case "!!null":
		return nil, nil
	case "!!int", "!!float", "!!bool":
		var v any
		if err := n.Decode(&v); err != nil {
			return nil, fmt.Errorf("line %d: %w", n.Line, err)
		}
		return v, nil
	}
	return n.Value, nil
}

// Unmarshal reads the one document in data strictly into v (a struct
// described by json tags): the first problem is returned as "line 4:
// nodes[0].gpus: unknown field (known: …)". listKnown lists the known
// fields of an unknown one.
func Unmarshal(data []byte, v any, listKnown bool) error {
	var doc yaml.Node
	if err := yaml.Unmarshal(data, &doc); err != nil {
		return errors.New(strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if len(doc.Content) == 0 {
		return nil // empty: nothing set
	}
	w := &Walker{ListKnown: listKnown}
	pruned := w.Walk(&doc, reflect.TypeOf(v).Elem(), "")
	if len(w.Problems) > 0 {
		return w.Problems[0]
	}
	return Decode(pruned, v)
}

// Documents calls f with each document of a multi-document stream (1-based
// n and the document's root; empty documents skipped). It stops at the
// first syntax error, which it returns with the number of the document it
// is in.
func Documents(r io.Reader, f func(n int, doc *yaml.Node)) (int, error) {
	dec := yaml.NewDecoder(r)
	for n := 1; ; n++ {
		var doc yaml.Node
		err := dec.Decode(&doc)
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return n, err
		}
		if len(doc.Content) == 0 || isNull(doc.Content[0]) {
			continue
		}
		f(n, doc.Content[0])
	}
}
