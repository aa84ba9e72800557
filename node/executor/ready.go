package executor

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/gpuplane/gpuplane/node/engine"
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
	return s.preloadOnce(addr)
}

// preloadOnce runs the engine's preload (engine.Command.Preload) once per
// start, bounded by the start deadline: an engine that answers its health
// path before its model is loaded (Ollama) is ready only once the preload
// loaded it. The preload runs off the supervisor's loop, which meanwhile
// answers stops, crashes and changes; each check asks how it went. It
// returns "" once done, else what the preload is doing or why it failed
// (run again at the next check). A failure no retry mends
// (*engine.StartError) is left in s.fatal, for check to fail the start.
func (s *supervisor) preloadOnce(addr string) string {
	if s.preload == nil || s.preloaded {
		return ""
	}
	p := s.preload
	if s.preloading == nil {
		ctx, cancel := context.WithDeadline(s.ctx, s.startedAt.Add(s.timeout))
		run := &preloadRun{done: make(chan struct{}), cancel: cancel}
		s.preloading = run
		port := s.port
		go func() {
			defer close(run.done)
			defer cancel()
			err := p.Run(ctx, "http://"+addr, run.setStatus)
			var se *engine.StartError
			switch {
			case errors.As(err, &se):
				// It says what is wrong and how to mend it.
				run.err, run.fatal = se.Reason, true
			case err != nil:
				run.err = fmt.Sprintf("preload on port %d (%s): %v", port, p, err)
			}
		}()
	}
	select {
	case <-s.preloading.done:
	default:
		return fmt.Sprintf("preloading its model on port %d: %s", s.port, s.preloading.status())
	}
	run := s.preloading
	s.preloading = nil
	if run.err != "" {
		if run.fatal {
			s.fatal = run.err
		}
		return run.err
	}
	s.preloaded = true
	return ""
}

// preloadRun is a preload in flight; err and fatal are set before done
// closes.
type preloadRun struct {
	done   chan struct{}
	cancel context.CancelFunc
	err    string
	fatal  bool

	mu   sync.Mutex
	step string
}

func (r *preloadRun) setStatus(step string) {
	r.mu.Lock()
	r.step = step
	r.mu.Unlock()
}

func (r *preloadRun) status() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.step == "" {
		return "starting"
	}
	return r.step
}

// stopPreload abandons a preload in flight (its engine stopped).
func (s *supervisor) stopPreload() {
	if s.preloading != nil {
		s.preloading.cancel()
		s.preloading = nil
	}
}

// probeHost is where the agent reaches an engine bound to BindHost.
func (s *supervisor) probeHost() string { return s.e.localHost() }

// localHost is where the agent reaches an engine bound to BindHost.
func (e *Executor) localHost() string {
	host := listenHost(e.opts.BindHost)
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
	// The leader first (it listens in most engines), then the rest of
	// the engine, cheapest to list first: its cgroups, its process group,
	// the processes carrying its engine id.
	seen := map[int]bool{}
	for _, list := range []func() []int{func() []int { return []int{s.proc.pid} }, s.proc.box.procs, s.proc.group, s.proc.box.marked} {
		for _, pid := range list() {
			if seen[pid] {
				continue
			}
			seen[pid] = true
			held, err := procfs.HoldsSocket(pid, listeners)
			if held || errors.Is(err, fs.ErrPermission) {
				return ""
			}
		}
	}
	for _, pid := range allPIDs() {
		if held, _ := procfs.HoldsSocket(pid, listeners); held {
			return fmt.Sprintf("port %d is held by pid %d (%s), not by the engine", s.port, pid, procfs.Comm(pid))
		}
	}
	return fmt.Sprintf("port %d is held by a process that is not the engine", s.port)
}

// group lists the live processes of the engine's process group.
func (p *process) group() []int {
	var out []int
	for _, pid := range allPIDs() {
		if st, err := procfs.ReadStat(pid); err == nil && st.PGID == p.pid && st.Alive() {
			out = append(out, pid)
		}
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
