package cli

import (
	"errors"
	"fmt"
	"strings"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	"github.com/gpuplane/gpuplane/cluster/audit"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// `gpuplane audit archive` and `audit compact`, and --archive on verify and
// replay: the history a server no longer holds is read from an archive
// (cluster/audit/archive.go, docs/archive.md).

// The archive-related reads of an audit source.

// lastApplied is the last index a source's log can be archived up to: a
// live node's applied index, or a stopped node's last entry.
func (s *remoteSource) lastApplied() (uint64, error) {
	resp, err := s.c.HashAt(ctx(s.cmd), connect.NewRequest(&pb.HashAtRequest{}))
	if err != nil {
		return 0, err
	}
	return resp.Msg.GetIndex(), nil
}

func (s *offlineSource) lastApplied() (uint64, error) { return s.last() }

func (s *remoteSource) entries(from, to uint64, fn func(*pb.ArchivedEntry) error) error {
	stream, err := s.c.Entries(ctx(s.cmd), connect.NewRequest(&pb.EntriesRequest{FromIndex: from, ToIndex: to}))
	if err != nil {
		return err
	}
	defer stream.Close()
	for stream.Receive() {
		for _, e := range stream.Msg().GetEntries() {
			if err := fn(e); err != nil {
				return err
			}
		}
	}
	return stream.Err()
}

func (s *offlineSource) entries(from, to uint64, fn func(*pb.ArchivedEntry) error) error {
	return s.off.Entries(from, to, fn)
}

// recorded is the hash head the node recorded after entry index, "" when it
// has none.
func (s *remoteSource) recorded(index uint64) (string, error) {
	resp, err := s.c.HashAt(ctx(s.cmd), connect.NewRequest(&pb.HashAtRequest{Index: index}))
	if err != nil {
		return "", err
	}
	return resp.Msg.GetHash(), nil
}

func (s *offlineSource) recorded(index uint64) (string, error) { return s.off.RecordedHash(index) }

// perEntry returns the per-entry records an archive is checked against, nil
// where reading them costs a request per entry (a live node: the segment
// heads are checked against it instead, in checkArchiveLink).
func (s *remoteSource) perEntry() func(uint64) (string, error)  { return nil }
func (s *offlineSource) perEntry() func(uint64) (string, error) { return s.off.RecordedHash }

// archiveSource is what the archive commands read.
type archiveSource interface {
	auditSource
	lastApplied() (uint64, error)
	entries(from, to uint64, fn func(*pb.ArchivedEntry) error) error
	recorded(index uint64) (string, error)
	perEntry() func(uint64) (string, error)
}

func (g *globals) archiveSource(cmd *cobra.Command, dataDir string) (archiveSource, error) {
	src, err := g.auditSource(cmd, dataDir)
	if err != nil {
		return nil, err
	}
	return src.(archiveSource), nil
}

func newAuditArchiveCommand(g *globals) *cobra.Command {
	var (
		to, dataDir string
		perSegment  uint64
		before      uint64
	)
	c := &cobra.Command{
		Use:   "archive --to DIR",
		Short: "Copy sealed log segments, their hash heads and the state at the cut into an archive directory",
		Long: `Copy the log into an archive directory in sealed segments of --segment-entries
entries each, with the hash chain head after each segment and a snapshot of
the state after the last archived entry (the cut). Run again on the same
directory, it adds the segments completed since; entries that do not fill a
segment stay for a later run. The format is docs/archive.md.

An archive is what lets a server drop old entries ('audit compact') while
'audit verify --archive' and 'audit replay --archive' keep covering the whole
history. Nothing is dropped by archiving.`,
		Args: argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if to == "" {
				return usageErrorf(cmd, "required flag --to DIR not set")
			}
			if perSegment == 0 {
				return usageErrorf(cmd, "invalid --segment-entries 0: a segment holds at least one entry")
			}
			src, err := g.archiveSource(cmd, dataDir)
			if err != nil {
				return err
			}
			defer src.close()
			upTo, err := src.lastApplied()
			if err != nil {
				return err
			}
			if before != 0 {
				upTo = min(upTo, before-1)
			}
			a, err := audit.OpenArchive(to, true)
			if err != nil {
				return err
			}
			from := a.Cut + 1
			n, err := a.Extend(src.entries, upTo, perSegment)
			if err != nil {
				return err
			}
			if n == 0 {
				fmt.Fprintf(g.stdout, "nothing to archive: entries %d..%d do not fill a segment of %d\n", from, upTo, perSegment)
				return nil
			}
			if want, err := src.recorded(a.Cut); err == nil && want != "" && want != a.Snapshot.Hash {
				return fmt.Errorf("the archived entries replay to hash %s at %d, but the server recorded %s when it applied that entry: the log was altered; run 'gpuplane audit verify'",
					short(a.Snapshot.Hash), a.Cut, short(want))
			}
			fmt.Fprintf(g.stdout, "archived entries %d..%d in %d segment(s) to %s; it holds 1..%d, hash %s\n",
				from, a.Cut, n, to, a.Cut, short(a.Snapshot.Hash))
			return nil
		},
	}
	c.Flags().StringVar(&to, "to", "", "archive directory (created if missing; extended if it holds an archive)")
	c.Flags().Uint64Var(&perSegment, "segment-entries", audit.DefaultSegmentEntries, "entries per sealed segment")
	c.Flags().Uint64Var(&before, "before", 0, "archive only entries before this index (0: up to the last applied)")
	addDataDirFlag(c, &dataDir)
	return c
}

