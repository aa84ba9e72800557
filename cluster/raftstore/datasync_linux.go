package raftstore

import "golang.org/x/sys/unix"

func datasync(fd uintptr) error {
	for {
		err := unix.Fdatasync(int(fd))
		if err != unix.EINTR {
			return err
		}
	}
}
