package procfs

import (
	"errors"
	"io/fs"
	"net"
	"strconv"
	"strings"

	promfs "github.com/prometheus/procfs"
)

// tcpListen is the state /proc/net/tcp gives a listening socket.
const tcpListen = 0x0A

// TCPListeners returns the inodes of the TCP sockets, IPv4 and IPv6, that
// listen on port in this process's network namespace and would take a
// connection to host: bound to host itself or to the unspecified address.
// A nil host matches every address.
func TCPListeners(port int, host net.IP) (map[uint64]bool, error) {
	pfs, err := promfs.NewDefaultFS()
	if err != nil {
		return nil, err
	}
	out := map[uint64]bool{}
	for i, read := range []func() (promfs.NetTCP, error){pfs.NetTCP, pfs.NetTCP6} {
		lines, err := read()
		if i == 1 && errors.Is(err, fs.ErrNotExist) {
			break // a kernel without IPv6
		}
		if err != nil {
			return nil, err
		}
		for _, l := range lines {
			if l.St != tcpListen || l.LocalPort != uint64(port) {
				continue
			}
			if host == nil || l.LocalAddr.IsUnspecified() || l.LocalAddr.Equal(host) {
				out[l.Inode] = true
			}
		}
	}
	return out, nil
}

// HoldsSocket says whether process pid has one of the sockets open.
func HoldsSocket(pid int, inodes map[uint64]bool) (bool, error) {
	p, err := promfs.NewProc(pid)
	if err != nil {
		return false, err
	}
	targets, err := p.FileDescriptorTargets()
	if err != nil {
		return false, err
	}
	for _, t := range targets {
		s, ok := strings.CutPrefix(t, "socket:[")
		if !ok {
			continue
		}
		if n, err := strconv.ParseUint(strings.TrimSuffix(s, "]"), 10, 64); err == nil && inodes[n] {
			return true, nil
		}
	}
	return false, nil
}

// Comm is the process's command name (/proc/PID/comm), "" if unknown.
func Comm(pid int) string {
	p, err := promfs.NewProc(pid)
	if err != nil {
		return ""
	}
	c, _ := p.Comm()
	return c
}
