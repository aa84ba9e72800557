package servesim

import (
	"regexp"
	"strconv"

	yaml "go.yaml.in/yaml/v3"
)

// A config's checks name a field by its path (models[3] (vision).peakGiB);
// lineOf finds the line that field is on, so the error also names the line.
// (Errors of the strict read name their lines themselves.)

var (
	// fieldPath is the path an error message starts with: a top-level key,
	// an optional [index] and (name), then .keys.
	fieldPath = regexp.MustCompile(`^([A-Za-z]+)(?:\[(\d+)\])?(?: \([^)]*\))?((?:\.[A-Za-z]+)*)`)
	dotKey    = regexp.MustCompile(`\.([A-Za-z]+)`)
)

// lineOf returns the 1-based line of the field an error about config b
// names, or 0 when it cannot tell.
func lineOf(b []byte, msg string) int {
	var doc yaml.Node
	if yaml.Unmarshal(b, &doc) != nil || len(doc.Content) == 0 {
		return 0
	}
	root := doc.Content[0]
	m := fieldPath.FindStringSubmatch(msg)
	if m == nil {
		return 0
	}
	key, n := mapKey(root, m[1])
	if n == nil {
		return 0
	}
	if m[2] != "" {
		i, _ := strconv.Atoi(m[2])
		if n.Kind != yaml.SequenceNode || i >= len(n.Content) {
			return key.Line
		}
		key, n = n.Content[i], n.Content[i]
	}
	for _, k := range dotKey.FindAllStringSubmatch(m[3], -1) {
		k2, v := mapKey(n, k[1])
		if v == nil {
			break
		}
		key, n = k2, v
	}
	return key.Line
}

// mapKey finds key in a mapping node: its key node and its value.
func mapKey(n *yaml.Node, key string) (k, v *yaml.Node) {
	if n.Kind != yaml.MappingNode {
		return nil, nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i], n.Content[i+1]
		}
	}
	return nil, nil
}
