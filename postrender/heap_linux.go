package main

import (
	"bytes"
	"os"
	"runtime"

	"golang.org/x/sys/unix"
)

// hugePage is the size of a transparent huge page on the platforms Go
// supports with them.
const hugePage = 2 << 20

// prepareHeap hands the Go heap, before the render, size bytes of memory
// backed by transparent huge pages where the system offers them on request
// (the "madvise" mode, the default of most distributions).
//
// Kustomize's heap grows to about 700 bytes for each byte of input, and a
// short process takes all of it from the kernel for the first time: 15,000
// page faults, a quarter of the whole run's CPU, for 200 documents. The runtime
// does not ask for huge pages for its heap, so this allocates one block of
// the size the render will need, asks for huge pages and fills them in one
// call each, and frees the block: the runtime reuses the memory for the
// render's objects without faulting it in again. Without huge pages
// ("never", or a kernel without MADV_POPULATE_WRITE) it does nothing.
func prepareHeap(size int) {
	if size < hugePage || !hugePagesOnRequest() {
		return
	}
	fillHugePages((size + hugePage - 1) / hugePage * hugePage)
	runtime.GC() // the block is unreachable: free for the render to reuse
}

// fillHugePages allocates size bytes backed by huge pages and drops them.
func fillHugePages(size int) {
	b := make([]byte, size)
	if unix.Madvise(b, unix.MADV_HUGEPAGE) == nil {
		_ = unix.Madvise(b, unix.MADV_POPULATE_WRITE)
	}
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
