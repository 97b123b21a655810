package main

import (
	"io"
	"os"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// drainOut returns once what was written to a pipe was read, not before;
// and it gives up after its bound when no one reads.
func TestDrainOutWaitsForThePipeToBeRead(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r.Close(); _ = w.Close() }()
	out := strings.Repeat("a line of the step's output\n", 1000)
	if _, err := io.WriteString(w, out[:16<<10]); err != nil {
		t.Fatal(err)
	}
	var read atomic.Int64
	go func() {
		time.Sleep(200 * time.Millisecond)
		b := make([]byte, 16<<10)
		n, _ := io.ReadFull(r, b)
		read.Store(int64(n))
	}()
	drainOut(w, time.Minute)
	if got := read.Load(); got != 16<<10 {
		t.Fatalf("drainOut returned with %d of %d bytes read", got, 16<<10)
	}

	// No reader: bounded.
	r2, w2, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = r2.Close(); _ = w2.Close() }()
	if _, err := io.WriteString(w2, "unread\n"); err != nil {
		t.Fatal(err)
	}
	drainOut(w2, 50*time.Millisecond)

	// Not a pipe: at once.
	f, err := os.CreateTemp(t.TempDir(), "out")
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = f.Close() }()
	drainOut(f, time.Hour)
}
