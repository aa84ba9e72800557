package executor

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/gpuplane/gpuplane/node/procfs"
)

// pidFile is the name of a replica's process record.
const pidFile = "pid.json"

// record is pid.json: the engine process running for a replica, enough to
// find it again (pid and start time) and to tell whether it is still what
// the replica wants (generation and placement fingerprint).
type record struct {
	Model       string    `json:"model"`
	Replica     uint32    `json:"replica"`
	Generation  uint64    `json:"generation"`
	Fingerprint string    `json:"fingerprint"`
	PID         int       `json:"pid"`
	StartTime   uint64    `json:"start_time"`
	Port        int       `json:"port"`
	Endpoint    string    `json:"endpoint"`
	Restarts    uint32    `json:"restarts"`
	Command     []string  `json:"command"`
	StartedAt   time.Time `json:"started_at"`
	// EngineID marks the engine's processes (see envEngineID); Cgroups are
	// its cgroups ("cgroup2" and v1 controllers to directories).
	EngineID string            `json:"engine_id,omitempty"`
	Cgroups  map[string]string `json:"cgroups,omitempty"`
}

func (r *record) key() key { return key{r.Model, r.Replica} }

// writeRecord replaces dir/pid.json atomically.
func writeRecord(dir string, r *record) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	tmp := filepath.Join(dir, pidFile+".tmp")
	if err := os.WriteFile(tmp, append(data, '\n'), 0o644); err != nil {
		return fmt.Errorf("record engine pid: %w", err)
	}
	if err := os.Rename(tmp, filepath.Join(dir, pidFile)); err != nil {
		return fmt.Errorf("record engine pid: %w", err)
	}
	return nil
}

func removeRecord(dir string) {
	_ = os.Remove(filepath.Join(dir, pidFile))
}

// readRecords reads every engines/<model>/<replica>/pid.json.
func (e *Executor) readRecords() []*record {
	paths, _ := filepath.Glob(filepath.Join(e.enginesDir(), "*", "*", pidFile))
	var out []*record
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		r := &record{}
		if err := json.Unmarshal(data, r); err != nil || r.PID <= 0 {
			e.log.Warn("ignore unreadable engine record", "path", p, "err", err)
			_ = os.Remove(p)
			continue
		}
		out = append(out, r)
	}
	return out
}

// leftEngine is the engine a previous executor left for a replica still
// wanted as it was: alive, to adopt, or dead, having exited while no
// executor watched it.
type leftEngine struct {
	rec   *record
	alive bool
}

// settle deals with the engines a previous executor left: those still
// wanted with the same generation and placement are adopted; every other
// one is stopped and its record removed, before anything new starts. It
// returns the engines of the replicas still wanted as they were, alive or
// not.
func (e *Executor) settle(records []*record, snap Snapshot) map[key]leftEngine {
	want := e.wanted(snap)
	left := map[key]leftEngine{}
	var wg sync.WaitGroup
	for _, r := range records {
		dir := e.replicaDir(r.key())
		p, alive := adoptProcess(r)
		d, wanted := want[r.key()]
		switch {
		case !alive:
			e.log.Info("engine of a previous agent is gone", "replica", r.key(), "pid", r.PID)
			// Its leader is gone; any process left in its group or its
			// cgroups is not.
			killGroupIfLeaderGone(r.PID)
			boxOf(r).remove(0)
			removeRecord(dir)
			if wanted && fingerprint(d) == r.Fingerprint {
				left[r.key()] = leftEngine{rec: r}
			}
		case wanted && fingerprint(d) == r.Fingerprint:
			e.log.Info("adopting the engine of a previous agent", "replica", r.key(), "pid", r.PID)
			left[r.key()] = leftEngine{rec: r, alive: true}
			p.stopPoll() // the supervisor polls its own
		default:
			why := "its replica left this node"
			if wanted {
				why = "its replica changed (generation or placement)"
			}
			e.log.Info("stopping the engine of a previous agent: "+why, "replica", r.key(), "pid", r.PID)
			wg.Go(func() {
				p.stop(e.opts.GracePeriod)
				removeRecord(dir)
			})
		}
	}
	wg.Wait()
	return left
}

