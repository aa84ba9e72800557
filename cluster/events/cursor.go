package events

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpuplane/gpuplane/cluster/auditrec"
	"github.com/gpuplane/gpuplane/fsm"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// Cursor walks a Raft log from index 1, applying every command to a private
// state machine with fsm.ApplyBytes (the code the live cluster runs), and
// turns the entries from a given index on into events. Results and hashes are
// therefore recomputed, not stored: the state machine is deterministic, so
// they are what every server computed. Because it always starts at index 1
// and reads every index, the events it yields are in index order with none
// missing, whichever node's log it reads; a client that resumes from the
// index after its last event sees each event exactly once.
//
// A Cursor is not safe for concurrent use.
type Cursor struct {
	log    LogReader
	from   uint64
	filter *pb.EventFilter

	next  uint64 // next index to read
	state *fsm.FSM
	conf  raft.Configuration
	// basePath is the log's audit base (written by cluster.Cluster.Compact), where a compacted
	// log's replay starts, and snapshotDir its snapshots (auditrec.FindBase).
	basePath, snapshotDir string
	// fanout, set on a Feed's cursor, makes apply name in changed the
	// nodes whose replicas a command entry changed although its event
	// does not name them (feed.go).
	fanout  bool
	changed []string
}

// NewCursor returns a cursor over log that yields the events with index >=
// from matching filter (nil: all).
func NewCursor(log LogReader, from uint64, filter *pb.EventFilter) *Cursor {
	return &Cursor{log: log, from: max(from, 1), filter: filter, next: 1, state: fsm.New()}
}

// Next is the index of the next entry the cursor will read.
func (c *Cursor) Next() uint64 { return c.next }

// View calls fn with the replayed state as of Next()-1. fn must not keep it.
func (c *Cursor) View(fn func(*fsm.FSM)) { fn(c.state) }

// Advance reads the entries up to upTo (inclusive) and calls yield with each
// matching event; it stops at the first error yield returns. Events wanted
// from entries compacted away behind an archive are ErrCompacted; other
// entries missing from the log (not yet written) are an error naming the
// index.
func (c *Cursor) Advance(upTo uint64, yield func(*pb.Event) error) error {
	if c.next == 1 && upTo >= 1 {
		if err := c.start(); err != nil {
			return err
		}
		if c.from < c.next {
			return fmt.Errorf("%w: entries 1..%d were archived and compacted away on this server: read them from the archive ('audit replay --archive DIR')", ErrCompacted, c.next-1)
		}
	}
	return c.advance(upTo, func(l *raft.Log, e *fsm.Entry) error { return c.step(l, e, yield) })
}

// start places a cursor that has read nothing: at index 1, or, on a log
// compacted after an archive, just after its audit base, from that state.
func (c *Cursor) start() error {
	first, err := c.log.FirstIndex()
	if err != nil {
		return fmt.Errorf("read log: %w", err)
	}
	if first <= 1 {
		return nil
	}
	base, err := auditrec.FindBase(c.basePath, c.snapshotDir, first)
	if err != nil {
		return err
	}
	if base == nil || base.AppliedIndex()+1 < first {
		return fmt.Errorf("the log starts at index %d: entries before it are gone, so it cannot be replayed", first)
	}
	c.state, c.next = base, base.AppliedIndex()+1
	return nil
}

// AdvanceHeads is Advance for a caller that needs no events, only each
// entry's hash head (audit verify): fn gets every entry Advance would make
// an event of (commands and membership changes) with its index, whether it
// is a command, and the hash head after it; describe, valid only until fn
// returns, gives a command's event summary, for a report. No event is
// built: no second decode of the envelope, no description, per entry.
func (c *Cursor) AdvanceHeads(upTo uint64, fn func(index uint64, command bool, hash string, describe func() string) error) error {
	return c.advance(upTo, func(l *raft.Log, e *fsm.Entry) error {
		if l.Index != c.next {
			return fmt.Errorf("log entry %d is stored under index %d: the log is corrupt", l.Index, c.next)
		}
		defer func() { c.next++ }()
		c.skip(l, e)
		if c.next < c.from || (l.Type != raft.LogCommand && l.Type != raft.LogConfiguration) {
			return nil
		}
		describe := func() string {
			if l.Type == raft.LogCommand {
				return commandEvent(l, nil, "").Summary
			}
			return "membership change"
		}
		return fn(l.Index, l.Type == raft.LogCommand, c.state.Hash(), describe)
	})
}

