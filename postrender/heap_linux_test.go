package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"strings"
	"testing"
	"unsafe"
)

// The memory of the freed block serves the allocations that follow, the
// render's: 8 MiB allocated after it land in it.
func TestPrepareHeapServesLaterAllocations(t *testing.T) {
	if !hugePagesOnRequest() {
		t.Skip("skipped: this system gives no transparent huge pages on request (/sys/kernel/mm/transparent_hugepage/enabled)")
	}
	const size = 32 << 20
	addr := adviseHugePages(size)
	runtime.GC()
	// No collection meanwhile: it could free memory below the block for
	// the next allocations.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	var keep [][]byte
	for range 256 {
		keep = append(keep, make([]byte, 32<<10))
	}
	last := uintptr(unsafe.Pointer(unsafe.SliceData(keep[len(keep)-1])))
	if last < addr || last >= addr+size {
		t.Errorf("an allocation after the block's at %#x, outside the block [%#x, %#x)", last, addr, addr+size)
	}
	runtime.KeepAlive(keep)
}

// The block prepareHeap hands the heap is memory the kernel may back with
// huge pages: its mapping says THPeligible (in the "madvise" mode only once
// asked for; in "always" every mapping says so).
func TestAdviseHugePagesMarksTheBlock(t *testing.T) {
	if !hugePagesOnRequest() {
		t.Skip("skipped: this system gives no transparent huge pages on request (/sys/kernel/mm/transparent_hugepage/enabled)")
	}
	addr := adviseHugePages(8 << 20)
	smaps, err := os.ReadFile("/proc/self/smaps")
	if err != nil {
		t.Skipf("skipped: no /proc/self/smaps: %v", err)
	}
	in := false
	for _, line := range strings.Split(string(smaps), "\n") {
		var lo, hi uintptr
		if n, _ := fmt.Sscanf(line, "%x-%x ", &lo, &hi); n == 2 && !strings.HasPrefix(line, "THP") {
			in = lo <= addr && addr < hi
			continue
		}
		if in && strings.HasPrefix(line, "THPeligible:") {
			if strings.TrimSpace(strings.TrimPrefix(line, "THPeligible:")) != "1" {
				t.Errorf("the block at %#x: %s, want 1", addr, line)
			}
			return
		}
	}
	t.Fatalf("no mapping with THPeligible holds the block at %#x", addr)
}

func TestHeapFor(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name  string
		input int
		want  int
	}{
		{name: "small input gets the floor", input: 1 << 10, want: 16 << 20},
		{name: "200 documents", input: 69 << 10, want: 69 << 10 * 700},
		{name: "big input is capped", input: 2 << 20, want: 64 << 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			if got := heapFor(tc.input); got != tc.want {
				t.Errorf("heapFor(%d) = %d, want %d", tc.input, got, tc.want)
			}
		})
	}
}
