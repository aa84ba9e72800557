package cluster

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// segments lists a stopped node's log segment files.
func segments(t *testing.T, dataDir string) []string {
	t.Helper()
	segs, err := filepath.Glob(filepath.Join(LogDir(dataDir), "*.wal"))
	if err != nil || len(segs) == 0 {
		t.Fatalf("segments of %s: %v %v", dataDir, segs, err)
	}
	return segs
}

// TestDamagedServerRecovers damages a stopped server's log (one byte
// flipped inside an entry it acknowledged): it refuses to start, naming the
// file, the offset and the entry index and saying what to do; started with
// Recover it sets its data aside, rejoins, receives the whole log from the
// leader and reaches the others' state.
func TestDamagedServerRecovers(t *testing.T) {
	tr := startTrio(t)
	_, leader := tr.leader()
	for i := range 40 {
		mustApply(t, leader, registerNode(fmt.Sprintf("gpu-%d", i)))
	}
	tr.converge()
	i, _ := tr.follower()
	tr.stop(i)
	dir := tr.opts[i].dir
	seg := segments(t, dir)[0]
	data, err := os.ReadFile(seg)
	if err != nil {
		t.Fatal(err)
	}
	at := strings.Index(string(data), "gpu-20")
	if at < 0 {
		t.Fatalf("gpu-20's registration not found in %s", seg)
	}
	data[at] ^= 0x04
	if err := os.WriteFile(seg, data, 0o600); err != nil {
		t.Fatal(err)
	}

	_, err = New(Config{NodeName: tr.opts[i].name, DataDir: dir, RaftBind: tr.opts[i].addr, Server: true,
		Bootstrap: true, BootstrapPeers: tr.opts[i].peers, Logger: testLogger()})
	if err == nil {
		t.Fatal("a server with a damaged log started")
	}
	for _, want := range []string{"raft log damaged", seg, "offset", "entry index", "--recover"} {
		if !strings.Contains(err.Error(), want) {
			t.Fatalf("start on a damaged log: %q does not say %q", err, want)
		}
	}

	tr.opts[i].recover = true
	tr.restart(i)
	if aside, _ := filepath.Glob(filepath.Join(dir, "raft.damaged-*")); len(aside) != 1 {
		t.Fatalf("damaged data set aside as %v, want one raft.damaged-* dir", aside)
	}
	_, leader = tr.leader()
	mustApply(t, leader, registerNode("after-recover"))
	tr.converge()
	if first, _ := tr.nodes[i].store.FirstIndex(); first != 1 {
		t.Fatalf("recovered server's log starts at %d, want 1 (the whole log)", first)
	}
}

// TestEmptiedTailRefused empties a stopped dev node's newest segment file:
// the store cannot tell that from a segment created just before a crash,
// but the node knows it applied entries the log no longer holds, and
// refuses to start.
func TestEmptiedTailRefused(t *testing.T) {
	c, o := startDev(t)
	for i := range 20 {
		mustApply(t, c, registerNode(fmt.Sprintf("gpu-%d", i)))
	}
	if err := c.Shutdown(); err != nil {
		t.Fatal(err)
	}
	segs := segments(t, o.dir)
	if err := os.Truncate(segs[len(segs)-1], 0); err != nil {
		t.Fatal(err)
	}
	_, err := New(Config{NodeName: o.name, DataDir: o.dir, RaftBind: o.addr, Server: true, Bootstrap: true, Logger: testLogger()})
	if err == nil || !strings.Contains(err.Error(), "entries it held are lost") {
		t.Fatalf("start with an emptied newest segment: %v", err)
	}
}
