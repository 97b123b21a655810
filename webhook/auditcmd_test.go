package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/runwarden/runwarden/policies"
	"github.com/runwarden/runwarden/webhook/audit"
	"github.com/runwarden/runwarden/webhook/policy"
)

// candidateDir is the shipped policies and the candidate rule of
// webhook/audit/testdata/candidate.rego, in a folder.
func candidateDir(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, policies.FS); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(filepath.Join("audit", "testdata", "candidate.rego"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "candidate.rego"), b, 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestPolicyAuditFiles runs policy audit on exported Jobs and pods and
// checks its exit status and what it names.
func TestPolicyAuditFiles(t *testing.T) {
	t.Parallel()
	candidate := candidateDir(t)
	pods := filepath.Join("testdata", "audit")
	tests := []struct {
		name     string
		args     []string
		code     int
		contains []string
	}{
		{
			name: "new denial", args: []string{"--policies", candidate, "--pods", pods}, code: auditNewDenials,
			contains: []string{
				"namespace team-a:\n  NEWLY DENIED: job/task-debug (job template, testdata/audit/jobs.yaml)\n    + deny no-debug-env: no-debug-env: DEBUG is set; remove it\n  unchanged: 1 pod(s)",
				"namespace team-b:\n  MUTATED DIFFERENTLY: pod/task-old-x7k2p (admitted pod (its Job is gone), testdata/audit/pods.yaml)\n    + patch add /metadata/annotations/runwarden.dev~1cost-center \"blue\"",
				"by rule:\n  no-debug-env now denies 1 pod(s): team-a/job/task-debug",
				"3 pod(s) audited, 1 newly denied",
			},
		},
		{name: "new denial allowed", args: []string{"--policies", candidate, "--pods", pods, "--allow-new-denials"}, code: auditOK},
		{name: "the same set", args: []string{"--policies", candidate, "--current", candidate, "--pods", pods}, code: auditOK, contains: []string{"unchanged: 2 pod(s)", "3 pod(s) audited, 0 newly denied"}},
		{name: "candidate removes the rule", args: []string{"--policies", candidateWithout(t), "--current", candidate, "--pods", pods}, code: auditOK, contains: []string{"NO LONGER DENIED: job/task-debug", "no-debug-env no longer denies 1 pod(s)"}},
		{name: "no source", args: []string{"--policies", candidate}, code: auditBadArguments},
		{name: "both sources", args: []string{"--policies", candidate, "--pods", pods, "--against-cluster"}, code: auditBadArguments},
		{name: "no pods there", args: []string{"--policies", candidate, "--pods", t.TempDir()}, code: auditBadArguments},
		{name: "candidate does not load", args: []string{"--policies", t.TempDir(), "--pods", pods}, code: auditFailed},
		{name: "bad output", args: []string{"--policies", candidate, "--pods", pods, "-o", "xml"}, code: auditBadArguments},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var stdout, stderr bytes.Buffer
			code := run(t.Context(), append([]string{"policy", "audit"}, tt.args...), &stdout, &stderr)
			if code != tt.code {
				t.Fatalf("exit status %d, want %d\nstdout:\n%s\nstderr:\n%s", code, tt.code, stdout.String(), stderr.String())
			}
			for _, want := range tt.contains {
				if !strings.Contains(stdout.String(), want) {
					t.Errorf("output lacks %q:\n%s", want, stdout.String())
				}
			}
		})
	}
}

// candidateWithout is the shipped set alone, as a folder.
func candidateWithout(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	if err := os.CopyFS(dir, policies.FS); err != nil {
		t.Fatal(err)
	}
	return dir
}

// TestPolicyAuditJSON checks the machine output: the pods' changes and
// the rules'.
func TestPolicyAuditJSON(t *testing.T) {
	t.Parallel()
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), []string{"policy", "audit", "--policies", candidateDir(t), "--pods", filepath.Join("testdata", "audit"), "-o", "json"}, &stdout, &stderr)
	if code != auditNewDenials {
		t.Fatalf("exit status %d, want %d: %s", code, auditNewDenials, stderr.String())
	}
	var got audit.Comparison
	if err := json.Unmarshal(stdout.Bytes(), &got); err != nil {
		t.Fatalf("the output is not a comparison: %v\n%s", err, stdout.String())
	}
	changes := map[string]audit.Change{}
	for _, d := range got.Diffs {
		changes[d.Subject.Ref.String()] = d.Change
	}
	want := map[string]audit.Change{"job/task-debug": audit.NewlyDenied, "job/task-plain": audit.Unchanged, "pod/task-old-x7k2p": audit.MutatedDifferently}
	if diff := cmp.Diff(want, changes); diff != "" {
		t.Errorf("changes (-want +got):\n%s", diff)
	}
	if len(got.Rules) != 1 || got.Rules[0].Rule != "no-debug-env" || got.Rules[0].List != audit.ListDeny {
		t.Errorf("rules = %+v, want no-debug-env in deny", got.Rules)
	}
}

// TestCurrentSetFromTheReleaseConfigMap checks that the set in force is
// read from the chart's ConfigMap as the webhook loads its folder: the
// same files give the same digest; a ConfigMap that is not there names
// the flags to give.
func TestCurrentSetFromTheReleaseConfigMap(t *testing.T) {
	t.Parallel()
	data := map[string]string{}
	entries, err := policies.FS.ReadDir(".")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		b, err := policies.FS.ReadFile(e.Name())
		if err != nil {
			t.Fatal(err)
		}
		data[e.Name()] = string(b)
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "rw-runwarden-policies", Namespace: "runwarden"}, Data: data}
	cl := fake.NewClientBuilder().WithObjects(cm).Build()
	c := auditConfig{release: "rw-runwarden", releaseNamespace: "runwarden"}
	set, err := currentSet(t.Context(), cl, c, policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	shipped, err := policy.Load(t.Context(), policies.FS, "shipped", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if set.Digest != shipped.Digest || set.Origin != "configmap runwarden/rw-runwarden-policies" {
		t.Errorf("set from the ConfigMap: origin %q digest %s; want configmap runwarden/rw-runwarden-policies and the shipped digest %s", set.Origin, set.Digest, shipped.Digest)
	}
	c.release = "other"
	if _, err := currentSet(t.Context(), cl, c, policy.Options{}); err == nil || !strings.Contains(err.Error(), "give --release and --release-namespace") {
		t.Errorf("a missing ConfigMap: %v, want the flags named", err)
	}
}
