package cli

import (
	"bytes"
	"strings"
	"testing"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

func sampleAccelerators() []*pb.Accelerator {
	return []*pb.Accelerator{
		{
			Name:   "standard",
			Spec:   &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_DEDICATED, DevicesPerReplica: 1},
			Status: &pb.AcceleratorStatus{MemoryPerModelMib: 23034, InUse: 0, CanPlace: 1, Ready: true},
		},
		{
			Name:   "small",
			Spec:   &pb.AcceleratorSpec{Device: "l4", Tenancy: pb.Tenancy_TENANCY_SHARED, MaxModels: 2, DevicesPerReplica: 1},
			Status: &pb.AcceleratorStatus{MemoryPerModelMib: 11517, InUse: 3, CanPlace: 1},
		},
		{
			Name:   "pair",
			Spec:   &pb.AcceleratorSpec{Device: "h100", Tenancy: pb.Tenancy_TENANCY_DEDICATED, DevicesPerReplica: 2},
			Status: &pb.AcceleratorStatus{MemoryPerModelMib: 163840},
		},
	}
}

// printed runs print with a globals whose -o is output and returns stdout.
func printed(t *testing.T, output string, print func(g *globals) error) string {
	t.Helper()
	var out bytes.Buffer
	g := &globals{output: output, stdout: &out}
	if err := print(g); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

func TestAcceleratorTable(t *testing.T) {
	accs := sampleAccelerators()
	got := printed(t, outputTable, func(g *globals) error { return g.printList(messages(accs), acceleratorTable(accs)) })
	want := `NAME       DEVICE   TENANCY     CARDS/REPLICA   MEMORY/MODEL   IN USE   CAN PLACE   READY
standard   l4       Dedicated   1               23034Mi        0        1           True
small      l4       Shared      1               11517Mi        3        1           False
pair       h100     Dedicated   2               163840Mi       0        0           False
`
	if got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
	// docs/cli.md's example row, split into fields.
	if row := strings.Fields(strings.Split(got, "\n")[1]); strings.Join(row, " ") != "standard l4 Dedicated 1 23034Mi 0 1 True" {
		t.Errorf("row = %q", row)
	}
}

func TestDeviceAndCardTables(t *testing.T) {
	devices := []*pb.Device{
		{Name: "l4", Product: "NVIDIA L4", MemoryMib: 23034, Architecture: "ada", Fp8: true, Total: 4, Free: 2, MaxPerNode: 2},
		{Name: "t4", Product: "Tesla T4", MemoryMib: 15360, Total: 1, Free: 1, MaxPerNode: 1},
	}
	got := printed(t, outputTable, func(g *globals) error { return g.printList(messages(devices), deviceTable(devices)) })
	want := `NAME   PRODUCT     MEMORY    ARCHITECTURE   FP8     TOTAL   FREE   MAX/NODE
l4     NVIDIA L4   23034Mi   ada            true    4       2      2
t4     Tesla T4    15360Mi   -              false   1       1      1
`
	if got != want {
		t.Errorf("devices table:\n%s\nwant:\n%s", got, want)
	}

	resp := &pb.GetDeviceResponse{
		Device: devices[0],
		Cards: []*pb.CardStatus{
			{Node: "n1", Index: 0, Uuid: "GPU-0", MemoryMib: 23034, UsedMib: 10240, FreeMib: 12794, Accelerator: "small", Replicas: []string{"chat/0", "code/1"},
				ReservedMib: 4096, ResidentMib: 10240, SleepingMib: 2048},
			{Node: "n1", Index: 1, Uuid: "GPU-1", MemoryMib: 23034, FreeMib: 23034},
		},
	}
	got = printed(t, outputTable, func(g *globals) error { return g.printObject(resp, cardTable(resp.GetCards())) })
	want = `NODE   INDEX   UUID    MEMORY    USED      RESERVED   RESIDENT   SLEEPING   FREE      ACCELERATOR   REPLICAS
n1     0       GPU-0   23034Mi   10240Mi   4096Mi     10240Mi    2048Mi     12794Mi   small         chat/0,code/1
n1     1       GPU-1   23034Mi   0Mi       0Mi        0Mi        0Mi        23034Mi   -             -
`
	if got != want {
		t.Errorf("cards table:\n%s\nwant:\n%s", got, want)
	}
}

func TestNodeTable(t *testing.T) {
	nodes := []*pb.Node{
		{
			Name: "n1", Address: "10.0.0.1:7410", Role: pb.NodeRole_NODE_ROLE_SERVER, Status: pb.NodeStatus_NODE_STATUS_ALIVE,
			Labels: map[string]string{"zone": "a", "rack": "r1"},
			Cards:  []*pb.Card{{Index: 0, Device: "l4"}, {Index: 1, Device: "l4"}, {Index: 2, Device: "h100"}},
		},
		{Name: "n2", Address: "10.0.0.2:7410", Role: pb.NodeRole_NODE_ROLE_CLIENT, Status: pb.NodeStatus_NODE_STATUS_LEFT},
	}
	got := printed(t, outputTable, func(g *globals) error { return g.printList(messages(nodes), nodeTable(nodes)) })
	want := `NAME   ADDRESS         ROLE     STATUS   CARDS         LABELS
n1     10.0.0.1:7410   server   alive    l4=2,h100=1   rack=r1,zone=a
n2     10.0.0.2:7410   client   left     -             -
`
	if got != want {
		t.Errorf("nodes table:\n%s\nwant:\n%s", got, want)
	}
}

func TestJSONAndYAML(t *testing.T) {
	accs := sampleAccelerators()[:1]
	list := func(g *globals) error { return g.printList(messages(accs), acceleratorTable(accs)) }
	// The descriptor's vocabulary, not protojson's: an accelerator is the
	// document apply reads, tenancy a word, 64-bit numbers numbers.
	wantObject := `{
  "resource": "Accelerator",
  "resourceVersion": "v1",
  "metadata": {
    "name": "standard"
  },
  "spec": {
    "device": "l4",
    "tenancy": "dedicated",
    "devicesPerReplica": 1
  },
  "status": {
    "memoryPerModelMib": 23034,
    "inUse": 0,
    "canPlace": 1,
    "ready": true,
    "createdIndex": 0
  }
}
`
	wantJSON := "[\n" + indent(wantObject, "  ") + "]\n"
	// protojson varies its whitespace between runs; the CLI's must not.
	for range 3 {
		if got := printed(t, outputJSON, list); got != wantJSON {
			t.Fatalf("-o json list:\n%s\nwant:\n%s", got, wantJSON)
		}
	}

	get := func(g *globals) error { return g.printObject(accs[0], acceleratorTable(accs)) }
	if got, want := printed(t, outputJSON, get), wantObject; got != want {
		t.Errorf("-o json get:\n%s\nwant:\n%s", got, want)
	}

	// YAML keeps the document's order.
	wantYAML := `- resource: Accelerator
  resourceVersion: v1
  metadata:
    name: standard
  spec:
    device: l4
    tenancy: dedicated
    devicesPerReplica: 1
  status:
    memoryPerModelMib: 23034
    inUse: 0
    canPlace: 1
    ready: true
    createdIndex: 0
`
	if got := printed(t, outputYAML, list); got != wantYAML {
		t.Errorf("-o yaml list:\n%s\nwant:\n%s", got, wantYAML)
	}

	var none []*pb.Accelerator
	if got := printed(t, outputJSON, func(g *globals) error { return g.printList(messages(none), acceleratorTable(none)) }); got != "[]\n" {
		t.Errorf("-o json of an empty list = %q, want []", got)
	}
	if got := printed(t, outputTable, func(g *globals) error { return g.printList(messages(none), acceleratorTable(none)) }); !strings.HasPrefix(got, "NAME ") || strings.Count(got, "\n") != 1 {
		t.Errorf("table of an empty list = %q, want the header only", got)
	}
}

// indent puts prefix before every line of s.
func indent(s, prefix string) string {
	lines := strings.SplitAfter(s, "\n")
	for i, l := range lines {
		if l != "" {
			lines[i] = prefix + l
		}
	}
	return strings.Join(lines, "")
}
