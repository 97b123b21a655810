package policy

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/open-policy-agent/opa/v1/ast"

	"github.com/runwarden/runwarden/policies"
)

// slowDecision decides at once on the probe pod (no input.config.slow), and
// for a pod whose platform configuration sets slow, only after a nested
// loop of 10^10 steps: far past any deadline, so only cancellation ends it.
const slowDecision = `package runwarden.admission

decision := {"deny": [], "warnings": [], "mutations": {}} if not input.config.slow

decision := {"deny": [], "warnings": [sprintf("%d", [n])], "mutations": {}} if {
	input.config.slow
	n := count([1 | some i in numbers.range(1, 100000); some j in numbers.range(1, 100000)])
}
`

// slowAlways takes the nested loop on every pod, the probe pod included.
const slowAlways = `package runwarden.admission

decision := {"deny": [], "warnings": [sprintf("%d", [n])], "mutations": {}} if {
	n := count([1 | some i in numbers.range(1, 100000); some j in numbers.range(1, 100000)])
}
`

// slowTest is a test that takes the nested loop.
const slowTest = `package runwarden.admission_test

test_slow if count([1 | some i in numbers.range(1, 100000); some j in numbers.range(1, 100000)]) > 0
`

// The deadline is short so the tests end soon; the assertions are only that
// each call returned, with the deadline's error.
var short = Options{Timeout: 300 * time.Millisecond, TestTimeout: 300 * time.Millisecond}

func TestEvalStopsASlowRuleAtTheDeadline(t *testing.T) {
	t.Parallel()
	s, err := Load(t.Context(), fstest.MapFS{"a.rego": {Data: []byte(slowDecision)}}, "slow", short)
	if err != nil {
		t.Fatalf("Load (the probe pod is decided at once): %v", err)
	}
	in := runnerInput()
	in.Config = map[string]any{"slow": true}
	for name, eval := range map[string]func() (Decision, error){
		"Eval":         func() (Decision, error) { return s.Eval(t.Context(), in) },
		"EvalUncached": func() (Decision, error) { return s.EvalUncached(t.Context(), in) },
	} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			d, err := eval()
			if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "took longer than 300ms") {
				t.Fatalf("%s of a slow rule = %+v, %v; want ErrTimeout naming the deadline", name, d, err)
			}
		})
	}
}

func TestLoadRefusesASetPastTheDeadline(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		fs   fstest.MapFS
		is   []error
		want string
	}{
		{name: "slow probe decision", fs: fstest.MapFS{"a.rego": {Data: []byte(slowAlways)}}, is: []error{ErrTimeout}, want: "deciding on a plain runner pod"},
		{
			name: "slow test",
			fs:   fstest.MapFS{"a.rego": {Data: []byte(minimal)}, "a_test.rego": {Data: []byte(slowTest)}},
			is:   []error{ErrTestsFailed, ErrTimeout},
			want: "a_test.rego:3) ran past the deadline of 300ms",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := Load(t.Context(), tt.fs, tt.name, short)
			for _, is := range tt.is {
				if !errors.Is(err, is) {
					t.Errorf("Load error = %v, want %v", err, is)
				}
			}
			if err == nil || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Load error = %v, want it to say %q", err, tt.want)
			}
		})
	}
}

func TestStoreKeepsTheLastGoodSetWhenAReloadTimesOut(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, "a.rego"), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write(minimal)
	var reloads []error
	s, err := NewStore(t.Context(), StoreOptions{Dir: dir, Interval: time.Hour, Load: short, OnReload: func(_ *Set, err error) { reloads = append(reloads, err) }})
	if err != nil {
		t.Fatal(err)
	}
	first := s.Current()

	write(slowAlways)
	s.Check(t.Context())
	if s.Current() != first || len(reloads) != 1 || !errors.Is(reloads[0], ErrTimeout) {
		t.Fatalf("slow set: current changed=%v, reloads %v; want the first set kept and ErrTimeout", s.Current() != first, reloads)
	}
	d, err := s.Current().Eval(t.Context(), runnerInput())
	if err != nil || len(d.Warnings) != 1 || d.Warnings[0] != "from v1" {
		t.Errorf("decision after the refused reload %+v, %v; want the first set's", d, err)
	}

	// The next change is loaded: the slow attempt blocked nothing.
	write(strings.Replace(minimal, "from v1", "from v2", 1))
	s.Check(t.Context())
	if len(reloads) != 2 || reloads[1] != nil || s.Current() == first {
		t.Fatalf("good set after a slow one not taken: reloads %v", reloads)
	}
}

