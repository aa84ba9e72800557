package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/cenkalti/backoff/v5"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
)

// `gpuplane events`: the committed event stream.

// Reconnection of `events --follow`: quick at first, then at most every 2 s.
const (
	followFirstRetry = 100 * time.Millisecond
	followMaxRetry   = 2 * time.Second
)

type eventFilterFlags struct {
	node, resource, actor string
}

func (f *eventFilterFlags) add(c *cobra.Command) {
	c.Flags().StringVar(&f.node, "node", "", "only entries that concern this node (its replicas included)")
	c.Flags().StringVar(&f.resource, "resource", "", "only entries about this resource, as KIND/NAME (node/gpu-1, accelerator/small, model/chat)")
	c.Flags().StringVar(&f.actor, "actor", "", "only entries proposed by this actor")
}

func (f *eventFilterFlags) proto(cmd *cobra.Command) (*pb.EventFilter, error) {
	if f.resource != "" {
		kind, name, ok := strings.Cut(f.resource, "/")
		if !ok || name == "" || !slices.Contains([]string{"node", "accelerator", "model", "server"}, kind) {
			return nil, usageErrorf(cmd, "invalid --resource %q: want KIND/NAME with KIND node, accelerator, model or server", f.resource)
		}
	}
	if f.node == "" && f.resource == "" && f.actor == "" {
		return nil, nil
	}
	return &pb.EventFilter{Node: f.node, Resource: f.resource, Actor: f.actor}, nil
}

func newEventsCommand(g *globals) *cobra.Command {
	var (
		from   uint64
		follow bool
		filter eventFilterFlags
	)
	c := &cobra.Command{
		Use:   "events [--from INDEX] [--follow]",
		Short: "Stream the committed events of the log, in index order",
		Long: `Stream the committed events of the log in index order: every command with its
result, and every membership change. With --follow the stream stays open; if
the node goes away it resumes, from the index after the last event printed, on
that node or another server, so no event is missed or printed twice.
-o json prints one JSON object per line.`,
		Args: argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := filter.proto(cmd)
			if err != nil {
				return err
			}
			return g.streamEvents(cmd, &pb.WatchRequest{FromIndex: from, Follow: follow, Filter: f})
		},
	}
	c.Flags().Uint64Var(&from, "from", 1, "first log index to show")
	c.Flags().BoolVarP(&follow, "follow", "f", false, "keep streaming new events; resume on another node if this one goes away")
	filter.add(c)
	return c
}

// logClients returns the event and audit clients of the node at addr.
func (g *globals) logClients(cmd *cobra.Command, addr string) (gpuplanev1connect.EventServiceClient, gpuplanev1connect.AuditServiceClient, error) {
	if _, err := g.api(cmd); err != nil { // checks --addr the way every command does
		return nil, nil, err
	}
	base, err := normalizeAddr(addr, g.ca != "")
	if err != nil {
		return nil, nil, &usageError{cmd: cmd, msg: err.Error()}
	}
	hc := g.httpClient
	if hc == nil {
		hc = &http.Client{}
	}
	opts := []connect.ClientOption{
		connect.WithInterceptors(headerInterceptor{token: g.token, userAgent: "gpuplane-cli/" + buildInfo().Version}),
		connect.WithReadMaxBytes(64 << 20),
	}
	return gpuplanev1connect.NewEventServiceClient(hc, base, opts...), gpuplanev1connect.NewAuditServiceClient(hc, base, opts...), nil
}

