package cli

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/gpuplane/gpuplane/cluster/audit"
	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
	"github.com/gpuplane/gpuplane/proto/gpuplane/v1/gpuplanev1connect"
)

// `gpuplane audit`: the log's history, the state as of any entry, and proof
// that the live state is what the log says (docs/audit.md). Every subcommand asks
// a node (--addr) or reads a stopped node's data dir (--data-dir).

func newAuditCommand(g *globals) *cobra.Command {
	return newGroupCommand("audit", "Read the log: its entries, the state as of any entry, verification", nil,
		newAuditLogCommand(g),
		newAuditReplayCommand(g),
		newAuditVerifyCommand(g),
		newAuditExportCommand(g),
		newAuditArchiveCommand(g),
		newAuditCompactCommand(g),
	)
}

// auditSource is where audit commands read the log: a node's API or a
// stopped node's data dir. Both run the same audit.History code.
type auditSource interface {
	log(req *pb.LogRequest, yield func(*pb.Event) error) error
	replay(req *pb.ReplayRequest) (*pb.ReplayResponse, error)
	verify() (*pb.VerifyResponse, error)
	close() error
}

func addDataDirFlag(c *cobra.Command, dir *string) {
	c.Flags().StringVar(dir, "data-dir", "", "read a stopped node's data dir (read-only) instead of asking --addr")
}

func (g *globals) auditSource(cmd *cobra.Command, dataDir string) (auditSource, error) {
	if dataDir != "" {
		off, err := audit.OpenOffline(dataDir)
		if err != nil {
			return nil, err
		}
		return &offlineSource{off: off, dir: dataDir}, nil
	}
	_, audit, err := g.logClients(cmd, g.addr)
	if err != nil {
		return nil, err
	}
	return &remoteSource{cmd: cmd, c: audit}, nil
}

type remoteSource struct {
	cmd *cobra.Command
	c   gpuplanev1connect.AuditServiceClient
}

func (s *remoteSource) log(req *pb.LogRequest, yield func(*pb.Event) error) error {
	stream, err := s.c.Log(ctx(s.cmd), connect.NewRequest(req))
	if err != nil {
		return err
	}
	defer stream.Close()
	for stream.Receive() {
		if err := yield(stream.Msg().GetEvent()); err != nil {
			return err
		}
	}
	return stream.Err()
}

func (s *remoteSource) replay(req *pb.ReplayRequest) (*pb.ReplayResponse, error) {
	resp, err := s.c.Replay(ctx(s.cmd), connect.NewRequest(req))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func (s *remoteSource) verify() (*pb.VerifyResponse, error) {
	resp, err := s.c.Verify(ctx(s.cmd), connect.NewRequest(&pb.VerifyRequest{}))
	if err != nil {
		return nil, err
	}
	return resp.Msg, nil
}

func (s *remoteSource) close() error { return nil }

// offlineSource reads every entry of a stopped node's log. Unlike a live
// node it cannot tell which of the last entries were committed: a node that
// stopped while entries were in flight may hold a few that the cluster
// later replaced.
type offlineSource struct {
	off *audit.Offline
	dir string
}

func (s *offlineSource) last() (uint64, error) { return s.off.LastIndex() }

func (s *offlineSource) log(req *pb.LogRequest, yield func(*pb.Event) error) error {
	last, err := s.last()
	if err != nil {
		return err
	}
	return s.off.Log(req, last, yield)
}

func (s *offlineSource) replay(req *pb.ReplayRequest) (*pb.ReplayResponse, error) {
	last, err := s.last()
	if err != nil {
		return nil, err
	}
	return s.off.Replay(req, last)
}

func (s *offlineSource) verify() (*pb.VerifyResponse, error) {
	last, err := s.last()
	if err != nil {
		return nil, err
	}
	v, err := s.off.Verify(last, nil)
	if err != nil {
		return nil, err
	}
	v.Server = s.dir
	if id, err := os.ReadFile(filepath.Join(s.dir, "node-id")); err == nil {
		v.Server = strings.TrimSpace(string(id))
	}
	out := &pb.VerifyResponse{Ok: v.Ok && len(v.Problems) == 0, FirstDivergence: v.FirstDivergence, Servers: []*pb.ServerVerification{v}}
	return out, nil
}

func (s *offlineSource) close() error { return s.off.Close() }

func newAuditLogCommand(g *globals) *cobra.Command {
	var (
		from, to uint64
		filter   eventFilterFlags
		dataDir  string
	)
	c := &cobra.Command{
		Use:   "log [--from N] [--to N] [--resource KIND/NAME] [--actor A]",
		Short: "One line per committed entry: index, term, time, actor, request, command, result",
		Long: `One line per committed entry: its index, term, proposal time, actor, request id,
a summary of the command, and its result (applied, or rejected with the
reason). Membership changes (servers joining, leaving, changing suffrage)
appear too. Results are recomputed by replaying the log. -o json prints the
full entries, commands included.`,
		Args: argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			f, err := filter.proto(cmd)
			if err != nil {
				return err
			}
			src, err := g.auditSource(cmd, dataDir)
			if err != nil {
				return err
			}
			defer src.close()
			var evs []*pb.Event
			if err := src.log(&pb.LogRequest{FromIndex: from, ToIndex: to, Filter: f}, func(ev *pb.Event) error {
				evs = append(evs, ev)
				return nil
			}); err != nil {
				return err
			}
			return g.printList(messages(evs), tableOf(eventHeader, evs, eventRow))
		},
	}
	c.Flags().Uint64Var(&from, "from", 1, "first log index")
	c.Flags().Uint64Var(&to, "to", 0, "last log index (default: the last applied)")
	filter.add(c)
	addDataDirFlag(c, &dataDir)
	return c
}

