package placesim

import (
	"fmt"
	"reflect"

	yaml "go.yaml.in/yaml/v3"

	"github.com/gpuplane/gpuplane/internal/strictyaml"
)

// decodeYAML decodes a nodes or workload file strictly into v (a struct
// described by json tags), and reports a problem the YAML way: the file,
// the line and the field's path, such as `nodes.yaml: line 4:
// nodes[0].gpus: unknown field (known: name, count, …)`.
func decodeYAML(name string, data []byte, v any) error {
	if err := strictyaml.Unmarshal(data, v, true); err != nil {
		return fmt.Errorf("%s: %w", name, err)
	}
	return nil
}

// YAMLShape checks cards as a map of device kind to count or a list of
// cards (strictyaml.Shaped).
func (*cardsSpec) YAMLShape(n *yaml.Node) (reflect.Type, string) {
	switch n.Kind {
	case yaml.MappingNode:
		return reflect.TypeFor[map[string]int](), ""
	case yaml.SequenceNode:
		return reflect.TypeFor[[]cardSpec](), ""
	}
	return nil, fmt.Sprintf("must be a map of device kind to count ({l4: 2}) or a list of cards, got %s", strictyaml.Describe(n))
}
