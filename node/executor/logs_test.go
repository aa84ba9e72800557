package executor

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gpuplane/gpuplane/internal/testutil"
)

// syncBuffer is a bytes.Buffer safe for a writer and a reader goroutine.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// shell is a replica of a command engine deployment named model that runs
// sh -c script.
func shell(model, script string) Desired {
	return command(model, "sh", "-c", script)
}

// logBytes is the size of every engine.log file of a replica on disk.
func logBytes(dir string) int64 {
	paths, _ := filepath.Glob(filepath.Join(dir, logFile+"*"))
	var n int64
	for _, p := range paths {
		if strings.HasSuffix(p, ".lock") {
			continue
		}
		if fi, err := os.Stat(p); err == nil {
			n += fi.Size()
		}
	}
	return n
}

// The writer rotates at write time: no file is ever above its share of the
// cap, the files together keep the newest bytes written, in order, and
// ReadLogs shows them oldest first.
func TestLogWriterKeepsTheNewestBytesWithinTheCap(t *testing.T) {
	dataDir := t.TempDir()
	dir := ReplicaDir(dataDir, "chat", 0)
	w, err := openLogWriter(dir, 40, 3) // 4 files of 10 bytes
	if err != nil {
		t.Fatal(err)
	}
	var all bytes.Buffer
	for i := range 50 {
		line := fmt.Sprintf("line %d\n", i)
		if _, err := w.Write([]byte(line)); err != nil {
			t.Fatal(err)
		}
		all.WriteString(line)
		for _, name := range []string{"engine.log", "engine.log.1", "engine.log.2", "engine.log.3"} {
			if fi, err := os.Stat(filepath.Join(dir, name)); err == nil && fi.Size() > 10 {
				t.Fatalf("after %q: %s holds %d bytes, more than 10", line, name, fi.Size())
			}
		}
		if n := logBytes(dir); n > 40 {
			t.Fatalf("after %q: %d bytes on disk, more than the cap of 40", line, n)
		}
	}
	// One big write is split across rotations too.
	big := strings.Repeat("x", 95) + "\n"
	if _, err := w.Write([]byte(big)); err != nil {
		t.Fatal(err)
	}
	all.WriteString(big)
	w.Close()
	if _, err := os.Stat(filepath.Join(dir, "engine.log.4")); !os.IsNotExist(err) {
		t.Errorf("engine.log.4 exists (%v); only 3 rotated files are kept", err)
	}
	var got bytes.Buffer
	if err := ReadLogs(context.Background(), dataDir, "chat", 0, false, &got); err != nil {
		t.Fatal(err)
	}
	if got.Len() > 40 || got.Len() <= 30 || !strings.HasSuffix(all.String(), got.String()) {
		t.Errorf("ReadLogs = %q (%d bytes), want the newest 31 to 40 bytes written, in order", got.String(), got.Len())
	}
	if err := ReadLogs(context.Background(), dataDir, "chat", 1, false, &got); err == nil || !strings.Contains(err.Error(), "chat/1 has no engine log") {
		t.Errorf("ReadLogs of a replica without a log = %v", err)
	}

	// Files an older agent left above the cap go when a writer opens.
	if err := os.WriteFile(filepath.Join(dir, "engine.log.1"), bytes.Repeat([]byte("o"), 1000), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "engine.log.7"), []byte("old"), 0o644); err != nil {
		t.Fatal(err)
	}
	w, err = openLogWriter(dir, 40, 3)
	if err != nil {
		t.Fatal(err)
	}
	w.Close()
	if n := logBytes(dir); n > 40 {
		t.Errorf("%d bytes on disk after reopening over an older agent's files, more than the cap of 40", n)
	}
}

