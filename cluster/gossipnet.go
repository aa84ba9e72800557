package cluster

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	sockaddr "github.com/hashicorp/go-sockaddr"
	"github.com/hashicorp/memberlist"
)

// gossipNet is memberlist's transport: a TCP listener and a UDP socket on
// one port, as memberlist's own NetTransport (v0.6.0), with one
// difference. NetTransport reads every UDP packet into a fresh 64 KiB
// buffer and hands that buffer on, so each gossip packet of a few hundred
// bytes allocates 64 KiB: with hundreds of members in one process (a
// hollow fleet) garbage collection becomes the largest part of gossip's
// CPU. gossipNet reads into one buffer and hands on a copy of the packet's
// own size.
type gossipNet struct {
	tcp  *net.TCPListener
	udp  *net.UDPConn
	bind string // the address bound, as given

	packetCh chan *memberlist.Packet
	streamCh chan net.Conn
	shutdown atomic.Bool
	wg       sync.WaitGroup
	logf     func(format string, args ...any)
}

var _ memberlist.NodeAwareTransport = (*gossipNet)(nil)

// udpRecvBuffer is the UDP socket's receive buffer asked of the kernel (as
// NetTransport's): bursts of gossip are dropped, not queued, past it.
const udpRecvBuffer = 2 * 1024 * 1024

// maxUDPPacket is the largest UDP payload.
const maxUDPPacket = 65536

// newGossipNet binds host:port for TCP and UDP. Port 0 picks a port free
// for both, retrying as NetTransport does when the UDP port is taken.
func newGossipNet(host string, port int, logf func(string, ...any)) (*gossipNet, error) {
	ip := net.ParseIP(host)
	if ip == nil {
		return nil, fmt.Errorf("gossip bind address %q is not an IP address", host)
	}
	tries := 1
	if port == 0 {
		tries = 10
	}
	var err error
	for range tries {
		var t *gossipNet
		if t, err = listenGossip(ip, port); err == nil {
			t.bind, t.logf = host, logf
			t.wg.Add(2)
			go t.acceptTCP()
			go t.readUDP()
			return t, nil
		}
		if !strings.Contains(err.Error(), "address already in use") {
			break
		}
	}
	return nil, err
}

func listenGossip(ip net.IP, port int) (*gossipNet, error) {
	tcp, err := net.ListenTCP("tcp", &net.TCPAddr{IP: ip, Port: port})
	if err != nil {
		return nil, fmt.Errorf("gossip TCP listener on %s port %d: %w", ip, port, err)
	}
	port = tcp.Addr().(*net.TCPAddr).Port
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: ip, Port: port})
	if err != nil {
		tcp.Close()
		return nil, fmt.Errorf("gossip UDP listener on %s port %d: %w", ip, port, err)
	}
	for size := udpRecvBuffer; size > 0; size /= 2 {
		if err = udp.SetReadBuffer(size); err == nil {
			break
		}
	}
	if err != nil {
		tcp.Close()
		udp.Close()
		return nil, fmt.Errorf("gossip UDP receive buffer: %w", err)
	}
	return &gossipNet{tcp: tcp, udp: udp, packetCh: make(chan *memberlist.Packet), streamCh: make(chan net.Conn)}, nil
}

// Port is the port bound (the one picked when 0 was asked).
func (t *gossipNet) Port() int { return t.tcp.Addr().(*net.TCPAddr).Port }

// FinalAdvertiseAddr is NetTransport's: the given address, or the bound
// one, or for an unspecified bind the host's private IP.
func (t *gossipNet) FinalAdvertiseAddr(ip string, port int) (net.IP, int, error) {
	if port == 0 {
		port = t.Port()
	}
	if ip == "" {
		if t.bind != "0.0.0.0" && t.bind != "::" {
			return t.tcp.Addr().(*net.TCPAddr).IP, t.Port(), nil
		}
		private, err := sockaddr.GetPrivateIP()
		if err != nil {
			return nil, 0, fmt.Errorf("gossip advertise address: interface addresses: %w", err)
		}
		if private == "" {
			return nil, 0, errors.New("gossip advertise address: no private IP address found; give one (--advertise)")
		}
		ip = private
	}
	addr := net.ParseIP(ip)
	if addr == nil {
		return nil, 0, fmt.Errorf("gossip advertise address %q is not an IP address", ip)
	}
	if ip4 := addr.To4(); ip4 != nil {
		addr = ip4
	}
	return addr, port, nil
}

func (t *gossipNet) WriteTo(b []byte, addr string) (time.Time, error) {
	return t.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress sends one packet. Peers' addresses are IP:port (memberlist
// gossips them so), parsed without a resolver's allocations.
func (t *gossipNet) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	if ap, err := netip.ParseAddrPort(a.Addr); err == nil {
		_, err = t.udp.WriteToUDPAddrPort(b, ap)
		return time.Now(), err
	}
	ua, err := net.ResolveUDPAddr("udp", a.Addr)
	if err != nil {
		return time.Time{}, err
	}
	_, err = t.udp.WriteTo(b, ua)
	return time.Now(), err
}

func (t *gossipNet) PacketCh() <-chan *memberlist.Packet { return t.packetCh }

func (t *gossipNet) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return t.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (t *gossipNet) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	d := net.Dialer{Timeout: timeout}
	return d.Dial("tcp", a.Addr)
}

func (t *gossipNet) StreamCh() <-chan net.Conn { return t.streamCh }

func (t *gossipNet) Shutdown() error {
	t.shutdown.Store(true)
	t.tcp.Close()
	t.udp.Close()
	t.wg.Wait()
	return nil
}

// acceptTCP hands accepted connections to memberlist, backing off on
// errors (5 ms doubling to 1 s) as NetTransport does.
func (t *gossipNet) acceptTCP() {
	defer t.wg.Done()
	var delay time.Duration
	for {
		conn, err := t.tcp.AcceptTCP()
		if err != nil {
			if t.shutdown.Load() {
				return
			}
			delay = min(max(2*delay, 5*time.Millisecond), time.Second)
			t.logf("[ERR] memberlist: Error accepting TCP connection: %v", err)
			time.Sleep(delay)
			continue
		}
		delay = 0
		t.streamCh <- conn
	}
}

// readUDP hands each packet to memberlist in a buffer of its own size:
// memberlist keeps the buffer (it may queue the message to handle later),
// so the read buffer itself is never handed on.
func (t *gossipNet) readUDP() {
	defer t.wg.Done()
	buf := make([]byte, maxUDPPacket)
	for {
		n, ap, err := t.udp.ReadFromUDPAddrPort(buf)
		ts := time.Now()
		if err != nil {
			if t.shutdown.Load() {
				return
			}
			t.logf("[ERR] memberlist: Error reading UDP packet: %v", err)
			continue
		}
		if n < 1 {
			continue
		}
		t.packetCh <- &memberlist.Packet{
			Buf:       append([]byte(nil), buf[:n]...),
			From:      net.UDPAddrFromAddrPort(netip.AddrPortFrom(ap.Addr().Unmap(), ap.Port())),
			Timestamp: ts,
		}
	}
}