// streamEvents prints the Watch stream. With follow it reconnects after any
// error, from the index after the last event printed, trying --addr and
// then the other servers of the cluster in turn.
func (g *globals) streamEvents(cmd *cobra.Command, req *pb.WatchRequest) error {
	addrs := []string{g.addr}
	if req.Follow {
		addrs = append(addrs, g.otherServers(cmd)...)
	}
	next := max(req.FromIndex, 1)
	// With --follow the events already in the log are read first, without
	// following, so that the table starts aligned on them; the stream goes
	// on from there.
	var backlog []*pb.Event
	if req.Follow && g.output == outputTable {
		if events, _, err := g.logClients(cmd, g.addr); err == nil {
			r := &pb.WatchRequest{FromIndex: next, Filter: req.Filter}
			if stream, err := events.Watch(ctx(cmd), connect.NewRequest(r)); err == nil {
				for stream.Receive() {
					if ev := stream.Msg().GetEvent(); ev.GetIndex() >= next {
						backlog = append(backlog, ev)
						next = ev.GetIndex() + 1
					}
				}
				stream.Close()
			}
		}
	}
	w, err := g.eventWriter(backlog)
	if err != nil {
		return err
	}
	// Without --follow the stream ends: its table is printed whole,
	// aligned as every other table.
	var got []*pb.Event
	finish := func(err error) error { return err }
	if !req.Follow && g.output == outputTable {
		w = func(ev *pb.Event) error {
			got = append(got, ev)
			return nil
		}
		finish = func(err error) error {
			if len(got) > 0 {
				if perr := tableOf(eventHeader, got, eventRow).write(g.stdout); err == nil {
					err = perr
				}
			}
			return err
		}
	}
	retry := &backoff.ExponentialBackOff{InitialInterval: followFirstRetry, Multiplier: 2, MaxInterval: followMaxRetry}
	retry.Reset()
	for attempt := 0; ; attempt++ {
		addr := addrs[attempt%len(addrs)]
		events, _, err := g.logClients(cmd, addr)
		if err != nil {
			return err
		}
		r := &pb.WatchRequest{FromIndex: next, Follow: req.Follow, Filter: req.Filter}
		stream, err := events.Watch(ctx(cmd), connect.NewRequest(r))
		if err == nil {
			for stream.Receive() {
				ev := stream.Msg().GetEvent()
				if ev.GetIndex() < next {
					continue // never sent by a correct server; never print twice
				}
				if err := w(ev); err != nil {
					stream.Close()
					return err
				}
				next = ev.GetIndex() + 1
				retry.Reset()
			}
			err = stream.Err()
			stream.Close()
		}
		if ctx(cmd).Err() != nil {
			return finish(nil) // interrupted: the stream was what the user asked for
		}
		if !req.Follow {
			return finish(err)
		}
		reason := "the stream ended"
		if err != nil {
			reason = g.errorLines(err)[0]
		}
		fmt.Fprintf(g.stderr, "warning: events from %s: %s; resuming from index %d\n", addr, reason, next)
		select {
		case <-ctx(cmd).Done():
			return nil
		case <-time.After(retry.NextBackOff()):
		}
	}
}

// otherServers returns the API addresses of the cluster's server nodes other
// than --addr, for `events --follow` to resume on; none when they cannot be
// listed now.
func (g *globals) otherServers(cmd *cobra.Command) []string {
	api, err := g.api(cmd)
	if err != nil {
		return nil
	}
	c, cancel := context.WithTimeout(ctx(cmd), 5*time.Second)
	defer cancel()
	resp, err := api.Nodes.ListNodes(c, connect.NewRequest(&pb.ListNodesRequest{Stale: true}))
	if err != nil {
		return nil
	}
	var out []string
	for _, n := range resp.Msg.GetNodes() {
		if n.GetRole() != pb.NodeRole_NODE_ROLE_SERVER || n.GetAddress() == "" {
			continue
		}
		if base, err := normalizeAddr(n.GetAddress(), g.ca != ""); err == nil && base != api.baseURL {
			out = append(out, base)
		}
	}
	return out
}

