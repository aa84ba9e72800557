package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
	"strings"
	"text/tabwriter"

	yaml "go.yaml.in/yaml/v3"
	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/proto"
)

// table is what a command shows in -o table: a header and rows of cells.
type table struct {
	header []string
	rows   [][]string
}

// tableOf builds a table with one row per item.
func tableOf[T any](header []string, items []T, row func(T) []string) table {
	t := table{header: header, rows: make([][]string, 0, len(items))}
	for _, it := range items {
		t.rows = append(t.rows, row(it))
	}
	return t
}

// write prints the table aligned in columns; an empty cell prints as "-" so
// that every row splits into the same number of fields.
func (t table) write(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 8, 3, ' ', 0)
	if t.header != nil {
		fmt.Fprintln(tw, strings.Join(t.header, "\t"))
	}
	for _, row := range t.rows {
		cells := make([]string, len(row))
		for i, c := range row {
			cells[i] = orDash(c)
		}
		fmt.Fprintln(tw, strings.Join(cells, "\t"))
	}
	return tw.Flush()
}

// printList prints a listing: the table, or the items as a JSON/YAML array.
func (g *globals) printList(items []proto.Message, t table) error {
	if g.output == outputTable {
		return t.write(g.stdout)
	}
	b, err := jsonArray(items)
	if err != nil {
		return err
	}
	return g.writeJSON(b)
}

// jsonArray is the JSON form of a listing: the messages' plain JSON in an
// array.
func jsonArray(items []proto.Message) ([]byte, error) {
	parts := make([][]byte, len(items))
	for i, m := range items {
		b, err := plainJSON(m)
		if err != nil {
			return nil, err
		}
		parts[i] = b
	}
	return append(append([]byte("["), bytes.Join(parts, []byte(","))...), ']'), nil
}

// printObject prints one resource: the table, or m as a JSON/YAML object.
func (g *globals) printObject(m proto.Message, t table) error {
	if g.output == outputTable {
		return t.write(g.stdout)
	}
	b, err := plainJSON(m)
	if err != nil {
		return err
	}
	return g.writeJSON(b)
}

// printValue prints a plain Go value (not a proto message) for -o json/yaml,
// or calls text for -o table.
func (g *globals) printValue(v any, text func(io.Writer) error) error {
	if g.output == outputTable {
		return text(g.stdout)
	}
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return g.writeJSON(b)
}

// writeJSON writes compact JSON indented by two spaces, or converted to YAML.
func (g *globals) writeJSON(compact []byte) error {
	var buf bytes.Buffer
	// Re-indenting also removes the random whitespace protojson inserts to
	// keep callers from depending on its exact output: ours is stable.
	if err := json.Indent(&buf, compact, "", "  "); err != nil {
		return fmt.Errorf("format JSON: %w", err)
	}
	buf.WriteByte('\n')
	out := buf.Bytes()
	if g.output == outputYAML {
		y, err := jsonToYAML(out)
		if err != nil {
			return fmt.Errorf("format YAML: %w", err)
		}
		out = y
	}
	_, err := g.stdout.Write(out)
	return err
}

// jsonToYAML converts JSON to YAML keeping every object's keys in their
// order (a descriptor reads resource, resourceVersion, metadata, spec,
// status, as it is written), which a conversion through Go maps would sort.
func jsonToYAML(j []byte) ([]byte, error) {
	// JSON is YAML: its node tree keeps the order of every mapping. The
	// JSON spelling (quotes, braces) is dropped for YAML's plain style.
	var doc yaml.Node
	if err := yaml.Unmarshal(j, &doc); err != nil {
		return nil, err
	}
	plain(&doc)
	var b bytes.Buffer
	enc := yaml.NewEncoder(&b)
	enc.SetIndent(2)
	enc.CompactSeqIndent() // lists under a key start at the key's column
	if err := enc.Encode(&doc); err != nil {
		return nil, err
	}
	if err := enc.Close(); err != nil {
		return nil, err
	}
	return b.Bytes(), nil
}

// plain resets the style of n and the nodes under it, so the encoder picks
// YAML's own (it quotes a string only where it would read otherwise). The
// words YAML 1.1 reads as booleans stay quoted, for the readers that still
// speak it.
func plain(n *yaml.Node) {
	n.Style = 0
	if n.Kind == yaml.ScalarNode && n.Tag == "!!str" && yaml11Bool[strings.ToLower(n.Value)] {
		n.Style = yaml.DoubleQuotedStyle
	}
	for _, c := range n.Content {
		plain(c)
	}
}

var yaml11Bool = map[string]bool{"y": true, "yes": true, "n": true, "no": true, "on": true, "off": true}

// marshalJSON is the API's JSON form of a message (protojson): camelCase
// names, every field present (zero values included). Only archives use it
// (audit export), so that they read back with any protobuf library.
func marshalJSON(m proto.Message) ([]byte, error) {
	return protojson.MarshalOptions{EmitUnpopulated: true}.Marshal(m)
}

// messages converts a typed slice for printList.
func messages[T proto.Message](items []T) []proto.Message {
	out := make([]proto.Message, len(items))
	for i, it := range items {
		out[i] = it
	}
	return out
}

// Cell formatting shared by the tables.

// mib formats a memory size in MiB the way tables show it: "23034Mi".
func mib(n uint64) string { return strconv.FormatUint(n, 10) + "Mi" }

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// titleBool is the Kubernetes-condition style of READY: "True" / "False".
func titleBool(b bool) string {
	if b {
		return "True"
	}
	return "False"
}

func itoa[T ~uint32 | ~uint64 | ~int | ~int64](n T) string { return fmt.Sprint(n) }

// enumName turns TENANCY_SHARED into "shared" given the prefix "TENANCY_";
// the unspecified value becomes "".
func enumName(s, prefix string) string {
	s = strings.TrimPrefix(s, prefix)
	if s == "UNSPECIFIED" {
		return ""
	}
	return strings.ToLower(s)
}
