package policy

import (
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
)

// TestRules checks that Rules names the literal rules of violation calls,
// once each, and not those of tests or of computed names.
func TestRules(t *testing.T) {
	t.Parallel()
	const src = `package runwarden.admission

violation(rule, container, field, message) := {"rule": rule, "container": container, "field": field, "message": message}

violations contains violation("no-b", "", "spec", "b") if input.pod.spec.b

violations contains violation("no-a", "main", "spec", "a") if input.pod.spec.a

violations contains violation("no-a", "init", "spec", "a") if input.pod.spec.c

violations contains violation(sprintf("computed-%s", ["x"]), "", "spec", "x") if input.pod.spec.x

decision := {"deny": [v | some v in violations], "warnings": [], "mutations": {}}
`
	const test = `package runwarden.admission_test

import data.runwarden.admission

test_only if {
	admission.violation("from-a-test", "", "", "") == {"rule": "from-a-test", "container": "", "field": "", "message": ""}
}
`
	s, err := Load(t.Context(), fstest.MapFS{"p.rego": {Data: []byte(src)}, "p_test.rego": {Data: []byte(test)}}, "rules", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff([]string{"no-a", "no-b"}, s.Rules()); diff != "" {
		t.Errorf("Rules (-want +got):\n%s", diff)
	}
}
