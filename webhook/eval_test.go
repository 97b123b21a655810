package main

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	jsonpatch "gopkg.in/evanphx/json-patch.v4"
	admissionv1 "k8s.io/api/admission/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/internal/contract"
	"github.com/runwarden/runwarden/policies"
	rwadmission "github.com/runwarden/runwarden/webhook/admission"
	"github.com/runwarden/runwarden/webhook/policy"
)

// The fixtures of webhook/admission/handler_test.go, which this test
// mirrors case by case.
const (
	jobController = "system:serviceaccount:kube-system:job-controller"
	resolverImage = "registry.example.com/runwarden/webhook:1"
)

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

func teamA(annotations map[string]string) *corev1.Namespace {
	return &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a", Annotations: annotations}}
}

func runnerSA() *corev1.ServiceAccount {
	return &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runner", Namespace: "team-a", Annotations: map[string]string{
		"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/runner",
	}}}
}

func taskJob() *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{Name: "task-1", Namespace: "team-a", UID: "job-uid-1", Labels: map[string]string{contract.LabelDispatcher: "d-1"}},
		Spec:       batchv1.JobSpec{Template: corev1.PodTemplateSpec{ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{contract.LabelRunner: "true"}}}},
	}
}

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

// plainPod is a pod of the runner namespace that is not a runner's.
func plainPod(privileged bool) *corev1.Pod {
	p := runnerPod("registry.example.com/web:1")
	p.Labels, p.OwnerReferences = map[string]string{"app": "web"}, nil
	if privileged {
		p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
	}
	return p
}

func with(p *corev1.Pod, change func(*corev1.Pod)) *corev1.Pod {
	change(p)
	return p
}

// admitCase is one admission request, the cluster it meets and the
// webhook's flags.
type admitCase struct {
	name    string
	pod     *corev1.Pod
	old     *corev1.Pod
	sub     string
	user    string // default: the Job controller
	cluster []client.Object
	config  map[string]any // default: platformConfig
	// resolver is the webhook's --resolver-image; empty: none.
	resolver        string
	runnerNamespace string
	jobUsers        []string
	// again admits the admitted pod a second time (reinvocation).
	again bool
	// resolved: the admitted pod has its secret references resolved
	// (resolver init container, env-file volume, fileKeyRef) and the
	// record annotations, so the comparison is not of two unshaped pods.
	resolved bool
	// notChecked: a lookup finds nothing in the cluster, so eval is not
	// given it and says so. The webhook refuses a pod whose namespace,
	// service account or Job it cannot find, so no case of the equivalence
	// has one; TestRun checks NOT CHECKED itself.
	notChecked bool
}

