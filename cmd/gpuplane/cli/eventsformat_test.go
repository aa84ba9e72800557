package cli

import (
	"context"
	"regexp"
	"strings"
	"testing"
	"time"
)

// resultColumn is where each line's RESULT column starts: the header's
// "RESULT", a row's "applied" or "rejected".
func resultColumn(line string) int {
	for _, w := range []string{" RESULT", " applied", " rejected"} {
		if i := strings.LastIndex(line, w); i >= 0 {
			return i + 1
		}
	}
	return -1
}

// checkAligned fails unless every line of out starts its RESULT column
// where the header does.
func checkAligned(t *testing.T, what, out string) {
	t.Helper()
	lines := strings.Split(strings.TrimSpace(out), "\n")
	if len(lines) < 3 {
		t.Fatalf("%s: %d lines:\n%s", what, len(lines), out)
	}
	want := resultColumn(lines[0])
	for _, l := range lines[1:] {
		if got := resultColumn(l); got != want {
			t.Errorf("%s: RESULT at column %d in %q, at %d in the header:\n%s", what, got, l, want, out)
			return
		}
	}
}

// TestEventTablesReadable: audit log and events show times to the
// millisecond (not the nanosecond), and events, streamed or not, align
// their columns.
func TestEventTablesReadable(t *testing.T) {
	servers := startServers(t)
	lead := waitLeaderOf(t, servers)
	for _, name := range []string{"a", "accelerator-with-a-long-name", "b"} {
		applyOK(t, lead.c, createAcc(name))
	}
	bad := createAcc("c")
	bad.GetCreateAccelerator().Spec.Device = ""
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if _, err := lead.c.Apply(ctx, bad); err != nil {
		t.Fatal(err)
	}

	stamp := regexp.MustCompile(`\b\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z\b`)
	r := run(t, "", nil, "--addr", lead.url, "audit", "log")
	if r.code != 0 {
		t.Fatalf("audit log: exit %d: %s", r.code, r.stderr)
	}
	for _, l := range strings.Split(strings.TrimSpace(r.stdout), "\n")[1:] {
		if f := strings.Fields(l); len(f) < 3 || f[2] != "-" && f[2] != stamp.FindString(l) {
			t.Errorf("audit log: TIME of %q is not RFC 3339 with milliseconds", l)
		}
	}

	r = run(t, "", nil, "--addr", lead.url, "events")
	if r.code != 0 {
		t.Fatalf("events: exit %d: %s", r.code, r.stderr)
	}
	checkAligned(t, "events", r.stdout)
	if !stamp.MatchString(r.stdout) {
		t.Errorf("events: no millisecond time in\n%s", r.stdout)
	}

	// Streamed with --follow: the lines printed so far are aligned too.
	fctx, fcancel := context.WithCancel(context.Background())
	var stdout, stderr syncBuffer
	done := make(chan int)
	go func() {
		g := &globals{stdin: strings.NewReader(""), stdout: &stdout, stderr: &stderr, getenv: func(string) string { return "" }}
		done <- g.run(fctx, []string{"--addr", lead.url, "events", "--follow"})
	}()
	deadline := time.Now().Add(20 * time.Second)
	for !strings.Contains(stdout.String(), "rejected") {
		if time.Now().After(deadline) {
			t.Fatalf("events --follow never printed the rejected entry:\n%s\nstderr: %s", stdout.String(), stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	// And so are the lines streamed after them.
	applyOK(t, lead.c, createAcc("d"))
	for !strings.Contains(stdout.String(), "CreateAccelerator d ") {
		if time.Now().After(deadline) {
			t.Fatalf("events --follow never printed the new entry:\n%s\nstderr: %s", stdout.String(), stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	fcancel()
	<-done
	checkAligned(t, "events --follow", stdout.String())
}
