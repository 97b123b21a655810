package policy

import (
	"encoding/json"
	"os"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/yaml"
)

// TestRedactor checks what a Redactor replaces in a text, and what it
// keeps: the pod's shape, its identity, secret references, short values.
func TestRedactor(t *testing.T) {
	t.Parallel()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: "task-1-abcde", Namespace: "team-a",
			Labels:          map[string]string{"job-name": "task-1-deploy-prod", "team": "label-value-1"},
			Annotations:     map[string]string{"note": "an annotation value", "runwarden.dev/warnings": "container main has no limits"},
			OwnerReferences: []metav1.OwnerReference{{Kind: "Job", Name: "task-1-deploy-prod", UID: "0f0e-uid-of-the-job"}},
		},
		Spec: corev1.PodSpec{
			InitContainers: []corev1.Container{{Name: "i", Env: []corev1.EnvVar{{Name: "A", Value: "init-secret"}}}},
			Containers: []corev1.Container{{
				Name: "main", Image: "registry.example.com/runner:1",
				Command: []string{"sh", "-c", "deploy --password=pw-0123456789 now"},
				Args:    []string{"--verbose", "a-long-argument-token-0123456789"},
				Env: []corev1.EnvVar{
					{Name: "B", Value: "s3cr3t"}, {Name: "C", Value: "s3cr3t-longer"}, {Name: "D", Value: "on"},
					{Name: "E", Value: "${vault:secret/db.password@team-a}"},
					{Name: "F", Value: `quote"back\slash<tag>&é`},
					{Name: "G", Value: "Bearer ${vault:secret/api#token@team-a}"},
					{Name: "H", Value: "${vault:team-a/../team-b/db.password@team-a}"},
					{Name: "I", Value: "${vault:unclosed-token-0123"},
				},
			}},
		},
	}
	r := NewRedactor(pod, nil)
	tests := []struct{ name, msg, want string }{
		{name: "init env value", msg: "saw init-secret here", want: "saw [redacted] here"},
		{name: "longest first", msg: "x s3cr3t-longer y s3cr3t", want: "x [redacted] y [redacted]"},
		{name: "short values kept", msg: "turned on", want: "turned on"},
		{name: "a whole reference kept", msg: "reference ${vault:secret/db.password@team-a} refused", want: "reference ${vault:secret/db.password@team-a} refused"},
		{name: "a reference in a value kept, the rest not", msg: "${vault:secret/api#token@team-a} in Bearer ${vault:secret/api#token@team-a}", want: "${vault:secret/api#token@team-a} in [redacted]"},
		{name: "a malformed reference kept: it names a secret", msg: "malformed secret reference ${vault:team-a/../team-b/db.password@team-a}: invalid secret id", want: "malformed secret reference ${vault:team-a/../team-b/db.password@team-a}: invalid secret id"},
		{name: "an unclosed reference is a value", msg: "malformed secret reference ${vault:unclosed-token-0123: no closing brace", want: "malformed secret reference [redacted]: no closing brace"},
		{name: "JSON-escaped", msg: `{"F":"quote\"back\\slash\u003ctag\u003e\u0026é"}`, want: `{"F":"[redacted]"}`},
		{name: "JSON-escaped without HTML escapes", msg: `"quote\"back\\slash<tag>&é"`, want: `"[redacted]"`},
		{name: "Go-quoted", msg: `["quote\"back\\slash<tag>&é"]`, want: `["[redacted]"]`},
		{name: "ASCII-quoted", msg: `"quote\"back\\slash<tag>&\u00e9"`, want: `"[redacted]"`},
		{name: "marshalled twice", msg: `{"v":"\"quote\\\"back\\\\slash\\u003ctag\\u003e\\u0026é\""}`, want: `{"v":"\"[redacted]\""}`},
		{name: "URL-encoded", msg: "q=quote%22back%5Cslash%3Ctag%3E%26%C3%A9", want: "q=[redacted]"},
		{name: "a part of an argument after =", msg: "password pw-0123456789", want: "password [redacted]"},
		{name: "a run of a long argument", msg: "token ends argument-token-01234", want: "token ends [redacted]"},
		{name: "a label value", msg: "team label-value-1", want: "team [redacted]"},
		{name: "an annotation value", msg: "note: an annotation value", want: "note: [redacted]"},
		{name: "the record annotation is not a value", msg: "container main has no limits", want: "container main has no limits"},
		{name: "the pod's identity is not a value", msg: "Job task-1-deploy-prod (UID 0f0e-uid-of-the-job)", want: "Job task-1-deploy-prod (UID 0f0e-uid-of-the-job)"},
		{name: "an image is not a value", msg: "image registry.example.com/runner:1", want: "image registry.example.com/runner:1"},
		{name: "a URL's userinfo, whoever wrote it", msg: "clone https://gitlab-ci-token:abc@gitlab.example.com/x.git and ssh://git@host/y", want: "clone https://[redacted]@gitlab.example.com/x.git and ssh://[redacted]@host/y"},
		{name: "a URL without userinfo kept", msg: "see https://example.com/a@b", want: "see https://example.com/a@b"},
		{name: "empty", msg: "", want: ""},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := r.Redact(tt.msg); got != tt.want {
				t.Errorf("Redact(%q) = %q, want %q", tt.msg, got, tt.want)
			}
		})
	}
}

