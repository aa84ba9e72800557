package executor

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/gpuplane/gpuplane/node/procfs"
)

// probeTimeout bounds one readiness or health probe.
const probeTimeout = 2 * time.Second

// probe asks whether the engine serves: a GET of its health path answering
// 200 when its kind has one, else a TCP connection its port accepts (a
// command engine: a live process that listens nowhere serves nothing). It
// returns "" when the engine serves, else what it found, for the replica's
// reason.
func (s *supervisor) probe() string {
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
