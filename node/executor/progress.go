package executor

import (
	"os"
	"path/filepath"
	"time"

	"github.com/gpuplane/gpuplane/node/procfs"
	"github.com/gpuplane/gpuplane/node/watchdog"
)

// memoryStepMiB is the growth of an engine's memory, GPU or host, above
// the most it has held so far that counts as progress: allocators and
// runtimes wobble by less while nothing loads.
const memoryStepMiB = 16

// progress is what a starting engine has shown so far: whatever changes
// in it is progress. An engine that shows none for
// Options.StartStallTimeout is stuck: its health probe finds the same,
// its log grows no more and its memory does not grow.
type progress struct {
	at time.Time
	// found is what the last probe found.
	found string
	// logSize and logTime are engine.log's.
	logSize int64
	logTime time.Time
	// gpuMiB and hostMiB are the most the engine has held.
	gpuMiB, hostMiB uint64
}

// watchProgress starts following the progress of the engine starting now.
func (s *supervisor) watchProgress() {
	s.progress = progress{at: time.Now()}
	s.progress.logSize, s.progress.logTime = s.logMark()
}

// stuck reports whether the starting engine, whose probe found found,
// has shown no progress for Options.StartStallTimeout.
func (s *supervisor) stuck(found string) bool {
	stall := s.e.opts.StartStallTimeout
	if stall < 0 || s.proc == nil {
		return false
	}
	p := &s.progress
	now := time.Now()
	if found != p.found {
		p.found, p.at = found, now
	}
	if size, mod := s.logMark(); size != p.logSize || !mod.Equal(p.logTime) {
		p.logSize, p.logTime, p.at = size, mod, now
	}
	if mib := s.gpuMiB(); mib >= p.gpuMiB+memoryStepMiB {
		p.gpuMiB, p.at = mib, now
	}
	if b, err := s.proc.box.hostMemory(); err == nil && b>>20 >= p.hostMiB+memoryStepMiB {
		p.hostMiB, p.at = b>>20, now
	}
	return now.Sub(p.at) > stall
}

// logMark is the size and modification time of the engine's log: the log
// writer appends everything the engine prints, and a rotation starts a new
// file, which changes both.
func (s *supervisor) logMark() (int64, time.Time) {
	fi, err := os.Stat(filepath.Join(s.dir, logFile))
	if err != nil {
		return -1, time.Time{}
	}
	return fi.Size(), fi.ModTime()
}

// gpuMiB is the GPU memory the engine's processes (its process group) hold
// on its cards, as NVML reports it; 0 without Options.NVML.
func (s *supervisor) gpuMiB() uint64 {
	lib := s.e.opts.NVML
	if lib == nil {
		return 0
	}
	var sum uint64
	for _, c := range s.cardsOf(s.current()) {
		procs, err := watchdog.ProcessMemory(lib, c.GetUuid())
		if err != nil {
			continue
		}
		for pid, mib := range procs {
			if pid == s.proc.pid {
				sum += mib
			} else if st, err := procfs.ReadStat(pid); err == nil && st.PGID == s.proc.pid {
				sum += mib
			}
		}
	}
	return sum
}
