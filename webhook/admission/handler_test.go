package admission

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"maps"
	"math/rand/v2"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/runwarden/runwarden/internal/contract"
	"github.com/runwarden/runwarden/internal/resolve"
	"github.com/runwarden/runwarden/policies"
	"github.com/runwarden/runwarden/webhook/policy"
)

type staticPolicies struct{ s *policy.Set }

func (p staticPolicies) Current() *policy.Set { return p.s }

var platformConfig = map[string]any{
	"workloadIdentity": map[string]any{"aws": map[string]any{"enabled": true}},
	"secretStores":     map[string]any{"vault": map[string]any{"enabled": true, "address": "https://vault:8200", "secretName": "vault-token"}},
	"secretRefs":       map[string]any{"allowedPatterns": []any{"vault:team-a:secret/**"}},
	"scheduling": map[string]any{
		"nodeSelector":         map[string]any{"runwarden.dev/pool": "runner"},
		"tolerations":          []any{map[string]any{"key": "runwarden.dev/pool", "operator": "Equal", "value": "runner", "effect": "NoSchedule"}},
		"requiredNodeAffinity": []any{map[string]any{"key": "kubernetes.io/arch", "operator": "In", "values": []any{"amd64"}}},
		"doNotEvict":           true,
	},
	"shape": map[string]any{"allowedRegistries": []any{"registry.example.com"}},
}

// jobController is the user the Job controller creates pods as.
const jobController = "system:serviceaccount:kube-system:job-controller"

// taskJob is the Job runnerPod's pods belong to, as the dispatcher makes it.
func taskJob() *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "task-1", Namespace: "team-a", UID: "job-uid-1", Labels: map[string]string{contract.LabelDispatcher: "d-1"}},
		Spec:       batchv1.JobSpec{Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{contract.LabelRunner: "true"}}}},
	}
}

// jobIn is taskJob in another namespace.
func jobIn(ns string) *batchv1.Job {
	j := taskJob()
	j.Namespace = ns
	return j
}

func newHandler(t testing.TB, mutate bool) *Handler {
	t.Helper()
	set, err := policy.Load(t.Context(), policies.FS, "embedded", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reader := fake.NewClientBuilder().WithObjects(handlerObjects()...).Build()
	return New(Options{
		Policies: staticPolicies{set}, Reader: reader, Jobs: reader, Config: platformConfig, Mutate: mutate,
		Resolver: &Resolver{Image: resolverImage},
	})
}

// handlerObjects are what newHandler's reader holds: the namespace and
// service account of runnerPod, and its Job (and one in another namespace).
func handlerObjects() []client.Object {
	return []client.Object{
		&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}},
		&corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runner", Namespace: "team-a", Annotations: map[string]string{
			"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/runner",
		}}},
		taskJob(), jobIn("team-b"),
	}
}

// resolverImage is the runwarden image the handlers' resolver runs.
const resolverImage = "registry.example.com/runwarden/webhook:1"

func runnerPod(image string) *corev1.Pod {
	return &corev1.Pod{
		TypeMeta: metav1.TypeMeta{APIVersion: "v1", Kind: "Pod"},
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: "task-1-", Namespace: "team-a", Labels: map[string]string{contract.LabelRunner: "true"},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "task-1", UID: "job-uid-1", Controller: ptr.To(true)}},
		},
		Spec: corev1.PodSpec{
			ServiceAccountName: "runner",
			Containers: []corev1.Container{{
				Name: "main", Image: image,
				Env: []corev1.EnvVar{{Name: "DB_PASSWORD", Value: "${vault:secret/db.password@team-a}"}},
			}},
		},
	}
}

func request(t testing.TB, pod *corev1.Pod) admission.Request {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	return admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Namespace: pod.Namespace,
		Operation: admissionv1.Create, Object: runtime.RawExtension{Raw: raw},
		UserInfo: authenticationv1.UserInfo{Username: jobController},
	}}
}

// mutatedPod applies a response's JSON patch to the pod it answered.
func mutatedPod(t *testing.T, pod *corev1.Pod, resp admission.Response) *corev1.Pod {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	ops, err := json.Marshal(resp.Patches)
	if err != nil {
		t.Fatal(err)
	}
	patch, err := jsonpatch.DecodePatch(ops)
	if err != nil {
		t.Fatalf("decoding the patch: %v", err)
	}
	patched, err := patch.Apply(raw)
	if err != nil {
		t.Fatalf("applying the patch: %v", err)
	}
	out := &corev1.Pod{}
	if err := json.Unmarshal(patched, out); err != nil {
		t.Fatal(err)
	}
	return out
}