func newAuditCompactCommand(g *globals) *cobra.Command {
	var (
		archive string
		before  uint64
	)
	c := &cobra.Command{
		Use:   "compact --before INDEX --archive DIR",
		Short: "Drop log entries before INDEX from every server, once an archive holds them",
		Long: `Drop the entries before --before from every server's log. The archive must hold
them: it is verified first, --before must follow the last entry of one of
its segments, and each server checks that the archive's hash head there is
the one it recorded when it applied that entry, or keeps its log. Each server
snapshots and keeps the state at the cut, so that 'audit verify' and
'audit replay' of later entries still work on it; older entries are read
from the archive (--archive). Nothing is ever compacted unless asked.`,
		Args: argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			if archive == "" || before == 0 {
				return usageErrorf(cmd, "required flags --before INDEX and --archive DIR")
			}
			a, err := audit.OpenArchive(archive, false)
			if err != nil {
				return err
			}
			var head string
			var ends []string
			for _, s := range a.Segments {
				if s.Last == before-1 {
					head = s.Head
				}
				ends = append(ends, itoa(s.Last+1))
			}
			if head == "" {
				return usageErrorf(cmd, "invalid --before %d: the archive's segments end so that --before may be %s", before, strings.Join(lastN(ends, 5), ", "))
			}
			if rep := a.Verify(nil); !rep.OK {
				for _, p := range rep.Problems {
					fmt.Fprintf(g.stderr, "error: %s\n", p)
				}
				return errors.New("the archive fails verification: nothing compacted")
			}
			_, audit, err := g.logClients(cmd, g.addr)
			if err != nil {
				return err
			}
			resp, err := audit.Compact(ctx(cmd), connect.NewRequest(&pb.CompactRequest{BeforeIndex: before, Hash: head}))
			if err != nil {
				return err
			}
			t := tableOf([]string{"SERVER", "FIRST INDEX", "RESULT"}, resp.Msg.GetServers(), func(s *pb.ServerCompaction) []string {
				result := "ok"
				if !s.GetOk() {
					result = "FAILED: " + s.GetProblem()
				}
				return []string{s.GetServer(), itoa(s.GetFirstIndex()), result}
			})
			if err := g.printObject(resp.Msg, t); err != nil {
				return err
			}
			if !resp.Msg.GetOk() {
				return errReported
			}
			return nil
		},
	}
	c.Flags().Uint64Var(&before, "before", 0, "first index to keep")
	c.Flags().StringVar(&archive, "archive", "", "archive directory that holds the entries before --before ('audit archive')")
	return c
}

func lastN(s []string, n int) []string {
	if len(s) > n {
		return s[len(s)-n:]
	}
	return s
}

// verifyArchive checks the archive in dir against itself and against the
// log src reads: its per-entry records where they are cheap to read
// (offline), else the head at every segment's end. It prints what fails
// and reports whether all passed.
func (g *globals) verifyArchive(dir string, src archiveSource) (bool, error) {
	a, err := audit.OpenArchive(dir, false)
	if err != nil {
		return false, err
	}
	rep := a.Verify(src.perEntry())
	if rep.OK {
		for i, s := range a.Segments {
			want, err := src.recorded(s.Last)
			if err != nil {
				return false, err
			}
			if want != "" && want != s.Head {
				rep.OK = false
				rep.Problems = append(rep.Problems, fmt.Sprintf("archived segment %d (entries %d..%d): its hash head %s differs from %s, which the server recorded after entry %d: the archive is not of this log, or was altered",
					i+1, s.First, s.Last, short(s.Head), short(want), s.Last))
				break
			}
		}
	}
	for _, p := range rep.Problems {
		fmt.Fprintf(g.stderr, "error: archive %s: %s\n", dir, p)
	}
	if rep.OK && g.output == outputTable {
		fmt.Fprintf(g.stdout, "ok: archive %s: %d segments, entries 1..%d, replay agrees with its hash heads and its snapshot\n", dir, len(a.Segments), a.Cut)
	}
	return rep.OK, nil
}