// admitCases are the cases of webhook/admission/handler_test.go, of the
// workload identity golden files and of TestRun's policy eval cases. Left out, because the webhook cannot decide
// on them and answers with an error, which eval has no file for: a pod that
// does not decode (TestMalformedPodIsABadRequest), a namespace the cache
// does not hold (TestUnknownNamespaceIsRefused) and Jobs that cannot be read
// (TestRunnerStatusIsEarned/Jobs_cannot_be_read).
func admitCases(t *testing.T) []admitCase {
	cluster := []client.Object{teamA(nil), runnerSA(), taskJob()}
	earnedCluster := []client.Object{teamA(nil), runnerSA(), taskJob()}
	update := func(old, pod *corev1.Pod, sub string) admitCase {
		return admitCase{pod: pod, old: old, sub: sub, user: "alice", cluster: cluster, resolver: resolverImage}
	}
	cases := []admitCase{
		{name: "TestHandlerMutatesRunnerPods", pod: runnerPod("registry.example.com/runner:1"), cluster: cluster, resolver: resolverImage, again: true, resolved: true},
		{name: "TestHandlerDeniesWithTheRule", pod: with(runnerPod("docker.io/library/busybox:1"), func(p *corev1.Pod) {
			p.Spec.Containers[0].SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(true)}
		}), cluster: cluster, resolver: resolverImage},
		{name: "TestHandlerLeavesOtherPodsAlone", pod: with(runnerPod("docker.io/anything"), func(p *corev1.Pod) {
			p.Labels = map[string]string{"app": "web"}
		}), cluster: cluster, resolver: resolverImage},
		{name: "TestHandlerDeniesAMountPathThePodAlreadyUses", pod: with(runnerPod("registry.example.com/runner:1"), func(p *corev1.Pod) {
			p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: "own-token", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
			p.Spec.Containers[0].VolumeMounts = []corev1.VolumeMount{{Name: "own-token", MountPath: "/var/run/secrets/eks.amazonaws.com/serviceaccount"}}
		}), cluster: cluster, resolver: resolverImage},
		{name: "TestHandlerWithANamespaceRefusesRunnerPodsElsewhere/in its namespace", pod: runnerPod("registry.example.com/runner:1"), cluster: cluster, resolver: resolverImage, runnerNamespace: "team-a"},
		{name: "TestHandlerWithANamespaceRefusesRunnerPodsElsewhere/a runner elsewhere", pod: with(runnerPod("registry.example.com/runner:1"), func(p *corev1.Pod) { p.Namespace = "team-b" }), cluster: cluster, resolver: resolverImage, runnerNamespace: "team-a"},
		{name: "TestHandlerWithANamespaceRefusesRunnerPodsElsewhere/another pod elsewhere", pod: with(runnerPod("registry.example.com/runner:1"), func(p *corev1.Pod) {
			p.Namespace, p.Labels = "team-b", map[string]string{"app": "web"}
		}), cluster: cluster, resolver: resolverImage, runnerNamespace: "team-a"},
		{name: "TestHandlerResolvesForInitContainers", pod: with(runnerPod("registry.example.com/runner:1"), func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{
				Name: "clone", Image: "registry.example.com/git:1",
				Env: []corev1.EnvVar{{Name: "GIT_TOKEN", Value: "token ${vault:secret/git.token@team-a}"}, {Name: "PLAIN", Value: "x"}},
			}}
		}), cluster: cluster, resolver: resolverImage, again: true, resolved: true},
		{name: "TestHandlerFilesDelivery", pod: runnerPod("registry.example.com/runner:1"), cluster: cluster, resolver: resolverImage, again: true, config: func() map[string]any {
			cfg := map[string]any{"secretDelivery": "files"}
			for k, v := range platformConfig {
				cfg[k] = v
			}
			return cfg
		}()},
		{name: "TestHandlerRefusesAContainerInTheResolversPlace/with references", pod: with(runnerPod("registry.example.com/runner:1"), func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "runwarden-secrets", Image: "registry.example.com/own:1"}}
		}), cluster: cluster, resolver: resolverImage},
		{name: "TestHandlerRefusesAContainerInTheResolversPlace/without references", pod: with(runnerPod("registry.example.com/runner:1"), func(p *corev1.Pod) {
			p.Spec.InitContainers = []corev1.Container{{Name: "runwarden-secrets", Image: "registry.example.com/own:1"}}
			p.Spec.Containers[0].Env = nil
		}), cluster: cluster, resolver: resolverImage},
	}
	for name, annotations := range map[string]map[string]string{
		"fractional tolerationSeconds":        {"runwarden.dev/tolerations": `[{"key":"team-a","operator":"Exists","effect":"NoExecute","tolerationSeconds":1.5}]`},
		"tolerationSeconds without NoExecute": {"runwarden.dev/tolerations": `[{"key":"team-a","operator":"Exists","tolerationSeconds":30}]`},
		"unknown operator":                    {"runwarden.dev/tolerations": `[{"key":"team-a","operator":"In","value":"x"}]`},
		"node selector value with a space":    {"runwarden.dev/node-selector": "pool=team a"},
	} {
		cases = append(cases, admitCase{name: "TestHandlerAdmitsDespiteBadNamespaceAnnotations/" + name, pod: runnerPod("registry.example.com/runner:1"),
			cluster: []client.Object{teamA(annotations), runnerSA(), taskJob()}})
	}
	foreignJob := taskJob()
	foreignJob.Labels = nil
	earned := func(name string, change func(*corev1.Pod), c admitCase) admitCase {
		c.name, c.pod = "TestRunnerStatusIsEarned/"+name, with(runnerPod("registry.example.com/runner:1"), change)
		if c.cluster == nil {
			c.cluster = earnedCluster
		}
		return c
	}
	keep := func(*corev1.Pod) {}
	cases = append(cases,
		// The cluster has no service account runner: the policies reach it,
		// and eval, not given one, says so.
		earned("earned", keep, admitCase{}),
		earned("created by another user", keep, admitCase{user: "system:serviceaccount:team-a:intruder"}),
		earned("no controller reference", func(p *corev1.Pod) { p.OwnerReferences = nil }, admitCase{}),
		earned("a Job that does not exist", func(p *corev1.Pod) { p.OwnerReferences[0].Name = "other" }, admitCase{}),
		earned("a forged UID", func(p *corev1.Pod) { p.OwnerReferences[0].UID = "forged" }, admitCase{}),
		earned("a Job not made by the dispatcher", keep, admitCase{cluster: []client.Object{teamA(nil), foreignJob}}),
		earned("another Job controller user", keep, admitCase{user: "system:serviceaccount:kube-system:custom-jobs", jobUsers: []string{"system:serviceaccount:kube-system:custom-jobs"}}),
	)
	validating := []struct {
		name string
		c    admitCase
	}{
		{"a plain pod", admitCase{pod: plainPod(false), user: "alice", cluster: cluster, resolver: resolverImage}},
		{"a privileged plain pod", admitCase{pod: plainPod(true), user: "alice", cluster: cluster, resolver: resolverImage}},
		{"a plain pod claiming the runner label", admitCase{pod: runnerPod("registry.example.com/runner:1"), user: "alice", cluster: cluster, resolver: resolverImage}},
		{"an image from elsewhere on a running runner", update(runnerPod("registry.example.com/runner:1"), runnerPod("evil.example.net/runner:1"), "")},
		{"an update that keeps the runner's shape", update(runnerPod("registry.example.com/runner:1"), with(runnerPod("registry.example.com/runner:1"), func(p *corev1.Pod) {
			p.Annotations = map[string]string{"note": "x"}
		}), "")},
		{"adding the runner label", update(plainPod(false), runnerPod("registry.example.com/web:1"), "")},
		{"removing the runner label", update(runnerPod("registry.example.com/web:1"), plainPod(false), "")},
		{"a debug container on a runner", update(runnerPod("registry.example.com/runner:1"), with(runnerPod("registry.example.com/runner:1"), func(p *corev1.Pod) {
			p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debugger", Image: "registry.example.com/debug:1"}}}
		}), "ephemeralcontainers")},
		{"a debug container on a plain pod", update(plainPod(false), with(plainPod(false), func(p *corev1.Pod) {
			p.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debugger", Image: "registry.example.com/debug:1"}}}
		}), "ephemeralcontainers")},
		{"a status update", update(runnerPod("registry.example.com/runner:1"), runnerPod("evil.example.net/runner:1"), "status")},
	}
	for _, v := range validating {
		v.c.name = "TestValidatingChecksEveryChange/" + v.name
		cases = append(cases, v.c)
	}
	cases = append(cases, identityCases(t)...)
	return append(cases, runTestCases(t)...)
}

