package memlimit

import (
	"errors"
	"math"
	"runtime/debug"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// TestFrom: a container limit gives the runtime Ratio of it; GOMEMLIMIT,
// AUTOMEMLIMIT=off and the absence of a limit leave the runtime's own.
func TestFrom(t *testing.T) {
	const gib = 1 << 30
	limit, ratio := float64(gib), Ratio
	ratioOfGiB := int64(limit * ratio)
	noLimit := func() (uint64, error) { return 0, errors.New("no cgroup memory limit") }
	tests := []struct {
		name string
		env  map[string]string
		p    memlimit.Provider
		want int64
	}{
		{"a container limit", nil, memlimit.Limit(gib), ratioOfGiB},
		{"GOMEMLIMIT wins", map[string]string{"GOMEMLIMIT": "100MiB"}, memlimit.Limit(gib), 0},
		{"AUTOMEMLIMIT=off", map[string]string{"AUTOMEMLIMIT": "off"}, memlimit.Limit(gib), 0},
		{"no limit", nil, noLimit, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			for k, v := range tt.env {
				t.Setenv(k, v)
			}
			prev := debug.SetMemoryLimit(math.MaxInt64)
			t.Cleanup(func() { debug.SetMemoryLimit(prev) })
			if got := from(tt.p); got != tt.want {
				t.Errorf("limit %d, want %d", got, tt.want)
			}
			if got := Current(); got != tt.want {
				t.Errorf("Current() %d, want %d", got, tt.want)
			}
		})
	}
}
