package cli

import (
	"fmt"
	"io"
	"strconv"
	"time"

	"connectrpc.com/connect"
	"github.com/spf13/cobra"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// `gpuplane cluster`: membership, Raft status, join and leave.

func newClusterCommand(g *globals) *cobra.Command {
	return newGroupCommand("cluster", "Show and change cluster membership", nil,
		newClusterJoinCommand(g),
		newClusterMembersCommand(g),
		newClusterStatusCommand(g),
		newClusterLeaveCommand(g),
		newClusterRemovePeerCommand(g),
	)
}

func newClusterJoinCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "join ADDR...",
		Short: "Make the agent at --addr join a cluster through these gossip addresses",
		Long: `Make the agent at --addr join a cluster through one or more gossip addresses
(host or host:port, default port 7412) of nodes already in it.`,
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return usageErrorf(cmd, "missing ADDR: at least one gossip address to join")
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			resp, err := api.Cluster.Join(ctx(cmd), connect.NewRequest(&pb.JoinRequest{Addresses: args}))
			if err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "joined through %d of %d addresses\n", resp.Msg.GetJoined(), len(args))
			return nil
		},
	}
}

func newClusterMembersCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "members",
		Short: "List the nodes gossip knows, with their role, status and Raft suffrage",
		Args:  argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			resp, err := api.Cluster.Members(ctx(cmd), connect.NewRequest(&pb.MembersRequest{}))
			if err != nil {
				return err
			}
			ms := resp.Msg.GetMembers()
			return g.printList(messages(ms), tableOf([]string{"NAME", "ADDRESS", "ROLE", "STATUS", "RAFT", "LEADER"}, ms,
				func(m *pb.Member) []string {
					return []string{m.GetName(), m.GetAddress(), m.GetRole(), m.GetStatus(), m.GetRaft(), strconv.FormatBool(m.GetLeader())}
				}))
		},
	}
}

func newClusterStatusCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "status",
		Short: "Show the leader, term, commit and applied index, each server's last contact and the state hash",
		Args:  argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			resp, err := api.Cluster.Status(ctx(cmd), connect.NewRequest(&pb.StatusRequest{}))
			if err != nil {
				return err
			}
			st := resp.Msg
			if g.output == outputTable {
				return writeStatus(g.stdout, st)
			}
			return g.printObject(st, table{})
		},
	}
}

// writeStatus prints `cluster status` as a table: the node's view, then one
// row per server.
func writeStatus(w io.Writer, st *pb.StatusResponse) error {
	leader := st.GetLeader()
	if leader == "" {
		leader = "none"
	} else if st.GetLeaderAddress() != "" {
		leader += " (" + st.GetLeaderAddress() + ")"
	}
	fmt.Fprintf(w, "Node:          %s (%s)\n", st.GetNode(), st.GetRaftState())
	fmt.Fprintf(w, "Leader:        %s\n", leader)
	fmt.Fprintf(w, "Term:          %d\n", st.GetTerm())
	fmt.Fprintf(w, "Commit index:  %d\n", st.GetCommitIndex())
	fmt.Fprintf(w, "Applied index: %d\n", st.GetAppliedIndex())
	fmt.Fprintf(w, "State hash:    %s\n", orDash(st.GetStateHash()))
	if r := st.GetResources(); r != nil {
		fmt.Fprintf(w, "Log:           %s, entries %d..%d\n", byteSize(r.GetLogBytes()), r.GetFirstIndex(), r.GetLastIndex())
		snap := "none yet"
		if r.GetSnapshotIndex() != 0 {
			snap = fmt.Sprintf("%s at index %d", byteSize(r.GetSnapshotBytes()), r.GetSnapshotIndex())
		}
		fmt.Fprintf(w, "Snapshot:      %s\n", snap)
		logTime := "-"
		if r.GetLogTime() != nil {
			logTime = r.GetLogTime().AsTime().UTC().Format(time.RFC3339)
		}
		fmt.Fprintf(w, "Request ids:   %d held (%d within the window), %s, window %s, log time %s\n", r.GetRequestEntries(), r.GetRequestLive(), byteSize(r.GetRequestBytes()),
			r.GetRequestWindow().AsDuration(), logTime)
	}
	fmt.Fprintln(w)
	return tableOf([]string{"SERVER", "ADDRESS", "RAFT", "LEADER", "LAST CONTACT"}, st.GetServers(),
		func(s *pb.ServerStatus) []string {
			contact := "unknown"
			if ms := s.GetLastContactMs(); ms >= 0 {
				contact = (time.Duration(ms) * time.Millisecond).String()
			}
			return []string{s.GetId(), s.GetAddress(), s.GetSuffrage(), strconv.FormatBool(s.GetId() == st.GetLeader()), contact}
		}).write(w)
}

// byteSize is n bytes for people: 512B, 3.4KiB, 78.9MiB.
func byteSize(n uint64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%dB", n)
	}
	v, suffix := float64(n), []string{"KiB", "MiB", "GiB", "TiB"}
	i := -1
	for v >= unit && i < len(suffix)-1 {
		v /= unit
		i++
	}
	return fmt.Sprintf("%.1f%s", v, suffix[i])
}

func newClusterLeaveCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "leave",
		Short: "Make the agent at --addr leave the cluster gracefully and stop",
		Long: `Make the agent at --addr leave the cluster gracefully and stop. A server hands
over leadership first if it leads, and the leader removes it from Raft; the
node is then recorded as left. A node stopped without leaving is recorded as
down instead, and a dead server stays in Raft until 'cluster remove-peer'.`,
		Args: argsNamed(),
		RunE: func(cmd *cobra.Command, _ []string) error {
			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			if _, err := api.Cluster.Leave(ctx(cmd), connect.NewRequest(&pb.LeaveRequest{})); err != nil {
				return err
			}
			fmt.Fprintln(g.stdout, "left the cluster")
			return nil
		},
	}
}

func newClusterRemovePeerCommand(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "remove-peer NAME",
		Short: "Remove a dead server from Raft",
		Args:  argsNamed("NAME"),
		RunE: func(cmd *cobra.Command, args []string) error {
			api, err := g.api(cmd)
			if err != nil {
				return err
			}
			if _, err := api.Cluster.RemovePeer(ctx(cmd), connect.NewRequest(&pb.RemovePeerRequest{Name: args[0]})); err != nil {
				return err
			}
			fmt.Fprintf(g.stdout, "server %s removed from raft\n", args[0])
			return nil
		},
	}
}