func newAuditExportCommand(g *globals) *cobra.Command {
	var (
		from, to uint64
		dataDir  string
	)
	c := &cobra.Command{
		Use:   "export [--from N] [--to N]",
		Short: "Every entry as JSON lines, for archiving",
		Args:  argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			src, err := g.auditSource(cmd, dataDir)
			if err != nil {
				return err
			}
			defer src.close()
			return src.log(&pb.LogRequest{FromIndex: from, ToIndex: to}, func(ev *pb.Event) error {
				// An archive keeps the API's protojson, which any
				// protobuf library reads back.
				return writeAPIJSONLine(g.stdout, ev)
			})
		},
	}
	c.Flags().Uint64Var(&from, "from", 1, "first log index")
	c.Flags().Uint64Var(&to, "to", 0, "last log index (default: the last applied)")
	addDataDirFlag(c, &dataDir)
	return c
}

func newAuditReplayCommand(g *globals) *cobra.Command {
	var at, dataDir, archive string
	c := &cobra.Command{
		Use:   "replay --at INDEX|RFC3339",
		Short: "The cluster state as it was after an entry, in the shapes of the live listings",
		Long: `Replay the log from index 1 up to an entry, or up to the last entry proposed at
or before a time, and print the state then: nodes, devices, accelerators,
deployments and replicas, in the same tables as the live listings. With
-o json, an object whose nodes, devices, accelerators, models and replicas
fields hold what the live 'list -o json' commands print.`,
		Args: argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			req, err := parseAt(cmd, at)
			if err != nil {
				return err
			}
			if archive != "" {
				a, err := audit.OpenArchive(archive, false)
				if err != nil {
					return err
				}
				if req.GetTime() != nil {
					// The archive answers for a time before the live log.
					idx, err := a.IndexAt(req.GetTime().AsTime())
					if err != nil {
						return err
					}
					if idx < a.Cut {
						req = &pb.ReplayRequest{Index: idx}
					}
				}
				if i := req.GetIndex(); i != 0 && i <= a.Cut {
					st, err := a.Replay(req.GetIndex())
					if err != nil {
						return err
					}
					return g.printReplay(st)
				}
			}
			src, err := g.auditSource(cmd, dataDir)
			if err != nil {
				return err
			}
			defer src.close()
			st, err := src.replay(req)
			if err != nil {
				return err
			}
			return g.printReplay(st)
		},
	}
	c.Flags().StringVar(&at, "at", "", "log index, or RFC 3339 time (2025-06-01T12:00:00Z)")
	c.Flags().StringVar(&archive, "archive", "", "archive directory ('audit archive'): an index it holds is replayed from it")
	addDataDirFlag(c, &dataDir)
	return c
}

func parseAt(cmd *cobra.Command, at string) (*pb.ReplayRequest, error) {
	if at == "" {
		return nil, usageErrorf(cmd, "required flag --at INDEX|RFC3339 not set")
	}
	if n, err := strconv.ParseUint(at, 10, 64); err == nil {
		if n == 0 {
			return nil, usageErrorf(cmd, "invalid --at 0: log indexes start at 1")
		}
		return &pb.ReplayRequest{Index: n}, nil
	}
	t, err := time.Parse(time.RFC3339Nano, at)
	if err != nil {
		return nil, usageErrorf(cmd, "invalid --at %q: want a log index or an RFC 3339 time such as 2025-06-01T12:00:00Z", at)
	}
	return &pb.ReplayRequest{Time: timestamppb.New(t)}, nil
}

