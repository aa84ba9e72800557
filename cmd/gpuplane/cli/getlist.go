package cli

import (
	"context"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
)

// Every kind of resource is read the same two ways, as kubectl does:
// `KIND list` shows every object as a table, one row each; `KIND get NAME`
// shows one object in detail, its listing's columns as "Field: value"
// lines, then its parts (a node's cards, a deployment's replicas) as
// tables. With -o json|yaml, list prints an array and get the object, in
// the same shape.

// listCommand builds `KIND list`: list reads the objects (stale: from the
// contacted node's state), tbl is their table.
func listCommand[T proto.Message](g *globals, short string, list func(ctx context.Context, api *apiClients, stale bool) ([]T, error), tbl func([]T) table) *cobra.Command {
	var stale bool
	c := &cobra.Command{
		Use:   "list",
		Short: short,
		Args:  argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			items, err := list(ctx(cmd), api, stale)
			if err != nil {
				return err
			}
			return g.printList(messages(items), tbl(items))
		},
	}
	addStaleFlag(c, &stale)
	return c
}

// getCommand builds `KIND get NAME`: get reads the object named, show is
// its detail; names completes NAME.
func getCommand[T proto.Message](g *globals, short string, names func(*cobra.Command, *apiClients) ([]string, error), get func(ctx context.Context, api *apiClients, name string, stale bool) (T, error), show func(T) detail) *cobra.Command {
	var stale bool
	c := &cobra.Command{
		Use:               "get NAME",
		Short:             short,
		Args:              argsNamed("NAME"),
		ValidArgsFunction: g.completeNames(names),
		RunE: func(cmd *cobra.Command, args []string) error {
			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			obj, err := get(ctx(cmd), api, args[0], stale)
			if err != nil {
				return err
			}
			return g.printDetail(obj, show(obj))
		},
	}
	addStaleFlag(c, &stale)
	return c
}

// answer is an RPC's response message, or its error: what the reads
// behind listCommand and getCommand return.
func answer[T any](resp *connect.Response[T], err error) (*T, error) {
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

// namesOf is the names of items read by an RPC, for completion.
func namesOf[T interface{ GetName() string }](items []T, err error) ([]string, error) {
	if err != nil {
		return nil, err
	}
	var names []string
	for _, it := range items {
		names = append(names, it.GetName())
	}
	return names, nil
}

// detail is what `get NAME` shows in -o table: fields, one per line, then
// parts, each a titled table.
type detail struct {
	fields [][2]string
	parts  []part
}

// part is a titled table of a detail.
type part struct {
	title string
	table table
}

// detailOf is the detail of an object whose listing is t (one row): each
// column becomes a field, labelled as the header reads in a sentence.
func detailOf(t table) detail {
	var d detail
	if len(t.rows) == 0 {
		return d
	}
	for i, h := range t.header {
		d.fields = append(d.fields, [2]string{fieldLabel(h), t.rows[0][i]})
	}
	return d
}

// with adds fields after those of d.
func (d detail) with(fields ...[2]string) detail {
	d.fields = append(d.fields, fields...)
	return d
}

// relabel renames the field labelled from.
func (d detail) relabel(from, to string) detail {
	for i := range d.fields {
		if d.fields[i][0] == from {
			d.fields[i][0] = to
		}
	}
	return d
}

// withPart adds a part, unless its table is empty.
func (d detail) withPart(title string, t table) detail {
	if len(t.rows) > 0 {
		d.parts = append(d.parts, part{title, t})
	}
	return d
}

// write prints the fields aligned after their labels ("Name:   chat"; an
// empty value as "-"), then each part under its title after a blank line.
func (d detail) write(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 8, 2, ' ', 0)
	for _, f := range d.fields {
		fmt.Fprintf(tw, "%s:\t%s\n", f[0], orDash(f[1]))
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, p := range d.parts {
		fmt.Fprintf(w, "\n%s:\n", p.title)
		if err := p.table.write(w); err != nil {
			return err
		}
	}
	return nil
}

// printDetail prints one resource: its detail, or m as a JSON/YAML object.
func (g *globals) printDetail(m proto.Message, d detail) error {
	if g.output == outputTable {
		return d.write(g.stdout)
	}
	b, err := plainJSON(m)
	if err != nil {
		return err
	}
	return g.writeJSON(b)
}

// fieldLabel turns a column header into a field label: "MEMORY/MODEL" →
// "Memory/model", "TTFT SLO" → "TTFT SLO" (acronyms stay).
func fieldLabel(header string) string {
	words := strings.Fields(header)
	for i, w := range words {
		if acronyms[w] {
			continue
		}
		w = strings.ToLower(w)
		if i == 0 {
			w = strings.ToUpper(w[:1]) + w[1:]
		}
		words[i] = w
	}
	return strings.Join(words, " ")
}

var acronyms = map[string]bool{"TTFT": true, "SLO": true, "UUID": true, "FP8": true, "CPU": true, "ID": true}
