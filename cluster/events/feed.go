package events

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/protobuf/proto"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// ErrNotInFeed is Subscribe's answer for a stream that starts before the
// events the feed still holds: the caller replays the log for it with a
// Cursor of its own.
var ErrNotInFeed = errors.New("the shared event feed no longer holds events from that index")

// ErrFellBehind ends a subscription whose reader did not keep up with the
// log: its buffer filled. Every event before the one named was delivered;
// the client resumes from it (on any server).
var ErrFellBehind = errors.New("event stream fell behind the log")

// Feed defaults: how many recent events a server keeps for streams that
// start a little behind it (a client node's stream starts just after the
// snapshot it read, often on another server), and how many events one
// subscriber may have waiting before it is cut off.
const (
	DefaultFeedWindow = 4096
	DefaultFeedBuffer = 1024
)

// feedPoll bounds how long the feed waits before it looks at the applied
// index again (it is normally woken as soon as it changes).
const feedPoll = time.Second

// Feed is a server's one replay of its log for all its followed event
// streams (EventService.Watch): each committed entry is applied once to the
// feed's state machine and its event handed to the subscribers it concerns,
// rather than every stream replaying the log into a state of its own (each
// write applied once per stream, and a whole state held per stream). A
// stream filtered to a node is indexed by node, so an event costs only its
// own nodes' subscribers; whether an entry changed a node's replicas is read
// from the nodes the state machine touched (fsm.TrackNodes), not from every
// watched node.
//
// Each subscriber has a bounded buffer; one that fills it is cut off with
// ErrFellBehind, naming the index to resume from, never skipped past. The
// feed keeps its last DefaultFeedWindow events for streams that start a
// little behind it; one that starts earlier gets ErrNotInFeed.
type Feed struct {
	progress func() (uint64, <-chan struct{})
	window   int
	buffer   int
	stopc    chan struct{}
	done     chan struct{}
	// stopErr, set before stopc is closed, is what Stop ends the
	// subscriptions with.
	stopErr error
	// cur is read only by run's goroutine.
	cur *Cursor

	mu sync.Mutex
	// kept is the first index from which every event before pos is in
	// recent; pos the next index the feed reads.
	kept, pos uint64
	recent    []fed
	// others are the subscribers without a node filter; byNode the
	// others, by their filter's node.
	others map[*Subscription]struct{}
	byNode map[string]map[*Subscription]struct{}
	err    error
}

// fed is one event and the nodes whose replicas its entry changed without
// the event naming them.
type fed struct {
	ev      *pb.Event
	changed []string
}

// Subscription is one stream's share of a Feed.
type Subscription struct {
	feed    *Feed
	filter  *pb.EventFilter
	from    uint64
	backlog []*pb.Event
	c       chan *pb.Event
	// last is the index of the last event queued; err why c was closed.
	// Both are written under feed.mu before c is closed.
	last uint64
	err  error
}

// Server is the server whose log a Feed follows: *cluster.Cluster.
type Server interface {
	// LogFiles is the server's log and its audit records (an error on a
	// node that keeps no log).
	LogFiles() (LogFiles, error)
	// Progress returns the applied index and a channel closed when it
	// changes.
	Progress() (uint64, <-chan struct{})
}

// NewFeed starts a feed over s's log that follows its progress. Its replay
// builds events from window entries before the applied index on; a
// subscriber may have buffer events waiting (DefaultFeedWindow,
// DefaultFeedBuffer). Stop ends it.
func NewFeed(s Server, window, buffer int) (*Feed, error) {
	files, err := s.LogFiles()
	if err != nil {
		return nil, err
	}
	progress := s.Progress
	cur := files.Cursor(1, nil)
	if err := cur.start(); err != nil {
		return nil, err
	}
	applied, _ := progress()
	from := cur.Next()
	if applied+1 > uint64(window) {
		from = max(from, applied+1-uint64(window))
	}
	cur.from = from
	cur.fanout = true
	f := &Feed{
		progress: progress, window: window, buffer: buffer, cur: cur,
		stopc: make(chan struct{}), done: make(chan struct{}),
		kept: from, pos: from,
		others: map[*Subscription]struct{}{},
		byNode: map[string]map[*Subscription]struct{}{},
	}
	go f.run()
	return f, nil
}

// run advances the feed with the applied index until stop.
func (f *Feed) run() {
	defer close(f.done)
	poll := time.NewTicker(feedPoll)
	defer poll.Stop()
	for {
		applied, advanced := f.progress()
		err := f.cur.Advance(applied, func(ev *pb.Event) error {
			var changed []string
			if ev.Type == pb.EventType_EVENT_TYPE_COMMAND && len(f.cur.changed) > 0 {
				changed = slices.Clone(f.cur.changed)
			}
			f.publish(fed{ev: ev, changed: changed})
			return nil
		})
		if err == nil {
			f.mu.Lock()
			f.pos = max(f.pos, f.cur.Next())
			f.mu.Unlock()
		}
		if err != nil {
			f.close(fmt.Errorf("event feed: %w", err))
			return
		}
		select {
		case <-f.stopc:
			f.close(f.stopErr)
			return
		case <-advanced:
		case <-poll.C:
		}
	}
}

// Stop ends the feed and waits for its replay to stop reading the log;
// its subscribers end with err (the server's cluster.ErrShutdown).
func (f *Feed) Stop(err error) {
	select {
	case <-f.stopc:
	default:
		f.stopErr = err
		close(f.stopc)
	}
	<-f.done
}