func TestHandlerMutatesRunnerPods(t *testing.T) {
	t.Parallel()
	h := newHandler(t, true)
	pod := runnerPod("registry.example.com/runner:1")
	resp := h.Handle(t.Context(), request(t, pod))
	if !resp.Allowed {
		t.Fatalf("denied: %v", resp.Result)
	}
	got := mutatedPod(t, pod, resp)
	envOf := func(c corev1.Container) map[string]string {
		env := map[string]string{}
		for _, e := range c.Env {
			switch {
			case e.ValueFrom == nil:
				env[e.Name] = e.Value
			case e.ValueFrom.SecretKeyRef != nil:
				env[e.Name] = "secret:" + e.ValueFrom.SecretKeyRef.Name + "/" + e.ValueFrom.SecretKeyRef.Key
			case e.ValueFrom.FileKeyRef != nil:
				f := e.ValueFrom.FileKeyRef
				env[e.Name] = "file:" + f.VolumeName + "/" + f.Path + "#" + f.Key
			}
		}
		return env
	}
	// The runner gets its identity and the reference's value from the env
	// file; the store's credentials go to the resolver alone.
	want := map[string]string{
		"DB_PASSWORD":                 "file:runwarden-secrets/secrets.env#RW_0",
		"AWS_ROLE_ARN":                "arn:aws:iam::111122223333:role/runner",
		"AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/secrets/eks.amazonaws.com/serviceaccount/token",
	}
	if diff := cmp.Diff(want, envOf(got.Spec.Containers[0])); diff != "" {
		t.Errorf("runner env (-want +got):\n%s", diff)
	}
	if len(got.Spec.InitContainers) != 1 || got.Spec.InitContainers[0].Name != "runwarden-secrets" || got.Spec.InitContainers[0].Image != resolverImage {
		t.Fatalf("init containers %+v, want the resolver", got.Spec.InitContainers)
	}
	resolver := envOf(got.Spec.InitContainers[0])
	spec, err := base64.StdEncoding.DecodeString(resolver["RUNWARDEN_SECRET_REFS"])
	if err != nil {
		t.Fatal(err)
	}
	delete(resolver, "RUNWARDEN_SECRET_REFS")
	if diff := cmp.Diff(map[string]string{"VAULT_ADDR": "https://vault:8200", "VAULT_KV_MOUNTS": "secret", "VAULT_TOKEN": "secret:vault-token/token"}, resolver); diff != "" {
		t.Errorf("resolver env (-want +got):\n%s", diff)
	}
	var vars []resolve.Var
	if err := json.Unmarshal(spec, &vars); err != nil {
		t.Fatal(err)
	}
	wantVars := []resolve.Var{{Key: "RW_0", Container: "main", Env: "DB_PASSWORD", Value: "${vault:secret/db.password@team-a}", Refs: []resolve.Ref{{
		Store: "vault", Name: "secret/db", Key: "password", Vault: "team-a", Raw: "${vault:secret/db.password@team-a}",
	}}}}
	if diff := cmp.Diff(wantVars, vars); diff != "" {
		t.Errorf("resolver plan (-want +got):\n%s", diff)
	}
	if !slices.ContainsFunc(got.Spec.Volumes, func(v corev1.Volume) bool {
		return v.Name == "runwarden-secrets" && v.EmptyDir != nil && v.EmptyDir.Medium == corev1.StorageMediumMemory
	}) {
		t.Errorf("volumes %+v lack the in-memory env file volume", got.Spec.Volumes)
	}
	if got.Spec.NodeSelector["runwarden.dev/pool"] != "runner" || len(got.Spec.Tolerations) != 1 || got.Spec.Affinity == nil {
		t.Errorf("placement not applied: %+v %+v %+v", got.Spec.NodeSelector, got.Spec.Tolerations, got.Spec.Affinity)
	}
	if got.Annotations["karpenter.sh/do-not-disrupt"] != "true" {
		t.Errorf("annotations %v", got.Annotations)
	}
	// The pod keeps the record of what was admitted: the spec's digest,
	// the policy set's, and what the policies changed, by name.
	if d := got.Annotations[contract.AnnotationSpecDigest]; d != SpecDigest(got.Spec) || !strings.HasPrefix(d, "sha256:") {
		t.Errorf("spec digest %q, want %q", d, SpecDigest(got.Spec))
	}
	if got.Annotations[contract.AnnotationPolicyDigest] == "" {
		t.Error("no policy digest recorded")
	}
	for _, m := range []string{"env AWS_ROLE_ARN", "toleration runwarden.dev/pool", "nodeSelector runwarden.dev/pool", "secret references resolved in the pod"} {
		if !strings.Contains(got.Annotations[contract.AnnotationMutations], m) {
			t.Errorf("recorded mutations %q lack %q", got.Annotations[contract.AnnotationMutations], m)
		}
	}
	if strings.Contains(got.Annotations[contract.AnnotationMutations], "arn:aws") {
		t.Errorf("recorded mutations %q hold a value", got.Annotations[contract.AnnotationMutations])
	}

	// Admitting the result again changes nothing.
	again := h.Handle(t.Context(), request(t, got))
	if !again.Allowed || len(again.Patches) != 0 {
		t.Errorf("second admission: allowed=%v, %d patches: %+v", again.Allowed, len(again.Patches), again.Patches)
	}
}