// advance reads the entries up to upTo (see Advance), calling step with
// each.
func (c *Cursor) advance(upTo uint64, step func(l *raft.Log, e *fsm.Entry) error) error {
	if c.next == 1 && upTo >= 1 {
		if err := c.start(); err != nil {
			return err
		}
	}
	if c.next == 1 && upTo >= 1<<12 {
		// Nearly every command carries a request id the state machine
		// remembers: size its map once for the whole replay.
		if last, err := c.log.LastIndex(); err == nil {
			c.state.ExpectEntries(int(min(upTo, last)))
		}
	}
	if r, ok := c.log.(LogRanger); ok && c.next <= upTo {
		err := r.RangeLogs(c.next, upTo, c.state.Prefetch, step)
		if errors.Is(err, raft.ErrLogNotFound) {
			return fmt.Errorf("log entry %d is missing", c.next)
		}
		return err
	}
	var l raft.Log
	for c.next <= upTo {
		if err := c.log.GetLog(c.next, &l); err != nil {
			if errors.Is(err, raft.ErrLogNotFound) {
				return fmt.Errorf("log entry %d is missing", c.next)
			}
			return fmt.Errorf("read log entry %d: %w", c.next, err)
		}
		if err := step(&l, nil); err != nil {
			return err
		}
	}
	return nil
}

// step applies entry c.next, yields its event if wanted, and moves on. e is
// the entry's Envelope when the reader decoded it ahead (nil: decode here).
func (c *Cursor) step(l *raft.Log, e *fsm.Entry, yield func(*pb.Event) error) error {
	if l.Index != c.next {
		return fmt.Errorf("log entry %d is stored under index %d: the log is corrupt", l.Index, c.next)
	}
	defer func() { c.next++ }()
	if c.next < c.from {
		// Before the first wanted event only the state matters: skip
		// building events nobody reads (decoding the envelope a second
		// time, describing it), a large part of a replay's cost.
		c.skip(l, e)
		return nil
	}
	ev := c.apply(l, e)
	if ev == nil || !c.matches(ev) {
		return nil
	}
	return yield(ev)
}

// skip applies one entry without building its event.
func (c *Cursor) skip(l *raft.Log, e *fsm.Entry) {
	switch l.Type {
	case raft.LogCommand:
		c.state.ReplayEntry(l.Index, decoded(l, e))
	case raft.LogConfiguration:
		if conf, err := decodeConfiguration(l.Data); err == nil {
			c.conf = conf
		}
	}
}

// decoded is e, or l's entry decoded now.
func decoded(l *raft.Log, e *fsm.Entry) fsm.Entry {
	if e != nil {
		return *e
	}
	return fsm.DecodeEntry(l.Data)
}

