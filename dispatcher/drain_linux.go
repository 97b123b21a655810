package main

import (
	"io"
	"os"
	"time"

	"golang.org/x/sys/unix"
)

// drainOut waits, at most max, until the runtime has read everything the
// steps wrote to out, when out is a pipe (a container's stdout is one, to
// its runtime's shim). The shim waits only a moment for a container's
// output once its process exits (containerd's runc shim: 2 seconds), so
// the last lines of a job that printed much just before it ended, its
// steps' end markers among them, could be cut: seen here as thousands of
// a 20,000-line step's lines lost on a loaded node.
func drainOut(out io.Writer, max time.Duration) {
	f, ok := out.(*os.File)
	if !ok {
		return
	}
	deadline := time.Now().Add(max)
	for time.Now().Before(deadline) {
		// Bytes still in the pipe (FIONREAD); an error: not a pipe.
		n, err := unix.IoctlGetInt(int(f.Fd()), unix.TIOCINQ)
		if err != nil || n == 0 {
			return
		}
		time.Sleep(10 * time.Millisecond)
	}
}