// identityCases are the workload identity cases of
// webhook/admission/testdata/identity (TestWorkloadIdentityGolden, which
// checks the policies' result against the EKS, Azure and GKE webhooks'),
// each pod made a runner pod of taskJob, its service account in the
// cluster.
func identityCases(t *testing.T) []admitCase {
	files, err := filepath.Glob("admission/testdata/identity/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var cases []admitCase
	for _, file := range files {
		if strings.HasSuffix(file, ".golden.yaml") {
			continue
		}
		var c struct {
			Config         map[string]any    `json:"config"`
			ServiceAccount map[string]string `json:"serviceAccount"`
			Pod            corev1.Pod        `json:"pod"`
		}
		if err := readYAML(file, &c); err != nil {
			t.Fatal(err)
		}
		if c.Config == nil {
			c.Config = map[string]any{}
		}
		pod := c.Pod.DeepCopy()
		pod.Namespace = "team-a"
		pod.Labels = map[string]string{contract.LabelRunner: "true"}
		pod.OwnerReferences = runnerPod("").OwnerReferences
		sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{
			Name: cmpOrString(pod.Spec.ServiceAccountName, "default"), Namespace: "team-a", Annotations: c.ServiceAccount,
		}}
		cases = append(cases, admitCase{
			name: "TestWorkloadIdentityGolden/" + strings.TrimSuffix(filepath.Base(file), ".yaml"), pod: pod,
			cluster: []client.Object{teamA(nil), sa, taskJob()}, config: c.Config, resolver: resolverImage, again: true,
		})
	}
	if len(cases) < 8 {
		t.Fatalf("%d cases in admission/testdata/identity, want at least 8", len(cases))
	}
	return cases
}

