package admission

import (
	"encoding/json"
	"maps"
	"strings"
	"sync"
	"testing"

	"github.com/go-logr/logr/funcr"
	"github.com/google/go-cmp/cmp"
	"github.com/google/go-cmp/cmp/cmpopts"
	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/runwarden/runwarden/internal/contract"
	"github.com/runwarden/runwarden/policies"
	"github.com/runwarden/runwarden/webhook/policy"
)

// TestHandlerActsOnEachViolation runs the shipped policies with the
// platform's enforcement (the action per rule, and per namespace) on a pod
// that breaks no-host-namespaces and no-privileged, and checks what the
// API server gets (a denial, or the pod admitted with or without
// warnings), what the handler counts by rule and action (the Recorder behind
// runwarden_webhook_denials_total), and the log line of each dryrun
// violation. The validating handler counts
// the violations of a pod it admits; the mutating one only of a pod it
// denies, so that each request counts once.
func TestHandlerActsOnEachViolation(t *testing.T) {
	t.Parallel()
	const (
		hostPID    = "no-host-namespaces: the pod uses the host's namespaces (hostPID)"
		privileged = `no-privileged: container "main" is privileged`
	)
	tests := []struct {
		name        string
		enforcement map[string]any // the platform configuration's enforcement
		mode        string
		annotations map[string]string // the namespace's
		mutate      bool
		denial      string // "" when admitted
		warnings    []string
		counts      map[string]int // rule/action
		logged      []string       // the rules of the dryrun log lines
	}{
		{
			name: "enforce by default", mutate: true,
			denial: "runwarden policy: " + hostPID + "; " + privileged,
			counts: map[string]int{"no-privileged/deny": 1, "no-host-namespaces/deny": 1},
		},
		{
			name: "audit mode warns", mode: "audit",
			warnings: []string{"audit: would deny: " + hostPID, "audit: would deny: " + privileged}, // sorted
			counts:   map[string]int{"no-privileged/warn": 1, "no-host-namespaces/warn": 1},
		},
		{
			name:        "dryrun admits silently, counts and logs",
			enforcement: map[string]any{"rules": map[string]any{"no-privileged": "dryrun", "no-host-namespaces": "dryrun"}},
			counts:      map[string]int{"no-privileged/dryrun": 1, "no-host-namespaces/dryrun": 1},
			logged:      []string{"no-host-namespaces", "no-privileged"},
		},
		{
			name:        "the mutating handler leaves the count of an admitted pod to the validating one",
			enforcement: map[string]any{"default": "dryrun"}, mutate: true,
		},
		{
			name:        "a rule in warn, another in dryrun",
			enforcement: map[string]any{"default": "dryrun", "rules": map[string]any{"no-host-namespaces": "warn"}},
			warnings:    []string{"audit: would deny: " + hostPID},
			counts:      map[string]int{"no-privileged/dryrun": 1, "no-host-namespaces/warn": 1},
			logged:      []string{"no-privileged"},
		},
		{
			name: "the namespace's deny beats the rule's dryrun",
			enforcement: map[string]any{
				"rules":      map[string]any{"no-privileged": "dryrun", "no-host-namespaces": "dryrun"},
				"namespaces": map[string]any{"team-a": map[string]any{"no-host-namespaces": "deny"}},
			},
			mutate: true,
			denial: "runwarden policy: " + hostPID,
			counts: map[string]int{"no-privileged/dryrun": 1, "no-host-namespaces/deny": 1},
			logged: []string{"no-privileged"},
		},
		{
			name:        "another namespace's setting does not apply",
			enforcement: map[string]any{"default": "dryrun", "namespaces": map[string]any{"team-b": map[string]any{"no-host-namespaces": "deny"}}},
			counts:      map[string]int{"no-privileged/dryrun": 1, "no-host-namespaces/dryrun": 1},
			logged:      []string{"no-host-namespaces", "no-privileged"},
		},
		{
			name:        "namespace annotations cannot relax a rule",
			annotations: map[string]string{"runwarden.dev/enforcement": "dryrun", "runwarden.dev/enforcement.no-host-namespaces": "dryrun", "runwarden.dev/mode": "audit"},
			mutate:      true,
			denial:      "runwarden policy: " + hostPID + "; " + privileged,
			counts:      map[string]int{"no-privileged/deny": 1, "no-host-namespaces/deny": 1},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := maps.Clone(platformConfig)
			if tt.enforcement != nil {
				cfg["enforcement"] = tt.enforcement
			}
			if tt.mode != "" {
				cfg["mode"] = tt.mode
			}
			if err := policy.CheckEnforcement(cfg); err != nil {
				t.Fatal(err)
			}
			set, err := policy.Load(t.Context(), policies.FS, "embedded", policy.Options{})
			if err != nil {
				t.Fatal(err)
			}
			reader := fake.NewClientBuilder().WithObjects(
				&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Annotations: tt.annotations}},
				&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runner", Namespace: "team-a"}},
				taskJob(),
			).Build()
			rec := &denials{}
			h := New(Options{Policies: staticPolicies{set}, Reader: reader, Jobs: reader, Config: cfg, Mutate: tt.mutate, Recorder: rec})
			var logs lines
			ctx := log.IntoContext(t.Context(), funcr.New(logs.add, funcr.Options{}))

			pod := runnerPod("registry.example.com/runner:1")
			pod.Name = "task-1-abcde"
			pod.Spec.HostPID = true
			pod.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
			resp := h.Handle(ctx, request(t, pod))

			if tt.denial == "" && !resp.Allowed {
				t.Errorf("denied (%s), want admitted", resp.Result.Message)
			}
			if tt.denial != "" && (resp.Allowed || resp.Result.Message != tt.denial) {
				t.Errorf("allowed %v, message %q; want denied with %q", resp.Allowed, resp.Result.Message, tt.denial)
			}
			if diff := cmp.Diff(tt.warnings, resp.Warnings, cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("warnings (-want +got):\n%s", diff)
			}
			if diff := cmp.Diff(tt.counts, rec.counts(), cmpopts.EquateEmpty()); diff != "" {
				t.Errorf("violations counted by rule/action (-want +got):\n%s", diff)
			}
			var logged []string
			for _, l := range logs.all() {
				if !strings.Contains(l, `"msg"="policy violation in dryrun, pod admitted"`) {
					continue
				}
				for _, w := range []string{`"namespace"="team-a"`, `"pod"="task-1-abcde"`, `"job"="task-1"`, `"message"=`} {
					if !strings.Contains(l, w) {
						t.Errorf("dryrun log line lacks %s: %s", w, l)
					}
				}
				_, rest, _ := strings.Cut(l, `"rule"="`)
				rule, _, _ := strings.Cut(rest, `"`)
				logged = append(logged, rule)
			}
			if diff := cmp.Diff(tt.logged, logged); diff != "" {
				t.Errorf("rules logged in dryrun (-want +got):\n%s", diff)
			}
		})
	}
}

