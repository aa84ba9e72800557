package watchdog

import (
	"maps"
	"os"
	"slices"
	"strings"
	"syscall"
	"testing"

	"github.com/NVIDIA/go-nvml/pkg/nvml"
	"github.com/NVIDIA/go-nvml/pkg/nvml/mock/dgxa100"
	mockserver "github.com/NVIDIA/go-nvml/pkg/nvml/mock/server"
)

// target records what the watchdog says.
type target struct {
	engines  []Engine
	exceeded []string
}

func (t *target) Engines() []Engine { return t.engines }
func (t *target) Exceeded(e Engine, used uint64, reason string) {
	t.exceeded = append(t.exceeded, e.Model+": "+reason)
}

// procs makes a device of the mock DGX A100 report these compute processes
// (pid → MiB).
func procs(t *testing.T, srv *mockserver.Server, index int, used map[uint32]uint64) string {
	t.Helper()
	d, ret := srv.DeviceGetHandleByIndex(index)
	if ret != nvml.SUCCESS {
		t.Fatal(ret)
	}
	dev := d.(*mockserver.Device)
	dev.GetComputeRunningProcessesFunc = func() ([]nvml.ProcessInfo, nvml.Return) {
		var out []nvml.ProcessInfo
		for _, pid := range slices.Sorted(maps.Keys(used)) {
			out = append(out, nvml.ProcessInfo{Pid: pid, UsedGpuMemory: used[pid] << 20})
		}
		return out, nvml.SUCCESS
	}
	return dev.UUID
}

func TestProcessMemoryReadsNVMLPerProcess(t *testing.T) {
	srv := dgxa100.New()
	uuid := procs(t, srv, 0, map[uint32]uint64{1001: 8000, 1005: 2000})
	got, err := ProcessMemory(srv, uuid)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[1001] != 8000 || got[1005] != 2000 {
		t.Fatalf("ProcessMemory = %v, want 1001:8000 1005:2000 MiB", got)
	}
	if _, err := ProcessMemory(srv, "GPU-nope"); err == nil || !strings.Contains(err.Error(), "GPU-nope") {
		t.Fatalf("ProcessMemory(unknown card) = %v, want an error naming it", err)
	}
}

func TestCheckStopsOnlyEnginesAboveTheirShare(t *testing.T) {
	srv := dgxa100.New()
	// Card 0 holds two replicas at 40 %: "big" (pid 1001, with a child 1005
	// in its group) uses 10000 MiB, "small" (pid 2002) 9000; 3003 is no
	// engine of ours.
	card0 := procs(t, srv, 0, map[uint32]uint64{1001: 8000, 1005: 2000, 2002: 9000, 3003: 20000})
	// "wide" spans cards 1 and 2 at 40000 MiB each: 41000 is within 5 %.
	card1 := procs(t, srv, 1, map[uint32]uint64{4004: 30000})
	card2 := procs(t, srv, 2, map[uint32]uint64{4004: 41000})
	// Small shares get 256 MiB of slack rather than 5 %.
	card3 := procs(t, srv, 3, map[uint32]uint64{5005: 1200, 6006: 1300})
	tg := &target{engines: []Engine{
		{Model: "big", PID: 1001, CardUUIDs: []string{card0}, ShareMiB: 9213},
		{Model: "small", PID: 2002, CardUUIDs: []string{card0}, ShareMiB: 9213},
		{Model: "wide", PID: 4004, CardUUIDs: []string{card1, card2}, ShareMiB: 40000},
		{Model: "tiny-ok", PID: 5005, CardUUIDs: []string{card3}, ShareMiB: 1000},
		{Model: "tiny-over", PID: 6006, CardUUIDs: []string{card3}, ShareMiB: 1000},
	}}
	w := New(srv, tg, Options{})
	w.groupOf = func(pid int) (int, bool) {
		if pid == 1005 {
			return 1001, true
		}
		return 0, false
	}
	w.Check()
	want := []string{
		"big: exceeded memory share (used 10000 MiB, share 9213 MiB)",
		"tiny-over: exceeded memory share (used 1300 MiB, share 1000 MiB)",
	}
	if !slices.Equal(tg.exceeded, want) {
		t.Fatalf("exceeded:\n%s\nwant:\n%s", strings.Join(tg.exceeded, "\n"), strings.Join(want, "\n"))
	}
}

// The memory of every process in an engine's group counts, found through
// /proc: here this test process stands for a worker of an engine whose
// group leader is the test's group.
func TestCheckCountsTheProcessGroup(t *testing.T) {
	srv := dgxa100.New()
	uuid := procs(t, srv, 0, map[uint32]uint64{uint32(os.Getpid()): 5000})
	tg := &target{engines: []Engine{{Model: "grouped", PID: syscall.Getpgrp(), CardUUIDs: []string{uuid}, ShareMiB: 1000}}}
	got := New(srv, tg, Options{}).Check()
	if len(got) != 1 || got[0].UsedMiB != 5000 || got[0].Card != uuid {
		t.Fatalf("Check = %+v, want the group's 5000 MiB on %s", got, uuid)
	}
}
