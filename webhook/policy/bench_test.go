package policy

import (
	"testing"

	"github.com/runwarden/runwarden/policies"
)

// BenchmarkEval evaluates the shipped policies for a runner pod: with the
// decision cache (a repeated template: every call after the first hits) and
// without it (a full OPA evaluation every time).
func BenchmarkEval(b *testing.B) {
	s, err := Load(b.Context(), policies.FS, "embedded", Options{})
	if err != nil {
		b.Fatal(err)
	}
	in := runnerInput()
	b.Run("cache=on", func(b *testing.B) {
		// The first call fills the cache; made before the loop, so that
		// the figures do not depend on how many calls the loop makes.
		if _, err := s.Eval(b.Context(), in); err != nil {
			b.Fatal(err)
		}
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.Eval(b.Context(), in); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("cache=off", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if _, err := s.EvalUncached(b.Context(), in); err != nil {
				b.Fatal(err)
			}
		}
	})
}