// process is a running engine: a child of this executor, or one adopted
// from a previous agent and followed through /proc.
type process struct {
	pid  int
	done chan struct{}
	// exit says how it ended, once done is closed.
	exit string
	// poll is closed to stop following an adopted process.
	poll     chan struct{}
	pollOnce sync.Once
	// box holds the engine and every process it starts.
	box *box
	// logDone is closed once the engine's log writer has written the last
	// of its output and exited; nil for an adopted engine, whose writer is
	// not this agent's child. logPID is the writer's pid and group.
	logDone chan struct{}
	logPID  int
}

// startEngine starts c as the engine of replica k: in its own process group
// and its box, its stdout and stderr a pipe to a log writer of its own
// (`gpuplane engine log`, see WriteLog) that keeps the replica's log within
// LogMaxBytes on disk. header is the log's first line for this start.
// Neither the engine nor its log writer depends on the agent, so both
// survive an agent restart. An engine whose log writer died gets EPIPE or
// SIGPIPE on its next write, like any program whose output is gone, and is
// restarted with a new one.
func (e *Executor) startEngine(k key, c *exec.Cmd, header string) (*process, error) {
	dir := e.replicaDir(k)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("engine directory: %w", err)
	}
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("engine log pipe: %w", err)
	}
	defer w.Close()
	lw := exec.Command(e.opts.Self, "engine", "log", "--dir", dir,
		"--max-bytes", strconv.FormatInt(e.opts.LogMaxBytes, 10), "--keep", itoa(e.opts.LogKeep))
	if e.opts.OrphanGrace > 0 {
		// The writer stops the engine once the agent has been gone for
		// the grace (orphan.go).
		lw.Args = append(lw.Args, "--agent-file", filepath.Join(e.enginesDir(), agentFile),
			"--orphan-grace", e.opts.OrphanGrace.String(), "--stop-grace", e.opts.GracePeriod.String())
	}
	lw.Stdin = r
	// A group of its own: a signal to the engine's group does not cut the
	// engine's last words short; it ends when the pipe does.
	lw.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = lw.Start()
	r.Close()
	if err != nil {
		return nil, fmt.Errorf("start the engine's log writer: %w", err)
	}
	logDone := make(chan struct{})
	go func() {
		_ = lw.Wait()
		close(logDone)
	}()
	_, _ = io.WriteString(w, header)
	c.Stdout, c.Stderr = w, w
	b := e.contain.newBox(k)
	p, err := launch(c, b)
	if err != nil {
		fmt.Fprintf(w, "--- gpuplane: start failed: %v\n", err)
		w.Close()
		b.remove(0)
		(&process{logDone: logDone, logPID: lw.Process.Pid}).endLog()
		return nil, err
	}
	p.logDone, p.logPID = logDone, lw.Process.Pid
	return p, nil
}

// launch starts cmd in its own process group (so that the whole engine,
// workers included, can be signalled) and in box, and follows it.
func launch(cmd *exec.Cmd, b *box) (*process, error) {
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	closeFD := b.prepare(cmd)
	err := cmd.Start()
	if err != nil && cmd.SysProcAttr.UseCgroupFD && cmd.Err == nil {
		// A kernel that cannot clone into a cgroup: start it, then move
		// it. An exec.Cmd starts once, even when its Start failed, so the
		// second attempt is a fresh one.
		intoCgroup := err
		cmd = restart(cmd)
		cmd.SysProcAttr.UseCgroupFD, cmd.SysProcAttr.CgroupFD = false, 0
		if err = cmd.Start(); err != nil && err.Error() != intoCgroup.Error() {
			err = fmt.Errorf("%w (and started straight into its cgroup: %v)", err, intoCgroup)
		}
	}
	closeFD()
	if err != nil {
		return nil, err
	}
	b.attach(cmd.Process.Pid)
	p := &process{pid: cmd.Process.Pid, done: make(chan struct{}), box: b}
	go func() {
		err := cmd.Wait()
		p.exit = "exited with status 0"
		if err != nil {
			p.exit = err.Error()
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
					p.exit = "killed by signal " + ws.Signal().String()
				} else {
					p.exit = fmt.Sprintf("exited with status %d", ee.ExitCode())
				}
			}
		}
		close(p.done)
	}()
	return p, nil
}

