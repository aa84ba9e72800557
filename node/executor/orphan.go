package executor

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"github.com/gpuplane/gpuplane/node/procfs"
)

// Engines outlive a killed agent so that a restarted one adopts them (see
// doc.go), but not indefinitely: each engine's log writer, the one process
// of it that is not the engine's own, watches the agent's mark (agentFile,
// the running agent's pid and process start time) and, once no live agent
// has held it for the orphan grace, stops the engine as the agent would
// (SIGTERM to its group, SIGKILL after the grace period, then everything
// left in its box). An agent restarted within the grace writes its own mark
// and adopts the engine as before.

// agentFile is the agent's mark in the engines directory.
const agentFile = "agent.json"

// DefaultOrphanGrace is how long an engine outlives its agent by default.
const DefaultOrphanGrace = time.Minute

// agentMark is agent.json: which process is the node's agent.
type agentMark struct {
	PID       int    `json:"pid"`
	StartTime uint64 `json:"start_time"`
}

// markAgent records this process as the agent that owns the engines under
// dir, replacing any mark of a previous agent.
func markAgent(dir string) error {
	st, err := procfs.ReadStat(os.Getpid())
	if err != nil {
		return fmt.Errorf("mark the agent: %w", err)
	}
	data, err := json.Marshal(agentMark{PID: st.PID, StartTime: st.StartTime})
	if err != nil {
		return err
	}
	path := filepath.Join(dir, agentFile)
	tmp := path + ".tmp"
	err = os.WriteFile(tmp, append(data, '\n'), 0o644)
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err == nil {
		return nil
	}
	_ = os.Remove(tmp)
	// A full disk has no room for a new file, but the previous agent's
	// mark has its own: written over in place, it needs no more.
	if inPlace(path, data) == nil {
		return nil
	}
	return fmt.Errorf("mark the agent: write %s: %w", path, err)
}

// inPlace writes a mark over the one at path without growing or replacing
// the file: a shorter mark is padded with spaces, which JSON ignores.
func inPlace(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY, 0)
	if err != nil {
		return err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return err
	}
	line := append([]byte(nil), data...)
	for int64(len(line)+1) < st.Size() {
		line = append(line, ' ')
	}
	line = append(line, '\n')
	if _, err := f.WriteAt(line, 0); err != nil {
		return err
	}
	return f.Sync()
}

// agentAlive says whether the process path names is still running: the same
// pid with the same start time. A missing or unreadable mark is no agent.
func agentAlive(path string) bool {
	data, err := os.ReadFile(path)
	if err != nil {
		return false
	}
	var m agentMark
	if json.Unmarshal(data, &m) != nil || m.PID <= 0 {
		return false
	}
	st, err := procfs.ReadStat(m.PID)
	return err == nil && st.Alive() && st.StartTime == m.StartTime
}

// OrphanWatch is what a log writer needs to stop its engine once the agent
// is gone: the agent's mark, how long to wait for an agent, and the grace
// between SIGTERM and SIGKILL.
type OrphanWatch struct {
	AgentFile string
	Grace     time.Duration
	StopGrace time.Duration
}

// watchOrphan polls the agent's mark until done is closed. Once no live
// agent has held it for w.Grace, it stops the engine recorded in dir
// (pid.json), saying so in the engine's log through say, and returns.
func watchOrphan(w OrphanWatch, dir string, done <-chan struct{}, say func(string)) {
	poll := min(time.Second, max(w.Grace/10, 10*time.Millisecond))
	t := time.NewTicker(poll)
	defer t.Stop()
	var goneSince time.Time
	for {
		select {
		case <-done:
			return
		case <-t.C:
		}
		if agentAlive(w.AgentFile) {
			goneSince = time.Time{}
			continue
		}
		if goneSince.IsZero() {
			goneSince = time.Now()
		}
		if time.Since(goneSince) >= w.Grace {
			stopOrphan(dir, w, say)
			return
		}
	}
}

// stopOrphan stops the engine recorded in dir if it is still the process
// the record names.
func stopOrphan(dir string, w OrphanWatch, say func(string)) {
	data, err := os.ReadFile(filepath.Join(dir, pidFile))
	if err != nil {
		return
	}
	r := &record{}
	if json.Unmarshal(data, r) != nil || r.PID <= 0 {
		return
	}
	st, err := procfs.ReadStat(r.PID)
	if err != nil || !st.Alive() || st.StartTime != r.StartTime || st.PGID != r.PID {
		return
	}
	say(fmt.Sprintf("--- gpuplane: no agent has run for %s (the orphan grace): stopping the engine (pid %d)\n", w.Grace, r.PID))
	_ = syscall.Kill(-r.PID, syscall.SIGTERM)
	deadline := time.Now().Add(w.StopGrace)
	for time.Now().Before(deadline) {
		if st, err := procfs.ReadStat(r.PID); err != nil || !st.Alive() || st.StartTime != r.StartTime {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	// The group id cannot name another group while any member lives.
	_ = syscall.Kill(-r.PID, syscall.SIGKILL)
	boxOf(r).remove(r.PID)
}
