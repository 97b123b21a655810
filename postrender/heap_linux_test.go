package main

import (
	"os"
	"runtime/metrics"
	"strings"
	"testing"
)

func TestPrepareHeapLeavesMemoryForReuse(t *testing.T) {
	if !hugePagesOnRequest() {
		t.Skip("skipped: this system gives no transparent huge pages on request (/sys/kernel/mm/transparent_hugepage/enabled)")
	}
	const size = 32 << 20
	prepareHeap(size)
	// The block is free, and the runtime kept it for the next allocations
	// rather than handing it back to the system.
	s := []metrics.Sample{{Name: "/memory/classes/heap/free:bytes"}}
	metrics.Read(s)
	if free := s[0].Value.Uint64(); free < size*3/4 {
		t.Errorf("free heap after prepareHeap(%d) = %d bytes, want at least %d", size, free, size*3/4)
	}
	if rollup, err := os.ReadFile("/proc/self/smaps_rollup"); err == nil {
		for _, line := range strings.Split(string(rollup), "\n") {
			if strings.HasPrefix(line, "AnonHugePages:") {
				t.Log(line)
			}
		}
	}
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