func TestHandlerDeniesWithTheRule(t *testing.T) {
	t.Parallel()
	h := newHandler(t, true)
	pod := runnerPod("docker.io/library/busybox:1")
	pod.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: new(true)}
	resp := h.Handle(t.Context(), request(t, pod))
	if resp.Allowed {
		t.Fatal("a privileged pod from a foreign registry was allowed")
	}
	msg := resp.Result.Message
	for _, w := range []string{"no-privileged", `container "main"`, "allowed-registries", "docker.io/library/busybox:1"} {
		if !strings.Contains(msg, w) {
			t.Errorf("denial %q does not mention %q", msg, w)
		}
	}
}

func TestHandlerLeavesOtherPodsAlone(t *testing.T) {
	t.Parallel()
	h := newHandler(t, true)
	pod := runnerPod("docker.io/anything")
	pod.Labels = map[string]string{"app": "web"}
	resp := h.Handle(t.Context(), request(t, pod))
	if !resp.Allowed || len(resp.Patches) != 0 {
		t.Errorf("non-runner pod: allowed=%v patches=%v", resp.Allowed, resp.Patches)
	}
}

func TestValidateOnlyNeverPatches(t *testing.T) {
	t.Parallel()
	h := newHandler(t, false)
	resp := h.Handle(t.Context(), request(t, runnerPod("registry.example.com/runner:1")))
	if !resp.Allowed || len(resp.Patches) != 0 {
		t.Errorf("validate-only: allowed=%v patches=%d", resp.Allowed, len(resp.Patches))
	}
}

// TestApplyTwiceEqualsOnce is a property test: for random pods and random
// mutations, applying the mutations to their own result changes nothing.
func TestApplyTwiceEqualsOnce(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(1, 2))
	pick := func(xs ...string) string { return xs[r.IntN(len(xs))] }
	for i := range 500 {
		pod := &corev1.Pod{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main"}, {Name: "side"}}}}
		if r.IntN(2) == 0 {
			pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: pick("A", "B"), Value: pick("1", "2")}}
			pod.Spec.Tolerations = []corev1.Toleration{{Key: pick("k", "j"), Operator: corev1.TolerationOpExists}}
		}
		var m policy.Mutations
		for range r.IntN(6) {
			c := []string{pick("main", "side", "*")}
			m.Env = append(m.Env, policy.ContainerEnv{Containers: c, Env: corev1.EnvVar{Name: pick("A", "B", "C"), Value: pick("1", "2", "3")}})
			m.VolumeMounts = append(m.VolumeMounts, policy.ContainerVolumeMount{Containers: c, VolumeMount: corev1.VolumeMount{Name: pick("v", "w"), MountPath: pick("/a", "/b")}})
			m.Volumes = append(m.Volumes, corev1.Volume{Name: pick("v", "w"), VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
			m.Tolerations = append(m.Tolerations, corev1.Toleration{Key: pick("k", "j"), Operator: corev1.TolerationOpExists})
			m.NodeAffinity = append(m.NodeAffinity, corev1.NodeSelectorRequirement{Key: pick("x", "y"), Operator: corev1.NodeSelectorOpExists})
			m.EnvFrom = append(m.EnvFrom, policy.ContainerEnvFrom{Containers: c, EnvFrom: corev1.EnvFromSource{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: pick("s", "t")}}}})
			m.Labels = map[string]string{pick("l1", "l2"): pick("a", "b")}
		}
		Apply(pod, m)
		once := pod.DeepCopy()
		Apply(pod, m)
		if diff := cmp.Diff(once, pod); diff != "" {
			t.Fatalf("case %d: applying twice differs from once (-once +twice):\n%s", i, diff)
		}
	}
}

func TestMalformedPodIsABadRequest(t *testing.T) {
	t.Parallel()
	h := newHandler(t, true)
	for name, raw := range map[string]string{
		"no object":        "",
		"not JSON":         "{not json",
		"wrong field type": `{"apiVersion":"v1","kind":"Pod","metadata":{"labels":"runner"}}`,
	} {
		req := request(t, runnerPod("registry.example.com/runner:1"))
		req.Object.Raw = []byte(raw)
		resp := h.Handle(t.Context(), req)
		if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusBadRequest || !strings.Contains(resp.Result.Message, "decoding the pod") {
			t.Errorf("%s: allowed %v, result %+v; want a 400 naming the pod's decoding", name, resp.Allowed, resp.Result)
		}
	}
}

// TestUnknownNamespaceIsRefused checks that a namespace the cache does not
// hold refuses the pod instead of lifting the namespace's limits.
func TestUnknownNamespaceIsRefused(t *testing.T) {
	t.Parallel()
	h := newHandler(t, true)
	pod := runnerPod("registry.example.com/runner:1")
	pod.Namespace = "team-b"
	resp := h.Handle(t.Context(), request(t, pod))
	if resp.Allowed || resp.Result == nil || resp.Result.Code != http.StatusInternalServerError || !strings.Contains(resp.Result.Message, "namespace team-b could not be read") {
		t.Errorf("allowed %v, result %+v; want a 500 saying namespace team-b could not be read", resp.Allowed, resp.Result)
	}
}

