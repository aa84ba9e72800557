package executor

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/testutil"
	"github.com/gpuplane/gpuplane/node/procfs"
	"github.com/gpuplane/gpuplane/node/watchdog"
)

// sleepers returns the live processes whose command line is `sleep arg`.
func sleepers(t *testing.T, arg string) []int {
	t.Helper()
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	var out []int
	for _, d := range dirs {
		pid, _ := strconv.Atoi(filepath.Base(d))
		raw, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil || string(raw) != "sleep\x00"+arg+"\x00" {
			continue
		}
		if st, err := procfs.ReadStat(pid); err == nil && st.Alive() {
			out = append(out, pid)
		}
	}
	return out
}

// uniqueSleep is a `sleep` argument no other test's process has.
func uniqueSleep(base int) string {
	return fmt.Sprintf("%d.%06d", base, rand.IntN(1000000))
}

func oneEngine(t *testing.T, ex *Executor) watchdog.Engine {
	t.Helper()
	var en []watchdog.Engine
	testutil.Until(t, 30*time.Second, "the executor has no engine", func() bool {
		en = ex.Engines()
		return len(en) == 1
	})
	return en[0]
}

// A child that leaves the engine's process group and session (setsid) is
// still the engine's: deleting the replica stops it too, after an agent
// restart as before, with cgroups and with the fallback without them.
func TestDeleteStopsEveryDescendant(t *testing.T) {
	for _, mode := range []string{ContainAuto, ContainProcessGroup} {
		t.Run(mode, func(t *testing.T) {
			dataDir := t.TempDir()
			c, err := newContainment(node, dataDir, mode)
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(c.close)
			if mode == ContainAuto && !c.cgroups() {
				t.Skip("no writable cgroup hierarchy on this host: " + c.describe())
			}
			escaped, wiped := uniqueSleep(999), uniqueSleep(998)
			script := "setsid sleep " + escaped + " & exec sleep 1000"
			if mode == ContainAuto {
				// Only a cgroup finds a child that also dropped its
				// environment (and so the engine id).
				script = "env -i setsid sleep " + wiped + " & " + script
			}
			keep := func(o *Options) { o.Containment, o.KeepEngines = mode, true }
			first := newHarness(t, dataDir, keep)
			d := shell("contained", script)
			first.want(10, d)
			leader := oneEngine(t, first.exec).PID
			var child int
			testutil.Until(t, 30*time.Second, "sleep "+escaped+" did not start", func() bool {
				pids := sleepers(t, escaped)
				if len(pids) == 1 {
					child = pids[0]
				}
				return child != 0
			})
			if st, err := procfs.ReadStat(child); err != nil || st.PGID == leader {
				t.Fatalf("sleep %s: %+v, %v; want it out of the engine's group %d", escaped, st, err, leader)
			}
			if mode == ContainAuto {
				testutil.Until(t, 30*time.Second, "sleep "+wiped+" did not start", func() bool { return len(sleepers(t, wiped)) == 1 })
				raw, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", child))
				if !strings.Contains(string(raw), "/"+baseName(node, dataDir)+"/contained/0\n") {
					t.Errorf("sleep %s is not in the engine's cgroup:\n%s", escaped, raw)
				}
			}

			// A new agent adopts the engine, then the replica is deleted.
			first.close()
			second := newHarness(t, dataDir, keep)
			second.want(11, d)
			if got := oneEngine(t, second.exec).PID; got != leader {
				t.Fatalf("the new executor runs engine %d, want %d adopted", got, leader)
			}
			second.want(12)
			testutil.Until(t, 30*time.Second, "the engine still runs after delete", func() bool { return len(second.exec.Engines()) == 0 })
			testutil.Until(t, 30*time.Second, "a process of the deleted engine remains", func() bool {
				return len(sleepers(t, escaped))+len(sleepers(t, wiped)) == 0
			})
			if _, err := procfs.ReadStat(leader); err == nil {
				t.Errorf("the engine's first process %d remains", leader)
			}
			for _, dir := range c.dirsOf(key{"contained", 0}) {
				if _, err := os.Stat(dir); !os.IsNotExist(err) {
					t.Errorf("cgroup %s remains after delete (%v)", dir, err)
				}
			}
		})
	}
}

// dirsOf are the cgroup directories an engine of replica k has.
func (c *containment) dirsOf(k key) []string {
	leaf := filepath.Join(k.model, strconv.FormatUint(uint64(k.index), 10))
	var out []string
	if c.v2 != "" {
		out = append(out, filepath.Join(c.v2, leaf))
	}
	for _, base := range c.v1 {
		out = append(out, filepath.Join(base, leaf))
	}
	return out
}

