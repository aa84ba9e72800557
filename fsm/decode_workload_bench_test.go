package fsm_test

import (
	"crypto/rand"
	"encoding/hex"
	"runtime"
	"testing"

	"github.com/hashicorp/raft"

	"github.com/gpuplane/gpuplane/cluster/replaylog"
	"github.com/gpuplane/gpuplane/fsm"
	"github.com/gpuplane/gpuplane/internal/cputime"
)

// BenchmarkDecodeWorkload decodes the command entries of the replay
// benchmark's workload (package replaylog) as a replay's reader does: one
// Decoder, reset every 256 entries. It reports the decoding thread's CPU
// time per entry, which the machine's load does not stretch as it does
// wall time.
func BenchmarkDecodeWorkload(b *testing.B) {
	newID := func() string {
		var id [16]byte
		_, _ = rand.Read(id[:])
		return hex.EncodeToString(id[:])
	}
	gen := replaylog.New(false, newID)
	var data [][]byte
	for i := uint64(1); len(data) < 200_000; i++ {
		if l := gen.Entry(i); l.Type == raft.LogCommand {
			data = append(data, l.Data)
		}
	}
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	d := &fsm.Decoder{Slab: 256}
	var cpu int64
	b.ResetTimer()
	for b.Loop() {
		t0 := cputime.Thread()
		for i, e := range data {
			d.DecodeEntry(e)
			if i%256 == 255 {
				d.Reset()
			}
		}
		cpu += int64(cputime.Thread() - t0)
		d.Reset()
	}
	b.ReportMetric(float64(cpu)/float64(b.N*len(data)), "cpu-ns/entry")
}