func TestHandlerDeniesAMountPathThePodAlreadyUses(t *testing.T) {
	t.Parallel()
	h := newHandler(t, true)
	pod := runnerPod("registry.example.com/runner:1")
	pod.Spec.Volumes = append(pod.Spec.Volumes, corev1.Volume{Name: "own-token", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	pod.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "own-token", MountPath: "/var/run/secrets/eks.amazonaws.com/serviceaccount"}}
	resp := h.Handle(t.Context(), request(t, pod))
	if resp.Allowed {
		t.Fatalf("allowed with %d patches; want a denial naming the clash", len(resp.Patches))
	}
	if msg := resp.Result.Message; !strings.Contains(msg, "container main already mounts volume own-token at /var/run/secrets/eks.amazonaws.com/serviceaccount, where the platform mounts aws-iam-token") {
		t.Errorf("denial %q does not name the clash", msg)
	}
}

// A service account the cache does not hold yet is read from the API
// server: its annotations decide the pod's credentials.
func TestCacheThenLiveReadsWhatTheCacheLacks(t *testing.T) {
	t.Parallel()
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "runners", Name: "deployer", Annotations: map[string]string{"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/r"}}}
	cache := fake.NewClientBuilder().Build()
	live := fake.NewClientBuilder().WithObjects(sa).Build()
	got := &corev1.ServiceAccount{}
	if err := CacheThenLive(cache, live).Get(t.Context(), client.ObjectKeyFromObject(sa), got); err != nil {
		t.Fatal(err)
	}
	if got.Annotations["eks.amazonaws.com/role-arn"] == "" {
		t.Errorf("annotations %v, want the live service account's", got.Annotations)
	}
	err := CacheThenLive(cache, live).Get(t.Context(), client.ObjectKey{Namespace: "runners", Name: "none"}, &corev1.ServiceAccount{})
	if !apierrors.IsNotFound(err) {
		t.Errorf("missing everywhere: %v, want NotFound", err)
	}
}

func TestHandlerWithANamespaceRefusesRunnerPodsElsewhere(t *testing.T) {
	t.Parallel()
	h := newHandler(t, true)
	h.opts.Namespace = "team-a"
	if resp := h.Handle(t.Context(), request(t, runnerPod("registry.example.com/runner:1"))); !resp.Allowed || len(resp.Patches) == 0 {
		t.Fatalf("a runner pod in the webhook's namespace: allowed=%v, %d patches, %v", resp.Allowed, len(resp.Patches), resp.Result)
	}
	pod := runnerPod("registry.example.com/runner:1")
	pod.Namespace = "team-b"
	resp := h.Handle(t.Context(), request(t, pod))
	if resp.Allowed {
		t.Fatal("a runner pod outside the webhook's namespace was allowed")
	}
	for _, w := range []string{"namespace team-a only", "this pod is in team-b"} {
		if !strings.Contains(resp.Result.Message, w) {
			t.Errorf("denial %q does not mention %q", resp.Result.Message, w)
		}
	}
	pod.Labels = map[string]string{"app": "web"}
	if resp := h.Handle(t.Context(), request(t, pod)); !resp.Allowed || len(resp.Patches) != 0 {
		t.Errorf("a pod that is not a runner's, elsewhere: allowed=%v patches=%v", resp.Allowed, resp.Patches)
	}
}

// TestHandlerAdmitsDespiteBadNamespaceAnnotations checks that a namespace
// annotation the API server would refuse in a pod (a toleration whose
// tolerationSeconds is not a whole number, a node selector value with a
// space) is left out with a warning: the pod is admitted with the
// platform's placement, not refused with an error.
func TestHandlerAdmitsDespiteBadNamespaceAnnotations(t *testing.T) {
	t.Parallel()
	set, err := policy.Load(t.Context(), policies.FS, "embedded", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name        string
		annotations map[string]string
		warning     string
	}{
		{name: "fractional tolerationSeconds", annotations: map[string]string{"runwarden.dev/tolerations": `[{"key":"team-a","operator":"Exists","effect":"NoExecute","tolerationSeconds":1.5}]`}, warning: "runwarden.dev/tolerations"},
		{name: "tolerationSeconds without NoExecute", annotations: map[string]string{"runwarden.dev/tolerations": `[{"key":"team-a","operator":"Exists","tolerationSeconds":30}]`}, warning: "runwarden.dev/tolerations"},
		{name: "unknown operator", annotations: map[string]string{"runwarden.dev/tolerations": `[{"key":"team-a","operator":"In","value":"x"}]`}, warning: "runwarden.dev/tolerations"},
		{name: "node selector value with a space", annotations: map[string]string{"runwarden.dev/node-selector": "pool=team a"}, warning: "runwarden.dev/node-selector"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			reader := fake.NewClientBuilder().WithObjects(
				&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Annotations: tt.annotations}}, runnerSA(), taskJob(),
			).Build()
			h := New(Options{Policies: staticPolicies{set}, Reader: reader, Jobs: reader, Config: platformConfig, Mutate: true})
			pod := runnerPod("registry.example.com/runner:1")
			resp := h.Handle(t.Context(), request(t, pod))
			if !resp.Allowed {
				t.Fatalf("refused: %+v", resp.Result)
			}
			if !slices.ContainsFunc(resp.Warnings, func(w string) bool { return strings.Contains(w, tt.warning) }) {
				t.Errorf("warnings %q, want one about %s", resp.Warnings, tt.warning)
			}
			got := mutatedPod(t, pod, resp)
			if diff := cmp.Diff(map[string]string{"runwarden.dev/pool": "runner"}, got.Spec.NodeSelector); diff != "" {
				t.Errorf("node selector (-want +got):\n%s", diff)
			}
			want := []corev1.Toleration{{Key: "runwarden.dev/pool", Operator: corev1.TolerationOpEqual, Value: "runner", Effect: corev1.TaintEffectNoSchedule}}
			if diff := cmp.Diff(want, got.Spec.Tolerations); diff != "" {
				t.Errorf("tolerations (-want +got):\n%s", diff)
			}
		})
	}
}