// lines collects log lines.
type lines struct {
	mu sync.Mutex
	l  []string
}

func (l *lines) add(prefix, args string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.l = append(l.l, prefix+" "+args)
}

func (l *lines) all() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return append([]string(nil), l.l...)
}

// counts is how many times each rule/action was counted.
func (d *denials) counts() map[string]int {
	out := map[string]int{}
	for _, r := range d.rules {
		out[r]++
	}
	return out
}

// TestRefusalsOutsideThePoliciesAlwaysDeny: the webhook's own refusals in
// Go are not policy rules, and no enforcement relaxes them: with every rule
// in dryrun, a runner label not earned, a change of a runner pod's record,
// and an exec into a runner pod are still refused, and counted as denials
// only.
func TestRefusalsOutsideThePoliciesAlwaysDeny(t *testing.T) {
	t.Parallel()
	cfg := maps.Clone(platformConfig)
	cfg["enforcement"] = map[string]any{"default": "dryrun", "rules": map[string]any{"no-exec-into-runners": "dryrun"}}
	set, err := policy.Load(t.Context(), policies.FS, "embedded", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	runner := runnerPod("registry.example.com/runner:1")
	runner.Name, runner.GenerateName = "task-1-abcde", ""
	reader := fake.NewClientBuilder().WithObjects(
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Annotations: map[string]string{"runwarden.dev/enforcement": "dryrun"}}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runner", Namespace: "team-a"}},
		taskJob(), runner.DeepCopy(),
	).Build()
	recorded := func() *corev1.Pod {
		p := runnerPod("registry.example.com/runner:1")
		p.Annotations = map[string]string{contract.AnnotationSpecDigest: "sha256:1", contract.AnnotationPolicyDigest: "p1", contract.AnnotationMutations: "env A"}
		return p
	}
	tests := []struct {
		name   string
		mutate bool
		req    func(t *testing.T) admission.Request
		want   string
	}{
		{name: "a runner label not earned", mutate: true, want: "it is created by alice", req: func(t *testing.T) admission.Request {
			r := request(t, runnerPod("registry.example.com/runner:1"))
			r.UserInfo.Username = "alice"
			return r
		}},
		{name: "a runner pod's record changed", want: "the annotation " + contract.AnnotationSpecDigest + " of a runner pod cannot be changed", req: func(t *testing.T) admission.Request {
			changed := recorded()
			changed.Annotations[contract.AnnotationSpecDigest] = "sha256:2"
			r := request(t, changed)
			r.Operation = admissionv1.Update
			raw, err := json.Marshal(recorded())
			if err != nil {
				t.Fatal(err)
			}
			r.OldObject.Raw = raw
			return r
		}},
		{name: "exec into a runner pod", want: "no-exec-into-runners", req: func(t *testing.T) admission.Request {
			return connectRequest(t, "exec", runner.Name, &corev1.PodExecOptions{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PodExecOptions"}, Container: "main", Stdout: true})
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			rec := &denials{}
			h := New(Options{Policies: staticPolicies{set}, Reader: reader, Jobs: reader, Pods: reader, Config: cfg, Mutate: tt.mutate, Recorder: rec})
			resp := h.Handle(t.Context(), tt.req(t))
			if resp.Allowed || !strings.Contains(resp.Result.Message, tt.want) {
				t.Errorf("allowed %v, %q; want denied naming %q", resp.Allowed, resp.Result.Message, tt.want)
			}
			if len(resp.Warnings) != 0 {
				t.Errorf("warnings %q, want none", resp.Warnings)
			}
			for _, k := range rec.rules {
				if !strings.HasSuffix(k, "/"+policy.ActionDeny) {
					t.Errorf("counted %s, want denials only", k)
				}
			}
		})
	}
}
