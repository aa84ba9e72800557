package descriptor

import (
	"fmt"
	"math"
	"reflect"
	"strings"

	yaml "go.yaml.in/yaml/v2"
)

// scalar is implemented by field types that accept a YAML scalar of their own
// syntax (Quantity). checkScalar returns why v is not acceptable, or "".
type scalar interface {
	checkScalar(v any) string
}

var scalarType = reflect.TypeFor[scalar]()

// fieldError is one structural problem the walker found.
type fieldError struct {
	field       string
	description string
}

// walker checks a decoded YAML tree against a Go type, described by its json
// tags: one generic walk serves every resource kind. It records every
// unknown field and type mismatch and returns a pruned copy of the tree that
// holds only the entries that passed, so that the typed conversion that
// follows cannot fail and the semantic checks still see every valid field.
type walker struct {
	errs []fieldError
}

func (w *walker) fail(field, format string, args ...any) {
	w.errs = append(w.errs, fieldError{field: field, description: fmt.Sprintf(format, args...)})
}

// failedAt reports whether a structural problem was found at path, inside
// it, or at one of its ancestors.
func (w *walker) failedAt(path string) bool {
	within := func(inner, outer string) bool {
		return inner == outer || strings.HasPrefix(inner, outer+".") || strings.HasPrefix(inner, outer+"[")
	}
	for _, e := range w.errs {
		if within(e.field, path) || within(path, e.field) {
			return true
		}
	}
	return false
}

// walk checks v against t at path and returns the pruned value and whether v
// itself is usable. A YAML null is always usable: it means "not set".
func (w *walker) walk(path string, v any, t reflect.Type) (any, bool) {
	if v == nil {
		return nil, true
	}
	for t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	if reflect.PointerTo(t).Implements(scalarType) {
		if msg := reflect.New(t).Interface().(scalar).checkScalar(v); msg != "" {
			w.fail(path, "%s", msg)
			return nil, false
		}
		return v, true
	}
	switch t.Kind() {
	case reflect.Struct:
		return w.walkStruct(path, v, t)
	case reflect.Map:
		return w.walkMap(path, v, t)
	case reflect.Slice:
		items, ok := v.([]any)
		if !ok {
			w.fail(path, "must be a list, got %s", describe(v))
			return nil, false
		}
		out := make([]any, 0, len(items))
		for i, item := range items {
			if item, ok := w.walk(fmt.Sprintf("%s[%d]", path, i), item, t.Elem()); ok {
				out = append(out, item)
			}
		}
		return out, true
	case reflect.String:
		if _, ok := v.(string); !ok {
			hint := ""
			if isScalar(v) {
				hint = " (quote it)"
			}
			w.fail(path, "must be a string, got %s%s", describe(v), hint)
			return nil, false
		}
		return v, true
	case reflect.Bool:
		if _, ok := v.(bool); !ok {
			w.fail(path, "must be true or false, got %s", describe(v))
			return nil, false
		}
		return v, true
	case reflect.Int, reflect.Int32, reflect.Int64:
		switch n := v.(type) {
		case int, int64:
			return v, true
		case uint64:
			w.fail(path, "must be an integer no larger than %d, got %d", int64(math.MaxInt64), n)
		default:
			w.fail(path, "must be an integer, got %s", describe(v))
		}
		return nil, false
	case reflect.Interface:
		return v, true
	default:
		// A schema type this walker does not know is a programming error;
		// say so instead of accepting the value unchecked.
		w.fail(path, "cannot be checked: unsupported schema type %s", t)
		return nil, false
	}
}

func (w *walker) walkStruct(path string, v any, t reflect.Type) (any, bool) {
	m, ok := v.(yaml.MapSlice)
	if !ok {
		w.fail(path, "must be a mapping, got %s", describe(v))
		return nil, false
	}
	fields := jsonFields(t)
	out := make(yaml.MapSlice, 0, len(m))
	for _, item := range m {
		key, ok := item.Key.(string)
		if !ok {
			w.fail(join(path, fmt.Sprint(item.Key)), "unknown field")
			continue
		}
		ft, ok := fields[key]
		if !ok {
			w.fail(join(path, key), "unknown field")
			continue
		}
		if val, ok := w.walk(join(path, key), item.Value, ft); ok {
			out = append(out, yaml.MapItem{Key: key, Value: val})
		}
	}
	return out, true
}

func (w *walker) walkMap(path string, v any, t reflect.Type) (any, bool) {
	if t.Key().Kind() != reflect.String {
		w.fail(path, "cannot be checked: unsupported map key type %s", t.Key())
		return nil, false
	}
	m, ok := v.(yaml.MapSlice)
	if !ok {
		w.fail(path, "must be a mapping, got %s", describe(v))
		return nil, false
	}
	out := make(yaml.MapSlice, 0, len(m))
	for _, item := range m {
		key, ok := item.Key.(string)
		if !ok {
			w.fail(join(path, fmt.Sprint(item.Key)), "key must be a string, got %s (quote it)", describe(item.Key))
			continue
		}
		if val, ok := w.walk(join(path, key), item.Value, t.Elem()); ok {
			out = append(out, yaml.MapItem{Key: key, Value: val})
		}
	}
	return out, true
}

// jsonFields maps the json names of t's fields to their types, inlining
// embedded structs the way encoding/json does. Fields tagged "-" are not part
// of the schema.
func jsonFields(t reflect.Type) map[string]reflect.Type {
	fields := make(map[string]reflect.Type)
	for i := range t.NumField() {
		f := t.Field(i)
		tag := f.Tag.Get("json")
		name, _, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if f.Anonymous && name == "" && f.Type.Kind() == reflect.Struct {
			for k, v := range jsonFields(f.Type) {
				fields[k] = v
			}
			continue
		}
		if !f.IsExported() {
			continue
		}
		if name == "" {
			name = f.Name
		}
		fields[name] = f.Type
	}
	return fields
}

func join(path, key string) string {
	if path == "" {
		return key
	}
	return path + "." + key
}

func isScalar(v any) bool {
	switch v.(type) {
	case yaml.MapSlice, []any, nil:
		return false
	}
	return true
}

// describe names a decoded YAML value in an error message.
func describe(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case string:
		return fmt.Sprintf("%q", v)
	case yaml.MapSlice, map[any]any:
		return "a mapping"
	case []any:
		return "a list"
	case float64:
		return fmt.Sprintf("%g", v)
	default:
		return fmt.Sprint(v)
	}
}
