package policy

import (
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"

	"github.com/runwarden/runwarden/policies"
)

// TestCacheOffNamesTheForm: a set that turns the cache off says why, with
// the file, the line and the form of the first place that does, for every
// form in CacheOffForms.
func TestCacheOffNamesTheForm(t *testing.T) {
	t.Parallel()
	// Each module's decision is on line 3, after its package clause; the
	// policy under test starts on line 5.
	const decide = "package runwarden.admission\n\ndecision := {\"deny\": [], \"warnings\": [json.marshal(x)], \"mutations\": {}}\n\n"
	tests := []struct {
		name  string
		files map[string]string
		want  CacheOff // its What is a part of the reason's
	}{
		{
			name:  "the input whole",
			files: map[string]string{"p.rego": decide + "x := json.marshal(input)\n"},
			want:  CacheOff{Form: CacheOffWholeInput, File: "p.rego", Line: 5, What: "input read whole"},
		},
		{
			name:  "a key of the input that is not a constant",
			files: map[string]string{"p.rego": decide + "k := \"pod\"\n\nx := input[k]\n"},
			want:  CacheOff{Form: CacheOffWholeInput, File: "p.rego", Line: 7, What: "input[k] reads the whole input"},
		},
		{
			name:  "a key of the input spelled as a marker",
			files: map[string]string{"p.rego": decide + "x := input[\"?\"]\n"},
			want:  CacheOff{Form: CacheOffWholeInput, File: "p.rego", Line: 5, What: `input["?"] reads the whole input`},
		},
		{
			name:  "object.get of the input with a key that is not a constant",
			files: map[string]string{"p.rego": decide + "k := \"pod\"\n\nx := object.get(input, k, {})\n"},
			want:  CacheOff{Form: CacheOffWholeInput, File: "p.rego", Line: 7, What: "input read whole"},
		},
		{
			name:  "an alias of the whole input used whole",
			files: map[string]string{"p.rego": decide + "whole := object.get(input, [], {})\n\nx := count(whole)\n"},
			want:  CacheOff{Form: CacheOffWholeInput, File: "p.rego", Line: 7, What: "whole reads the whole input"},
		},
		{
			name:  "a built-in that reads the clock, as a term",
			files: map[string]string{"lib/clock.rego": decide + "x := time.now_ns()\n"},
			want:  CacheOff{Form: CacheOffImpureBuiltin, File: "lib/clock.rego", Line: 5, What: "a call of time.now_ns, a built-in that depends on the clock"},
		},
		{
			name:  "a built-in that reads randomness, as a statement",
			files: map[string]string{"p.rego": decide + "x := n if {\n\trand.intn(\"k\", 10, n)\n}\n"},
			want:  CacheOff{Form: CacheOffImpureBuiltin, File: "p.rego", Line: 6, What: "a call of rand.intn, a built-in that depends on randomness"},
		},
		{
			name:  "a built-in that reads the clock unmarked by OPA",
			files: map[string]string{"p.rego": decide + "x := crypto.x509.parse_and_verify_certificates(input.config.chain)\n"},
			want:  CacheOff{Form: CacheOffImpureBuiltin, File: "p.rego", Line: 5, What: "a call of crypto.x509.parse_and_verify_certificates, a built-in that depends on the clock"},
		},
		{
			name:  "a function mocked with an impure built-in",
			files: map[string]string{"p.rego": decide + "f(_) := 0\n\nx := y if {\n\ty := f(input.config.k) with data.runwarden.admission.f as uuid.rfc4122\n}\n"},
			want:  CacheOff{Form: CacheOffWithImpureBuiltin, File: "p.rego", Line: 8, What: "with data.runwarden.admission.f as uuid.rfc4122 mocks a function with uuid.rfc4122"},
		},
		{
			name:  "a built-in replaced with with",
			files: map[string]string{"p.rego": decide + "myget(o, _, _) := o\n\nx := y if {\n\ty := object.get(input.pod.spec, \"nodeName\", \"\") with object.get as myget\n}\n"},
			want:  CacheOff{Form: CacheOffWithTarget, File: "p.rego", Line: 8, What: "with object.get as myget replaces object.get"},
		},
		{
			name:  "a rule named as a built-in",
			files: map[string]string{"p.rego": decide + "x := 1\n\nobject.get(o, _, _) := o\n"},
			want:  CacheOff{Form: CacheOffBuiltinName, File: "p.rego", Line: 7, What: "rule object.get takes the name of the built-ins object.*"},
		},
		{
			name: "an import named as a built-in",
			files: map[string]string{
				"p.rego": "package runwarden.admission\n\nimport data.runwarden.lib.object\n\ndecision := {\"deny\": [], \"warnings\": [], \"mutations\": {}}\n",
			},
			want: CacheOff{Form: CacheOffBuiltinName, File: "p.rego", Line: 3, What: "import data.runwarden.lib.object names the built-ins object.*"},
		},
		{
			name: "the first place in file order, the others counted",
			files: map[string]string{
				"b.rego": "package runwarden.admission\n\ny := time.now_ns()\n",
				"a.rego": decide + "x := [input[k] | some k in [\"pod\"]]\n\nz := time.now_ns()\n",
			},
			want: CacheOff{Form: CacheOffWholeInput, File: "a.rego", Line: 5, What: "input[k] reads the whole input", More: 2},
		},
	}
	covered := map[CacheOffForm]bool{}
	for _, tt := range tests {
		covered[tt.want.Form] = true
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fsys := fstest.MapFS{}
			for name, src := range tt.files {
				fsys[name] = &fstest.MapFile{Data: []byte(src)}
			}
			s, err := Load(t.Context(), fsys, tt.name, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if s.Cached || s.CacheOff == nil {
				t.Fatalf("Cached %v, CacheOff %v: want the cache off", s.Cached, s.CacheOff)
			}
			got := *s.CacheOff
			if !strings.Contains(got.What, tt.want.What) {
				t.Errorf("What %q, want it to hold %q", got.What, tt.want.What)
			}
			got.What, got.col = tt.want.What, 0
			if diff := cmp.Diff(tt.want, got, cmp.AllowUnexported(CacheOff{})); diff != "" {
				t.Errorf("CacheOff (-want +got):\n%s", diff)
			}
		})
	}
	for _, form := range CacheOffForms() {
		if !covered[form] {
			t.Errorf("no case turns the cache off with %s", form)
		}
	}
}

