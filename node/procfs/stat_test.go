package procfs

import (
	"os"
	"os/exec"
	"syscall"
	"testing"
	"time"
)

func TestReadStat(t *testing.T) {
	me, err := ReadStat(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if !me.Alive() || me.PGID != syscall.Getpgrp() || me.PPID != os.Getppid() || me.StartTime == 0 {
		t.Fatalf("ReadStat(self) = %+v; want alive, ppid %d, pgid %d, a start time", me, os.Getppid(), syscall.Getpgrp())
	}
	// A child in its own group that exits and is not yet reaped: a zombie.
	cmd := exec.Command("true")
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	deadline := time.Now().Add(5 * time.Second)
	for {
		st, err := ReadStat(pid)
		if err != nil {
			t.Fatal(err)
		}
		if st.PGID != pid {
			t.Fatalf("child's group = %d, want its own (%d)", st.PGID, pid)
		}
		if !st.Alive() {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("child still %c after 5s", st.State)
		}
		time.Sleep(10 * time.Millisecond)
	}
	_ = cmd.Wait()
	if _, err := ReadStat(pid); err == nil {
		t.Fatal("ReadStat of a reaped process succeeded")
	}
}