// --follow shows every byte written, in order, across rotations.
func TestReadLogsFollowsAcrossRotations(t *testing.T) {
	dataDir := t.TempDir()
	w, err := openLogWriter(ReplicaDir(dataDir, "chat", 0), 40, 3)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	w.Write([]byte("first\n"))
	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- ReadLogs(ctx, dataDir, "chat", 0, true, &out) }()
	want := "first\n"
	testutil.Until(t, 5*time.Second, "follow did not show the log", func() bool { return out.String() == want })
	// Each step crosses at least one rotation (10-byte files).
	for _, s := range []string{"second line\n", "third\n", "the fourth line\n", "5\n"} {
		w.Write([]byte(s))
		want += s
		testutil.Until(t, 5*time.Second, fmt.Sprintf("follow shows %q, want %q", out.String(), want), func() bool { return out.String() == want })
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// watchLogBytes samples the bytes a replica's log holds on disk until stop
// and returns the most it saw.
func watchLogBytes(dir string, stop <-chan struct{}) <-chan int64 {
	peak := make(chan int64, 1)
	go func() {
		var most int64
		t := time.NewTicker(5 * time.Millisecond)
		defer t.Stop()
		for {
			most = max(most, logBytes(dir))
			select {
			case <-stop:
				peak <- most
				return
			case <-t.C:
			}
		}
	}()
	return peak
}

// logSlack is what the cap may be exceeded by: one pipe read of the log
// writer.
const logSlack = 64 << 10

// An engine that writes as fast as it can (`yes`) for 30 s never has more
// than the cap of log on disk, and `replicas logs` shows its newest output.
func TestEngineLogCapHoldsUnderYes(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	const capBytes = 10 << 20 // the default
	dir := ReplicaDir(h.dataDir, "yes", 0)
	stop := make(chan struct{})
	peak := watchLogBytes(dir, stop)
	h.want(10, shell("yes", "exec yes"))
	testutil.Until(t, 30*time.Second, "yes never filled its log", func() bool { return logBytes(dir) >= capBytes/2 })
	deadline := time.After(30 * time.Second)
	tick := time.NewTicker(100 * time.Millisecond)
	defer tick.Stop()
wait:
	for {
		select {
		case <-deadline:
			break wait
		case <-tick.C:
			// Fail at once rather than fill the disk.
			if n := logBytes(dir); n > capBytes+logSlack {
				h.want(11)
				t.Fatalf("%d bytes of engine log on disk, cap %d", n, capBytes)
			}
		}
	}
	h.want(11)
	testutil.Until(t, 30*time.Second, "yes still runs", func() bool { return len(h.exec.Engines()) == 0 })
	close(stop)
	if most := <-peak; most > capBytes+logSlack {
		t.Errorf("up to %d bytes of engine log on disk, more than the cap %d and a buffer", most, capBytes)
	} else {
		t.Logf("at most %d bytes of engine log on disk (cap %d)", most, capBytes)
	}
	var out bytes.Buffer
	if err := ReadLogs(context.Background(), h.dataDir, "yes", 0, false, &out); err != nil {
		t.Fatal(err)
	}
	if out.Len() > capBytes || out.Len() < capBytes/2 || !strings.HasSuffix(out.String(), "y\ny\ny\n") {
		t.Errorf("replicas logs shows %d bytes ending %q; want the newest output, at most the cap", out.Len(), out.String()[max(out.Len()-20, 0):])
	}
}

// A one-off burst of 1 GB leaves no more than the cap on disk, during the
// burst and after it, and the log ends with what the engine wrote last.
func TestEngineLogCapHoldsUnderABurst(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	const capBytes = 10 << 20
	dir := ReplicaDir(h.dataDir, "burst", 0)
	stop := make(chan struct{})
	peak := watchLogBytes(dir, stop)
	var over atomic.Int64
	h.want(10, shell("burst", "head -c 1000000000 /dev/zero; echo; echo burst-done; exec sleep 1000"))
	testutil.Until(t, 5*time.Minute, "the burst did not reach the log", func() bool {
		if n := logBytes(dir); n > capBytes+logSlack {
			over.Store(n)
			return true
		}
		return strings.HasSuffix(tail(t, filepath.Join(dir, logFile)), "burst-done\n")
	})
	close(stop)
	h.want(11)
	if n := over.Load(); n > 0 {
		t.Fatalf("%d bytes of engine log on disk during the burst, cap %d", n, capBytes)
	}
	if most := <-peak; most > capBytes+logSlack {
		t.Errorf("up to %d bytes of engine log on disk, more than the cap %d and a buffer", most, capBytes)
	} else {
		t.Logf("at most %d bytes of engine log on disk during a 1 GB burst (cap %d)", most, capBytes)
	}
}

// tail is the last bytes of a file ("" if it cannot be read).
func tail(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	if fi, err := f.Stat(); err == nil && fi.Size() > 64 {
		f.Seek(-64, io.SeekEnd)
	}
	b, _ := io.ReadAll(f)
	return string(b)
}

// `replicas logs` shows an engine's output across its restarts, oldest
// first, each start headed by the executor's line.
func TestEngineLogAcrossRestarts(t *testing.T) {
	h := newHarness(t, t.TempDir(), nil)
	h.want(10, shell("flaky", "echo hello from $$; exit 3"))
	testutil.Until(t, 20*time.Second, "flaky did not restart twice", func() bool {
		st := h.rep.last("flaky")
		return st != nil && st.Restarts >= 3
	})
	h.want(11)
	testutil.Until(t, 30*time.Second, "flaky still runs", func() bool { return len(h.exec.Engines()) == 0 })
	var out bytes.Buffer
	if err := ReadLogs(context.Background(), h.dataDir, "flaky", 0, false, &out); err != nil {
		t.Fatal(err)
	}
	log := out.String()
	last := -1
	for i := range 3 {
		head := fmt.Sprintf("starting command engine for flaky/0 (generation 1, restart %d)", i)
		at := strings.Index(log, head)
		if at <= last || !strings.Contains(log[at:], "hello from") {
			t.Fatalf("log lacks %q followed by the engine's output, after the previous start:\n%s", head, log)
		}
		last = at
	}
}
