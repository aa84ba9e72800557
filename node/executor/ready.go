package executor

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/gpuplane/gpuplane/node/procfs"
)

// probeTimeout bounds one readiness or health probe.
const probeTimeout = 2 * time.Second

// probe asks whether the engine serves: a GET of its health path answering
// 200 when its kind has one, else a TCP connection its port accepts (a
// command engine: a live process that listens nowhere serves nothing), and
// then whether what answered is the engine (portHolder). It returns "" when
// the engine serves, else what it found, for the replica's reason.
func (s *supervisor) probe() string {
	if found := s.ask(); found != "" {
		return found
	}
	return s.portHolder()
}

// ask is probe's request to the engine's port.
func (s *supervisor) ask() string {
	addr := net.JoinHostPort(s.probeHost(), itoa(s.port))
	if s.health == "" {
		conn, err := net.DialTimeout("tcp", addr, probeTimeout)
		if err != nil {
			return fmt.Sprintf("nothing listened on port %d", s.port)
		}
		conn.Close()
		return ""
	}
	resp, err := s.client.Get("http://" + addr + s.health)
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Sprintf("nothing listened on port %d", s.port)
	case err != nil:
		return fmt.Sprintf("GET %s on port %d: %v", s.health, s.port, err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Sprintf("GET %s on port %d answered %s", s.health, s.port, resp.Status)
	}
	return ""
}

// probeHost is where the agent reaches an engine bound to BindHost.
func (s *supervisor) probeHost() string {
	host := listenHost(s.e.opts.BindHost)
	if ip := net.ParseIP(host); ip != nil && ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	return host
}

// exited says the engine's process has ended, even before the goroutine
// that waits for it has closed done: a health answer must not make an
// engine that has already exited Running (something else, such as a child
// it left, may answer on its port).
func (p *process) exited() bool {
	select {
	case <-p.done:
		return true
	default:
	}
	st, err := procfs.ReadStat(p.pid)
	return err != nil || !st.Alive()
}

// portHolder says whether the socket listening on the engine's port is the
// engine's: held by its process or one of its descendants (in its
// cgroups, its process group, or carrying its engine id). Another process
// may hold the port the engine was told to listen on: another agent's
// engine on this host, handed the same port before either listened, or a
// program the user started. Its health answer must not make this engine
// Running. It returns "" when the engine holds the port (or when that
// cannot be told: /proc/net unreadable, or an engine process whose open
// files this agent may not read), else what holds it.
func (s *supervisor) portHolder() string {
	listeners, err := procfs.TCPListeners(s.port, net.ParseIP(s.probeHost()))
	if err != nil {
		return ""
	}
	if len(listeners) == 0 {
		// It stopped listening since it answered.
		return fmt.Sprintf("nothing listened on port %d", s.port)
	}
	held, err := procfs.HoldsSocket(s.proc.pid, listeners)
	if held || errors.Is(err, fs.ErrPermission) {
		return ""
	}
	for _, pid := range s.proc.others() {
		held, err := procfs.HoldsSocket(pid, listeners)
		if held || errors.Is(err, fs.ErrPermission) {
			return ""
		}
	}
	for _, pid := range allPIDs() {
		if held, _ := procfs.HoldsSocket(pid, listeners); held {
			return fmt.Sprintf("port %d is held by pid %d (%s), not by the engine", s.port, pid, procfs.Comm(pid))
		}
	}
	return fmt.Sprintf("port %d is held by a process that is not the engine", s.port)
}

// others lists the engine's live processes but its leader: the rest of its
// box, its process group and the processes carrying its engine id.
func (p *process) others() []int {
	var out []int
	seen := map[int]bool{p.pid: true}
	add := func(pid int) {
		if !seen[pid] {
			seen[pid] = true
			out = append(out, pid)
		}
	}
	for _, pid := range p.box.procs() {
		add(pid)
	}
	for _, pid := range allPIDs() {
		if st, err := procfs.ReadStat(pid); err == nil && st.PGID == p.pid && st.Alive() {
			add(pid)
		}
	}
	for _, pid := range p.box.marked() {
		add(pid)
	}
	return out
}

// allPIDs lists the processes in /proc.
func allPIDs() []int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	out := make([]int, 0, len(dirs))
	for _, d := range dirs {
		if pid, err := strconv.Atoi(filepath.Base(d)); err == nil {
			out = append(out, pid)
		}
	}
	return out
}
