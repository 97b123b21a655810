package main

import (
	"fmt"
	"os"
	"runtime"
	"runtime/debug"
	"runtime/metrics"
	"strings"
	"testing"
)

// The memory prepareHeap hands the heap serves the allocations that
// follow, the render's: 24 MiB allocated after preparing 32 MiB take
// (almost) no more memory from the system.
func TestPrepareHeapServesLaterAllocations(t *testing.T) {
	if !hugePagesOnRequest() {
		t.Skip("skipped: this system gives no transparent huge pages on request (/sys/kernel/mm/transparent_hugepage/enabled)")
	}
	const size = 32 << 20
	prepareHeap(size)
	// No collection meanwhile: the test measures where new objects go.
	defer debug.SetGCPercent(debug.SetGCPercent(-1))
	before := mappedBytes()
	var keep [][]byte
	for range 768 {
		keep = append(keep, make([]byte, 32<<10))
	}
	if grew := mappedBytes() - before; grew > 4<<20 {
		t.Errorf("24 MiB allocated after prepareHeap(%d) took %d more bytes from the system, want at most 4 MiB", size, grew)
	}
	runtime.KeepAlive(keep)
}

// mappedBytes is the memory the Go runtime holds from the system.
func mappedBytes() uint64 {
	s := []metrics.Sample{{Name: "/memory/classes/total:bytes"}}
	metrics.Read(s)
	return s[0].Value.Uint64()
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
	if !strings.Contains(string(smaps), "\nTHPeligible:") {
		t.Skip("skipped: this kernel's /proc/self/smaps has no THPeligible field (Linux 5.0 and later have it)")
	}
	in := false
	for _, line := range strings.Split(string(smaps), "\n") {
		var lo, hi uintptr
		if n, _ := fmt.Sscanf(line, "%x-%x ", &lo, &hi); n == 2 {
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
