package auditrec

import (
	"bytes"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestHashesWriteFailureLoggedOnce checks that a record file that cannot be
// written (a full disk) costs one error line for the outage and one line when
// writing works again, not a line per applied entry.
func TestHashesWriteFailureLoggedOnce(t *testing.T) {
	path := filepath.Join(t.TempDir(), HashesFile)
	var out bytes.Buffer
	log := slog.New(slog.NewTextHandler(&out, nil))
	h, err := OpenHashes(path, false, log)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	good := h.f
	// Writes through a read-only handle fail as a full disk's do.
	ro, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer ro.Close()
	h.f = ro
	for i := uint64(1); i <= 50; i++ {
		h.Add(i, [hashSize]byte{byte(i)})
		h.Flush()
	}
	if n := strings.Count(out.String(), "write entry hashes"); n != 1 {
		t.Fatalf("50 failed writes logged %d times, want once:\n%s", n, out.String())
	}
	h.f = good
	h.Add(51, [hashSize]byte{51})
	h.Flush()
	if !strings.Contains(out.String(), "entry hashes written again") || !strings.Contains(out.String(), "skipped=50") {
		t.Fatalf("recovery not logged with the count skipped:\n%s", out.String())
	}
	if got, _ := h.At(51); got == "" {
		t.Fatal("record 51 not written after recovery")
	}
	if got, _ := h.At(10); got != "" {
		t.Fatalf("record 10 was lost in the outage but reads %q", got)
	}
}