// Done is closed once the feed has stopped: by Stop, or on an error
// reading the log, which its subscribers were told.
func (f *Feed) Done() <-chan struct{} { return f.done }

// close ends every subscription with err.
func (f *Feed) close(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
	for s := range f.others {
		f.cut(s, err)
	}
	for _, subs := range f.byNode {
		for s := range subs {
			f.cut(s, err)
		}
	}
}

// publish keeps e among the recent events and queues it for the
// subscribers it concerns.
func (f *Feed) publish(e fed) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.recent = append(f.recent, e)
	if len(f.recent) > 2*f.window {
		drop := len(f.recent) - f.window
		f.kept = f.recent[drop-1].ev.Index + 1
		f.recent = slices.Clone(f.recent[drop:])
	}
	f.pos = e.ev.Index + 1
	for s := range f.others {
		if ev := s.concerns(e); ev != nil {
			f.queue(s, ev)
		}
	}
	if len(f.byNode) == 0 {
		return
	}
	if e.ev.Type != pb.EventType_EVENT_TYPE_COMMAND {
		for _, subs := range f.byNode {
			for s := range subs {
				if ev := s.concerns(e); ev != nil {
					f.queue(s, ev)
				}
			}
		}
		return
	}
	for _, r := range e.ev.Resources {
		if n, ok := strings.CutPrefix(r, "node/"); ok {
			for s := range f.byNode[n] {
				if ev := s.concerns(e); ev != nil {
					f.queue(s, ev)
				}
			}
		}
	}
	for _, n := range e.changed {
		for s := range f.byNode[n] {
			if ev := s.concerns(e); ev != nil {
				f.queue(s, ev)
			}
		}
	}
}

// concerns returns the event s is sent for e (nil: none): e's, or, for a
// node filter whose node's replicas e changed without naming it, a copy
// that names it, as a stream's own Cursor does.
func (s *Subscription) concerns(e fed) *pb.Event {
	if e.ev.Index < s.from {
		return nil
	}
	ev := e.ev
	if n := s.filter.GetNode(); n != "" && ev.Type == pb.EventType_EVENT_TYPE_COMMAND && slices.Contains(e.changed, n) {
		ev = proto.Clone(ev).(*pb.Event)
		ev.Resources = append(ev.Resources, "node/"+n)
	}
	if !matchesFilter(s.filter, ev) {
		return nil
	}
	return ev
}

// queue hands ev to s, or cuts s off when its buffer is full. Called with
// f.mu held.
func (f *Feed) queue(s *Subscription, ev *pb.Event) {
	select {
	case s.c <- ev:
		s.last = ev.Index
	default:
		f.cut(s, fmt.Errorf("%w: more than %d events waited to be sent; resume from index %d", ErrFellBehind, f.buffer, s.last+1))
	}
}

// cut ends s with err. Called with f.mu held.
func (f *Feed) cut(s *Subscription, err error) {
	if !f.remove(s) {
		return
	}
	s.err = err
	close(s.c)
}

// remove unregisters s, reporting whether it was registered. Called with
// f.mu held.
func (f *Feed) remove(s *Subscription) bool {
	if n := s.filter.GetNode(); n != "" {
		subs := f.byNode[n]
		if _, ok := subs[s]; !ok {
			return false
		}
		delete(subs, s)
		if len(subs) == 0 {
			delete(f.byNode, n)
		}
		return true
	}
	if _, ok := f.others[s]; !ok {
		return false
	}
	delete(f.others, s)
	return true
}

// Subscribe starts a subscription to the events with index >= from that
// match filter (nil: all). The events the feed has already passed are its
// Backlog; the others arrive on C in index order, none missing. from before
// the events the feed holds is ErrNotInFeed.
func (f *Feed) Subscribe(from uint64, filter *pb.EventFilter) (*Subscription, error) {
	from = max(from, 1)
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	if from < f.kept {
		return nil, fmt.Errorf("%w: it holds %d and later, not %d", ErrNotInFeed, f.kept, from)
	}
	s := &Subscription{feed: f, filter: filter, from: from, c: make(chan *pb.Event, f.buffer), last: from - 1}
	if from < f.pos {
		i, _ := slices.BinarySearchFunc(f.recent, from, func(e fed, idx uint64) int {
			switch {
			case e.ev.Index < idx:
				return -1
			case e.ev.Index > idx:
				return 1
			}
			return 0
		})
		for _, e := range f.recent[i:] {
			if ev := s.concerns(e); ev != nil {
				s.backlog = append(s.backlog, ev)
				s.last = ev.Index
			}
		}
	}
	if n := filter.GetNode(); n != "" {
		if f.byNode[n] == nil {
			f.byNode[n] = map[*Subscription]struct{}{}
		}
		f.byNode[n][s] = struct{}{}
	} else {
		f.others[s] = struct{}{}
	}
	return s, nil
}

// Backlog is the events the feed had passed when s started, to send
// before those on C.
func (s *Subscription) Backlog() []*pb.Event { return s.backlog }

// C delivers the events after the backlog. It is closed when the
// subscription ends other than by Close; Err then says why.
func (s *Subscription) C() <-chan *pb.Event { return s.c }

// Err is why C was closed: ErrFellBehind (wrapped, with the index to resume
// from), Stop's error, or the feed's error reading the log.
func (s *Subscription) Err() error {
	s.feed.mu.Lock()
	defer s.feed.mu.Unlock()
	return s.err
}

// Close ends s; C is not closed.
func (s *Subscription) Close() {
	s.feed.mu.Lock()
	defer s.feed.mu.Unlock()
	s.feed.remove(s)
}
