package porttest

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// TestFreeNeverRepeats checks that ports are unique within a process, below
// the ephemeral range, and bindable.
func TestFreeNeverRepeats(t *testing.T) {
	seen := map[int]bool{}
	for range 200 {
		p := Free(t)
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
		if p < low || p >= high {
			t.Fatalf("port %d outside [%d, %d)", p, low, high)
		}
	}
}

// TestFreeAcrossProcesses checks that a port held by this process is never
// handed to another: a child test binary asks for many ports while this one
// holds many.
func TestFreeAcrossProcesses(t *testing.T) {
	if os.Getenv("PORTTEST_CHILD") == "1" {
		var out []string
		for range 300 {
			out = append(out, strconv.Itoa(Free(t)))
		}
		os.Stdout.WriteString("PORTS " + strings.Join(out, ",") + "\n")
		return
	}
	mine := map[string]bool{}
	for range 300 {
		mine[strconv.Itoa(Free(t))] = true
	}
	cmd := exec.Command(os.Args[0], "-test.run", "^TestFreeAcrossProcesses$", "-test.count=1")
	cmd.Env = append(os.Environ(), "PORTTEST_CHILD=1")
	b, err := cmd.Output()
	if err != nil {
		t.Fatalf("child: %v\n%s", err, b)
	}
	i := strings.Index(string(b), "PORTS ")
	if i < 0 {
		t.Fatalf("child printed no ports:\n%s", b)
	}
	line := strings.Fields(string(b)[i+len("PORTS "):])[0]
	for _, p := range strings.Split(line, ",") {
		if mine[p] {
			t.Fatalf("port %s held by this process was handed to the child", p)
		}
	}
}
