//go:build linux

package jepsen

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Ports every agent uses inside its own namespace.
const (
	apiPort    = 7410
	raftPort   = 7411
	gossipPort = 7412
	// Servers' Raft traffic goes through hostIP:proxyPortBase+i for server i.
	proxyPortBase = 17010
	// A hollow process's node j serves its API on hollowAPIPort+j and
	// gossips on hollowGossipPort+j (`gpuplane agent --hollow N` with
	// fixed base ports).
	hollowAPIPort    = 20000
	hollowGossipPort = hollowAPIPort + maxHollowNodes
)

// Agent is one `gpuplane agent` process in its namespace: a server, a
// client, or (Hollow > 0) a `gpuplane agent --hollow N` process running N
// hollow client nodes named Name-0000, Name-0001, ...
type Agent struct {
	Name    string
	Index   int // 1-based: the address is nodeIP(Index)
	Server  bool
	Hollow  int
	DataDir string
	LogPath string

	bin  string
	join []string
	// extra are more flags for every agent (Config.RequestWindow's).
	extra []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	done   chan struct{}
	paused bool
	starts int
}

// IP is the agent's address on the test subnet.
func (a *Agent) IP() string { return nodeIP(a.Index) }

// APIURL is the base URL of the agent's API (a hollow process's first
// node's).
func (a *Agent) APIURL() string {
	if a.Hollow > 0 {
		return fmt.Sprintf("http://%s:%d", a.IP(), hollowAPIPort)
	}
	return fmt.Sprintf("http://%s:%d", a.IP(), apiPort)
}

// Nodes are the names of the cluster nodes the process runs: its own, or
// its hollow nodes'.
func (a *Agent) Nodes() []string {
	if a.Hollow == 0 {
		return []string{a.Name}
	}
	out := make([]string, a.Hollow)
	for j := range out {
		out[j] = fmt.Sprintf("%s-%04d", a.Name, j)
	}
	return out
}

func (a *Agent) args() []string {
	if a.Hollow > 0 {
		args := []string{"netns", "exec", netnsName(a.Name), a.bin, "agent",
			"--hollow", strconv.Itoa(a.Hollow), "--node-name", a.Name, "--data-dir", a.DataDir,
			"--bind", a.IP(), "--advertise", a.IP(),
			"--api-port", strconv.Itoa(hollowAPIPort), "--gossip-port", strconv.Itoa(hollowGossipPort),
			"--join", strings.Join(a.join, ","),
			"--sim-gpus", "l4=2", "--log-level", "info",
		}
		return append(args, a.extra...)
	}
	args := []string{"netns", "exec", netnsName(a.Name), a.bin, "agent",
		"--node-name", a.Name, "--data-dir", a.DataDir,
		"--bind", a.IP(), "--advertise", a.IP(),
		"--api-port", strconv.Itoa(apiPort), "--raft-port", strconv.Itoa(raftPort), "--gossip-port", strconv.Itoa(gossipPort), "--gateway-port", "0",
		"--join", strings.Join(a.join, ","),
		"--sim-gpus", "l4=2", "--log-level", "info",
	}
	if a.Server {
		args = append(args, "--server", "--bootstrap-expect", "3")
	}
	return append(args, a.extra...)
}

// Start starts the agent (again, after Kill) with the same data dir. `ip
// netns exec` execs the agent, so the process is the agent itself.
func (a *Agent) Start() error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd != nil {
		return fmt.Errorf("agent %s is already running", a.Name)
	}
	if err := os.MkdirAll(a.DataDir, 0o700); err != nil {
		return err
	}
	logf, err := os.OpenFile(a.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	a.starts++
	fmt.Fprintf(logf, "\n===== jepsen: start #%d at %s\n", a.starts, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command("ip", a.args()...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// The agent dies with the test process, whatever kills it.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		logf.Close()
		return fmt.Errorf("start agent %s: %w", a.Name, err)
	}
	done := make(chan struct{})
	a.cmd, a.done, a.paused = cmd, done, false
	go func() {
		cmd.Wait()
		logf.Close()
		close(done)
	}()
	return nil
}

// Running reports whether the process is up (paused counts as up).
func (a *Agent) Running() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.cmd != nil
}

// Paused reports whether the process is stopped with SIGSTOP.
func (a *Agent) Paused() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.paused
}

// Kill sends SIGKILL (after SIGCONT, so a paused agent dies too) and waits
// for the process to exit.
func (a *Agent) Kill() { a.stop(syscall.SIGKILL, 10*time.Second) }

// Stop asks the agent to shut down (SIGTERM) and kills it after timeout.
func (a *Agent) Stop(timeout time.Duration) { a.stop(syscall.SIGTERM, timeout) }

func (a *Agent) stop(sig syscall.Signal, timeout time.Duration) {
	a.mu.Lock()
	cmd, done := a.cmd, a.done
	a.mu.Unlock()
	if cmd == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGCONT)
	cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(timeout):
		cmd.Process.Kill()
		<-done
	}
	a.mu.Lock()
	a.cmd, a.paused = nil, false
	a.mu.Unlock()
}

// Pause stops the process with SIGSTOP; Resume continues it.
func (a *Agent) Pause() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd != nil && !a.paused {
		a.cmd.Process.Signal(syscall.SIGSTOP)
		a.paused = true
	}
}

// Resume continues a paused agent.
func (a *Agent) Resume() {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.cmd != nil && a.paused {
		a.cmd.Process.Signal(syscall.SIGCONT)
		a.paused = false
	}
}

// Wipe removes the agent's data dir (the agent must be down): it comes back
// as a new server.
func (a *Agent) Wipe() error {
	if a.Running() {
		return fmt.Errorf("wipe %s: still running", a.Name)
	}
	return os.RemoveAll(a.DataDir)
}

func newAgent(bin, dir string, index int, name string, server bool, join []string) *Agent {
	return &Agent{
		Name: name, Index: index, Server: server,
		DataDir: filepath.Join(dir, "data", name),
		LogPath: filepath.Join(dir, name+".log"),
		bin:     bin, join: join,
	}
}
