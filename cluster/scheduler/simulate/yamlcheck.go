package simulate

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"

	yamlv3 "go.yaml.in/yaml/v3"
	"sigs.k8s.io/yaml"
)

// decodeYAML decodes a nodes or workload file strictly into v (a struct
// described by json tags, sigs.k8s.io/yaml's convention), and reports a
// problem the YAML way: the file, the line and the field's path, such as
// `nodes.yaml: line 4: nodes[0].gpus: unknown field (known: name, count,
// …)`. sigs.k8s.io/yaml converts YAML to JSON before decoding, so its own
// errors speak of JSON and Go types; the file is first walked here against
// v's fields, with the lines yaml.v3 keeps, and only what passes is decoded.
func decodeYAML(name string, data []byte, v any) error {
	var root yamlv3.Node
	if err := yamlv3.Unmarshal(data, &root); err != nil {
		return fmt.Errorf("%s: %s", name, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if len(root.Content) > 0 {
		if err := checkYAML(root.Content[0], reflect.TypeOf(v).Elem(), ""); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
	}
	if err := yaml.UnmarshalStrict(data, v); err != nil {
		// The walk above should have caught it; say it without the JSON
		// decoder's framing.
		msg := err.Error()
		for _, p := range []string{"error converting YAML to JSON: ", "error unmarshaling JSON: ", "while decoding JSON: ", "json: ", "yaml: "} {
			msg = strings.ReplaceAll(msg, p, "")
		}
		return fmt.Errorf("%s: %s", name, msg)
	}
	return nil
}

var cardsSpecType = reflect.TypeFor[cardsSpec]()

// checkYAML checks node n against type t at path.
func checkYAML(n *yamlv3.Node, t reflect.Type, path string) error {
	if n.Kind == yamlv3.AliasNode && n.Alias != nil {
		n = n.Alias
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if n.Kind == yamlv3.ScalarNode && n.Tag == "!!null" {
		return nil // not set
	}
	fail := func(format string, args ...any) error {
		where := fmt.Sprintf("line %d", n.Line)
		if path != "" {
			where += ": " + path
		}
		return fmt.Errorf("%s: %s", where, fmt.Sprintf(format, args...))
	}
	if t == cardsSpecType {
		// A map of device kind to count, or a list of cards.
		switch n.Kind {
		case yamlv3.MappingNode:
			return checkYAML(n, reflect.TypeFor[map[string]int](), path)
		case yamlv3.SequenceNode:
			return checkYAML(n, reflect.TypeFor[[]cardSpec](), path)
		}
		return fail("must be a map of device kind to count ({l4: 2}) or a list of cards, got %s", describeYAML(n))
	}
	switch t.Kind() {
	case reflect.Struct:
		if n.Kind != yamlv3.MappingNode {
			return fail("must be a mapping, got %s", describeYAML(n))
		}
		fields, names := jsonFieldsOf(t)
		for i := 0; i+1 < len(n.Content); i += 2 {
			key, val := n.Content[i], n.Content[i+1]
			ft, ok := fields[key.Value]
			if !ok {
				return fmt.Errorf("line %d: %s: unknown field (known: %s)", key.Line, joinPath(path, key.Value), strings.Join(names, ", "))
			}
			if err := checkYAML(val, ft, joinPath(path, key.Value)); err != nil {
				return err
			}
		}
	case reflect.Map:
		if n.Kind != yamlv3.MappingNode {
			return fail("must be a mapping, got %s", describeYAML(n))
		}
		for i := 0; i+1 < len(n.Content); i += 2 {
			if err := checkYAML(n.Content[i+1], t.Elem(), joinPath(path, n.Content[i].Value)); err != nil {
				return err
			}
		}
	case reflect.Slice:
		if n.Kind != yamlv3.SequenceNode {
			return fail("must be a list, got %s", describeYAML(n))
		}
		for i, item := range n.Content {
			if err := checkYAML(item, t.Elem(), fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
	case reflect.String:
		if n.Kind != yamlv3.ScalarNode || n.Tag != "!!str" {
			hint := ""
			if n.Kind == yamlv3.ScalarNode {
				hint = " (quote it)"
			}
			return fail("must be a string, got %s%s", describeYAML(n), hint)
		}
	case reflect.Int, reflect.Int32, reflect.Int64:
		if n.Kind != yamlv3.ScalarNode || n.Tag != "!!int" {
			return fail("must be an integer, got %s", describeYAML(n))
		}
	case reflect.Bool:
		if n.Kind != yamlv3.ScalarNode || n.Tag != "!!bool" {
			return fail("must be true or false, got %s", describeYAML(n))
		}
	}
	return nil
}

// jsonFieldsOf maps t's json field names to their types, and lists the
// names in declaration order for messages.
func jsonFieldsOf(t reflect.Type) (map[string]reflect.Type, []string) {
	fields := map[string]reflect.Type{}
	var names []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if name == "-" || !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = f.Type
		names = append(names, name)
	}
	return fields, slices.Clip(names)
}

func joinPath(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

// describeYAML names a node's value in a message.
func describeYAML(n *yamlv3.Node) string {
	switch n.Kind {
	case yamlv3.MappingNode:
		return "a mapping"
	case yamlv3.SequenceNode:
		return "a list"
	}
	if n.Tag == "!!str" {
		b, _ := json.Marshal(n.Value)
		return string(b)
	}
	return n.Value
}