// apply applies one entry and returns its event, nil for entries that are
// not events (no-ops, barriers).
func (c *Cursor) apply(l *raft.Log, e *fsm.Entry) *pb.Event {
	switch l.Type {
	case raft.LogCommand:
		c.changed = c.changed[:0]
		// A node filter needs to know whether the entry changed that node's
		// replicas, which only the state before and after can tell.
		var before []*pb.Replica
		node := c.filter.GetNode()
		if node != "" && c.next >= c.from {
			before = c.state.ReplicasOn(node)
		}
		if c.fanout {
			c.state.TrackNodes()
		}
		res := c.state.ApplyEntry(l.Index, decoded(l, e))
		ev := commandEvent(l, res, c.state.Hash())
		if node != "" && c.next >= c.from && !slices.Contains(ev.Resources, "node/"+node) &&
			!replicasEqual(before, c.state.ReplicasOn(node)) {
			ev.Resources = append(ev.Resources, "node/"+node)
		}
		// A deployment's new spec concerns the nodes running it even when
		// its replicas stay as they were (adapters, residency, SLO): their
		// executors must see it.
		var specNodes []string
		if res.GetCode() == pb.Code_CODE_OK && strings.HasPrefix(ev.Summary, "ApplyModel ") && len(ev.Resources) > 0 {
			specNodes = c.state.NodesOf(strings.TrimPrefix(ev.Resources[0], "model/"))
		}
		if node != "" && c.next >= c.from && !slices.Contains(ev.Resources, "node/"+node) && slices.Contains(specNodes, node) {
			ev.Resources = append(ev.Resources, "node/"+node)
		}
		if c.fanout {
			for n, before := range c.state.Touched() {
				if !slices.Contains(ev.Resources, "node/"+n) && !replicasEqual(before, c.state.ReplicasOn(n)) {
					c.changed = append(c.changed, n)
				}
			}
			for _, n := range specNodes {
				if !slices.Contains(ev.Resources, "node/"+n) && !slices.Contains(c.changed, n) {
					c.changed = append(c.changed, n)
				}
			}
			slices.Sort(c.changed)
		}
		return ev
	case raft.LogConfiguration:
		conf, err := decodeConfiguration(l.Data)
		ev := &pb.Event{Index: l.Index, Term: l.Term, Type: pb.EventType_EVENT_TYPE_MEMBERSHIP, Actor: "raft", Hash: c.state.Hash()}
		if !l.AppendedAt.IsZero() {
			ev.ProposedAt = timestamppb.New(l.AppendedAt)
		}
		if err != nil {
			ev.Summary = "Membership: undecodable configuration: " + err.Error()
			return ev
		}
		m, changed := membershipChange(c.conf, conf)
		c.conf = conf
		ev.Membership = m
		ev.Summary = "Membership " + strings.Join(m.Changes, ", ")
		for _, id := range changed {
			ev.Resources = append(ev.Resources, "server/"+id)
		}
		return ev
	}
	return nil
}

func replicasEqual(a, b []*pb.Replica) bool {
	return slices.EqualFunc(a, b, func(x, y *pb.Replica) bool { return proto.Equal(x, y) })
}

func (c *Cursor) matches(ev *pb.Event) bool { return matchesFilter(c.filter, ev) }

// matchesFilter reports whether ev passes f (nil: every event does).
func matchesFilter(f *pb.EventFilter, ev *pb.Event) bool {
	if f == nil {
		return true
	}
	if f.Actor != "" && ev.Actor != f.Actor {
		return false
	}
	if f.Resource != "" && !slices.Contains(ev.Resources, f.Resource) {
		return false
	}
	if f.Node != "" && ev.Type == pb.EventType_EVENT_TYPE_COMMAND && !slices.Contains(ev.Resources, "node/"+f.Node) {
		return false
	}
	return true
}

// decodeConfiguration is raft.DecodeConfiguration, which panics on bad
// input: an entry altered on disk must be reported, not crash the reader.
func decodeConfiguration(data []byte) (conf raft.Configuration, err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("%v", r)
		}
	}()
	return raft.DecodeConfiguration(data), nil
}

// membershipChange describes conf and how it differs from prev: "s1 joined as
// voter", "s3 removed", "s2 became voter". It returns the ids that changed.
func membershipChange(prev, conf raft.Configuration) (*pb.Membership, []string) {
	m := &pb.Membership{}
	before := map[raft.ServerID]raft.Server{}
	for _, s := range prev.Servers {
		before[s.ID] = s
	}
	var changed []string
	for _, s := range conf.Servers {
		m.Servers = append(m.Servers, &pb.RaftServer{Id: string(s.ID), Address: string(s.Address), Suffrage: Suffrage(s.Suffrage)})
		old, ok := before[s.ID]
		delete(before, s.ID)
		switch {
		case !ok:
			m.Changes = append(m.Changes, fmt.Sprintf("%s joined as %s", s.ID, Suffrage(s.Suffrage)))
		case old.Suffrage != s.Suffrage:
			m.Changes = append(m.Changes, fmt.Sprintf("%s became %s", s.ID, Suffrage(s.Suffrage)))
		case old.Address != s.Address:
			m.Changes = append(m.Changes, fmt.Sprintf("%s moved to %s", s.ID, s.Address))
		default:
			continue
		}
		changed = append(changed, string(s.ID))
	}
	for _, s := range prev.Servers {
		if _, gone := before[s.ID]; gone {
			m.Changes = append(m.Changes, fmt.Sprintf("%s removed", s.ID))
			changed = append(changed, string(s.ID))
		}
	}
	if len(m.Changes) == 0 {
		m.Changes = []string{"unchanged"}
	}
	return m, changed
}

