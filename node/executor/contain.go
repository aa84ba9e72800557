package executor

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gpuplane/gpuplane/node/procfs"
)

// Containment modes (Options.Containment).
const (
	// ContainAuto puts every engine in a cgroup of its own where this node
	// lets the agent make cgroups, else falls back to ContainProcessGroup.
	ContainAuto = "auto"
	// ContainProcessGroup finds an engine's processes by its process group
	// and by the engine id in their environment, with the agent as child
	// subreaper so that orphaned descendants stay its children.
	ContainProcessGroup = "process-group"
)

// envEngineID marks every process of an engine: set in the engine's
// environment and inherited by its descendants, it finds those that left
// the engine's process group (setsid) even after an agent restart.
const envEngineID = "GPUPLANE_ENGINE_ID"

// containment is how this node keeps each engine and all its descendants
// together, so that stopping an engine reaches every process it started and
// its host memory can be read.
//
// With cgroups, each engine gets one cgroup per hierarchy, named
// gpuplane-<node>-<hash>/<model>/<replica> under the agent's own cgroup: in the
// cgroup2 hierarchy (pure v2, or the unified mount of a hybrid host) the
// engine is cloned straight into it (CLONE_INTO_CGROUP), so no descendant
// can be forked outside it, and cgroup.kill stops them all; on a cgroup v1
// host the freezer cgroup does that (the engine is moved in right after it
// starts). The memory cgroup (v2 memory controller, else v1 memory) gives
// the engine's host memory.
//
// Whatever the mode, a stop also signals the engine's process group and
// every process carrying its engine id, so an engine is contained even
// where its cgroup could not be made.
//
// It does not use github.com/containerd/cgroups (v3): its managers place a
// process once it runs (AddProc, Add), which races with the engine's first
// forks, while the start into the cgroup here is Go's own
// SysProcAttr.UseCgroupFD; the rest is a few cgroupfs files, not worth its
// dbus, systemd and eBPF dependencies.
type containment struct {
	// v2 is the directory in the cgroup2 hierarchy under which engine
	// cgroups are made; "" when there is none or it is not writable.
	v2 string
	// v1 maps the v1 controllers used (freezer, memory, pids) to the
	// directory under which engine cgroups are made.
	v1 map[string]string
}

// v1Controllers are the cgroup v1 hierarchies an engine is put in.
var v1Controllers = []string{"freezer", "memory", "pids"}

// newContainment finds this host's cgroup hierarchies and makes the node's
// base cgroups; mode ContainProcessGroup, or no usable hierarchy, leaves
// the fallback, for which the agent becomes a child subreaper.
func newContainment(node, dataDir, mode string) (*containment, error) {
	c := &containment{v1: map[string]string{}}
	if mode != ContainProcessGroup {
		name := baseName(node, dataDir)
		own := ownCgroups()
		for _, m := range cgroupMounts() {
			if m.v2 && c.v2 == "" {
				if dir := baseDir(m, own["0::"], name); dir != "" {
					c.v2 = dir
					// Lets the engine cgroups account memory where the
					// hierarchy has the controller (pure v2); refused
					// harmlessly elsewhere.
					_ = os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+memory +pids"), 0)
				}
				continue
			}
			for _, ctl := range v1Controllers {
				if _, done := c.v1[ctl]; !done && m.controllers[ctl] {
					if dir := baseDir(m, own[ctl], name); dir != "" {
						c.v1[ctl] = dir
					}
				}
			}
		}
	}
	if !c.cgroups() {
		if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
			return nil, fmt.Errorf("executor: no usable cgroups, and becoming child subreaper failed: %w", err)
		}
	}
	return c, nil
}

// close removes the node's base cgroups if no engine is left in them (the
// engines a successor adopts keep theirs).
func (c *containment) close() {
	for _, base := range append([]string{c.v2}, slices.Collect(maps.Values(c.v1))...) {
		if base == "" {
			continue
		}
		models, _ := os.ReadDir(base)
		for _, m := range models {
			if m.IsDir() {
				_ = syscall.Rmdir(filepath.Join(base, m.Name()))
			}
		}
		_ = syscall.Rmdir(base)
	}
}

