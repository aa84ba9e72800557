// Package procfs reads the few fields of Linux's /proc/PID/stat that the
// node needs to follow engine processes it did not start (after an agent
// restart) and to attribute GPU memory to an engine's process group, and
// which process holds a listening TCP socket (sockets.go, over
// prometheus/procfs), so that an engine's port is known to be its own.
// It only reads; it never signals a process.
package procfs

import (
	"fmt"
	"os"
	"strconv"
	"strings"
)

// Stat is part of one process's /proc/PID/stat.
type Stat struct {
	PID int
	// State is R, S, D, Z (zombie), T, ...
	State byte
	// PPID is the parent; PGID the process group.
	PPID int
	PGID int
	// StartTime is when the process started, in clock ticks after boot:
	// with the pid it names one process, even after the pid is reused.
	StartTime uint64
}

// ReadStat reads /proc/PID/stat.
func ReadStat(pid int) (Stat, error) {
	data, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return Stat{}, err
	}
	// The command name (field 2) may hold spaces and parentheses: the
	// fields after it start after its last ')'.
	s := string(data)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return Stat{}, fmt.Errorf("parse /proc/%d/stat: no command name", pid)
	}
	f := strings.Fields(s[i+1:])
	// f[0] is field 3 (state); field 4 (ppid) is f[1], 5 (pgrp) f[2]; field 22 (starttime) is f[19].
	if len(f) < 20 || len(f[0]) != 1 {
		return Stat{}, fmt.Errorf("parse /proc/%d/stat: %d fields", pid, len(f)+2)
	}
	ppid, err0 := strconv.Atoi(f[1])
	pgid, err1 := strconv.Atoi(f[2])
	start, err2 := strconv.ParseUint(f[19], 10, 64)
	if err0 != nil || err1 != nil || err2 != nil {
		return Stat{}, fmt.Errorf("parse /proc/%d/stat: bad ppid %q, pgrp %q or starttime %q", pid, f[1], f[2], f[19])
	}
	return Stat{PID: pid, State: f[0][0], PPID: ppid, PGID: pgid, StartTime: start}, nil
}

// Alive says the process exists and is not a zombie.
func (s Stat) Alive() bool { return s.State != 'Z' && s.State != 'X' }