func TestLoadRefusesNetworkAndHostBuiltins(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		call string
		want string
	}{
		{name: "http.send", call: `r := http.send({"method": "GET", "url": "http://example.invalid"})`, want: "http.send is not allowed"},
		{name: "http.send as a statement", call: `http.send({"method": "GET", "url": "http://example.invalid"}, r)`, want: "http.send is not allowed"},
		{name: "net.lookup_ip_addr", call: `r := net.lookup_ip_addr("example.invalid")`, want: "net.lookup_ip_addr is not allowed"},
		{name: "opa.runtime", call: `r := opa.runtime().env`, want: "opa.runtime is not allowed"},
		{name: "json.match_schema", call: `r := json.match_schema({}, {"$ref": "file:///etc/passwd"})`, want: "json.match_schema is not allowed"},
		{name: "json.verify_schema", call: `r := json.verify_schema({"$ref": "file:///etc/passwd"})`, want: "json.verify_schema is not allowed"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			// The call is on line 6 of policies/extra.rego.
			src := "package runwarden.admission\n\ndecision := {\"deny\": [], \"warnings\": [], \"mutations\": {}}\n\nx if {\n\t" + tt.call + "\n\tr\n}\n"
			_, err := Load(t.Context(), fstest.MapFS{"policies/extra.rego": {Data: []byte(src)}}, tt.name, Options{})
			if !errors.Is(err, ErrCompile) || !strings.Contains(err.Error(), "policies/extra.rego:6") || !strings.Contains(err.Error(), tt.want) {
				t.Errorf("Load error = %v, want ErrCompile at policies/extra.rego:6 saying %q", err, tt.want)
			}
		})
	}
}

func TestTheShippedPoliciesLoadWithTheCapabilities(t *testing.T) {
	t.Parallel()
	if _, err := Load(t.Context(), policies.FS, "embedded", Options{}); err != nil {
		t.Fatalf("Load: %v", err)
	}
	// The refused names are built-ins of this OPA version: one renamed by
	// an upgrade would silently be allowed under its new name.
	want := []string{"http.send", "json.match_schema", "json.verify_schema", "net.lookup_ip_addr", "opa.runtime"}
	if diff := cmp.Diff(want, RefusedBuiltins()); diff != "" {
		t.Errorf("refused built-ins of this OPA version (-want +got):\n%s", diff)
	}
	for _, name := range want {
		if Capabilities().ContainsBuiltin(name) {
			t.Errorf("the policies' capabilities contain %s", name)
		}
	}
	if c := Capabilities(); c.AllowNet == nil || len(c.AllowNet) != 0 {
		t.Errorf("AllowNet = %#v, want empty and not nil (nil allows every host)", c.AllowNet)
	}
	if !Capabilities().ContainsBuiltin("time.now_ns") {
		t.Error("the capabilities lack time.now_ns, which reaches nothing")
	}
}

// TestTestsStopAtTheFirstPastItsDeadline: of a set's many slow tests, the
// first past its own deadline stops the rest (which would each wait out
// theirs: 88 tests of 30 s are 44 minutes), and all of them together stop
// at the total deadline even when no single test has one.
func TestTestsStopAtTheFirstPastItsDeadline(t *testing.T) {
	t.Parallel()
	many := strings.Builder{}
	many.WriteString("package runwarden.admission_test\n")
	for i := range 40 {
		fmt.Fprintf(&many, "\ntest_slow_%d if count([1 | some i in numbers.range(1, 100000); some j in numbers.range(1, 100000)]) > 0\n", i)
	}
	mods := func(test string) map[string]*ast.Module {
		t.Helper()
		out := map[string]*ast.Module{}
		for name, src := range map[string]string{"a.rego": minimal, "a_test.rego": test} {
			m, err := ast.ParseModuleWithOpts(name, src, ast.ParserOptions{RegoVersion: ast.RegoV1})
			if err != nil {
				t.Fatal(err)
			}
			out[name] = m
		}
		return out
	}
	tests := []struct {
		name  string
		test  string
		opts  Options
		ran   int // at most
		wants []string
	}{
		{
			name: "each test's deadline", test: many.String(),
			opts: Options{TestTimeout: 300 * time.Millisecond, TestsTimeout: time.Hour},
			ran:  20, wants: []string{"ran past the deadline of 300ms; the rest were not run"},
		},
		{
			name: "the total deadline", test: slowTest,
			opts: Options{TestTimeout: time.Hour, TestsTimeout: 300 * time.Millisecond},
			ran:  1, wants: []string{"the set's tests ran past their total deadline of 300ms in data.runwarden.admission_test.test_slow (a_test.rego:3), test 1; the rest were not run"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			m := mods(tt.test)
			c, err := compile(m)
			if err != nil {
				t.Fatal(err)
			}
			n, err := runTests(t.Context(), c, m, nil, tt.opts)
			if !errors.Is(err, ErrTestsFailed) || !errors.Is(err, ErrTimeout) {
				t.Fatalf("runTests error = %v, want ErrTestsFailed and ErrTimeout", err)
			}
			// The runner runs as many tests at once as there are CPUs,
			// and one waiting for its turn when the stop comes may still
			// start (and end at once): a few more than one, never all.
			if n > tt.ran || strings.Count(err.Error(), "the rest were not run") != 1 {
				t.Errorf("%d tests ran, error %v; want at most %d, and one past its deadline", n, err, tt.ran)
			}
			for _, w := range tt.wants {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("runTests error = %v, want it to say %q", err, w)
				}
			}
		})
	}
	t.Run("TestWithCoverage has one total deadline", func(t *testing.T) {
		t.Parallel()
		_, err := TestWithCoverage(t.Context(), fstest.MapFS{"a.rego": {Data: []byte(minimal)}, "a_test.rego": {Data: []byte(slowTest)}}, "slow",
			Options{TestTimeout: time.Hour, TestsTimeout: 300 * time.Millisecond})
		if !errors.Is(err, ErrTimeout) || !strings.Contains(err.Error(), "total deadline of 300ms") {
			t.Errorf("TestWithCoverage error = %v, want the total deadline's", err)
		}
	})
}