// baseName names the node's base cgroups: gpuplane-<node>-<data dir hash>,
// so that agents sharing a host (a dev cluster, tests) never share engine
// cgroups even under one node name, while a restarted agent, on the same
// data dir, finds its engines' again.
func baseName(node, dataDir string) string {
	if abs, err := filepath.Abs(dataDir); err == nil {
		dataDir = abs
	}
	sum := sha256.Sum256([]byte(dataDir))
	return "gpuplane-" + strings.NewReplacer("/", "_", ".", "_").Replace(node) + "-" + hex.EncodeToString(sum[:4])
}

// cgroups says whether engines are contained by cgroups (else the fallback).
func (c *containment) cgroups() bool { return c.v2 != "" || c.v1["freezer"] != "" }

// describe says how engines are contained, for the agent's log.
func (c *containment) describe() string {
	switch {
	case c.v2 != "":
		return "cgroup2 " + c.v2
	case c.v1["freezer"] != "":
		return "cgroup v1 " + c.v1["freezer"]
	}
	return "process group and child subreaper (no usable cgroups)"
}

type cgroupMount struct {
	dir, root   string
	v2          bool
	controllers map[string]bool
}

// cgroupMounts reads the cgroup mounts of /proc/self/mountinfo.
func cgroupMounts() []cgroupMount {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []cgroupMount
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// id parent major:minor root mountpoint opts [optional…] - fstype source superopts
		pre, post, ok := strings.Cut(sc.Text(), " - ")
		a, b := strings.Fields(pre), strings.Fields(post)
		if !ok || len(a) < 5 || len(b) < 3 {
			continue
		}
		m := cgroupMount{dir: unescapeMount(a[4]), root: unescapeMount(a[3]), controllers: map[string]bool{}}
		switch b[0] {
		case "cgroup2":
			m.v2 = true
		case "cgroup":
			for o := range strings.SplitSeq(b[2], ",") {
				m.controllers[o] = true
			}
		default:
			continue
		}
		out = append(out, m)
	}
	return out
}

