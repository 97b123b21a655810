package policy

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runwarden/runwarden/policies"
)

const minimal = `package runwarden.admission

decision := {"deny": [], "warnings": ["from v1"], "mutations": {}}
`

const minimalTest = `package runwarden.admission_test

import data.runwarden.admission

test_warns if admission.decision.warnings == ["from v1"]
`

func runnerInput() *Input {
	return &Input{
		Operation: "CREATE",
		Pod: &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: "team-a", Labels: map[string]string{"runwarden.dev/runner": "true"}},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "r/x:1"}}},
		},
		Namespace:      NamespaceInfo{Name: "team-a", Labels: map[string]string{}, Annotations: map[string]string{}},
		ServiceAccount: ObjectInfo{Name: "default", Annotations: map[string]string{"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/r"}},
		Config:         map[string]any{"workloadIdentity": map[string]any{"aws": map[string]any{"enabled": true}}},
		SecretRefs:     []SecretRef{},
	}
}

func TestLoadEmbeddedPoliciesPassTheirTests(t *testing.T) {
	t.Parallel()
	s, err := Load(t.Context(), policies.FS, "embedded", Options{})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if s.Tests < 20 {
		t.Errorf("ran %d tests, want the shipped suite (20 or more)", s.Tests)
	}
	d, err := s.Eval(t.Context(), runnerInput())
	if err != nil {
		t.Fatalf("Eval: %v", err)
	}
	var names []string
	for _, e := range d.Mutations.Env {
		names = append(names, e.Env.Name)
	}
	if len(names) != 2 || len(d.Mutations.Volumes) != 1 || d.Mutations.Volumes[0].Projected == nil {
		t.Errorf("IRSA decision: env %v, volumes %+v", names, d.Mutations.Volumes)
	}
}

func TestLoadRefusesBadSets(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		fs   fstest.MapFS
		is   error
	}{
		{name: "empty", fs: fstest.MapFS{"README.md": {Data: []byte("x")}}, is: ErrNoPolicies},
		{name: "syntax error", fs: fstest.MapFS{"a.rego": {Data: []byte("package x\n\nallow if {")}}, is: ErrCompile},
		{name: "v0 syntax", fs: fstest.MapFS{"a.rego": {Data: []byte("package x\n\nallow { true }\n")}}, is: ErrCompile},
		{name: "undefined reference", fs: fstest.MapFS{"a.rego": {Data: []byte("package runwarden.admission\n\ndecision := nope\n")}}, is: ErrCompile},
		{name: "failing test", fs: fstest.MapFS{
			"a.rego":      {Data: []byte(minimal)},
			"a_test.rego": {Data: []byte("package runwarden.admission_test\n\nimport data.runwarden.admission\n\ntest_fails if admission.decision.warnings == [\"something else\"]\n")},
		}, is: ErrTestsFailed},
		{name: "misspelt package", fs: fstest.MapFS{"a.rego": {Data: []byte(strings.Replace(minimal, "package runwarden.admission", "package runwarden.admision", 1))}}, is: ErrNoDecision},
		{name: "decision of the wrong shape", fs: fstest.MapFS{"a.rego": {Data: []byte("package runwarden.admission\n\ndecision := {\"deny\": \"nope\"}\n")}}, is: ErrCompile},
		// json.Unmarshal ignores unknown keys: a misspelt deny would admit every pod.
		{name: "decision with a misspelt deny", fs: decisionFS(`{"denials": [], "warnings": [], "mutations": {}}`), is: ErrCompile},
		{name: "decision without warnings", fs: decisionFS(`{"deny": [], "mutations": {}}`), is: ErrCompile},
		{name: "decision without mutations", fs: decisionFS(`{"deny": [], "warnings": []}`), is: ErrCompile},
		{name: "decision with an unknown key", fs: decisionFS(`{"deny": [], "warnings": [], "mutations": {}, "patch": []}`), is: ErrCompile},
		{name: "decision with a null deny", fs: decisionFS(`{"deny": null, "warnings": [], "mutations": {}}`), is: ErrCompile},
		{name: "decision with mutations that are not an object", fs: decisionFS(`{"deny": [], "warnings": [], "mutations": []}`), is: ErrCompile},
		{name: "decision that is not an object", fs: decisionFS(`[]`), is: ErrCompile},
		{name: "decision with a dryrun that is not a list", fs: decisionFS(`{"deny": [], "dryrun": {}, "warnings": [], "mutations": {}}`), is: ErrCompile},
		{name: "decision with a warn that is not a list", fs: decisionFS(`{"deny": [], "warn": "x", "warnings": [], "mutations": {}}`), is: ErrCompile},
		{name: "decision with a misspelt dryrun", fs: decisionFS(`{"deny": [], "dry_run": [], "warnings": [], "mutations": {}}`), is: ErrCompile},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if _, err := Load(t.Context(), tt.fs, tt.name, Options{}); !errors.Is(err, tt.is) {
				t.Errorf("Load error = %v, want %v", err, tt.is)
			}
		})
	}
}

