//go:build !linux

package fsm

import "unsafe"

// adviseHuge: see huge_linux.go; elsewhere nothing.
func adviseHuge(unsafe.Pointer, int) {}