// TestCacheableSetsHaveNoReason: the shipped policies, and a set that reads
// by name, keep the cache on, with no reason.
func TestCacheableSetsHaveNoReason(t *testing.T) {
	t.Parallel()
	shipped, err := Load(t.Context(), policies.FS, "embedded", Options{})
	if err != nil {
		t.Fatal(err)
	}
	named, err := Load(t.Context(), fstest.MapFS{"p.rego": {Data: []byte(`package runwarden.admission

ann := object.get(input, ["pod", "metadata", "annotations"], {})

decision := {"deny": [], "warnings": [w | some c in input.pod.spec.containers; w := sprintf("%s %s", [c.name, ann.x])], "mutations": {}}
`)}}, "named", Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range []*Set{shipped, named} {
		if !s.Cached || s.CacheOff != nil {
			t.Errorf("%s: Cached %v, CacheOff %v: want the cache on", s.Origin, s.Cached, s.CacheOff)
		}
	}
}

// TestCacheOffString: the reason as the webhook logs it and policy eval
// prints it.
func TestCacheOffString(t *testing.T) {
	t.Parallel()
	tests := []struct {
		off  CacheOff
		want string
	}{
		{
			off:  CacheOff{Form: CacheOffImpureBuiltin, File: "lib/clock.rego", Line: 5, What: "a call of time.now_ns, a built-in that depends on the clock"},
			want: "lib/clock.rego:5: a call of time.now_ns, a built-in that depends on the clock (impure-builtin)",
		},
		{
			off:  CacheOff{Form: CacheOffWholeInput, File: "p.rego", Line: 7, What: "input[k] reads the whole input", More: 2},
			want: "p.rego:7: input[k] reads the whole input (whole-input); and 2 more",
		},
		{off: CacheOff{Form: CacheOffWholeInput, What: "input read whole"}, want: "input read whole (whole-input)"},
	}
	for _, tt := range tests {
		if got := tt.off.String(); got != tt.want {
			t.Errorf("String() = %q, want %q", got, tt.want)
		}
	}
	if forms := CacheOffForms(); len(slices.Compact(slices.Sorted(slices.Values(forms)))) != len(forms) {
		t.Errorf("CacheOffForms %v: a form twice", forms)
	}
}