// Suffrage is the word for a Raft server's suffrage, in events and in
// the cluster's status.
func Suffrage(s raft.ServerSuffrage) string {
	switch s {
	case raft.Voter:
		return "voter"
	case raft.Nonvoter:
		return "nonvoter"
	default:
		return "staging"
	}
}

// commandEvent builds the event of one applied command entry.
func commandEvent(l *raft.Log, res *pb.Result, hash string) *pb.Event {
	ev := &pb.Event{Index: l.Index, Term: l.Term, Type: pb.EventType_EVENT_TYPE_COMMAND, Result: res, Hash: hash}
	env := &pb.Envelope{}
	if err := proto.Unmarshal(l.Data, env); err != nil {
		ev.Summary = "undecodable entry"
		return ev
	}
	// A token's secret hash authenticates nobody (the secret does), but
	// events are for every reader: they show tokens as `acl token list` does.
	if b := env.GetBootstrapAcl(); b != nil {
		b.SecretHash = ""
	}
	if c := env.GetCreateToken(); c != nil {
		c.SecretHash = ""
	}
	ev.Envelope = env
	ev.ProposedAt = env.GetProposedAt()
	ev.Actor = env.GetActor()
	ev.RequestId = env.GetRequestId()
	ev.Summary, ev.Resources = describe(env)
	return ev
}

