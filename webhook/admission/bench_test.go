package admission

import (
	"testing"
)

// BenchmarkHandle is one admission of a runner pod with the full shipped
// policy set and a platform configuration that turns most policies on:
// decode, input, evaluation, mutation and patch.
func BenchmarkHandle(b *testing.B) {
	h := newHandler(b, true)
	req := request(b, runnerPod("registry.example.com/runner:1"))
	b.ReportAllocs()
	for b.Loop() {
		if resp := h.Handle(b.Context(), req); !resp.Allowed || len(resp.Patches) == 0 {
			b.Fatalf("unexpected response: %+v", resp.Result)
		}
	}
}
