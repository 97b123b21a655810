package main

import (
	"bytes"
	"os"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// hugePage is the size of a transparent huge page on the platforms Go
// supports with them.
const hugePage = 2 << 20

// prepareHeap makes size bytes of the Go heap, before the render, memory
// the kernel backs with transparent huge pages where the system offers them
// on request (the "madvise" mode, the default of most distributions).
//
// Kustomize's heap grows to about 700 bytes for each byte of input, and a
// short process takes all of it from the kernel for the first time: 14,000
// page faults, a quarter of the whole run's CPU, for 200 documents. The
// runtime does not ask for huge pages for its heap, so this allocates one
// block of the size the render will need, asks for huge pages for it, and
// frees it: the runtime reuses that memory for the render's objects, and
// the first touch of each 2 MiB of it is one page fault. The pages are
// filled as the render touches them, on the threads that build, not up
// front. Without huge pages ("never") it does nothing.
func prepareHeap(size int) {
	if size < hugePage || !hugePagesOnRequest() {
		return
	}
	adviseHugePages((size + hugePage - 1) / hugePage * hugePage)
	runtime.GC() // the block is unreachable: free for the render to reuse
}

// adviseHugePages allocates size bytes, asks for huge pages for them, and
// drops them. It returns the block's address, for tests.
func adviseHugePages(size int) uintptr {
	b := make([]byte, size)
	_ = unix.Madvise(b, unix.MADV_HUGEPAGE)
	return uintptr(unsafe.Pointer(unsafe.SliceData(b)))
}

// hugePagesOnRequest reports whether the kernel gives transparent huge
// pages to memory that asks for them.
func hugePagesOnRequest() bool {
	mode, err := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if err != nil {
		return false
	}
	return bytes.Contains(mode, []byte("[madvise]")) || bytes.Contains(mode, []byte("[always]"))
}
