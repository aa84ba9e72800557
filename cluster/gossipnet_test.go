package cluster

import (
	"bytes"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/hashicorp/memberlist"
)

// TestGossipNetPacketsKeepTheirBytes checks what memberlist relies on when
// it queues a message to handle later: each packet handed on holds its own
// bytes, not the transport's read buffer (a later packet must not change an
// earlier one), and no more than the packet's size.
func TestGossipNetPacketsKeepTheirBytes(t *testing.T) {
	a, err := newGossipNet("127.0.0.1", 0, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown()
	b, err := newGossipNet("127.0.0.1", 0, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Shutdown()
	to := memberlist.Address{Addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(a.Port()))}
	first, second := bytes.Repeat([]byte{'a'}, 300), bytes.Repeat([]byte{'b'}, 200)
	for _, msg := range [][]byte{first, second} {
		if _, err := b.WriteToAddress(msg, to); err != nil {
			t.Fatal(err)
		}
	}
	var got []*memberlist.Packet
	for len(got) < 2 {
		select {
		case p := <-a.PacketCh():
			got = append(got, p)
		case <-time.After(10 * time.Second):
			t.Fatalf("%d of 2 packets arrived", len(got))
		}
	}
	if !bytes.Equal(got[0].Buf, first) || !bytes.Equal(got[1].Buf, second) {
		t.Fatalf("packets changed: %q / %q", got[0].Buf[:10], got[1].Buf[:10])
	}
	if cap(got[0].Buf) > 512 {
		t.Errorf("a 300-byte packet holds a %d-byte buffer", cap(got[0].Buf))
	}
	if from := got[0].From.String(); from != net.JoinHostPort("127.0.0.1", strconv.Itoa(b.Port())) {
		t.Errorf("from %s, want b's address", from)
	}
}

// TestGossipNetBindsOnePortForBoth checks that port 0 picks one port for
// TCP and UDP (memberlist dials and sends to the same advertised port),
// streams arrive, and the advertised address is the bound one.
func TestGossipNetBindsOnePortForBoth(t *testing.T) {
	tr, err := newGossipNet("127.0.0.1", 0, t.Logf)
	if err != nil {
		t.Fatal(err)
	}
	defer tr.Shutdown()
	if udp := tr.udp.LocalAddr().(*net.UDPAddr).Port; udp != tr.Port() {
		t.Fatalf("UDP on %d, TCP on %d", udp, tr.Port())
	}
	ip, port, err := tr.FinalAdvertiseAddr("", 0)
	if err != nil || !ip.Equal(net.IPv4(127, 0, 0, 1)) || port != tr.Port() {
		t.Fatalf("advertise: %v %d %v", ip, port, err)
	}
	if _, _, err := tr.FinalAdvertiseAddr("not-an-ip", 1); err == nil {
		t.Fatal("advertise address not-an-ip: no error")
	}
	c, err := tr.DialTimeout(net.JoinHostPort("127.0.0.1", strconv.Itoa(tr.Port())), 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case s := <-tr.StreamCh():
		s.Close()
	case <-time.After(10 * time.Second):
		t.Fatal("no stream")
	}
	if _, err := newGossipNet("127.0.0.1", tr.Port(), t.Logf); err == nil {
		t.Fatal("a second transport bound the same port")
	}
}
