package executor

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
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

// The log rotates past its size, keeps the newest copies, and ReadLogs shows
// them oldest first, then follows what the engine appends after a rotation.
func TestEngineLogRotatesAndFollows(t *testing.T) {
	dataDir := t.TempDir()
	dir := ReplicaDir(dataDir, "chat", 0)
	write := func(line string) {
		f, err := openLog(dir, 10, 2) // rotate past 10 bytes, keep 2
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.WriteString(line); err != nil {
			t.Fatal(err)
		}
		f.Close()
	}
	for _, l := range []string{"one one one\n", "two two two\n", "three three\n", "four four four\n"} {
		write(l)
	}
	// "one" was dropped: engine.log.2 holds two, .1 three, engine.log four.
	for name, want := range map[string]string{"engine.log.2": "two two two\n", "engine.log.1": "three three\n", "engine.log": "four four four\n"} {
		if got, err := os.ReadFile(filepath.Join(dir, name)); err != nil || string(got) != want {
			t.Errorf("%s = %q, %v; want %q", name, got, err, want)
		}
	}
	if _, err := os.Stat(filepath.Join(dir, "engine.log.3")); !os.IsNotExist(err) {
		t.Errorf("engine.log.3 exists (%v); only 2 copies are kept", err)
	}
	var all bytes.Buffer
	if err := ReadLogs(context.Background(), dataDir, "chat", 0, false, &all); err != nil {
		t.Fatal(err)
	}
	if want := "two two two\nthree three\nfour four four\n"; all.String() != want {
		t.Errorf("ReadLogs = %q, want %q", all.String(), want)
	}
	if err := ReadLogs(context.Background(), dataDir, "chat", 1, false, &all); err == nil || !strings.Contains(err.Error(), "chat/1 has no engine log") {
		t.Errorf("ReadLogs of a replica without a log = %v", err)
	}

	ctx, cancel := context.WithCancel(context.Background())
	var out syncBuffer
	done := make(chan error, 1)
	go func() { done <- ReadLogs(ctx, dataDir, "chat", 0, true, &out) }()
	// An engine appends to its open file; the executor rotates it meanwhile.
	f, err := os.OpenFile(LogPath(dataDir, "chat", 0), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	f.WriteString("five\n")
	eventually(t, 3*time.Second, "follow did not show the appended line", func() bool { return strings.HasSuffix(out.String(), "five\n") })
	if err := rotateLog(LogPath(dataDir, "chat", 0), 10, 2); err != nil {
		t.Fatal(err)
	}
	f.WriteString("six\n")
	eventually(t, 3*time.Second, "follow did not continue after a rotation", func() bool { return strings.HasSuffix(out.String(), "five\nsix\n") })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}
