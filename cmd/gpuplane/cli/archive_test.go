package cli

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestLiveArchiveAndCompact runs the archive story of docs/archive.md
// through the CLI
// against a real agent: archive the log, compact the server's log behind
// the archive, verify across archive and live log, replay an archived index
// from the archive to the same state as before compaction, and name an
// altered archived segment by number and entries.
func TestLiveArchiveAndCompact(t *testing.T) {
	run := startDevAgent(t)
	must := func(args ...string) string {
		t.Helper()
		out, errOut, code := run(args...)
		if code != 0 {
			t.Fatalf("%s: exit %d: %s%s", strings.Join(args, " "), code, out, errOut)
		}
		return out
	}
	for i := range 30 {
		must("accelerators", "create", fmt.Sprintf("a%d", i), "--device", "l4")
	}
	const at = "12"
	before := must("audit", "replay", "--at", at, "-o", "json")

	dir := t.TempDir()
	out := must("audit", "archive", "--to", dir, "--segment-entries", "10")
	if !strings.Contains(out, "archived entries 1..") {
		t.Fatalf("audit archive: %s", out)
	}
	var m struct {
		Cut      uint64
		Segments []struct{ File string }
	}
	b, err := os.ReadFile(filepath.Join(dir, "MANIFEST.json"))
	if err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal(b, &m); err != nil || m.Cut < 30 || len(m.Segments) != int(m.Cut/10) {
		t.Fatalf("manifest: cut %d, %d segments, %v", m.Cut, len(m.Segments), err)
	}
	if _, errOut, code := run("audit", "compact", "--before", "15", "--archive", dir); code == 0 || !strings.Contains(errOut, "--before") {
		t.Errorf("compact before an index inside a segment: exit %d, %s; want a usage error naming --before", code, errOut)
	}
	out = must("audit", "compact", "--before", fmt.Sprint(m.Cut+1), "--archive", dir)
	if !strings.Contains(out, "ok") {
		t.Fatalf("audit compact: %s", out)
	}
	if status := must("cluster", "status"); strings.Contains(status, "entries 1..") {
		t.Errorf("cluster status after compaction still shows the log from index 1:\n%s", status)
	}
	must("accelerators", "create", "after", "--device", "l4")

	if _, errOut, code := run("audit", "replay", "--at", at); code == 0 || !strings.Contains(errOut, "--archive") {
		t.Errorf("replay of a compacted index without the archive: exit %d, %s; want an error pointing at --archive", code, errOut)
	}
	if got := must("audit", "replay", "--at", at, "--archive", dir, "-o", "json"); got != before {
		t.Errorf("replay at %s from the archive:\n%s\nbefore compaction:\n%s", at, got, before)
	}
	out = must("audit", "verify", "--archive", dir)
	if !strings.Contains(out, "ok: archive") || !strings.Contains(out, "agree with the replay") {
		t.Errorf("audit verify --archive: %s", out)
	}

	seg := filepath.Join(dir, m.Segments[1].File)
	data, _ := os.ReadFile(seg)
	data[len(data)/2] ^= 0x01
	if err := os.WriteFile(seg, data, 0o644); err != nil {
		t.Fatal(err)
	}
	_, errOut, code := run("audit", "verify", "--archive", dir)
	if code == 0 || !strings.Contains(errOut, "archived segment 2 (entries 11..20)") {
		t.Errorf("verify of a tampered archive: exit %d, %s; want segment 2 (entries 11..20) named", code, errOut)
	}
}