// runTestCases are TestRun's policy eval cases, on the same files.
func runTestCases(t *testing.T) []admitCase {
	read := func(file string, into any) {
		t.Helper()
		if err := readYAML(filepath.Join("testdata", file), into); err != nil {
			t.Fatal(err)
		}
	}
	valid, invalid, clashing := &corev1.Pod{}, &corev1.Pod{}, &corev1.Pod{}
	ns, sa, job := &corev1.Namespace{}, &corev1.ServiceAccount{}, &batchv1.Job{}
	read("valid-pod.yaml", valid)
	read("invalid-pod.yaml", invalid)
	read("clashing-pod.yaml", clashing)
	read("namespace.yaml", ns)
	read("service-account.yaml", sa)
	read("job.yaml", job)
	cfg, err := readPlatformConfig("testdata/platform.yaml")
	if err != nil {
		t.Fatal(err)
	}
	plainNS := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "team-a"}}
	defaultSA := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "default", Namespace: "team-a"}}
	// The Job of invalid-pod.yaml and clashing-pod.yaml.
	job43 := job.DeepCopy()
	job43.Name, job43.UID = "task-43", "5f0c9a52-8d0e-4b43-9d55-2f8e2c0a0043"
	return []admitCase{
		{name: "TestRun/policy eval shapes a pod", pod: valid, cluster: []client.Object{ns, sa, job}, config: cfg, resolver: resolverImage, again: true, resolved: true},
		{name: "TestRun/policy eval of a denied pod", pod: invalid, cluster: []client.Object{plainNS, defaultSA, job43}, config: map[string]any{}, resolver: resolverImage},
		{name: "TestRun/policy eval of a pod whose volumes clash with the mutations", pod: clashing, cluster: []client.Object{plainNS, sa, job43}, config: cfg, resolver: resolverImage},
		{name: "TestRun/policy eval of a runner pod another user creates", pod: valid, user: "system:serviceaccount:team-a:intruder", cluster: []client.Object{ns, sa, job}, config: cfg, resolver: resolverImage},
	}
}

// admitted is what a request comes to: the pod the API server stores, or
// the denial's message.
type admitted struct {
	Denial string
	Pod    *corev1.Pod
}