// failingReader fails every read.
type failingReader struct{ client.Reader }

func (failingReader) Get(context.Context, client.ObjectKey, client.Object, ...client.GetOption) error {
	return errors.New("connection refused")
}

// TestRunnerStatusIsEarned: a pod gets the runner's shape and credentials
// only if the Job controller makes it for a Job of the dispatcher; every
// other claim of the runner label is refused, naming why, and a Job that
// cannot be read is a failure to decide, not a denial.
func TestRunnerStatusIsEarned(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mut    func(*corev1.Pod, *admission.Request, *Options)
		code   int32
		reason string
	}{
		{name: "earned", code: http.StatusOK},
		{name: "created by another user", mut: func(_ *corev1.Pod, r *admission.Request, _ *Options) {
			r.UserInfo.Username = "system:serviceaccount:team-a:intruder"
		}, code: http.StatusForbidden, reason: "it is created by system:serviceaccount:team-a:intruder, not by the Job controller"},
		{name: "no controller reference", mut: func(p *corev1.Pod, _ *admission.Request, _ *Options) { p.OwnerReferences = nil }, code: http.StatusForbidden, reason: "it has no controller reference to a Job"},
		{name: "a Job that does not exist", mut: func(p *corev1.Pod, _ *admission.Request, _ *Options) { p.OwnerReferences[0].Name = "other" }, code: http.StatusForbidden, reason: "its Job other does not exist"},
		{name: "a forged UID", mut: func(p *corev1.Pod, _ *admission.Request, _ *Options) { p.OwnerReferences[0].UID = "forged" }, code: http.StatusForbidden, reason: "names Job task-1 with UID forged, and that Job's UID is job-uid-1"},
		{name: "a Job not made by the dispatcher", mut: func(_ *corev1.Pod, _ *admission.Request, o *Options) {
			j := taskJob()
			j.Labels = nil
			o.Jobs = fake.NewClientBuilder().WithObjects(j).Build()
		}, code: http.StatusForbidden, reason: "its Job task-1 was not made by runwarden's dispatcher"},
		{name: "Jobs cannot be read", mut: func(_ *corev1.Pod, _ *admission.Request, o *Options) { o.Jobs = failingReader{} }, code: http.StatusInternalServerError, reason: "reading Job team-a/task-1: connection refused"},
		{name: "another Job controller user", mut: func(_ *corev1.Pod, r *admission.Request, o *Options) {
			r.UserInfo.Username = "system:serviceaccount:kube-system:custom-jobs"
			o.JobControllerUsers = []string{"system:serviceaccount:kube-system:custom-jobs"}
		}, code: http.StatusOK},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			set, err := policy.Load(t.Context(), policies.FS, "embedded", policy.Options{})
			if err != nil {
				t.Fatal(err)
			}
			reader := fake.NewClientBuilder().WithObjects(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}, runnerSA(), taskJob()).Build()
			o := Options{Policies: staticPolicies{set}, Reader: reader, Jobs: reader, Config: platformConfig, Mutate: true}
			pod := runnerPod("registry.example.com/runner:1")
			req := request(t, pod)
			if tt.mut != nil {
				tt.mut(pod, &req, &o)
				raw, _ := json.Marshal(pod)
				req.Object.Raw = raw
			}
			resp := New(o).Handle(t.Context(), req)
			if tt.code == http.StatusOK {
				if !resp.Allowed || len(resp.Patches) == 0 {
					t.Errorf("allowed %v with %d patches (%+v), want the runner shaped", resp.Allowed, len(resp.Patches), resp.Result)
				}
				return
			}
			if resp.Allowed || resp.Result.Code != tt.code || !strings.Contains(resp.Result.Message, tt.reason) {
				t.Errorf("allowed %v, %d %q; want %d naming %q", resp.Allowed, resp.Result.Code, resp.Result.Message, tt.code, tt.reason)
			}
		})
	}
}