// HostMemory reads an engine's host memory from its memory cgroup: a real
// number for a real process holding 16 MB (little enough for its shell to
// build quickly on a loaded machine; far above what a shell holds alone).
func TestHostMemoryOfAnEngine(t *testing.T) {
	c, err := newContainment(node, t.TempDir(), ContainAuto)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	probe := c.newBox(key{"probe", 0})
	_, err = probe.hostMemory()
	probe.remove(0)
	if err != nil {
		t.Skip("no memory cgroup on this host: " + err.Error())
	}
	h := newHarness(t, t.TempDir(), nil)
	if _, err := h.exec.HostMemory("mem", 0); err == nil {
		t.Error("HostMemory of a replica with no engine is not an error")
	}
	const held = 16_000_000
	h.want(10, shell("mem", fmt.Sprintf("x=$(head -c %d /dev/zero | tr '\\0' a); echo loaded; sleep 1000", held)))
	leader := oneEngine(t, h.exec).PID
	testutil.Until(t, 30*time.Second, "the engine did not load its 16 MB", func() bool {
		raw, _ := os.ReadFile(LogPath(h.dataDir, "mem", 0))
		return bytes.Contains(raw, []byte("loaded\n"))
	})
	got, err := h.exec.HostMemory("mem", 0)
	rss := vmRSS(t, leader)
	t.Logf("HostMemory = %d bytes; the engine's shell has VmRSS %d bytes", got, rss)
	if err != nil || got < held*9/10 || got > 4<<30 {
		t.Errorf("HostMemory = %d, %v; want about the %d bytes the engine holds (VmRSS %d)", got, err, held, rss)
	}
	h.want(11)
	testutil.Until(t, 30*time.Second, "the engine still runs after delete", func() bool { return len(h.exec.Engines()) == 0 })
	if _, err := h.exec.HostMemory("mem", 0); err == nil {
		t.Error("HostMemory of a deleted replica is not an error")
	}
}

// vmRSS is a process's resident memory in bytes.
func vmRSS(t *testing.T, pid int) uint64 {
	t.Helper()
	raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(raw), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			kb, _ := strconv.ParseUint(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
			return kb << 10
		}
	}
	t.Fatalf("no VmRSS for %d", pid)
	return 0
}

// On a cgroup v1 host (no cgroup2 hierarchy) the freezer cgroup alone stops
// an engine's every process, even one that left its group and dropped its
// engine id.
func TestCgroupV1FreezerStopsEveryProcess(t *testing.T) {
	c, err := newContainment(node, t.TempDir(), ContainAuto)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	if c.v1["freezer"] == "" {
		t.Skip("no writable cgroup v1 freezer hierarchy on this host")
	}
	k := key{"freezer-only", 0}
	b := c.newBox(k)
	v2 := b.v2
	b.v2, b.id = "", "" // only the v1 cgroups
	escaped := uniqueSleep(997)
	cmd := exec.Command("sh", "-c", "sleep 0.2; env -i setsid sleep "+escaped+" & exec sleep 1000")
	p, err := launch(cmd, b)
	if err != nil {
		t.Fatal(err)
	}
	testutil.Until(t, 30*time.Second, "sleep "+escaped+" did not start", func() bool { return len(sleepers(t, escaped)) == 1 })
	b.remove(p.pid)
	<-p.done
	testutil.Until(t, 30*time.Second, "a process of the engine remains", func() bool { return len(sleepers(t, escaped)) == 0 })
	for _, d := range b.dirs() {
		if _, err := os.Stat(d); !os.IsNotExist(err) {
			t.Errorf("cgroup %s remains (%v)", d, err)
		}
	}
	if v2 != "" {
		_ = os.Remove(v2)
		_ = os.Remove(filepath.Dir(v2))
	}
}

// Where the engine's cgroup2 cgroup has no memory controller and there is
// no v1 memory cgroup, host memory is the resident memory of the cgroup's
// processes.
func TestHostMemoryWithoutAMemoryController(t *testing.T) {
	c, err := newContainment(node, t.TempDir(), ContainAuto)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.close)
	if c.v2 == "" {
		t.Skip("no writable cgroup2 hierarchy on this host")
	}
	b := c.newBox(key{"rss", 0})
	if mem := b.v1["memory"]; mem != "" {
		delete(b.v1, "memory")
		t.Cleanup(func() { os.Remove(mem) })
	}
	if _, err := os.Stat(filepath.Join(b.v2, "memory.current")); err == nil {
		b.remove(0)
		t.Skip("the cgroup2 hierarchy has the memory controller here")
	}
	const held = 32_000_000
	loaded := filepath.Join(t.TempDir(), "loaded")
	p, err := launch(exec.Command("sh", "-c", fmt.Sprintf("x=$(head -c %d /dev/zero | tr '\\0' a); touch %s; sleep 1000", held, loaded)), b)
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		b.remove(p.pid)
		<-p.done
	}()
	testutil.Until(t, 30*time.Second, "the engine did not load", func() bool { _, err := os.Stat(loaded); return err == nil })
	got, err := b.hostMemory()
	if err != nil || got < held {
		t.Errorf("hostMemory = %d, %v; want at least the %d bytes the process holds", got, err, held)
	}
}