// TestEvalAdmitsWhatTheWebhookAdmits runs every admission case through the
// webhook as the API server calls it (the mutating handler, its JSON patch
// applied to the pod, then the validating handler on the result) and
// through `runwarden-webhook policy eval` given the same cluster objects as
// files: both come to the same denial or to the same pod, field for field
// (resolver init container, env-file volume, fileKeyRef, record
// annotations included).
func TestEvalAdmitsWhatTheWebhookAdmits(t *testing.T) {
	t.Parallel()
	set, err := policy.Load(t.Context(), policies.FS, "embedded", policy.Options{})
	if err != nil {
		t.Fatal(err)
	}
	for _, tt := range admitCases(t) {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			pod := tt.pod
			for round := range 2 {
				want := webhookAdmits(t, set, tt, pod)
				got, stdout := evalAdmits(t, tt, pod)
				if diff := cmp.Diff(want, got, cmp.Comparer(func(a, b resource.Quantity) bool { return a.Cmp(b) == 0 })); diff != "" {
					t.Fatalf("round %d: policy eval differs from the webhook (-webhook +eval):\n%s\neval's output:\n%s", round, diff, stdout)
				}
				if tt.resolved {
					checkResolved(t, got.Pod)
				}
				if tt.notChecked != strings.Contains(stdout, "# NOT CHECKED: ") {
					t.Errorf("round %d: eval given every object the webhook found, NOT CHECKED printed %v, want %v:\n%s", round, !tt.notChecked, tt.notChecked, stdout)
				}
				if !tt.again || want.Pod == nil {
					return
				}
				pod = want.Pod
			}
		})
	}
}

// webhookAdmits sends the case to the webhook's two handlers.
func webhookAdmits(t *testing.T, set *policy.Set, tt admitCase, pod *corev1.Pod) admitted {
	t.Helper()
	reader := fake.NewClientBuilder().WithObjects(tt.cluster...).Build()
	var resolver *rwadmission.Resolver
	if tt.resolver != "" {
		resolver = &rwadmission.Resolver{Image: tt.resolver}
	}
	for _, mutate := range []bool{true, false} {
		h := rwadmission.New(rwadmission.Options{
			Policies: staticSet{set}, Reader: reader, Jobs: reader, Config: cmpOr(tt.config, platformConfig), Mutate: mutate,
			Namespace: tt.runnerNamespace, JobControllerUsers: tt.jobUsers, Resolver: resolver,
		})
		// The handler's log lines are not this test's business.
		resp := h.Handle(logr.NewContext(t.Context(), logr.Discard()), admissionRequest(t, tt, pod))
		if !resp.Allowed {
			if resp.Result == nil || resp.Result.Code != 403 {
				t.Fatalf("mutate %v: the webhook could not decide: %+v", mutate, resp.Result)
			}
			return admitted{Denial: resp.Result.Message}
		}
		pod = patched(t, pod, resp)
	}
	return admitted{Pod: pod}
}

func cmpOr(m, def map[string]any) map[string]any {
	if m == nil {
		return def
	}
	return m
}

func admissionRequest(t *testing.T, tt admitCase, pod *corev1.Pod) admission.Request {
	t.Helper()
	raw, err := json.Marshal(pod)
	if err != nil {
		t.Fatal(err)
	}
	req := admission.Request{AdmissionRequest: admissionv1.AdmissionRequest{
		UID: "1", Kind: metav1.GroupVersionKind{Version: "v1", Kind: "Pod"}, Namespace: pod.Namespace,
		Operation: admissionv1.Create, SubResource: tt.sub, Object: runtime.RawExtension{Raw: raw},
		UserInfo: authenticationv1.UserInfo{Username: cmpOrString(tt.user, jobController)},
	}}
	if tt.old != nil {
		old, err := json.Marshal(tt.old)
		if err != nil {
			t.Fatal(err)
		}
		req.Operation, req.OldObject.Raw = admissionv1.Update, old
	}
	return req
}