func unescapeMount(s string) string {
	return strings.NewReplacer(`\040`, " ", `\011`, "\t", `\012`, "\n", `\134`, `\`).Replace(s)
}

// ownCgroups reads /proc/self/cgroup: the agent's cgroup per v1 controller,
// and its cgroup2 path under "0::".
func ownCgroups() map[string]string {
	raw, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return nil
	}
	out := map[string]string{}
	for line := range strings.SplitSeq(strings.TrimSpace(string(raw)), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		if parts[0] == "0" && parts[1] == "" {
			out["0::"] = parts[2]
			continue
		}
		for ctl := range strings.SplitSeq(parts[1], ",") {
			out[ctl] = parts[2]
		}
	}
	return out
}

// baseDir makes the node's base cgroup under the agent's own cgroup in
// mount m and returns it, or "" where that is not possible.
func baseDir(m cgroupMount, own, name string) string {
	rel := own
	if m.root != "/" {
		// A mount of a sub-tree: the agent's path starts with it.
		r, ok := strings.CutPrefix(own, m.root)
		if !ok {
			return ""
		}
		rel = r
	}
	dir := filepath.Join(m.dir, rel, name)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return ""
	}
	if _, err := os.Stat(filepath.Join(dir, "cgroup.procs")); err != nil {
		return ""
	}
	return dir
}

// box is one engine's containment: its id and its cgroups.
type box struct {
	// id is the engine id in the environment of the engine's processes.
	id string
	// v2 is the engine's cgroup2 directory; v1 its v1 directories by
	// controller; either may be empty.
	v2 string
	v1 map[string]string
}

// newBox makes fresh cgroups for a new engine of replica k. A cgroup left
// from before (by an engine the agent lost track of) is emptied and made
// anew first: a cgroup2 cgroup that was ever written cgroup.kill may kill
// the processes later cloned into it (seen on Linux 6.18), so one is never
// reused. A cgroup that cannot be made is left out: the engine is then
// contained by what remains.
func (c *containment) newBox(k key) *box {
	b := &box{id: fmt.Sprintf("%s/%d@%d", k.model, k.index, time.Now().UnixNano()), v1: map[string]string{}}
	leaf := filepath.Join(k.model, strconv.FormatUint(uint64(k.index), 10))
	old := &box{v1: map[string]string{}}
	if c.v2 != "" {
		old.v2 = filepath.Join(c.v2, leaf)
	}
	for ctl, base := range c.v1 {
		old.v1[ctl] = filepath.Join(base, leaf)
	}
	old.remove(0)
	if c.v2 != "" && os.MkdirAll(old.v2, 0o755) == nil {
		b.v2 = old.v2
	}
	for ctl, dir := range old.v1 {
		if os.MkdirAll(dir, 0o755) == nil {
			b.v1[ctl] = dir
		}
	}
	return b
}

// dirs are the box's cgroup directories.
func (b *box) dirs() []string {
	var out []string
	if b.v2 != "" {
		out = append(out, b.v2)
	}
	for _, ctl := range v1Controllers {
		if d := b.v1[ctl]; d != "" {
			out = append(out, d)
		}
	}
	return out
}

// cgroupsRecord is what pid.json keeps of the box's cgroups: "cgroup2" and
// the v1 controllers, each to its directory.
func (b *box) cgroupsRecord() map[string]string {
	out := map[string]string{}
	if b.v2 != "" {
		out["cgroup2"] = b.v2
	}
	for ctl, d := range b.v1 {
		out[ctl] = d
	}
	return out
}

// boxOf is the box an engine's record names (an engine of a previous agent).
func boxOf(r *record) *box {
	b := &box{id: r.EngineID, v1: map[string]string{}}
	for ctl, d := range r.Cgroups {
		if ctl == "cgroup2" {
			b.v2 = d
		} else if slices.Contains(v1Controllers, ctl) {
			b.v1[ctl] = d
		}
	}
	return b
}

// prepare marks cmd with the engine id and has it cloned straight into the
// engine's cgroup2 cgroup; it returns what to close once cmd started.
func (b *box) prepare(cmd *exec.Cmd) func() {
	cmd.Env = append(cmd.Env, envEngineID+"="+b.id)
	if b.v2 == "" {
		return func() {}
	}
	fd, err := unix.Open(b.v2, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return func() {} // moved in after it starts instead
	}
	if cmd.SysProcAttr == nil {
		cmd.SysProcAttr = &syscall.SysProcAttr{}
	}
	cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = true, fd
	return func() { syscall.Close(fd) }
}

// attach moves a started engine into the cgroups it is not in yet (all v1
// ones; the v2 one where the kernel could not clone it there).
func (b *box) attach(pid int) {
	for _, d := range b.dirs() {
		_ = os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
	}
}

// procs lists the processes in the box's cgroups.
func (b *box) procs() []int {
	seen := map[int]bool{}
	var out []int
	for _, d := range b.dirs() {
		raw, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			continue
		}
		for f := range strings.FieldsSeq(string(raw)) {
			if pid, err := strconv.Atoi(f); err == nil && !seen[pid] {
				seen[pid] = true
				out = append(out, pid)
			}
		}
	}
	return out
}

// marked lists the live processes whose environment carries the box's id.
func (b *box) marked() []int {
	if b.id == "" {
		return nil
	}
	want := []byte(envEngineID + "=" + b.id + "\x00")
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	self := os.Getpid()
	var out []int
	for _, d := range dirs {
		pid, err := strconv.Atoi(filepath.Base(d))
		if err != nil || pid == self {
			continue
		}
		env, err := os.ReadFile(filepath.Join(d, "environ"))
		if err != nil || !bytes.Contains(append([]byte{0}, env...), append([]byte{0}, want...)) {
			continue
		}
		if st, err := procfs.ReadStat(pid); err == nil && st.Alive() {
			out = append(out, pid)
		}
	}
	return out
}

// kill sends SIGKILL to every process of the box: through cgroup.kill (or a
// frozen cgroup, so that nothing forks meanwhile), then to every process
// carrying its id. leader, the engine's first process (0 if none is ours),
// is reaped by whoever started it; any other process of the box that is a
// child of the agent (an orphan it adopted as subreaper) is reaped here.
func (b *box) kill(leader int) {
	victims := b.procs()
	switch {
	case len(victims) == 0:
	case b.v2 != "" && writeCgroup(b.v2, "cgroup.kill", "1") == nil:
	case b.v2 != "":
		b.freezeKill(b.v2, "cgroup.freeze", "1", "0")
	case b.v1["freezer"] != "":
		b.freezeKill(b.v1["freezer"], "freezer.state", "FROZEN", "THAWED")
	}
	for _, pid := range b.marked() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
		victims = append(victims, pid)
	}
	for _, pid := range victims {
		if pid != leader {
			go reap(pid)
		}
	}
}

// reap waits for a killed process that is, or becomes, a child of the agent
// (its parent died with it and the agent is their subreaper), so that no
// zombie is left; it gives up once the process is gone or after a while.
func reap(pid int) {
	self := os.Getpid()
	for range 100 {
		st, err := procfs.ReadStat(pid)
		if err != nil {
			return
		}
		if st.PPID == self {
			_, _ = syscall.Wait4(pid, nil, 0, nil)
			return
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// freezeKill freezes cgroup dir, kills every process in it and thaws it,
// for hierarchies without cgroup.kill.
func (b *box) freezeKill(dir, file, freeze, thaw string) {
	_ = writeCgroup(dir, file, freeze)
	for _, pid := range b.procs() {
		_ = syscall.Kill(pid, syscall.SIGKILL)
	}
	_ = writeCgroup(dir, file, thaw)
}

// remove kills what is left in the box and deletes its cgroups once they
// are empty (the kernel frees a killed process's cgroup membership shortly
// after it dies).
func (b *box) remove(leader int) {
	b.kill(leader)
	deadline := time.Now().Add(10 * time.Second)
	for _, d := range b.dirs() {
		if _, err := os.Stat(d); err != nil {
			continue
		}
		for {
			err := syscall.Rmdir(d)
			if err == nil || errors.Is(err, fs.ErrNotExist) || time.Now().After(deadline) {
				break
			}
			time.Sleep(20 * time.Millisecond)
		}
		// The model's directory goes with its last replica; a busy one stays.
		_ = syscall.Rmdir(filepath.Dir(d))
	}
}

func writeCgroup(dir, file, value string) error {
	return os.WriteFile(filepath.Join(dir, file), []byte(value), 0)
}

// hostMemory is the host memory the engine's processes use, in bytes: the
// working set of its memory cgroup (usage less inactive file cache, the
// figure Kubernetes reports), from the cgroup2 memory controller where the
// engine cgroup has it, else from its cgroup v1 memory cgroup.
func (b *box) hostMemory() (uint64, error) {
	if b.v2 != "" {
		if usage, err := readUint(filepath.Join(b.v2, "memory.current")); err == nil {
			return workingSet(usage, filepath.Join(b.v2, "memory.stat"), "inactive_file"), nil
		}
	}
	if d := b.v1["memory"]; d != "" {
		// A process forked before the engine was moved in (v1 moves a
		// started process) joins now; the cgroup2 list has them all.
		if b.v2 != "" {
			for _, pid := range b.procs() {
				_ = os.WriteFile(filepath.Join(d, "cgroup.procs"), []byte(strconv.Itoa(pid)), 0)
			}
		}
		usage, err := readUint(filepath.Join(d, "memory.usage_in_bytes"))
		if err != nil {
			return 0, fmt.Errorf("engine host memory: %w", err)
		}
		return workingSet(usage, filepath.Join(d, "memory.stat"), "total_inactive_file"), nil
	}
	if b.v2 != "" && isDir(b.v2) {
		// No memory controller here (a pure cgroup v2 host where the
		// agent's cgroup cannot hand it down): the resident memory of the
		// cgroup's processes, shared pages counted in each.
		var sum uint64
		for _, pid := range b.procs() {
			raw, err := os.ReadFile(fmt.Sprintf("/proc/%d/statm", pid))
			if f := strings.Fields(string(raw)); err == nil && len(f) > 1 {
				pages, _ := strconv.ParseUint(f[1], 10, 64)
				sum += pages * uint64(os.Getpagesize())
			}
		}
		return sum, nil
	}
	return 0, errors.New("engine host memory: no memory cgroup on this node")
}

func isDir(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.IsDir()
}

func workingSet(usage uint64, statFile, inactiveKey string) uint64 {
	raw, _ := os.ReadFile(statFile)
	for line := range strings.SplitSeq(string(raw), "\n") {
		if k, v, ok := strings.Cut(line, " "); ok && k == inactiveKey {
			if n, err := strconv.ParseUint(v, 10, 64); err == nil && n < usage {
				return usage - n
			}
		}
	}
	return usage
}

func readUint(path string) (uint64, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(strings.TrimSpace(string(raw)), 10, 64)
}