// TestRedactorFindsTheUserinfoOfAPodsURL: the userinfo of a URL the pod
// carries is a value, whole and each half, wherever a message quotes it.
func TestRedactorFindsTheUserinfoOfAPodsURL(t *testing.T) {
	t.Parallel()
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Annotations: map[string]string{
		"runwarden.dev/repo-url": "https://gitlab-ci-token:tok3n-value@gitlab.example.com/g/p.git",
	}}}
	r := NewRedactor(pod)
	for msg, want := range map[string]string{
		"user and token gitlab-ci-token:tok3n-value": "user and token [redacted]",
		"token tok3n-value":                          "token [redacted]",
	} {
		if got := r.Redact(msg); got != want {
			t.Errorf("Redact(%q) = %q, want %q", msg, got, want)
		}
	}
}

// quotingPod is testdata/quoting/pod.yaml, and the secrets it holds.
func quotingPod(t testing.TB) (*corev1.Pod, []string) {
	t.Helper()
	b, err := os.ReadFile("testdata/quoting/pod.yaml")
	if err != nil {
		t.Fatal(err)
	}
	pod := &corev1.Pod{}
	if err := yaml.UnmarshalStrict(b, pod); err != nil {
		t.Fatal(err)
	}
	s, err := os.ReadFile("testdata/quoting/secrets.txt")
	if err != nil {
		t.Fatal(err)
	}
	secrets := strings.Fields(string(s))
	raw, _ := json.Marshal(pod)
	for _, sec := range secrets {
		if !strings.Contains(string(raw), sec) {
			t.Fatalf("the pod holds no secret %q", sec)
		}
	}
	return pod, secrets
}

// leaked names each secret of which text holds 8 bytes in a row (all of a
// shorter one).
func leaked(text string, secrets []string) []string {
	var out []string
	for _, s := range secrets {
		n := min(8, len(s))
		for i := 0; i+n <= len(s); i++ {
			if strings.Contains(text, s[i:i+n]) {
				out = append(out, s)
				break
			}
		}
	}
	return out
}

// TestEvalNeverQuotesAPodsValue runs a set whose every rule quotes what
// the pod carries (testdata/quoting: raw, %v of the containing object, %q,
// json.marshal, a substring, URL-encoded, in the rule's name and field
// too) on a pod with a secret in each field a rule may quote, and checks
// that no decision the set returns holds one: evaluated, from the cache,
// and uncached. Without the redaction in Eval it fails on every secret.
func TestEvalNeverQuotesAPodsValue(t *testing.T) {
	t.Parallel()
	set, err := Load(t.Context(), os.DirFS("testdata/quoting"), "quoting", Options{})
	if err != nil {
		t.Fatal(err)
	}
	pod, secrets := quotingPod(t)
	for _, list := range []string{"deny", "warn", "dryrun"} {
		t.Run(list, func(t *testing.T) {
			t.Parallel()
			in := &Input{Operation: "CREATE", Pod: pod, OldPod: pod, Runner: true, Config: map[string]any{"list": list}}
			for _, how := range []string{"evaluated", "cached", "uncached"} {
				var d Decision
				var err error
				if how == "uncached" {
					d, err = set.EvalUncached(t.Context(), in)
				} else {
					d, err = set.Eval(t.Context(), in)
				}
				if err != nil {
					t.Fatal(err)
				}
				if len(d.Violations()) < 20 || len(d.Warnings) < 20 {
					t.Fatalf("%s: %d violations and %d warnings, want the set's quotes", how, len(d.Violations()), len(d.Warnings))
				}
				text, _ := json.Marshal(d)
				if l := leaked(string(text), secrets); len(l) > 0 {
					t.Errorf("%s: the decision holds the secrets %q:\n%s", how, l, text)
				}
				if !strings.Contains(string(text), "raw ${vault:secret/db.password@team-a}") {
					t.Errorf("%s: the secret reference, not a value, was redacted too", how)
				}
			}
		})
	}
}

// TestRedactDecisionKeepsTheNamespace: the namespace of an admission is the
// pod's identity, even where the request's pod leaves it out (a CREATE),
// one of the pod's values is the namespace's name, and long values (the
// task ID, a URL) hold it; a message naming it keeps it.
func TestRedactDecisionKeepsTheNamespace(t *testing.T) {
	t.Parallel()
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "rw-task-", Labels: map[string]string{"team": "e2e-team-namespace"},
			Annotations: map[string]string{"runwarden.dev/task-id": "e2e-team-namespace/climb/0f0e-uid"},
		},
		Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Env: []corev1.EnvVar{
			{Name: "NS", Value: "e2e-team-namespace"}, {Name: "T", Value: "a-token-value"},
			// A long value holding the namespace: its runs are matched
			// wherever a message holds them, but not inside the namespace.
			{Name: "URL", Value: "https://e2e-team-namespace.vault.example/v1/secret-token-0123"},
		}}}},
	}
	in := &Input{Pod: pod, Namespace: NamespaceInfo{Name: "e2e-team-namespace"}}
	for msg, want := range map[string]string{
		"namespace e2e-team-namespace may not read a-token-value":                "namespace e2e-team-namespace may not read [redacted]",
		"${vault:a/../b/db.password@e2e-team-namespace} is malformed":            "${vault:a/../b/db.password@e2e-team-namespace} is malformed",
		"task e2e-team-namespace/climb/0f0e-uid refused":                         "task e2e-team-namespace/climb/0f0e-uid refused",
		"it reads https://e2e-team-namespace.vault.example/v1/secret-token-0123": "it reads [redacted]",
		"a part of it: vault.example/v1/secret-tok":                              "a part of it: [redacted]",
	} {
		d := redactDecision(Decision{Deny: []Violation{{Rule: "r", Message: msg}}}, in)
		if got := d.Deny[0].Message; got != want {
			t.Errorf("redacted %q: %q, want %q", msg, got, want)
		}
	}
}
