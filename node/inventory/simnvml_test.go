package inventory

import (
	"bufio"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"google.golang.org/protobuf/proto"

	pb "github.com/gpuplane/gpuplane/proto/gpuplane/v1"
)

// A test binary started with envRegisterAs registers itself as an engine
// would, prints "ready" and waits for its stdin to close.
const envRegisterAs = "INVENTORY_TEST_REGISTER_AS"

func TestMain(m *testing.M) {
	if card := os.Getenv(envRegisterAs); card != "" {
		if err := NewSimUsage(os.Getenv(EnvSimUsageDir)).Register(card, os.Getpid(), 7000); err != nil {
			os.Stderr.WriteString(err.Error() + "\n")
			os.Exit(1)
		}
		os.Stdout.WriteString("ready\n")
		_, _ = bufio.NewReader(os.Stdin).ReadString('\n')
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// deadPID returns the pid of a process that has exited and been reaped.
func deadPID(t *testing.T) int {
	t.Helper()
	cmd := exec.Command("true")
	if err := cmd.Run(); err != nil {
		t.Fatal(err)
	}
	return cmd.Process.Pid
}

func TestSimNVMLReportsRegisteredProcesses(t *testing.T) {
	cards, err := Simulated("n1", "l4=2")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	usage := NewSimUsage(dir)
	card0 := cards[0].GetUuid()
	me, dead := os.Getpid(), deadPID(t)
	if err := usage.Register(card0, me, 3000); err != nil {
		t.Fatal(err)
	}
	if err := usage.Register(card0, dead, 500); err != nil {
		t.Fatal(err)
	}

	var lib nvml.Interface = NewSimNVML(cards, usage)
	if ret := lib.Init(); ret != nvml.SUCCESS {
		t.Fatalf("Init: %v", ret)
	}
	dev, ret := lib.DeviceGetHandleByUUID(card0)
	if ret != nvml.SUCCESS {
		t.Fatalf("DeviceGetHandleByUUID: %v", ret)
	}
	procs, ret := dev.GetComputeRunningProcesses()
	if ret != nvml.SUCCESS || len(procs) != 1 || procs[0].Pid != uint32(me) || procs[0].UsedGpuMemory != 3000<<20 {
		t.Fatalf("processes on card 0 = %+v, %v; want only pid %d using 3000 MiB", procs, ret, me)
	}
	if _, err := os.Stat(filepath.Join(dir, card0, strconv.Itoa(dead))); !os.IsNotExist(err) {
		t.Errorf("the dead pid's usage file is still there (stat: %v)", err)
	}
	mem, _ := dev.GetMemoryInfo()
	if mem.Total != 23034<<20 || mem.Used != 3000<<20 || mem.Free != (23034-3000)<<20 {
		t.Errorf("memory on card 0 = %+v, want 23034 MiB total, 3000 used", mem)
	}

	// A new registration replaces the old one.
	if err := usage.Register(card0, me, 4096); err != nil {
		t.Fatal(err)
	}
	if procs, _ := dev.GetComputeRunningProcesses(); len(procs) != 1 || procs[0].UsedGpuMemory != 4096<<20 {
		t.Errorf("after re-registering 4096 MiB, processes = %+v", procs)
	}
	other, _ := lib.DeviceGetHandleByIndex(1)
	if procs, _ := other.GetComputeRunningProcesses(); len(procs) != 0 {
		t.Errorf("card 1 reports processes %+v, want none", procs)
	}
	if err := usage.Unregister(card0, me); err != nil {
		t.Fatal(err)
	}
	if err := usage.Unregister(card0, me); err != nil {
		t.Errorf("unregistering twice: %v", err)
	}
	if procs, _ := dev.GetComputeRunningProcesses(); len(procs) != 0 {
		t.Errorf("after Unregister, processes = %+v, want none", procs)
	}
}

func TestSimUsageAcrossProcesses(t *testing.T) {
	cards, err := Simulated("n1", "h100=1")
	if err != nil {
		t.Fatal(err)
	}
	dir := t.TempDir()
	lib := NewSimNVML(cards, NewSimUsage(dir))
	dev, _ := lib.DeviceGetHandleByIndex(0)

	engine := exec.Command(os.Args[0], "-test.run=^$")
	engine.Env = append(os.Environ(), envRegisterAs+"="+cards[0].GetUuid(), EnvSimUsageDir+"="+dir)
	stdin, _ := engine.StdinPipe()
	stdout, _ := engine.StdoutPipe()
	engine.Stderr = os.Stderr
	if err := engine.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(stdout).ReadString('\n'); line != "ready\n" {
		t.Fatalf("engine said %q, %v", line, err)
	}
	procs, _ := dev.GetComputeRunningProcesses()
	if len(procs) != 1 || procs[0].Pid != uint32(engine.Process.Pid) || procs[0].UsedGpuMemory != 7000<<20 {
		t.Errorf("while the engine runs, processes = %+v; want pid %d using 7000 MiB", procs, engine.Process.Pid)
	}
	stdin.Close()
	if err := engine.Wait(); err != nil {
		t.Fatal(err)
	}
	if procs, _ := dev.GetComputeRunningProcesses(); len(procs) != 0 {
		t.Errorf("after the engine exited without unregistering, processes = %+v, want none", procs)
	}
}

func TestSimNVMLReadsBackAsTheSameCards(t *testing.T) {
	cards, err := Simulated("n1", "l4=1,h100=1,a100-80gb=1")
	if err != nil {
		t.Fatal(err)
	}
	res, err := Detect(Options{NodeName: "n1", Lib: NewSimNVML(cards, nil)})
	if err != nil {
		t.Fatal(err)
	}
	if !slices.EqualFunc(res.Cards, cards, func(a, b *pb.Card) bool { return proto.Equal(a, b) }) {
		t.Errorf("Detect(NewSimNVML(cards)) = %v, want %v", res.Cards, cards)
	}
}

func TestSimUsageRefusesPathsOutsideItsDir(t *testing.T) {
	usage := NewSimUsage(t.TempDir())
	for _, uuid := range []string{"", ".", "..", "../x", `a\b`} {
		if err := usage.Register(uuid, os.Getpid(), 1); err == nil || err.Error() != "invalid card UUID "+strconv.Quote(uuid) {
			t.Errorf("Register(%q) error = %v", uuid, err)
		}
	}
	if err := usage.Register("GPU-1", 0, 1); err == nil || err.Error() != "register usage of GPU-1: invalid pid 0" {
		t.Errorf("Register with pid 0: error = %v", err)
	}
}

// Sim engines on a card see each other's records; a dead engine's record
// is dropped, and the records do not show up as GPU processes.
func TestSimEngineRecords(t *testing.T) {
	usage := NewSimUsage(t.TempDir())
	me, dead := os.Getpid(), deadPID(t)
	if err := usage.Register("GPU-a", me, 1000); err != nil {
		t.Fatal(err)
	}
	for _, e := range []SimEngine{
		{PID: me, Model: "chat", ComputeWeight: 60, Busy: true, State: "awake"},
		{PID: dead, Model: "gone", Copying: true},
	} {
		if err := usage.SetEngine("GPU-a", e); err != nil {
			t.Fatal(err)
		}
	}
	if err := usage.SetEngine("GPU-a", SimEngine{PID: me, Model: "chat", ComputeWeight: 60, Copying: true, State: "waking", HostMiB: 900}); err != nil {
		t.Fatal(err)
	}
	got, err := usage.Engines("GPU-a")
	want := []SimEngine{{PID: me, Model: "chat", ComputeWeight: 60, Copying: true, State: "waking", HostMiB: 900}}
	if err != nil || !slices.Equal(got, want) {
		t.Fatalf("Engines = %+v, %v; want %+v", got, err, want)
	}
	if procs, err := usage.Processes("GPU-a"); err != nil || len(procs) != 1 || procs[0].UsedMiB != 1000 {
		t.Fatalf("Processes = %v, %v; want only this process's 1000 MiB", procs, err)
	}
	if err := usage.RemoveEngine("GPU-a", me); err != nil {
		t.Fatal(err)
	}
	if got, err := usage.Engines("GPU-a"); err != nil || len(got) != 0 {
		t.Fatalf("Engines after RemoveEngine = %+v, %v", got, err)
	}
	if err := usage.SetEngine("../x", SimEngine{PID: me}); err == nil {
		t.Fatal("SetEngine accepted a card UUID that escapes the directory")
	}
}
