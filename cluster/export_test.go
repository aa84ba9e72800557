package cluster

import (
	"os"
	"testing"
)

// The audit tests of package cluster_test run servers with these helpers
// and read their logs with package audit, which imports cluster (so they
// cannot live in package cluster itself).
var (
	StartDev          = startDev
	WaitLeader        = waitLeader
	TestCtx           = testCtx
	MustApply         = mustApply
	RegisterNode      = registerNode
	CreateAccelerator = createAccelerator
	RenameInLog       = renameInLog
)

// NodeOpts is a test server's name, data dir and Raft address.
type NodeOpts = nodeOpts

// NewNodeOpts returns the options of a server that bootstraps itself.
func NewNodeOpts(t testing.TB, name string) NodeOpts {
	return nodeOpts{name: name, dir: t.TempDir(), addr: freeAddr(t), bootstrap: true}
}

func (o nodeOpts) Name() string { return o.name }
func (o nodeOpts) Dir() string  { return o.dir }
func (o nodeOpts) Addr() string { return o.addr }

// Start opens the server of o (see start).
func Start(t testing.TB, o NodeOpts) *Cluster { return start(t, o) }

// TakeSnapshot has c's Raft take a snapshot now.
func TakeSnapshot(c *Cluster) error { return c.raft.Snapshot().Error() }

// Trio is three servers on loopback (see trio).
type Trio = trio

func StartTrio(t *testing.T) *Trio         { return startTrio(t) }
func (tr *trio) Leader() (int, *Cluster)   { return tr.leader() }
func (tr *trio) Follower() (int, *Cluster) { return tr.follower() }
func (tr *trio) Converge() string          { return tr.converge() }
func (tr *trio) Stop(i int)                { tr.stop(i) }
func (tr *trio) Restart(i int)             { tr.restart(i) }
func (tr *trio) Node(i int) *Cluster       { return tr.nodes[i] }
func (tr *trio) Len() int                  { return len(tr.nodes) }

// Wipe deletes stopped server i's data dir; restarted, it joins the others
// as a new server.
func (tr *trio) Wipe(i int) error {
	tr.opts[i].bootstrap = false
	return os.RemoveAll(tr.opts[i].dir)
}
