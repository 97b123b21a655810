package policy

import (
	"slices"
	"testing"
	"testing/fstest"

	"github.com/open-policy-agent/opa/v1/ast"
)

// TestEveryBuiltinIsReviewed fails when this OPA version's built-ins and
// the reviewed lists differ: a built-in a new OPA adds must be classified
// (pure, and cached; or impure, with what it reads) before it is either,
// and a name OPA dropped leaves the lists. Until then a set calling it is
// not cached (TestUnreviewedBuiltinsTurnTheCacheOff).
func TestEveryBuiltinIsReviewed(t *testing.T) {
	t.Parallel()
	var names []string
	for name, b := range ast.BuiltinMap {
		if name == b.Name { // not an infix ("==" for equal)
			names = append(names, name)
		}
	}
	for _, b := range ast.CapabilitiesForThisVersion().Builtins {
		if !slices.Contains(names, b.Name) {
			names = append(names, b.Name)
		}
	}
	slices.Sort(names)
	for _, name := range names {
		b := ast.BuiltinMap[name]
		_, impure := impureBuiltins[name]
		switch {
		case pureBuiltins[name] && impure:
			t.Errorf("built-in %s is both pure and impure", name)
		case !pureBuiltins[name] && !impure:
			t.Errorf("built-in %s of this OPA version is not reviewed: add it to pureBuiltins if its result depends on its arguments alone, else to impureBuiltins with what else it reads (builtins.go)", name)
		case pureBuiltins[name] && b != nil && b.Nondeterministic:
			t.Errorf("built-in %s is listed pure, and OPA marks it non-deterministic", name)
		}
	}
	for name := range pureBuiltins {
		if !slices.Contains(names, name) {
			t.Errorf("pureBuiltins lists %s, which this OPA version does not have", name)
		}
	}
	for name := range impureBuiltins {
		if !slices.Contains(names, name) {
			t.Errorf("impureBuiltins lists %s, which this OPA version does not have", name)
		}
	}
}

// TestUnreviewedBuiltinsTurnTheCacheOff: a set that calls a built-in the
// allow-list does not name is not cached, as a term, as a statement or as
// a with value; one that calls only pure ones is. The impure built-ins
// stand for a built-in a future OPA adds, which no list names.
func TestUnreviewedBuiltinsTurnTheCacheOff(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, rule string
		cached     bool
	}{
		{name: "pure only", rule: `x := count(split(input.pod.metadata.name, "-"))`, cached: true},
		{name: "a clock OPA does not mark", rule: `x := crypto.x509.parse_and_verify_certificates(input.config.chain)`},
		{name: "a clock OPA marks", rule: `x := time.now_ns()`},
		{name: "as a statement", rule: "x if {\n\tio.jwt.decode_verify(input.config.t, {}, y)\n\ty\n}"},
		{name: "as a with value", rule: "f(a) := a\n\nx if {\n\ty := f(\"k\") with f as uuid.rfc4122\n\ty\n}"},
		{name: "a signer", rule: `x := providers.aws.sign_req({}, {}, 0)`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			src := "package runwarden.admission\n\ndecision := {\"deny\": [], \"warnings\": [], \"mutations\": {}}\n\n" + tt.rule + "\n"
			s, err := Load(t.Context(), fstest.MapFS{"a.rego": {Data: []byte(src)}}, tt.name, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if s.Cached != tt.cached {
				t.Errorf("cached = %v, want %v", s.Cached, tt.cached)
			}
		})
	}
}
