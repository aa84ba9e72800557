package strictyaml

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	yaml "go.yaml.in/yaml/v3"
)

type size struct{ Bytes int64 }

func (s *size) CheckYAMLScalar(v any) string {
	if str, ok := v.(string); !ok || !strings.HasSuffix(str, "Gi") {
		return fmt.Sprintf("must be a size such as 2Gi, got %v", v)
	}
	return ""
}

func (s *size) UnmarshalJSON(b []byte) error {
	var n int64
	_, err := fmt.Sscanf(string(b), `"%dGi"`, &n)
	s.Bytes = n << 30
	return err
}

// either takes a list of names or one name.
type either []string

func (*either) YAMLShape(n *yaml.Node) (reflect.Type, string) {
	switch n.Kind {
	case yaml.SequenceNode:
		return reflect.TypeFor[[]string](), ""
	case yaml.ScalarNode:
		return reflect.TypeFor[string](), ""
	}
	return nil, "must be a name or a list of names, got " + Describe(n)
}

func (e *either) UnmarshalJSON(b []byte) error {
	var one string
	if json.Unmarshal(b, &one) == nil {
		*e = either{one}
		return nil
	}
	return json.Unmarshal(b, (*[]string)(e))
}

type base struct {
	Name string `json:"name"`
}

type card struct {
	base
	Count  int               `json:"count"`
	Share  float64           `json:"share"`
	Slots  uint32            `json:"slots"`
	Down   bool              `json:"down"`
	Memory *size             `json:"memory"`
	Labels map[string]string `json:"labels"`
	Owners either            `json:"owners"`
	Since  string            `json:"since"`
	Notes  []string          `json:"notes"`
	Secret string            `json:"-"`
}

type file struct {
	Cards []card `json:"cards"`
}

// TestWalkNamesLineAndField checks each problem the walk reports, with the
// line and the path of the field, in the file's order.
func TestWalkNamesLineAndField(t *testing.T) {
	src := `cards:
- name: a
  count: two
  share: lots
  slots: -1
  down: maybe
  memory: 20
  labels: {x: 1}
  owners: {who: me}
  colour: red
  name: b
  notes: [ok, [1]]
  Secret: s
- 7
`
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatal(err)
	}
	w := &Walker{ListKnown: true}
	w.Walk(&doc, reflect.TypeFor[file](), "")
	var got []string
	for _, p := range w.Problems {
		got = append(got, p.Error())
	}
	want := []string{
		`line 3: cards[0].count: must be an integer, got "two"`,
		`line 4: cards[0].share: must be a number, got "lots"`,
		`line 5: cards[0].slots: must be an integer ≥ 0, got -1`,
		`line 6: cards[0].down: must be true or false, got "maybe"`,
		`line 7: cards[0].memory: must be a size such as 2Gi, got 20`,
		`line 8: cards[0].labels.x: must be a string, got 1 (quote it)`,
		`line 9: cards[0].owners: must be a name or a list of names, got a mapping`,
		`line 10: cards[0].colour: unknown field (known: name, count, share, slots, down, memory, labels, owners, since, notes)`,
		`line 11: cards[0].name: set twice, at lines 2 and 11`,
		`line 12: cards[0].notes[1]: must be a string, got a list`,
		`line 13: cards[0].Secret: unknown field (known: name, count, share, slots, down, memory, labels, owners, since, notes)`,
		`line 14: cards[1]: must be a mapping, got 7`,
	}
	if !slices.Equal(got, want) {
		t.Errorf("problems:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if !w.FailedAt("cards[0].labels") || !w.FailedAt("cards[0]") || w.FailedAt("cards[0].since") {
		t.Errorf("FailedAt does not follow the problems")
	}
}

// TestDecodeKeepsWhatPassed checks that the walked tree decodes into the
// typed value with the valid fields set and the refused ones left out.
func TestDecodeKeepsWhatPassed(t *testing.T) {
	src := `cards:
- &first
  name: a
  count: 3
  share: 0.5
  memory: 2Gi
  owners: me
  since: 2024-01-01
  notes: [x, 2, y]
  labels: ~
- name: c
  <<: [{count: 4}, *first]
- name: b
  count: nine
  owners: [you, them]
`
	var doc yaml.Node
	if err := yaml.Unmarshal([]byte(src), &doc); err != nil {
		t.Fatal(err)
	}
	w := &Walker{}
	pruned := w.Walk(&doc, reflect.TypeFor[file](), "")
	var f file
	if err := Decode(pruned, &f); err != nil {
		t.Fatal(err)
	}
	// The merge brings in the first card's fields but its own name and the
	// count of the earlier merged mapping; the refused note is refused in
	// the merged card too.
	if len(w.Problems) != 3 || w.Problems[0].Field != "cards[0].notes[1]" || w.Problems[1].Field != "cards[1].notes[1]" || w.Problems[1].Line != 9 || w.Problems[2].Field != "cards[2].count" {
		t.Fatalf("problems %v", w.Problems)
	}
	first := card{base: base{Name: "a"}, Count: 3, Share: 0.5, Memory: &size{2 << 30}, Owners: either{"me"}, Since: "2024-01-01", Notes: []string{"x", "y"}}
	merged := first
	merged.Name, merged.Count = "c", 4
	want := file{Cards: []card{
		first,
		merged,
		{base: base{Name: "b"}, Owners: either{"you", "them"}},
	}}
	if !reflect.DeepEqual(f, want) {
		t.Errorf("decoded %+v\nwant %+v", f, want)
	}
}

// TestUnmarshalReportsTheFirstProblem checks the one-document form.
func TestUnmarshalReportsTheFirstProblem(t *testing.T) {
	var f file
	for src, want := range map[string]string{
		"cards:\n- name: a\n  gpus: 2\n  count: x\n": "line 3: cards[0].gpus: unknown field (known: name, count,",
		"cards: [\n": "line 1: did not find expected node content",
	} {
		err := Unmarshal([]byte(src), &f, true)
		if err == nil || !strings.HasPrefix(err.Error(), want) {
			t.Errorf("%q: error %v, want %q", src, err, want)
		}
	}
	if err := Unmarshal([]byte("cards:\n- name: a\n  count: 2\n"), &f, true); err != nil || len(f.Cards) != 1 || f.Cards[0].Count != 2 {
		t.Errorf("good file: %+v, %v", f, err)
	}
}

// TestDocumentsNumbersThem checks that documents are numbered from 1, that
// empty ones are skipped, and that a syntax error names its document.
func TestDocumentsNumbersThem(t *testing.T) {
	var seen []int
	n, err := Documents(strings.NewReader("a: 1\n---\n---\nb: 2\n---\nc: [\n"), func(n int, doc *yaml.Node) {
		seen = append(seen, n)
	})
	if err == nil || n != 4 || !slices.Equal(seen, []int{1, 3}) {
		t.Errorf("documents %v, error %v in document %d; want 1 and 3, an error in 4", seen, err, n)
	}
}