// TestValidatingChecksEveryChange: the validating handler decides on every
// pod of the namespace and every way to change one: other pods get the shape
// rules, an update is checked as the pod it makes, the runner label cannot
// be added or removed, nor a runner pod's record annotations (the
// webhook's, written at its creation) added, removed or changed, nor its
// task label or controller reference, and an ephemeral container on a
// runner pod is refused (the rest of what is frozen: TestFrozenAfterAdmission).
func TestValidatingChecksEveryChange(t *testing.T) {
	t.Parallel()
	update := func(t *testing.T, old, pod *corev1.Pod, sub string) admission.Request {
		req := request(t, pod)
		req.Operation, req.SubResource = admissionv1.Update, sub
		req.UserInfo.Username = "alice"
		raw, _ := json.Marshal(old)
		req.OldObject.Raw = raw
		return req
	}
	plain := func(privileged bool) *corev1.Pod {
		p := runnerPod("registry.example.com/web:1")
		p.Labels, p.OwnerReferences = map[string]string{"app": "web"}, nil
		if privileged {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		}
		return p
	}
	// recorded is a runner pod as the webhook admitted it, its record
	// written.
	recorded := func() *corev1.Pod {
		p := runnerPod("registry.example.com/runner:1")
		p.Annotations = map[string]string{contract.AnnotationSpecDigest: "sha256:1", contract.AnnotationPolicyDigest: "p1", contract.AnnotationMutations: "env A", contract.AnnotationWarnings: "w1"}
		return p
	}
	tests := []struct {
		name    string
		req     func(t *testing.T) admission.Request
		allowed bool
		want    string
	}{
		{name: "a plain pod", allowed: true, req: func(t *testing.T) admission.Request {
			r := request(t, plain(false))
			r.UserInfo.Username = "alice"
			return r
		}},
		{name: "a privileged plain pod", want: "no-privileged", req: func(t *testing.T) admission.Request {
			r := request(t, plain(true))
			r.UserInfo.Username = "alice"
			return r
		}},
		{name: "a plain pod claiming the runner label", want: "it is created by alice", req: func(t *testing.T) admission.Request {
			r := request(t, runnerPod("registry.example.com/runner:1"))
			r.UserInfo.Username = "alice"
			return r
		}},
		{name: "an image from elsewhere on a running runner", want: "spec.containers[main].image of a runner pod cannot be changed after its admission", req: func(t *testing.T) admission.Request {
			old := runnerPod("registry.example.com/runner:1")
			return update(t, old, runnerPod("evil.example.net/runner:1"), "")
		}},
		{name: "an update that keeps the runner's shape", allowed: true, req: func(t *testing.T) admission.Request {
			old := runnerPod("registry.example.com/runner:1")
			pod := runnerPod("registry.example.com/runner:1")
			pod.Annotations = map[string]string{"note": "x"}
			return update(t, old, pod, "")
		}},
		{name: "adding the runner label", want: "cannot be added to or removed from a pod", req: func(t *testing.T) admission.Request {
			return update(t, plain(false), runnerPod("registry.example.com/web:1"), "")
		}},
		{name: "removing the runner label", want: "cannot be added to or removed from a pod", req: func(t *testing.T) admission.Request {
			return update(t, runnerPod("registry.example.com/web:1"), plain(false), "")
		}},
		{name: "a debug container on a runner", want: "no-ephemeral-containers", req: func(t *testing.T) admission.Request {
			old := runnerPod("registry.example.com/runner:1")
			pod := runnerPod("registry.example.com/runner:1")
			pod.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debugger", Image: "registry.example.com/debug:1"}}}
			return update(t, old, pod, "ephemeralcontainers")
		}},
		{name: "a debug container on a plain pod", allowed: true, req: func(t *testing.T) admission.Request {
			pod := plain(false)
			pod.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debugger", Image: "registry.example.com/debug:1"}}}
			return update(t, plain(false), pod, "ephemeralcontainers")
		}},
		{name: "an update that keeps a runner's record", allowed: true, req: func(t *testing.T) admission.Request {
			old, pod := recorded(), recorded()
			pod.Annotations["note"] = "x"
			return update(t, old, pod, "")
		}},
		{name: "a runner's spec digest rewritten", want: "annotation " + contract.AnnotationSpecDigest + " of a runner pod cannot be changed", req: func(t *testing.T) admission.Request {
			pod := recorded()
			pod.Annotations[contract.AnnotationSpecDigest] = "sha256:forged"
			return update(t, recorded(), pod, "")
		}},
		{name: "a runner's policy digest rewritten", want: "annotation " + contract.AnnotationPolicyDigest + " of a runner pod cannot be changed", req: func(t *testing.T) admission.Request {
			pod := recorded()
			pod.Annotations[contract.AnnotationPolicyDigest] = "forged"
			return update(t, recorded(), pod, "")
		}},
		{name: "a runner's mutations removed", want: "annotation " + contract.AnnotationMutations + " of a runner pod cannot be changed", req: func(t *testing.T) admission.Request {
			pod := recorded()
			delete(pod.Annotations, contract.AnnotationMutations)
			return update(t, recorded(), pod, "")
		}},
		{name: "warnings added to a runner's record", want: "annotation " + contract.AnnotationWarnings + " of a runner pod cannot be changed", req: func(t *testing.T) admission.Request {
			pod := recorded()
			pod.Annotations[contract.AnnotationWarnings] = "all is well"
			return update(t, recorded(), pod, "")
		}},
		{name: "a record written on a runner that had none", want: "annotation " + contract.AnnotationSpecDigest + " of a runner pod cannot be changed", req: func(t *testing.T) admission.Request {
			pod := runnerPod("registry.example.com/runner:1")
			pod.Annotations = map[string]string{contract.AnnotationSpecDigest: "sha256:forged"}
			return update(t, runnerPod("registry.example.com/runner:1"), pod, "")
		}},
		{name: "a runner's task label changed", want: "the label " + contract.TaskID + " of a runner pod cannot be changed", req: func(t *testing.T) admission.Request {
			old, pod := recorded(), recorded()
			old.Labels[contract.TaskID], pod.Labels[contract.TaskID] = "t-1", "t-2"
			return update(t, old, pod, "")
		}},
		{name: "a task label added to a runner", want: "the label " + contract.TaskID + " of a runner pod cannot be changed", req: func(t *testing.T) admission.Request {
			pod := recorded()
			pod.Labels[contract.TaskID] = "t-2"
			return update(t, recorded(), pod, "")
		}},
		{name: "a runner given to another Job", want: "the controller reference of a runner pod cannot be changed", req: func(t *testing.T) admission.Request {
			pod := recorded()
			pod.OwnerReferences[0].UID, pod.OwnerReferences[0].Name = "job-uid-2", "task-2"
			return update(t, recorded(), pod, "")
		}},
		{name: "a controller given to a runner that had none", want: "the controller reference of a runner pod cannot be changed", req: func(t *testing.T) admission.Request {
			old := recorded()
			old.OwnerReferences = nil
			return update(t, old, recorded(), "")
		}},
		{name: "a runner's controller reference removed by another than the Job controller", want: "the controller reference of a runner pod cannot be changed", req: func(t *testing.T) admission.Request {
			pod := recorded()
			pod.OwnerReferences = nil
			return update(t, recorded(), pod, "")
		}},
		{name: "record annotations on a plain pod", allowed: true, req: func(t *testing.T) admission.Request {
			pod := plain(false)
			pod.Annotations = map[string]string{contract.AnnotationSpecDigest: "sha256:anything"}
			return update(t, plain(false), pod, "")
		}},
		{name: "a status update", allowed: true, req: func(t *testing.T) admission.Request {
			return update(t, runnerPod("registry.example.com/runner:1"), runnerPod("evil.example.net/runner:1"), "status")
		}},
	}
	h := newHandler(t, false)
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			resp := h.Handle(t.Context(), tt.req(t))
			if resp.Allowed != tt.allowed || len(resp.Patches) != 0 {
				t.Fatalf("allowed %v with %d patches (%+v), want allowed %v and no patch", resp.Allowed, len(resp.Patches), resp.Result, tt.allowed)
			}
			if !tt.allowed && !strings.Contains(resp.Result.Message, tt.want) {
				t.Errorf("denial %q does not name %q", resp.Result.Message, tt.want)
			}
		})
	}
	// The mutating handler shapes pods at creation only.
	old := runnerPod("registry.example.com/runner:1")
	if resp := newHandler(t, true).Handle(t.Context(), update(t, old, runnerPod("evil.example.net/runner:1"), "")); !resp.Allowed || len(resp.Patches) != 0 {
		t.Errorf("mutating an update: allowed %v with %d patches", resp.Allowed, len(resp.Patches))
	}
}

