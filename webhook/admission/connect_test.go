package admission

import (
	"encoding/json"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/runwarden/runwarden/policies"
	"github.com/runwarden/runwarden/webhook/policy"
)

// denials records the rules a Handler counts, each as "rule/action".
type denials struct{ rules []string }

func (d *denials) Admission(string, time.Duration) {}
func (d *denials) Violation(rule, action string)   { d.rules = append(d.rules, rule+"/"+action) }
func (d *denials) Decision(policy.Source)          {}

// connectRequest is a CONNECT on a subresource of pod name in team-a, as
// the API server sends it: the options as the object, the pod by name.
func connectRequest(t *testing.T, sub, name string, opts runtime.Object) admission.Request {
	t.Helper()
	raw, err := json.Marshal(opts)
	if err != nil {
		t.Fatal(err)
	}
	kind := opts.GetObjectKind().GroupVersionKind().Kind
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: kind}, Namespace: "team-a", Name: name,
		Resource:    metav1.GroupVersionResource{Version: "v1", Resource: "pods"},
		SubResource: sub, Operation: admissionv1.Connect, Object: runtime.RawExtension{Raw: raw},
		UserInfo: authenticationv1.UserInfo{Username: "alice"},
	}}
}

// TestConnectIntoRunnerPods: kubectl exec, attach and port-forward into a
// runner pod are refused, naming the rule, unless the platform allows them
// (exec.allow); other pods are not the webhook's business; a pod that
// cannot be read is a failure to decide (HTTP 500, refused by the chart's
// failurePolicy Fail), never an allowance.
func TestConnectIntoRunnerPods(t *testing.T) {
	t.Parallel()
	execOpts := &corev1.PodExecOptions{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PodExecOptions"}, Container: "main", Command: []string{"cat", "/proc/1/environ"}, Stdout: true}
	attachOpts := &corev1.PodAttachOptions{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PodAttachOptions"}, Container: "main", Stdout: true}
	forwardOpts := &corev1.PodPortForwardOptions{TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "PodPortForwardOptions"}, Ports: []int32{8080}}
	runner := runnerPod("registry.example.com/runner:1")
	runner.Name, runner.GenerateName = "task-1-abcde", ""
	plain := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: "tool", Namespace: "team-a", Labels: map[string]string{"app": "tool"}}}
	allowExec := map[string]any{"exec": map[string]any{"allow": true}}
	tests := []struct {
		name    string
		sub     string
		pod     string
		opts    runtime.Object
		mut     func(*admission.Request, *Options)
		code    int32
		message string
		denied  []string
	}{
		{name: "exec into a runner", sub: "exec", pod: runner.Name, opts: execOpts, code: http.StatusForbidden,
			message: "runwarden policy: no-exec-into-runners: exec into runner pod task-1-abcde (container main) is off (platform configuration exec.allow)", denied: []string{RuleNoExec + "/deny"}},
		{name: "attach to a runner", sub: "attach", pod: runner.Name, opts: attachOpts, code: http.StatusForbidden,
			message: "no-exec-into-runners: attach to runner pod task-1-abcde (container main)", denied: []string{RuleNoExec + "/deny"}},
		{name: "port-forward to a runner", sub: "portforward", pod: runner.Name, opts: forwardOpts, code: http.StatusForbidden,
			message: "no-exec-into-runners: port-forward to runner pod task-1-abcde (port 8080)", denied: []string{RuleNoExec + "/deny"}},
		{name: "exec into a pod that is not a runner", sub: "exec", pod: plain.Name, opts: execOpts, code: http.StatusOK},
		{name: "port-forward to a pod that is not a runner", sub: "portforward", pod: plain.Name, opts: forwardOpts, code: http.StatusOK},
		{name: "a pod that does not exist", sub: "exec", pod: "gone", opts: execOpts, code: http.StatusOK},
		{name: "exec into a runner, allowed by the platform", sub: "exec", pod: runner.Name, opts: execOpts, code: http.StatusOK,
			mut: func(_ *admission.Request, o *Options) { o.Config = allowExec }},
		{name: "another runner namespace's webhook", sub: "exec", pod: runner.Name, opts: execOpts, code: http.StatusOK,
			mut: func(_ *admission.Request, o *Options) { o.Namespace = "team-b" }},
		{name: "the mutating configuration", sub: "exec", pod: runner.Name, opts: execOpts, code: http.StatusOK,
			mut: func(_ *admission.Request, o *Options) { o.Mutate = true }},
		{name: "pods cannot be read", sub: "exec", pod: runner.Name, opts: execOpts, code: http.StatusInternalServerError,
			message: "reading pod team-a/task-1-abcde to tell whether it is a runner: connection refused",
			mut:     func(_ *admission.Request, o *Options) { o.Pods = failingReader{} }},
		{name: "no pod reader", sub: "exec", pod: runner.Name, opts: execOpts, code: http.StatusInternalServerError,
			message: "this webhook cannot read pods", mut: func(_ *admission.Request, o *Options) { o.Pods = nil }},
		{name: "options of another kind", sub: "exec", pod: runner.Name, opts: attachOpts, code: http.StatusBadRequest,
			message: "carries PodAttachOptions options, want PodExecOptions"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			set, err := policy.Load(t.Context(), policies.FS, "embedded", policy.Options{})
			if err != nil {
				t.Fatal(err)
			}
			rec := &denials{}
			reader := fake.NewClientBuilder().WithObjects(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}, runner.DeepCopy(), plain.DeepCopy()).Build()
			o := Options{Policies: staticPolicies{set}, Reader: reader, Pods: reader, Config: platformConfig, Recorder: rec}
			req := connectRequest(t, tt.sub, tt.pod, tt.opts)
			if tt.mut != nil {
				tt.mut(&req, &o)
			}
			resp := New(o).Handle(t.Context(), req)
			if tt.code == http.StatusOK {
				if !resp.Allowed {
					t.Errorf("refused (%+v), want allowed", resp.Result)
				}
			} else if resp.Allowed || resp.Result.Code != tt.code || !strings.Contains(resp.Result.Message, tt.message) {
				t.Errorf("allowed %v, %d %q; want %d naming %q", resp.Allowed, resp.Result.Code, resp.Result.Message, tt.code, tt.message)
			}
			if len(resp.Patches) > 0 {
				t.Errorf("patches %v on a CONNECT", resp.Patches)
			}
			if diff := cmp.Diff(tt.denied, rec.rules); diff != "" {
				t.Errorf("denials recorded (-want +got):\n%s", diff)
			}
		})
	}
}