// eventWriter prints events one at a time as they arrive: a line of the
// audit log table, one JSON object per line for -o json, a YAML document
// for -o yaml. A stream cannot align its lines on the widest cell as a
// table does: the table's columns (but the last) take the width of the
// widest cell of backlog, the events already in the log, which it prints
// first, or a width that holds a typical cell, and grow, for the lines
// after, when a cell does not fit.
func (g *globals) eventWriter(backlog []*pb.Event) (func(*pb.Event) error, error) {
	header := false
	widths := slices.Clone(eventMinWidths)
	for _, ev := range backlog {
		for i, c := range eventRow(ev)[:len(widths)-1] {
			widths[i] = max(widths[i], len(orDash(c)))
		}
	}
	line := func(cells []string) error {
		var b strings.Builder
		for i, c := range cells {
			c = orDash(c)
			if i == len(cells)-1 {
				b.WriteString(c)
				break
			}
			widths[i] = max(widths[i], len(c))
			b.WriteString(c)
			b.WriteString(strings.Repeat(" ", widths[i]-len(c)+3))
		}
		_, err := fmt.Fprintln(g.stdout, b.String())
		return err
	}
	write := func(ev *pb.Event) error {
		switch g.output {
		case outputTable:
			if !header {
				if err := line(eventHeader); err != nil {
					return err
				}
				header = true
			}
			return line(eventRow(ev))
		case outputJSON:
			return writeJSONLine(g.stdout, ev)
		default:
			fmt.Fprintln(g.stdout, "---")
			return g.printObject(ev, table{})
		}
	}
	for _, ev := range backlog {
		if err := write(ev); err != nil {
			return nil, err
		}
	}
	return write, nil
}

// eventMinWidths are the widths a streamed event line starts with, per
// column of eventHeader: indexes up to a million, a millisecond time, the
// default actor names, an 8-character request id, most summaries.
var eventMinWidths = []int{5, 4, len(eventTimeFormat), len("anonymous"), 8, 40, 0}

// writeJSONLine writes m as one line of compact JSON (JSON lines), in the
// CLI's plain form.
func writeJSONLine(w interface{ Write([]byte) (int, error) }, m proto.Message) error {
	b, err := plainJSON(m)
	if err != nil {
		return err
	}
	return writeLine(w, b)
}

// writeAPIJSONLine is writeJSONLine in the API's protojson form.
func writeAPIJSONLine(w interface{ Write([]byte) (int, error) }, m proto.Message) error {
	b, err := marshalJSON(m)
	if err != nil {
		return err
	}
	return writeLine(w, b)
}

func writeLine(w interface{ Write([]byte) (int, error) }, b []byte) error {
	var buf bytes.Buffer
	if err := json.Compact(&buf, b); err != nil {
		return err
	}
	buf.WriteByte('\n')
	_, err := w.Write(buf.Bytes())
	return err
}

var eventHeader = []string{"INDEX", "TERM", "TIME", "ACTOR", "REQUEST", "COMMAND", "RESULT"}

// eventTimeFormat is RFC 3339 with milliseconds, always three digits so
// that the column keeps its width: nanoseconds made lines ~170 wide.
const eventTimeFormat = "2006-01-02T15:04:05.000Z07:00"

// eventRow is one entry as the audit log shows it.
func eventRow(ev *pb.Event) []string {
	at := ""
	if ev.GetProposedAt() != nil {
		at = ev.GetProposedAt().AsTime().UTC().Format(eventTimeFormat)
	}
	req := ev.GetRequestId()
	if len(req) > 8 {
		req = req[:8]
	}
	return []string{itoa(ev.GetIndex()), itoa(ev.GetTerm()), at, ev.GetActor(), req, ev.GetSummary(), resultText(ev)}
}

// resultText says what an entry did: "applied: created", "rejected: <why>".
func resultText(ev *pb.Event) string {
	if ev.GetType() == pb.EventType_EVENT_TYPE_MEMBERSHIP {
		return "applied"
	}
	res := ev.GetResult()
	if res.GetCode() != pb.Code_CODE_OK {
		msg := res.GetMessage()
		for _, v := range res.GetViolations() {
			msg += "; " + violationLine(v)
		}
		return "rejected: " + msg
	}
	out := "applied"
	if o := enumName(res.GetOutcome().String(), "OUTCOME_"); o != "" {
		out += ": " + o
	}
	if res.GetDuplicate() {
		out += " (duplicate request)"
	}
	return out
}
