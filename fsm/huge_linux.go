package fsm

import (
	"syscall"
	"unsafe"
)

// adviseHuge asks the kernel to back the 2 MiB-aligned pages within the n
// bytes at p, a large allocation of the state machine's that lives long
// (the request table), with huge pages: a replay of a million entries
// otherwise takes tens of thousands of page faults to grow its heap, dear on
// virtual machines, and as many TLB misses to look ids up. It is only advice
// (transparent huge pages set to madvise, as on most distributions; a no-op
// when they are off or always on) and changes nothing else.
func adviseHuge(p unsafe.Pointer, n int) {
	const huge = 2 << 20
	if n < huge {
		return
	}
	base := uintptr(p)
	start := (base+huge-1)&^(huge-1) - base // offsets into the n bytes
	end := (base+uintptr(n))&^(huge-1) - base
	if end > start {
		_ = syscall.Madvise(unsafe.Slice((*byte)(p), n)[start:end], syscall.MADV_HUGEPAGE)
	}
}