// TestLoadAcceptsDecisionsWithAndWithoutActions checks that warn and
// dryrun are optional: a set written before actions loads, and so does one
// with them.
func TestLoadAcceptsDecisionsWithAndWithoutActions(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		term string
	}{
		{name: "without warn and dryrun", term: `{"deny": [], "warnings": [], "mutations": {}}`},
		{name: "with warn and dryrun", term: `{"deny": [], "warn": [], "dryrun": [], "warnings": [], "mutations": {}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if _, err := Load(t.Context(), decisionFS(tt.term), tt.name, Options{}); err != nil {
				t.Errorf("Load: %v", err)
			}
		})
	}
}

// decisionFS is a policy set whose decision is the given Rego term.
func decisionFS(term string) fstest.MapFS {
	return fstest.MapFS{"a.rego": {Data: []byte("package runwarden.admission\n\ndecision := " + term + "\n")}}
}

func TestLoadSkipsConfigMapMountInternals(t *testing.T) {
	t.Parallel()
	fsys := fstest.MapFS{
		"a.rego":                   {Data: []byte(minimal)},
		"..2026_11_22/a.rego":      {Data: []byte(minimal)},
		"..2026_11_22/broken.rego": {Data: []byte("not rego")},
		"nested/a_test.rego":       {Data: []byte(minimalTest)},
	}
	s, err := Load(t.Context(), fsys, "mount", Options{})
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if len(s.Files) != 2 || s.Tests != 1 {
		t.Errorf("files %v, tests %d; want a.rego and nested/a_test.rego, 1 test", s.Files, s.Tests)
	}
}

func TestStoreKeepsTheLastGoodSet(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	write := func(name, content string) {
		t.Helper()
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	write("a.rego", minimal)
	write("a_test.rego", minimalTest)
	var reloads []error
	s, err := NewStore(t.Context(), StoreOptions{Dir: dir, Interval: time.Hour, OnReload: func(_ *Set, err error) { reloads = append(reloads, err) }})
	if err != nil {
		t.Fatal(err)
	}
	first := s.Current()

	s.Check(t.Context()) // unchanged: no reload
	if len(reloads) != 0 {
		t.Fatalf("reloaded an unchanged folder: %v", reloads)
	}

	write("a.rego", "package runwarden.admission\n\ndecision := {\n") // does not compile
	s.Check(t.Context())
	if s.Current() != first || len(reloads) != 1 || !errors.Is(reloads[0], ErrCompile) {
		t.Fatalf("broken set: current changed=%v, reloads %v", s.Current() != first, reloads)
	}

	write("a.rego", `package runwarden.admission

decision := {"deny": [], "warnings": ["from v2"], "mutations": {}}
`) // compiles, but a_test.rego now fails
	s.Check(t.Context())
	if s.Current() != first || len(reloads) != 2 || !errors.Is(reloads[1], ErrTestsFailed) {
		t.Fatalf("set failing its tests: current changed=%v, reloads %v", s.Current() != first, reloads)
	}

	write("a_test.rego", "package runwarden.admission_test\n\nimport data.runwarden.admission\n\ntest_warns if admission.decision.warnings == [\"from v2\"]\n")
	s.Check(t.Context())
	if len(reloads) != 3 || reloads[2] != nil || s.Current() == first {
		t.Fatalf("good set not taken: reloads %v", reloads)
	}
	d, err := s.Current().Eval(t.Context(), runnerInput())
	if err != nil || len(d.Warnings) != 1 || d.Warnings[0] != "from v2" {
		t.Errorf("decision %+v, %v; want the v2 warning", d, err)
	}
}

func TestTestWithCoverage(t *testing.T) {
	t.Parallel()
	rep, err := TestWithCoverage(t.Context(), policies.FS, "embedded", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Coverage < 90 {
		t.Errorf("shipped policies' coverage %.1f%%, want at least 90%%; uncovered: %v", rep.Coverage, rep.Uncovered)
	}
}