// restart is a fresh exec.Cmd for another attempt at starting what cmd
// describes (after a failed Start): same program, arguments, environment,
// directory, files and process attributes.
func restart(cmd *exec.Cmd) *exec.Cmd {
	attr := *cmd.SysProcAttr
	return &exec.Cmd{Path: cmd.Path, Args: cmd.Args, Env: cmd.Env, Dir: cmd.Dir,
		Stdin: cmd.Stdin, Stdout: cmd.Stdout, Stderr: cmd.Stderr, ExtraFiles: cmd.ExtraFiles,
		SysProcAttr: &attr, Err: cmd.Err}
}

// adoptProcess finds the process of r again: alive only if the pid still
// names the same process (same start time), a live group leader.
func adoptProcess(r *record) (*process, bool) {
	st, err := procfs.ReadStat(r.PID)
	if err != nil || !st.Alive() || st.StartTime != r.StartTime || st.PGID != r.PID {
		return nil, false
	}
	p := &process{pid: r.PID, done: make(chan struct{}), poll: make(chan struct{}), box: boxOf(r)}
	go func() {
		t := time.NewTicker(250 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-p.poll:
				return
			case <-t.C:
			}
			st, err := procfs.ReadStat(r.PID)
			if err != nil || !st.Alive() || st.StartTime != r.StartTime {
				p.exit = "exited (status unknown: started by a previous agent)"
				close(p.done)
				return
			}
		}
	}()
	return p, true
}

func (p *process) stopPoll() {
	if p.poll != nil {
		p.pollOnce.Do(func() { close(p.poll) })
	}
}

// stop sends SIGTERM to the process group, SIGKILL after grace, and waits
// until the leader is gone; then it kills whatever is left of the engine.
func (p *process) stop(grace time.Duration) {
	_ = syscall.Kill(-p.pid, syscall.SIGTERM)
	t := time.NewTimer(grace)
	defer t.Stop()
	select {
	case <-p.done:
	case <-t.C:
		_ = syscall.Kill(-p.pid, syscall.SIGKILL)
		p.box.kill(p.pid)
		<-p.done
	}
	p.stopPoll()
	p.killStragglers()
}

// killStragglers kills the processes left of an engine whose leader has
// exited (workers it did not take down with it, descendants that left its
// group) and removes its cgroups.
func (p *process) killStragglers() {
	// The group id cannot name another group while any member lives, and
	// the leader, a zombie or reaped, no longer runs code.
	_ = syscall.Kill(-p.pid, syscall.SIGKILL)
	p.box.remove(p.pid)
	p.endLog()
}

// endLog waits until the engine's log writer has written the engine's last
// words and exited, which it does as soon as every process of the engine is
// gone. One that does not (it is not reading: Self is not a gpuplane that
// knows `engine log`) is killed, so that it never outlives its engine.
func (p *process) endLog() {
	if p.logDone == nil {
		return
	}
	t := time.NewTimer(2 * time.Second)
	defer t.Stop()
	select {
	case <-p.logDone:
	case <-t.C:
		_ = syscall.Kill(-p.logPID, syscall.SIGKILL)
		<-p.logDone
	}
}

// killGroupIfLeaderGone kills the group of a recorded engine whose leader
// pid no longer exists at all, so no new process can lead a group by that id.
func killGroupIfLeaderGone(pid int) {
	if _, err := procfs.ReadStat(pid); errors.Is(err, fs.ErrNotExist) {
		_ = syscall.Kill(-pid, syscall.SIGKILL)
	}
}

func itoa(n int) string { return strconv.Itoa(n) }
