package executor

import (
	"net"
	"net/url"
	"strconv"
	"testing"
	"time"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// TestEnginePortsFromTrackedRange: engines started together get distinct
// ports from the configured range, skipping one that another program
// listens on, instead of ports the kernel picked and let go.
func TestEnginePortsFromTrackedRange(t *testing.T) {
	// Three free ports in a row in the engines' default range (where no
	// other test reserves ports); the first is then taken by another
	// program.
	var first int
	var other net.Listener
	for base := DefaultPortFirst + 500; base < DefaultPortLast-3 && other == nil; base += 7 {
		if !bindable("127.0.0.1", base+1) || !bindable("127.0.0.1", base+2) {
			continue
		}
		if ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(base)); err == nil {
			first, other = base, ln
		}
	}
	if other == nil {
		t.Fatal("no three free ports in a row")
	}
	defer other.Close()

	h := newHarness(t, t.TempDir(), func(o *Options) { o.PortFirst, o.PortLast = first, first+2 })
	h.want(10, sim("alpha", 1), sim("beta", 1))
	ports := map[int]string{}
	for _, m := range []string{"alpha", "beta"} {
		st := h.waitState(m, pb.ReplicaState_REPLICA_STATE_RUNNING, 20*time.Second)
		u, err := url.Parse(st.Endpoint)
		if err != nil {
			t.Fatal(err)
		}
		port, _ := strconv.Atoi(u.Port())
		if port <= first || port > first+2 || ports[port] != "" {
			t.Errorf("%s runs on port %d; want one of %d-%d, not %d (in use) nor %s's", m, port, first+1, first+2, first, ports[port])
		}
		ports[port] = m
	}
}