func cmpOrString(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// patched applies a response's JSON patch to the pod it answered.
func patched(t *testing.T, pod *corev1.Pod, resp admission.Response) *corev1.Pod {
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
	out, err := patch.Apply(raw)
	if err != nil {
		t.Fatalf("applying the patch: %v", err)
	}
	p := &corev1.Pod{}
	if err := json.Unmarshal(out, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// evalAdmits runs policy eval on the case, its cluster objects as files:
// the pod's namespace, its service account and the Job the pod names (or
// another of the cluster's, which eval then finds is not the pod's).
func evalAdmits(t *testing.T, tt admitCase, pod *corev1.Pod) (admitted, string) {
	t.Helper()
	dir := t.TempDir()
	write := func(name string, obj any) string {
		t.Helper()
		b, err := yaml.Marshal(obj)
		if err != nil {
			t.Fatal(err)
		}
		path := filepath.Join(dir, name)
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		return path
	}
	args := []string{"policy", "eval", "--pod", write("pod.yaml", pod), "--config", write("config.yaml", cmpOr(tt.config, platformConfig)),
		"--user", cmpOrString(tt.user, jobController), "--resolver-image", tt.resolver, "--runner-namespace", tt.runnerNamespace}
	if tt.old != nil {
		args = append(args, "--old-pod", write("old-pod.yaml", tt.old), "--subresource", tt.sub)
	}
	if len(tt.jobUsers) > 0 {
		args = append(args, "--job-controller-users", strings.Join(tt.jobUsers, ","))
	}
	saName := cmpOrString(pod.Spec.ServiceAccountName, "default")
	for _, obj := range tt.cluster {
		switch o := obj.(type) {
		case *corev1.Namespace:
			if o.Name == pod.Namespace {
				args = append(args, "--namespace", write("namespace.yaml", o))
			}
		case *corev1.ServiceAccount:
			if o.Name == saName && o.Namespace == pod.Namespace {
				args = append(args, "--service-account", write("sa.yaml", o))
			}
		case *batchv1.Job:
			args = append(args, "--job", write("job.yaml", o))
		}
	}
	var stdout, stderr bytes.Buffer
	code := run(t.Context(), args, &stdout, &stderr)
	out := stdout.String()
	switch code {
	case 0:
		_, doc, ok := strings.Cut(out, "\n---\n")
		if !ok {
			t.Fatalf("eval admitted the pod and printed no pod:\n%s", out)
		}
		var got struct {
			Pod *corev1.Pod `json:"pod"`
		}
		if err := yaml.UnmarshalStrict([]byte(doc), &got); err != nil {
			t.Fatalf("eval's pod: %v\n%s", err, doc)
		}
		return admitted{Pod: got.Pod}, out
	case 1:
		for line := range strings.Lines(out) {
			if _, msg, ok := strings.Cut(line, "# the pod would be DENIED by the "); ok {
				_, msg, _ = strings.Cut(msg, " webhook: ")
				return admitted{Denial: strings.TrimSuffix(msg, "\n")}, out
			}
		}
		t.Fatalf("eval exited 1 and named no denial:\n%s", out)
	}
	t.Fatalf("eval exited %d:\nstdout: %s\nstderr: %s", code, out, stderr.String())
	return admitted{}, out
}

// checkResolved checks that a pod's DB_PASSWORD comes from the resolver's
// env file and that the pod holds the webhook's record.
func checkResolved(t *testing.T, pod *corev1.Pod) {
	t.Helper()
	if pod == nil {
		t.Fatal("the pod was denied, want it admitted with its references resolved")
	}
	if len(pod.Spec.InitContainers) == 0 || pod.Spec.InitContainers[0].Name != "runwarden-secrets" || pod.Spec.InitContainers[0].Image != resolverImage {
		t.Errorf("init containers %+v, want the resolver first", pod.Spec.InitContainers)
	}
	if !slices.ContainsFunc(pod.Spec.Volumes, func(v corev1.Volume) bool { return v.Name == "runwarden-secrets" && v.EmptyDir != nil }) {
		t.Errorf("volumes %+v lack the env file's", pod.Spec.Volumes)
	}
	env := pod.Spec.Containers[0].Env
	if i := slices.IndexFunc(env, func(e corev1.EnvVar) bool { return e.Name == "DB_PASSWORD" }); i < 0 || env[i].ValueFrom == nil || env[i].ValueFrom.FileKeyRef == nil {
		t.Errorf("main's env %+v, want DB_PASSWORD from the env file", env)
	}
	for _, a := range []string{contract.AnnotationSpecDigest, contract.AnnotationPolicyDigest, contract.AnnotationMutations} {
		if pod.Annotations[a] == "" {
			t.Errorf("annotations %v lack %s", pod.Annotations, a)
		}
	}
}
