package descriptor

import "fmt"

// describe names a YAML value, as a Scalar check receives it, in an error
// message.
func describe(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case string:
		return fmt.Sprintf("%q", v)
	case map[string]any, map[any]any:
		return "a mapping"
	case []any:
		return "a list"
	case float64:
		return fmt.Sprintf("%g", v)
	default:
		return fmt.Sprint(v)
	}
}
