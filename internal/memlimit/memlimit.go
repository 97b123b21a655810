// Package memlimit gives a program's Go runtime the memory limit of the
// container it runs in, so that its garbage collector works harder as the
// heap nears the limit instead of the kernel ending the process.
//
// runwarden-webhook collects at GOGC=400 (its heap may grow to five times
// what stays in use between collections) and runs, with the chart's
// defaults, under a 256 MiB limit: with no memory limit known to the
// runtime, a live heap past about 50 MiB could take the pod past its
// limit before the next collection, and an OOM-killed webhook refuses runner
// pods (failurePolicy Fail) until it is back.
package memlimit

import (
	"math"
	"runtime/debug"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// Ratio is the share of the container's memory limit given to the Go
// runtime; the rest is headroom for memory the runtime does not account
// for.
const Ratio = 0.9

// FromContainer sets the Go runtime's memory limit to Ratio of the
// cgroup's memory limit, unless GOMEMLIMIT is set (which wins, as it does
// for the runtime) or AUTOMEMLIMIT=off. Without a cgroup memory limit (a
// process outside a container, or a pod without limits) it changes
// nothing. It returns the limit in force afterwards, 0 for none.
func FromContainer() int64 {
	return from(memlimit.FromCgroup)
}

func from(p memlimit.Provider) int64 {
	// Errors are the absence of a limit to follow (no cgroup, no limit):
	// the runtime keeps its own default, no limit.
	_, _ = memlimit.SetGoMemLimitWithOpts(memlimit.WithRatio(Ratio), memlimit.WithProvider(p))
	return Current()
}

// Current is the Go runtime's memory limit, 0 for none.
func Current() int64 {
	if l := debug.SetMemoryLimit(-1); l != math.MaxInt64 {
		return l
	}
	return 0
}