// The resolver goes first, so an init container of the pod's own gets its
// references' values too; the JSON patch inserts it ahead of the others.
func TestHandlerResolvesForInitContainers(t *testing.T) {
	t.Parallel()
	h := newHandler(t, true)
	pod := runnerPod("registry.example.com/runner:1")
	pod.Spec.InitContainers = []corev1.Container{{
		Name: "clone", Image: "registry.example.com/git:1",
		Env: []corev1.EnvVar{{Name: "GIT_TOKEN", Value: "token ${vault:secret/git.token@team-a}"}, {Name: "PLAIN", Value: "x"}},
	}}
	resp := h.Handle(t.Context(), request(t, pod))
	if !resp.Allowed {
		t.Fatalf("denied: %v", resp.Result)
	}
	got := mutatedPod(t, pod, resp)
	var names []string
	for _, c := range got.Spec.InitContainers {
		names = append(names, c.Name)
	}
	if !slices.Equal(names, []string{"runwarden-secrets", "clone"}) {
		t.Fatalf("init containers %v, want the resolver first", names)
	}
	clone := got.Spec.InitContainers[1].Env
	if len(clone) != 2 || clone[0].ValueFrom == nil || clone[0].ValueFrom.FileKeyRef == nil || clone[0].ValueFrom.FileKeyRef.Key != "RW_0" || clone[1].Value != "x" {
		t.Errorf("clone env %+v, want GIT_TOKEN from the env file (RW_0) and PLAIN kept", clone)
	}
	if e := got.Spec.Containers[0].Env[0]; e.ValueFrom == nil || e.ValueFrom.FileKeyRef == nil || e.ValueFrom.FileKeyRef.Key != "RW_1" {
		t.Errorf("main's DB_PASSWORD %+v, want RW_1 of the env file", e)
	}
	if again := h.Handle(t.Context(), request(t, got)); !again.Allowed || len(again.Patches) != 0 {
		t.Errorf("second admission: allowed=%v, %d patches: %+v", again.Allowed, len(again.Patches), again.Patches)
	}
}

