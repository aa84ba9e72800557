package cluster

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/fsm"
)

const (
	helperDirEnv  = "GPUPLANE_CLUSTER_HELPER_DIR"
	helperAddrEnv = "GPUPLANE_CLUSTER_HELPER_ADDR"
)

// TestHelperProcess is not a test: TestCrash runs the test binary again with
// it to get a node in a process it can SIGKILL. It applies entries from four
// goroutines and prints "ack INDEX NAME" for each acknowledged one until it
// is killed.
func TestHelperProcess(t *testing.T) {
	dir := os.Getenv(helperDirEnv)
	if dir == "" {
		t.Skip("helper process for TestCrash")
	}
	c, err := New(Config{NodeName: "n1", DataDir: dir, RaftBind: os.Getenv(helperAddrEnv), Server: true, Bootstrap: true, Logger: testLogger()})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	waitLeader(t, c)
	var mu sync.Mutex
	for g := range 4 {
		go func() {
			for i := 0; ; i++ {
				name := fmt.Sprintf("w%d-%d", g, i)
				res, err := c.Apply(t.Context(), registerNode(name))
				if err != nil {
					fmt.Println("error", err)
					os.Exit(1)
				}
				mu.Lock()
				fmt.Printf("ack %d %s\n", res.Index, name)
				mu.Unlock()
			}
		}()
	}
	select {}
}

// TestCrash kills a node with SIGKILL while it is writing, restarts it on the
// same data dir and checks that every write it acknowledged survived and that
// replaying the log from index 1 gives the live state.
func TestCrash(t *testing.T) {
	dir, addr := t.TempDir(), freeAddr(t)
	cmd := exec.Command(os.Args[0], "-test.run=^TestHelperProcess$")
	cmd.Env = append(os.Environ(), helperDirEnv+"="+dir, helperAddrEnv+"="+addr)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })

	acked := map[string]uint64{}
	var maxIndex uint64
	lines := bufio.NewScanner(out)
	deadline := time.Now().Add(20 * time.Second)
	killed := false
	for lines.Scan() {
		f := strings.Fields(lines.Text())
		switch {
		case len(f) == 3 && f[0] == "ack":
			idx, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				t.Fatalf("helper: %q", lines.Text())
			}
			acked[f[2]] = idx
			maxIndex = max(maxIndex, idx)
		case strings.HasPrefix(lines.Text(), "error"):
			t.Fatalf("helper: %s", lines.Text())
		}
		// Acks printed before the kill are still read: they were acknowledged.
		if !killed && (len(acked) >= 300 || time.Now().After(deadline)) {
			if err := cmd.Process.Kill(); err != nil {
				t.Fatal(err)
			}
			killed = true
		}
	}
	cmd.Wait()
	if len(acked) < 50 {
		t.Fatalf("helper acknowledged only %d writes", len(acked))
	}

	c := start(t, nodeOpts{name: "n1", dir: dir, addr: addr})
	ctx := testCtx(t)
	var live string
	if err := c.Read(ctx, false, func(f *fsm.FSM) error {
		for name, idx := range acked {
			if _, ok := f.Node(name); !ok {
				return fmt.Errorf("write %s acknowledged at index %d is lost", name, idx)
			}
		}
		if f.AppliedIndex() < maxIndex {
			return fmt.Errorf("applied index %d < last acknowledged %d", f.AppliedIndex(), maxIndex)
		}
		live = f.Hash()
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if got := replayHash(t, c); got != live {
		t.Fatalf("replay of the log: hash %s, live %s", got, live)
	}
	t.Logf("%d acknowledged writes survived SIGKILL (last index %d)", len(acked), maxIndex)
}