// printReplay prints a replayed state. Each list is printed by the code that
// prints the live listing of the same messages (tables and jsonArray), so
// the shapes match by construction.
func (g *globals) printReplay(st *pb.ReplayResponse) error {
	sections := []struct {
		name  string
		items []proto.Message
		table table
	}{
		{"nodes", messages(st.GetNodes()), nodeTable(st.GetNodes())},
		{"devices", messages(st.GetDevices()), deviceTable(st.GetDevices())},
		{"accelerators", messages(st.GetAccelerators()), acceleratorTable(st.GetAccelerators())},
		{"models", messages(st.GetModels()), modelTable(st.GetModels(), false)},
		{"replicas", messages(st.GetReplicas()), replicaTable(st.GetReplicas())},
	}
	if g.output == outputTable {
		fmt.Fprintf(g.stdout, "State after index %d (hash %s)\n", st.GetIndex(), st.GetHash())
		for _, s := range sections {
			fmt.Fprintf(g.stdout, "\n%s\n", strings.ToUpper(s.name))
			if err := s.table.write(g.stdout); err != nil {
				return err
			}
		}
		return nil
	}
	var buf bytes.Buffer
	fmt.Fprintf(&buf, `{"index":%d,"hash":%q`, st.GetIndex(), st.GetHash())
	for _, s := range sections {
		arr, err := jsonArray(s.items)
		if err != nil {
			return err
		}
		fmt.Fprintf(&buf, `,%q:`, s.name)
		buf.Write(arr)
	}
	buf.WriteByte('}')
	return g.writeJSON(buf.Bytes())
}

func newAuditVerifyCommand(g *globals) *cobra.Command {
	var dataDir, archive string
	c := &cobra.Command{
		Use:   "verify",
		Short: "Replay the whole log and compare it with the live state of every server",
		Long: `Replay every entry from index 1 into a fresh state machine and compare the
result and the hash chain with the live state of every server (each server
checks its own log the same way), with the hash each entry had when it was
applied, and with the snapshots on disk. Exits 0 only when all agree;
otherwise names the first index where they part.

With --data-dir, checks a stopped node's log against the per-entry hashes
and the snapshots in its data dir.

A log compacted after an archive is replayed from the state its server kept
at the cut; with --archive, the archive is verified too (every segment's
digest and hash head, its snapshot against the replay, and its heads against
those the server recorded), and a failing segment is named by number and
entries.`,
		Args: argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			src, err := g.archiveSource(cmd, dataDir)
			if err != nil {
				return err
			}
			defer src.close()
			archiveOK := true
			if archive != "" {
				if archiveOK, err = g.verifyArchive(archive, src); err != nil {
					return err
				}
			}
			res, err := src.verify()
			if err != nil {
				return err
			}
			if err := g.printVerify(res); err != nil {
				return err
			}
			if !archiveOK {
				return errReported
			}
			return nil
		},
	}
	c.Flags().StringVar(&archive, "archive", "", "archive directory ('audit archive') to verify with the log")
	addDataDirFlag(c, &dataDir)
	return c
}

func (g *globals) printVerify(res *pb.VerifyResponse) error {
	t := tableOf([]string{"SERVER", "APPLIED", "HASH", "REPLAYED", "ENTRIES", "RESULT"}, res.GetServers(),
		func(v *pb.ServerVerification) []string {
			result := "ok"
			if !v.GetOk() || len(v.GetProblems()) > 0 {
				result = "FAILED"
				if d := v.GetFirstDivergence(); d != 0 {
					result += " at index " + itoa(d)
				}
			}
			return []string{v.GetServer(), itoa(v.GetAppliedIndex()), short(v.GetHash()), short(v.GetReplayedHash()), itoa(v.GetEntries()), result}
		})
	if err := g.printObject(res, t); err != nil {
		return err
	}
	for _, v := range res.GetServers() {
		for _, p := range v.GetProblems() {
			fmt.Fprintf(g.stderr, "error: %s: %s\n", v.GetServer(), p)
		}
	}
	if res.GetOk() {
		if g.output == outputTable {
			fmt.Fprintf(g.stdout, "ok: %d server(s) agree with the replay of the log\n", len(res.GetServers()))
		}
		return nil
	}
	if d := res.GetFirstDivergence(); d != 0 {
		fmt.Fprintf(g.stderr, "error: verification failed: the log and the state part at index %d\n", d)
	} else {
		fmt.Fprintln(g.stderr, "error: verification failed")
	}
	return errReported
}

func short(hash string) string {
	if len(hash) > 12 {
		return hash[:12]
	}
	return hash
}
