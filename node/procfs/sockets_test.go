package procfs

import (
	"net"
	"os"
	"os/exec"
	"testing"
)

func TestListenerHolders(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port
	lo := net.ParseIP("127.0.0.1")
	inodes, err := TCPListeners(port, lo)
	if err != nil || len(inodes) != 1 {
		t.Fatalf("TCPListeners(%d, 127.0.0.1) = %v, %v; want this test's listener", port, inodes, err)
	}
	if other, err := TCPListeners(port, net.ParseIP("127.0.0.2")); err != nil || len(other) != 0 {
		t.Errorf("TCPListeners(%d, 127.0.0.2) = %v, %v; want none (the listener is bound to 127.0.0.1)", port, other, err)
	}
	if held, err := HoldsSocket(os.Getpid(), inodes); !held || err != nil {
		t.Errorf("HoldsSocket(self) = %t, %v; want true", held, err)
	}
	child := exec.Command("sleep", "60")
	if err := child.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = child.Process.Kill(); _ = child.Wait() }()
	if held, err := HoldsSocket(child.Process.Pid, inodes); held || err != nil {
		t.Errorf("HoldsSocket(a child without the socket) = %t, %v; want false", held, err)
	}

	// A listener on every address takes connections to 127.0.0.1 too.
	wild, err := net.Listen("tcp", ":0")
	if err != nil {
		t.Fatal(err)
	}
	defer wild.Close()
	port = wild.Addr().(*net.TCPAddr).Port
	if inodes, err := TCPListeners(port, lo); err != nil || len(inodes) != 1 {
		t.Errorf("TCPListeners(%d, 127.0.0.1) of a wildcard listener = %v, %v; want it", port, inodes, err)
	}
	// An IPv6 address is decoded too (where the host has IPv6).
	if v6, err := net.Listen("tcp", "[::1]:0"); err == nil {
		defer v6.Close()
		port = v6.Addr().(*net.TCPAddr).Port
		if inodes, err := TCPListeners(port, net.IPv6loopback); err != nil || len(inodes) != 1 {
			t.Errorf("TCPListeners(%d, ::1) = %v, %v; want the [::1] listener", port, inodes, err)
		}
		if inodes, err := TCPListeners(port, lo); err != nil || len(inodes) != 0 {
			t.Errorf("TCPListeners(%d, 127.0.0.1) of a [::1] listener = %v, %v; want none", port, inodes, err)
		}
	}
	if Comm(os.Getpid()) != "procfs.test" {
		t.Errorf("Comm(self) = %q, want procfs.test", Comm(os.Getpid()))
	}
}