// describe summarises a command for people and names the resources it is
// about. It only reads the envelope; what the command did is the result's.
func describe(env *pb.Envelope) (string, []string) {
	node := func(n string) string { return "node/" + n }
	acc := func(n string) string { return "accelerator/" + n }
	model := func(n string) string { return "model/" + n }
	switch c := env.GetCommand().(type) {
	case *pb.Envelope_RegisterNode:
		n := c.RegisterNode.GetNode()
		return fmt.Sprintf("RegisterNode %s (%s)", n.GetName(), cardKinds(n.GetCards())), []string{node(n.GetName())}
	case *pb.Envelope_UpdateInventory:
		u := c.UpdateInventory
		return fmt.Sprintf("UpdateInventory %s (%s)", u.GetNode(), cardKinds(u.GetCards())), []string{node(u.GetNode())}
	case *pb.Envelope_SetNodeStatus:
		s := c.SetNodeStatus
		return fmt.Sprintf("SetNodeStatus %s %s", s.GetNode(), enumWord(s.GetStatus().String(), "NODE_STATUS_")), []string{node(s.GetNode())}
	case *pb.Envelope_DeregisterNode:
		return "DeregisterNode " + c.DeregisterNode.GetNode(), []string{node(c.DeregisterNode.GetNode())}
	case *pb.Envelope_CreateAccelerator:
		a := c.CreateAccelerator
		return fmt.Sprintf("CreateAccelerator %s (%s %s)", a.GetName(),
			enumWord(a.GetSpec().GetTenancy().String(), "TENANCY_"), a.GetSpec().GetDevice()), []string{acc(a.GetName())}
	case *pb.Envelope_DeleteAccelerator:
		s := "DeleteAccelerator " + c.DeleteAccelerator.GetName()
		if c.DeleteAccelerator.GetForce() {
			s += " (force)"
		}
		return s, []string{acc(c.DeleteAccelerator.GetName())}
	case *pb.Envelope_ApplyModel:
		m := c.ApplyModel
		return fmt.Sprintf("ApplyModel %s (%s, %d replicas)", m.GetName(), m.GetSpec().GetPlacement().GetAccelerator(), m.GetSpec().GetReplicas()),
			[]string{model(m.GetName()), acc(m.GetSpec().GetPlacement().GetAccelerator())}
	case *pb.Envelope_DeleteModel:
		return "DeleteModel " + c.DeleteModel.GetName(), []string{model(c.DeleteModel.GetName())}
	case *pb.Envelope_BootstrapAcl:
		return "BootstrapACL " + c.BootstrapAcl.GetName() + " (admin)", []string{"token/" + c.BootstrapAcl.GetName()}
	case *pb.Envelope_CreateToken:
		t := c.CreateToken
		s := fmt.Sprintf("CreateToken %s (%s", t.GetName(), fsm.RoleString(t.GetRole()))
		if t.GetTenant() != "" {
			s += ", tenant " + t.GetTenant()
		}
		if t.Weight != nil {
			s += ", weight " + fsm.FormatWeight(t.GetWeight())
		}
		return s + ")", []string{"token/" + t.GetName()}
	case *pb.Envelope_DeleteToken:
		return "DeleteToken " + c.DeleteToken.GetName(), []string{"token/" + c.DeleteToken.GetName()}
	case *pb.Envelope_PlaceReplicas:
		var parts, res []string
		add := func(r string) {
			if !slices.Contains(res, r) {
				res = append(res, r)
			}
		}
		for _, p := range c.PlaceReplicas.GetPlacements() {
			parts = append(parts, fmt.Sprintf("%s/%d on %s:%s", p.GetModel(), p.GetReplica(), p.GetNode(), joinUints(p.GetCards())))
			add(model(p.GetModel()))
			add(node(p.GetNode()))
		}
		if n := len(c.PlaceReplicas.GetPending()); n > 0 {
			parts = append(parts, fmt.Sprintf("%d pending", n))
			for _, p := range c.PlaceReplicas.GetPending() {
				add(model(p.GetModel()))
			}
		}
		return "PlaceReplicas " + strings.Join(parts, ", "), res
	case *pb.Envelope_UnplaceReplica:
		u := c.UnplaceReplica
		return fmt.Sprintf("UnplaceReplica %s/%d (%s)", u.GetModel(), u.GetReplica(), u.GetReason()), []string{model(u.GetModel())}
	case *pb.Envelope_ReplicaStatus:
		s := c.ReplicaStatus
		text := fmt.Sprintf("ReplicaStatus %s/%d on %s %s", s.GetModel(), s.GetReplica(), s.GetNode(), enumWord(s.GetState().String(), "REPLICA_STATE_"))
		if r := s.GetResidency(); r != pb.ReplicaResidency_REPLICA_RESIDENCY_UNSPECIFIED {
			// A residency transition, with why (docs/residency.md).
			text += ", " + enumWord(r.String(), "REPLICA_RESIDENCY_")
			if why := s.GetResidencyReason(); why != "" {
				text += " (" + why + ")"
			}
		}
		if ra := s.GetAdapters(); ra != nil {
			// Where its adapters are now: those not named are on disk.
			by := map[pb.AdapterTier][]string{}
			for _, a := range ra.GetAdapters() {
				by[a.GetTier()] = append(by[a.GetTier()], a.GetName())
			}
			var tiers []string
			for _, t := range []pb.AdapterTier{pb.AdapterTier_ADAPTER_TIER_CARD, pb.AdapterTier_ADAPTER_TIER_LOADING, pb.AdapterTier_ADAPTER_TIER_HOST} {
				if len(by[t]) > 0 {
					tiers = append(tiers, enumWord(t.String(), "ADAPTER_TIER_")+" "+strings.Join(by[t], ","))
				}
			}
			if len(tiers) == 0 {
				tiers = append(tiers, "all on disk")
			}
			text += "; adapters " + strings.Join(tiers, "; ")
		}
		return text, []string{model(s.GetModel()), node(s.GetNode())}
	}
	return "unknown command", nil
}

// cardKinds counts cards by device kind: "l4=2,h100=1", or "no cards".
func cardKinds(cards []*pb.Card) string {
	var kinds []string
	count := map[string]int{}
	for _, c := range cards {
		if count[c.GetDevice()] == 0 {
			kinds = append(kinds, c.GetDevice())
		}
		count[c.GetDevice()]++
	}
	if len(kinds) == 0 {
		return "no cards"
	}
	parts := make([]string, len(kinds))
	for i, k := range kinds {
		parts[i] = fmt.Sprintf("%s=%d", k, count[k])
	}
	return strings.Join(parts, ",")
}

func enumWord(s, prefix string) string { return strings.ToLower(strings.TrimPrefix(s, prefix)) }

func joinUints(v []uint32) string {
	parts := make([]string, len(v))
	for i, x := range v {
		parts[i] = fmt.Sprint(x)
	}
	return strings.Join(parts, ",")
}