// With secretDelivery "files" (clusters without EnvFiles) each value is a
// file on the in-memory volume, mounted read-only: NAME_FILE names it, NAME
// is not set, never to the reference's text.
func TestHandlerFilesDelivery(t *testing.T) {
	t.Parallel()
	h := newHandler(t, true)
	cfg := map[string]any{"secretDelivery": "files"}
	for k, v := range platformConfig {
		cfg[k] = v
	}
	h = New(Options{Policies: h.opts.Policies, Reader: h.opts.Reader, Jobs: h.opts.Jobs, Config: cfg, Mutate: true, Resolver: &Resolver{Image: resolverImage}})
	pod := runnerPod("registry.example.com/runner:1")
	resp := h.Handle(t.Context(), request(t, pod))
	if !resp.Allowed {
		t.Fatalf("denied: %v", resp.Result)
	}
	got := mutatedPod(t, pod, resp)
	main := got.Spec.Containers[0]
	env := map[string]string{}
	for _, e := range main.Env {
		env[e.Name] = e.Value
	}
	if _, set := env["DB_PASSWORD"]; set || env["DB_PASSWORD_FILE"] != "/run/runwarden/secrets/RW_0" {
		t.Errorf("runner env %v, want DB_PASSWORD_FILE naming the value's file and no DB_PASSWORD", env)
	}
	if !slices.ContainsFunc(main.VolumeMounts, func(m corev1.VolumeMount) bool {
		return m.Name == "runwarden-secrets" && m.MountPath == "/run/runwarden/secrets" && m.ReadOnly
	}) {
		t.Errorf("runner mounts %+v, want the values' volume read-only", main.VolumeMounts)
	}
	if args := got.Spec.InitContainers[0].Args; !slices.Equal(args, []string{"resolve", "--delivery", "files"}) {
		t.Errorf("resolver args %q", args)
	}
	if again := h.Handle(t.Context(), request(t, got)); !again.Allowed || len(again.Patches) != 0 {
		t.Errorf("second admission: allowed=%v, %d patches", again.Allowed, len(again.Patches))
	}
}

// A pod whose own init container has the resolver's name cannot have its
// references resolved: it is refused, never let through with the
// references' text in its variables.
func TestHandlerRefusesAContainerInTheResolversPlace(t *testing.T) {
	t.Parallel()
	h := newHandler(t, true)
	pod := runnerPod("registry.example.com/runner:1")
	pod.Spec.InitContainers = []corev1.Container{{Name: "runwarden-secrets", Image: "registry.example.com/own:1"}}
	resp := h.Handle(t.Context(), request(t, pod))
	if resp.Allowed || !strings.Contains(resp.Result.Message, "has an init container named runwarden-secrets of its own") {
		t.Fatalf("allowed=%v: %v, want refused naming the container", resp.Allowed, resp.Result)
	}
	pod.Spec.Containers[0].Env = nil
	if resp := h.Handle(t.Context(), request(t, pod)); !resp.Allowed {
		t.Errorf("the same pod without references: %v, want allowed", resp.Result)
	}
}

// sources counts the decisions a handler records, by source.
type sources map[policy.Source]int

func (s sources) Admission(string, time.Duration) {}
func (s sources) Violation(string, string)        {}
func (s sources) Decision(src policy.Source)      { s[src]++ }

// TestTasksShareADecision admits the runner pods of three tasks of one
// template, each with variables and arguments of its own, then one with
// another image: the tasks share the first one's decision, from the cache,
// and the other image is evaluated.
func TestTasksShareADecision(t *testing.T) {
	t.Parallel()
	rec := sources{}
	h := newHandler(t, true)
	h.opts.Recorder = rec
	for i, image := range []string{"registry.example.com/runner:1", "registry.example.com/runner:1", "registry.example.com/runner:1", "registry.example.com/runner:2"} {
		pod := runnerPod(image)
		c := &pod.Spec.Containers[0]
		c.Env = append(c.Env, corev1.EnvVar{Name: "DEPLOY_REF", Value: strings.Repeat("x", i+1)})
		c.Args = []string{"deploy", image, strings.Repeat("y", i+1)}
		if resp := h.Handle(t.Context(), request(t, pod)); !resp.Allowed {
			t.Fatalf("pod %d denied: %v", i, resp.Result)
		}
	}
	if want := (sources{policy.FromEvaluation: 2, policy.FromCache: 2}); !maps.Equal(rec, want) {
		t.Errorf("decisions by source: %v, want %v", rec, want)
	}
}
