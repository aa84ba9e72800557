package procfs

import (
	"bufio"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"strconv"
	"strings"

	promfs "github.com/prometheus/procfs"
)

// tcpListen is the state /proc/net/tcp gives a listening socket.
const tcpListen = "0A"

// TCPListeners returns the inodes of the TCP sockets, IPv4 and IPv6, that
// listen on port in this process's network namespace and would take a
// connection to host: bound to host itself or to the unspecified address.
// A nil host matches every address.
//
// It reads /proc/net/tcp and tcp6 itself: prometheus/procfs's readers of
// them are deprecated (in favour of netlink's sock_diag), and the format is
// a stable kernel interface of a few fields.
func TCPListeners(port int, host net.IP) (map[uint64]bool, error) {
	out := map[uint64]bool{}
	for _, file := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		err := listeners(file, port, host, out)
		if file == "/proc/net/tcp6" && errors.Is(err, fs.ErrNotExist) {
			break // a kernel without IPv6
		}
		if err != nil {
			return nil, err
		}
	}
	return out, nil
}

// listeners adds the inodes of file's matching listeners to out. A line is
// "sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout
// inode ...", addresses as hex words and a hex port (ADDR:PORT).
func listeners(file string, port int, host net.IP, out map[uint64]bool) error {
	f, err := os.Open(file)
	if err != nil {
		return err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	sc.Scan() // the header
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		if len(fields) < 10 || fields[3] != tcpListen {
			continue
		}
		addr, p, ok := strings.Cut(fields[1], ":")
		if !ok {
			return fmt.Errorf("%s: local address %q", file, fields[1])
		}
		if n, err := strconv.ParseUint(p, 16, 16); err != nil || int(n) != port {
			continue
		}
		ip, err := procIP(addr)
		if err != nil {
			return fmt.Errorf("%s: local address %q: %w", file, fields[1], err)
		}
		inode, err := strconv.ParseUint(fields[9], 10, 64)
		if err != nil {
			return fmt.Errorf("%s: inode %q: %w", file, fields[9], err)
		}
		if host == nil || ip.IsUnspecified() || ip.Equal(host) {
			out[inode] = true
		}
	}
	return sc.Err()
}

// procIP decodes an address of /proc/net/tcp{,6}: 32-bit words, each
// printed as a number in hex, stored in host byte order.
func procIP(s string) (net.IP, error) {
	b, err := hex.DecodeString(s)
	if err != nil || (len(b) != net.IPv4len && len(b) != net.IPv6len) {
		return nil, fmt.Errorf("not an address")
	}
	ip := make(net.IP, len(b))
	for i := 0; i < len(b); i += 4 {
		binary.NativeEndian.PutUint32(ip[i:], binary.BigEndian.Uint32(b[i:]))
	}
	return ip, nil
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
