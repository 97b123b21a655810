//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	authenticationv1 "k8s.io/api/authentication/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	eventsv1 "k8s.io/api/events/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/e2e-framework/klient/k8s"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/orchestrator"
	"github.com/runwarden/runwarden/dispatcher/orchestrator/orchestratortest"
	"github.com/runwarden/runwarden/e2e/harness"
	"github.com/runwarden/runwarden/internal/contract"
)

// The writers of what the dispatcher reads after it made a task's Job
// (docs/security.md, "After admission"): each forgery is tried on the real
// API server by a user holding only the RBAC it needs, against the chart's
// writers policy, and the dispatcher's own reading is shown robust where
// the forger is one the policy trusts (the suite's admin, in
// system:masters, stands for a deployment without the policy).

// installWritersPolicy renders the chart's writers policy for runner
// namespace ns, under a release of its own (the policies are
// cluster-scoped), with the values set (helm --set), and creates it.
func installWritersPolicy(ctx context.Context, t *testing.T, cfg *envconf.Config, ns string, set ...string) {
	t.Helper()
	release := "wr-" + ns[len(ns)-6:]
	args := []string{"template", release, filepath.Join(suite.RepoRoot, "charts", "runwarden"),
		"--namespace", release, "--set", "runnerNamespace=" + ns, "--show-only", "templates/writers-policy.yaml"}
	for _, v := range set {
		args = append(args, "--set", v)
	}
	out, err := newHelm(t, cfg, "helm4").run(ctx, args...)
	if err != nil {
		t.Fatalf("helm template: %v\n%s", err, out)
	}
	var policies []string
	for _, doc := range strings.Split(out, "\n---\n") {
		obj := &unstructured.Unstructured{}
		if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil || obj.GetKind() == "" {
			continue
		}
		if err := cfg.Client().Resources().Create(ctx, obj); err != nil {
			t.Fatalf("creating %s %s: %v", obj.GetKind(), obj.GetName(), err)
		}
		t.Cleanup(func() { _ = cfg.Client().Resources().Delete(context.Background(), obj) })
		if obj.GetKind() == "ValidatingAdmissionPolicy" {
			policies = append(policies, obj.GetName())
		}
	}
	// Each policy type-checked by the API server (its status's observed
	// generation), as its admission side loads it; a test still probes
	// the rules it relies on first.
	for _, name := range policies {
		checked := func(ctx context.Context) (bool, error) {
			var p admissionregistrationv1.ValidatingAdmissionPolicy
			if err := cfg.Client().Resources().Get(ctx, name, "", &p); err != nil {
				return false, err
			}
			if p.Status.ObservedGeneration < p.Generation {
				return false, nil
			}
			if p.Status.TypeChecking != nil {
				for _, w := range p.Status.TypeChecking.ExpressionWarnings {
					t.Logf("policy %s: the API server's type check of %s: %s", name, w.FieldRef, w.Warning)
				}
			}
			return true, nil
		}
		if err := harness.WaitFor(ctx, "policy "+name+" to be type-checked", time.Minute, checked); err != nil {
			t.Fatal(err)
		}
	}
}

// pendingTemplate writes a runner pod template whose pods no node takes:
// the task's Job runs, unfinished, for as long as the test needs (with
// --unschedulable-timeout long enough).
func pendingTemplate(t *testing.T) string {
	t.Helper()
	b, err := yaml.Marshal(corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		NodeSelector: map[string]string{"runwarden.dev/no-such-pool": "true"},
		Containers:   []corev1.Container{{Name: job.RunnerContainer, Image: "busybox:stable"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "pending.yaml")
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// forger is a user of the runner namespace with the rights issue 42's
// attacker has: create and patch Jobs and their status, create events of
// both APIs, create pods, patch their status and bind them, patch
// RunnerTasks' status; and write Secrets, ConfigMaps and the namespace's
// own object.
func forger(ctx context.Context, t *testing.T, cfg *envconf.Config, ns string) client.Client {
	t.Helper()
	u := harness.User{Name: "forger-" + ns[len(ns)-6:]}
	if err := u.Grant(ctx, cfg, ns, "forger",
		rbacv1.PolicyRule{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"create", "get", "patch", "update"}},
		rbacv1.PolicyRule{APIGroups: []string{"batch"}, Resources: []string{"jobs/status"}, Verbs: []string{"patch", "update"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create", "patch"}},
		rbacv1.PolicyRule{APIGroups: []string{"events.k8s.io"}, Resources: []string{"events"}, Verbs: []string{"create"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"create", "get", "list"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch", "update"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods/binding", "bindings"}, Verbs: []string{"create"}},
		rbacv1.PolicyRule{APIGroups: []string{"runwarden.dev"}, Resources: []string{"runnertasks/status"}, Verbs: []string{"patch", "update"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets", "configmaps"}, Verbs: []string{"create", "get", "patch", "update", "delete"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"serviceaccounts"}, Verbs: []string{"create", "get", "patch", "update"}},
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"serviceaccounts/token"}, Verbs: []string{"create"}},
		// A Role in a namespace grants these on that namespace's own object.
		rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"namespaces", "namespaces/status"}, Verbs: []string{"get", "patch", "update"}},
	); err != nil {
		t.Fatal(err)
	}
	c, err := u.Client(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// byKubelets is the writers policy's refusal of a runner pod's status.
const byKubelets = "is written by the kubelets"

// waitEnforced waits for a policy just installed to be in force (the API
// server loads one within seconds): probe makes a write the policy refuses
// with want, with a new value n each time (one that landed before the
// policy did would make the same write a change of nothing, allowed), and
// the wait ends at its first refusal.
func waitEnforced(ctx context.Context, t *testing.T, what, want string, probe func(ctx context.Context, n int) error) {
	t.Helper()
	n := 0
	refused := func(ctx context.Context) (bool, error) {
		n++
		err := probe(ctx, n)
		return err != nil && strings.Contains(err.Error(), want), nil
	}
	if err := harness.WaitFor(ctx, what+" to be enforced", time.Minute, refused); err != nil {
		t.Fatal(err)
	}
}

// mergePatch patches obj with a JSON merge patch as c's user.
func mergePatch(ctx context.Context, c client.Client, obj client.Object, patch string) error {
	return c.Patch(ctx, obj, client.RawPatch(types.MergePatchType, []byte(patch)))
}

// checkForgeriesRefused tries, as the forger, every write of issue 42's
// part 2 on the running task Job j, and wants each refused by the writers
// policy with its reason; a note of the forger's own stays allowed.
func checkForgeriesRefused(ctx context.Context, t *testing.T, fc client.Client, j *batchv1.Job) {
	t.Helper()
	const byDispatcher = "are written by the dispatcher"
	// The probe: a runwarden.dev/ annotation no code reads.
	waitEnforced(ctx, t, "the writers policy", byDispatcher, func(ctx context.Context, n int) error {
		return mergePatch(ctx, fc, j.DeepCopy(), fmt.Sprintf(`{"metadata":{"annotations":{"runwarden.dev/e2e-probe":"%d"}}}`, n))
	})
	for what, patch := range map[string]string{
		"an outcome on the running Job":    `{"metadata":{"annotations":{"runwarden.dev/outcome":"{\"Phase\":\"Succeeded\",\"Reason\":\"Completed\"}"}}}`,
		"another task ID":                  `{"metadata":{"annotations":{"runwarden.dev/task-id":"t-2"}}}`,
		"the reported mark":                `{"metadata":{"annotations":{"runwarden.dev/reported":"true"}}}`,
		"the awaiting-secret mark":         `{"metadata":{"annotations":{"runwarden.dev/awaiting-secret":"true"}}}`,
		"the task label":                   `{"metadata":{"labels":{"runwarden.dev/task-id":"t-2"}}}`,
		"no dispatcher label":              `{"metadata":{"labels":{"runwarden.dev/dispatcher":null}}}`,
		"the task annotation removed":      `{"metadata":{"annotations":{"runwarden.dev/task-id":null}}}`,
		"a lease of the forger's choosing": `{"metadata":{"annotations":{"runwarden.dev/lease-id":"l-forged"}}}`,
	} {
		if err := mergePatch(ctx, fc, j.DeepCopy(), patch); err == nil || !strings.Contains(err.Error(), byDispatcher) {
			t.Errorf("the forger writing %s: %v, want refused (%q)", what, err, byDispatcher)
		}
	}
	if err := mergePatch(ctx, fc, j.DeepCopy(), `{"metadata":{"annotations":{"note":"the forger's own"}}}`); err != nil {
		t.Errorf("a note of the forger's on the Job: %v, want allowed", err)
	}

	// The Job's status: the Job controller's (and Kueue's). The forgery
	// starts from the Job as it is once the Job controller started it: a
	// start time other than the one it set is refused by validation first.
	started := func(ctx context.Context) (bool, error) {
		if err := fc.Get(ctx, client.ObjectKeyFromObject(j), j); err != nil {
			return false, err
		}
		return j.Status.StartTime != nil, nil
	}
	if err := harness.WaitFor(ctx, "the Job controller to start Job "+j.Name, time.Minute, started); err != nil {
		t.Fatal(err)
	}
	complete := j.DeepCopy()
	now := metav1.Now()
	complete.Status.Conditions = append(complete.Status.Conditions,
		batchv1.JobCondition{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue, LastTransitionTime: now, LastProbeTime: now},
		batchv1.JobCondition{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, LastTransitionTime: now, LastProbeTime: now})
	// A status the API server's own validation takes (no active pod, the
	// start time kept), so that only the policy refuses it.
	zero := int32(0)
	complete.Status.CompletionTime, complete.Status.Succeeded, complete.Status.Active, complete.Status.Ready = &now, 1, 0, &zero
	// active is omitted when 0: the merge patch names it.
	patch, err := client.MergeFrom(j).Data(complete)
	if err != nil {
		t.Fatal(err)
	}
	patch = bytes.Replace(patch, []byte(`"status":{`), []byte(`"status":{"active":0,`), 1)
	if err := fc.Status().Patch(ctx, complete, client.RawPatch(types.MergePatchType, patch)); err == nil || !strings.Contains(err.Error(), "is written by the Job controller") {
		t.Errorf("the forger completing the Job through its status: %v, want refused", err)
	}

	// A FailedCreate of the Job controller's words, in both event APIs.
	const events = "events about runner Jobs and pods"
	denied := `Error creating: admission webhook "pods.runwarden.dev" denied the request: forged`
	core := &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{GenerateName: j.Name + ".", Namespace: j.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Job", APIVersion: "batch/v1", Name: j.Name, Namespace: j.Namespace, UID: j.UID},
		Type:           corev1.EventTypeWarning, Reason: "FailedCreate", Message: denied,
		Source: corev1.EventSource{Component: "job-controller"}, FirstTimestamp: now, LastTimestamp: now, Count: 1,
	}
	if err := fc.Create(ctx, core); err == nil || !strings.Contains(err.Error(), events) {
		t.Errorf("the forger's FailedCreate event (core/v1): %v, want refused (%q)", err, events)
	}
	ev := &eventsv1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: j.Name + "-", Namespace: j.Namespace},
		EventTime:  metav1.NewMicroTime(time.Now()), ReportingController: "job-controller", ReportingInstance: "forged",
		Action: "Create", Reason: "FailedCreate", Note: denied, Type: corev1.EventTypeWarning,
		Regarding: corev1.ObjectReference{Kind: "Job", APIVersion: "batch/v1", Name: j.Name, Namespace: j.Namespace, UID: j.UID},
	}
	if err := fc.Create(ctx, ev); err == nil || !strings.Contains(err.Error(), events) {
		t.Errorf("the forger's FailedCreate event (events.k8s.io/v1): %v, want refused (%q)", err, events)
	}
	// Events about the forger's own objects stay the forger's to write.
	own := core.DeepCopy()
	own.InvolvedObject = corev1.ObjectReference{Kind: "ConfigMap", APIVersion: "v1", Name: "forgers-own", Namespace: j.Namespace}
	if err := fc.Create(ctx, own); err != nil {
		t.Errorf("an event about the forger's own object: %v, want allowed", err)
	}

	// The runner pod's status: how its runner ended is the kubelet's to say.
	pod := runnerPodOf(ctx, t, fc, j)
	exited := pod.DeepCopy()
	exited.Status.ContainerStatuses = []corev1.ContainerStatus{{
		Name: job.RunnerContainer, Image: pod.Spec.Containers[0].Image,
		State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0, Reason: "Completed", StartedAt: now, FinishedAt: now}},
	}}
	patch, err = client.MergeFrom(pod).Data(exited)
	if err != nil {
		t.Fatal(err)
	}
	if err := fc.Status().Patch(ctx, exited, client.RawPatch(types.MergePatchType, patch)); err == nil || !strings.Contains(err.Error(), byKubelets) {
		t.Errorf("the forger writing the runner pod's exit 0 into its status: %v, want refused (%q)", err, byKubelets)
	}
	checkMadeSoRefused(ctx, t, fc, j, pod)
}

// The platform's objects of the runner namespace TestWritersKubeSource
// names in its writers policy: the CA bundle runner pods trust and a
// credential set's Secret.
const (
	platformCA    = "runner-ca"
	platformCreds = "git-creds"
)

// checkNamesAndPlatformRefused tries, as the forger, what a task's Job was
// believed by once made, through the objects around it: a Job or Secret
// under the dispatcher's names for a task (made first, or in place of a
// deleted one, a Job would be squatted and a Secret's values, a Gitea
// job's plan, replaced), the runner namespace's runwarden.dev/ annotations
// (through the Namespace and its status: what secrets its tasks may name,
// their placement and queues), and the platform's CA bundle and
// credentials Secret that runner pods read. Each is refused by the writers
// policy; the forger's own Job, Secret, ConfigMap and annotation stay
// allowed.
func checkNamesAndPlatformRefused(ctx context.Context, t *testing.T, cfg *envconf.Config, fc client.Client, ns string, j *batchv1.Job) {
	t.Helper()
	// A kubelet's credentials write events about its pods, not about a
	// runner Job: a FailedCreate of a Job's would fail its task.
	node := harness.User{Name: "system:node:forged-" + ns[len(ns)-6:]}
	if err := node.Grant(ctx, cfg, ns, "node-events", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"events"}, Verbs: []string{"create"}}); err != nil {
		t.Fatal(err)
	}
	nc, err := node.Client(cfg)
	if err != nil {
		t.Fatal(err)
	}
	now := metav1.Now()
	for _, kind := range []string{"Job", "Pod"} {
		ev := &corev1.Event{
			ObjectMeta:     metav1.ObjectMeta{GenerateName: j.Name + ".", Namespace: ns},
			InvolvedObject: corev1.ObjectReference{Kind: kind, Name: j.Name, Namespace: ns, UID: j.UID},
			Type:           corev1.EventTypeWarning, Reason: "FailedCreate", Message: `Error creating: admission webhook "pods.runwarden.dev" denied the request: forged`,
			FirstTimestamp: now, LastTimestamp: now, Count: 1,
		}
		err := nc.Create(ctx, ev)
		if kind == "Job" && (err == nil || !strings.Contains(err.Error(), "events about runner Jobs and pods")) {
			t.Errorf("a kubelet's event about runner Job %s: %v, want refused", j.Name, err)
		}
		if kind == "Pod" && err != nil {
			t.Errorf("a kubelet's event about a pod: %v, want allowed", err)
		}
	}

	const byDispatcher = "the names the dispatcher"
	squat := func(name string) *batchv1.Job {
		return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, Spec: batchv1.JobSpec{
			Suspend: ptr.To(true),
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever,
				Containers: []corev1.Container{{Name: "c", Image: "busybox:stable"}}}},
		}}
	}
	waitEnforced(ctx, t, "the names policy", byDispatcher, func(ctx context.Context, n int) error {
		return fc.Create(ctx, squat(job.Name(fmt.Sprintf("next-task-%d", n))))
	})
	if err := fc.Create(ctx, squat("forgers-own")); err != nil {
		t.Errorf("the forger's own Job: %v, want allowed", err)
	}
	secret := func(name string) *corev1.Secret {
		return &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns}, StringData: map[string]string{"RUNWARDEN_STEPS_PLAN": "{}"}}
	}
	for _, name := range []string{job.SecretName(job.Name("next-task")), job.SecretName(j.Name)} {
		if err := fc.Create(ctx, secret(name)); err == nil || !strings.Contains(err.Error(), byDispatcher) {
			t.Errorf("the forger making Secret %s: %v, want refused (%q)", name, err, byDispatcher)
		}
	}
	if err := fc.Create(ctx, secret("forgers-own")); err != nil {
		t.Errorf("the forger's own Secret: %v, want allowed", err)
	}

	const byPlatform = "writers.groups"
	nsObj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
	waitEnforced(ctx, t, "the namespace policy", byPlatform, func(ctx context.Context, n int) error {
		return mergePatch(ctx, fc, nsObj.DeepCopy(), fmt.Sprintf(`{"metadata":{"annotations":{"runwarden.dev/secret-patterns":"vault:*:%d/**"}}}`, n))
	})
	for what, patch := range map[string]string{
		"the stores":        `{"metadata":{"annotations":{"runwarden.dev/secret-stores":"vault,ssm,gcp,azure"}}}`,
		"the tolerations":   `{"metadata":{"annotations":{"runwarden.dev/tolerations":"[{\"operator\":\"Exists\"}]"}}}`,
		"the queues":        `{"metadata":{"annotations":{"runwarden.dev/allowed-queues":"anyone"}}}`,
		"the node selector": `{"metadata":{"annotations":{"runwarden.dev/node-selector":"pool=platform"}}}`,
	} {
		if err := mergePatch(ctx, fc, nsObj.DeepCopy(), patch); err == nil || !strings.Contains(err.Error(), byPlatform) {
			t.Errorf("the forger writing %s of the runner namespace: %v, want refused (%q)", what, err, byPlatform)
		}
		if err := fc.Status().Patch(ctx, nsObj.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(patch))); err == nil || !strings.Contains(err.Error(), byPlatform) {
			t.Errorf("the forger writing %s of the runner namespace through its status: %v, want refused (%q)", what, err, byPlatform)
		}
	}
	if err := mergePatch(ctx, fc, nsObj.DeepCopy(), `{"metadata":{"annotations":{"note":"the forger's own"}}}`); err != nil {
		t.Errorf("a note of the forger's on the namespace: %v, want allowed", err)
	}

	for _, obj := range []client.Object{
		&corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: platformCA, Namespace: ns}, Data: map[string]string{"ca.crt": "the forger's CA"}},
		secret(platformCreds),
	} {
		if err := fc.Create(ctx, obj); err == nil || !strings.Contains(err.Error(), "is the platform's") {
			t.Errorf("the forger making the platform's %T %s: %v, want refused", obj, obj.GetName(), err)
		}
	}
	if err := fc.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "forgers-own", Namespace: ns}}); err != nil {
		t.Errorf("the forger's own ConfigMap: %v, want allowed", err)
	}
	// Made by the platform, the credentials' values are the platform's;
	// their metadata (a label, the garbage collector's orphaning) is not
	// what runner pods read.
	creds := secret(platformCreds)
	if err := cfg.Client().Resources().Create(ctx, creds); err != nil {
		t.Fatal(err)
	}
	if err := mergePatch(ctx, fc, creds.DeepCopy(), `{"stringData":{"RUNWARDEN_STEPS_PLAN":"the forger's"}}`); err == nil || !strings.Contains(err.Error(), "is the platform's") {
		t.Errorf("the forger changing the platform's credentials: %v, want refused", err)
	}
	if err := mergePatch(ctx, fc, creds.DeepCopy(), `{"metadata":{"labels":{"note":"the-forgers-own"}}}`); err != nil {
		t.Errorf("a label of the forger's on the platform's credentials: %v, want allowed", err)
	}

	// The runner service account (the chart's default name): as the chart
	// renders it, anyone who may make it may; its identity annotations and
	// its token's mounting are the platform's.
	const byAccount = "identity annotations"
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runwarden-runner", Namespace: ns}, AutomountServiceAccountToken: ptr.To(false)}
	if err := fc.Create(ctx, sa); err != nil {
		t.Fatalf("the runner service account as the chart renders it: %v, want allowed", err)
	}
	for what, patch := range map[string]string{
		"an IRSA role":              `{"metadata":{"annotations":{"eks.amazonaws.com/role-arn":"arn:aws:iam::111122223333:role/forgers"}}}`,
		"an Azure identity":         `{"metadata":{"annotations":{"azure.workload.identity/client-id":"00000000-0000-0000-0000-000000000000"}}}`,
		"a Google service account":  `{"metadata":{"annotations":{"iam.gke.io/gcp-service-account":"forger@p.iam.gserviceaccount.com"}}}`,
		"an API token in every pod": `{"automountServiceAccountToken":true}`,
	} {
		if err := mergePatch(ctx, fc, sa.DeepCopy(), patch); err == nil || !strings.Contains(err.Error(), byAccount) {
			t.Errorf("the forger giving the runner service account %s: %v, want refused (%q)", what, err, byAccount)
		}
	}
	if err := mergePatch(ctx, fc, sa.DeepCopy(), `{"metadata":{"annotations":{"note":"the forger's own"}}}`); err != nil {
		t.Errorf("a note of the forger's on the runner service account: %v, want allowed", err)
	}
	// Nor does the forger mint the account's token (its cloud identity's):
	// the kubelets do, for runner pods.
	tr := &authenticationv1.TokenRequest{Spec: authenticationv1.TokenRequestSpec{Audiences: []string{"sts.amazonaws.com"}}}
	if err := fc.SubResource("token").Create(ctx, sa.DeepCopy(), tr); err == nil || !strings.Contains(err.Error(), "tokens of the runner service account") {
		t.Errorf("the forger minting a token of the runner service account: %v, want refused", err)
	}
}

// checkMadeSoRefused tries, as the forger, to make objects of its own pass
// for the dispatcher's Job j and its runner pod through the subresources
// that write an object's labels and annotations besides the object itself
// (the API server resets only the spec there): jobs/status, pods/status
// and a pod's binding. Each is refused by the writers policy; the forger's
// own label on its own pod through pods/status, and a binding with the
// topology labels the API server adds and an annotation not runwarden's,
// stay allowed.
func checkMadeSoRefused(ctx context.Context, t *testing.T, fc client.Client, j *batchv1.Job, runner *corev1.Pod) {
	t.Helper()
	ns := j.Namespace
	// A Job of the forger's, suspended (no pod), labelled the dispatcher's
	// afterwards: the kube source would take it for a task's Job by its
	// labels and annotation, the restore of either source for one of its own.
	own := &batchv1.Job{
		// Not named rw-...: those names are the dispatcher's (-names).
		ObjectMeta: metav1.ObjectMeta{Name: "forged-" + j.Name[len(job.NamePrefix):], Namespace: ns},
		Spec: batchv1.JobSpec{Suspend: ptr.To(true), Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
			RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: job.RunnerContainer, Image: "busybox:stable"}},
		}}},
	}
	if err := fc.Create(ctx, own); err != nil {
		t.Fatalf("the forger's own Job: %v", err)
	}
	taken := `{"metadata":{"labels":{"` + contract.LabelDispatcher + `":"` + j.Labels[contract.LabelDispatcher] + `","` + contract.TaskID + `":"` + j.Labels[contract.TaskID] +
		`"},"annotations":{"` + contract.TaskID + `":"` + j.Annotations[contract.TaskID] + `"}}}`
	const byDispatcher = "are written by the dispatcher"
	if err := fc.Status().Patch(ctx, own.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(taken))); err == nil || !strings.Contains(err.Error(), byDispatcher) {
		t.Errorf("the forger labelling its own Job the dispatcher's through jobs/status: %v, want refused (%q)", err, byDispatcher)
	}

	// A pod of the forger's, pending (no node takes it), made plainly: its
	// runner pod's labels and runwarden's record through pods/status would
	// make it the Job's runner pod to the dispatcher (job.IsPodOf, the
	// record) and, with the selector, to the Job controller.
	decoy := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: j.Name + "-decoy", Namespace: ns},
		Spec: corev1.PodSpec{
			NodeSelector: map[string]string{"runwarden.dev/no-such-pool": "true"}, RestartPolicy: corev1.RestartPolicyNever,
			Containers: []corev1.Container{{Name: job.RunnerContainer, Image: "busybox:stable"}},
		},
	}
	if err := fc.Create(ctx, decoy); err != nil {
		t.Fatalf("the forger's own pod: %v", err)
	}
	labels, err := json.Marshal(runner.Labels)
	if err != nil {
		t.Fatal(err)
	}
	// The runner label makes the pod a runner pod, whose status is the
	// kubelets' (the first rule to refuse it says so); the rest are refused
	// on any pod.
	const throughStatus = "are not changed through pods/status"
	for what, p := range map[string]struct{ patch, want string }{
		"the runner pod's labels":             {`{"metadata":{"labels":` + string(labels) + `}}`, byKubelets},
		"a Job's selector":                    {`{"metadata":{"labels":{"` + batchv1.ControllerUidLabel + `":"` + string(j.UID) + `"}}}`, throughStatus},
		"the dispatcher's label":              {`{"metadata":{"labels":{"` + contract.LabelDispatcher + `":"x"}}}`, throughStatus},
		"runwarden's record of its admission": {`{"metadata":{"annotations":{"` + contract.AnnotationSpecDigest + `":"sha256:forged"}}}`, throughStatus},
	} {
		if err := fc.Status().Patch(ctx, decoy.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(p.patch))); err == nil || !strings.Contains(err.Error(), p.want) {
			t.Errorf("the forger writing %s onto its own pod through pods/status: %v, want refused (%q)", what, err, p.want)
		}
	}
	if err := fc.Status().Patch(ctx, decoy.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"note":"the-forgers-own"}}}`))); err != nil {
		t.Errorf("the forger's own label on its own pod through pods/status: %v, want allowed", err)
	}
	// Nor on the runner pod: none of its labels, whoever writes its status
	// (here one the status rule alone would refuse too).
	if err := fc.Status().Patch(ctx, runner.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"note":"x"}}}`))); err == nil {
		t.Errorf("the forger labelling the runner pod through pods/status: allowed, want refused")
	}

	// A binding writes its labels and annotations onto the pod it binds,
	// through pods/binding and the older bindings alike.
	bind := func(labels, annotations map[string]string) *corev1.Binding {
		return &corev1.Binding{
			ObjectMeta: metav1.ObjectMeta{Name: decoy.Name, Namespace: ns, Labels: labels, Annotations: annotations},
			Target:     corev1.ObjectReference{Kind: "Node", Name: "rw-sim-0"},
		}
	}
	const byBinding = "a binding of pod"
	forgedBy := map[string]func() error{
		"pods/binding with the runner pod's labels": func() error {
			return fc.SubResource("binding").Create(ctx, decoy.DeepCopy(), bind(runner.Labels, nil))
		},
		"pods/binding with runwarden's record": func() error {
			return fc.SubResource("binding").Create(ctx, decoy.DeepCopy(), bind(nil, map[string]string{contract.AnnotationPolicyDigest: "sha256:forged"}))
		},
		"bindings with a Job's selector": func() error {
			return fc.Create(ctx, bind(map[string]string{"controller-uid": string(j.UID)}, nil))
		},
	}
	for what, forge := range forgedBy {
		if err := forge(); err == nil || !strings.Contains(err.Error(), byBinding) {
			t.Errorf("the forger binding its own pod through %s: %v, want refused (%q)", what, err, byBinding)
		}
	}
	if err := fc.Create(ctx, bind(map[string]string{"note": "x"}, nil)); err == nil || !strings.Contains(err.Error(), byBinding) {
		t.Errorf("the forger binding its own pod with a label of its own: %v, want refused (%q)", err, byBinding)
	}
	// The API server's own topology labels, and annotations not runwarden's.
	if err := fc.SubResource("binding").Create(ctx, decoy.DeepCopy(), bind(map[string]string{"topology.kubernetes.io/zone": "z1"}, map[string]string{"note": "x"})); err != nil {
		t.Errorf("a binding of the forger's own pod with a zone label and a note: %v, want allowed", err)
	}
}

// runnerPodOf waits for the pod of Job j to exist, as c's user sees it, and
// returns it.
func runnerPodOf(ctx context.Context, t *testing.T, c client.Client, j *batchv1.Job) *corev1.Pod {
	t.Helper()
	var pod *corev1.Pod
	made := func(ctx context.Context) (bool, error) {
		var pods corev1.PodList
		if err := c.List(ctx, &pods, client.InNamespace(j.Namespace), client.MatchingLabels{batchv1.ControllerUidLabel: string(j.UID)}); err != nil {
			return false, err
		}
		for i := range pods.Items {
			if job.IsPodOf(j, &pods.Items[i]) {
				pod = &pods.Items[i]
				return true, nil
			}
		}
		return false, nil
	}
	if err := harness.WaitFor(ctx, "the runner pod of Job "+j.Name, time.Minute, made); err != nil {
		t.Fatal(err)
	}
	return pod
}

// runningJobOf waits for the Job of the task named by id (its task
// annotation) to exist, and returns it.
func runningJobOf(ctx context.Context, t *testing.T, cfg *envconf.Config, ns, id string, d *dispatcherProcess) batchv1.Job {
	t.Helper()
	var j batchv1.Job
	made := func(ctx context.Context) (bool, error) {
		jobs := jobsFor(ctx, t, cfg, ns, id)
		if len(jobs) == 1 && jobs[0].UID != "" && !job.Finished(&jobs[0]) {
			j = jobs[0]
			return true, nil
		}
		return false, nil
	}
	if err := harness.WaitFor(ctx, "the Job of task "+id, time.Minute, made); err != nil {
		t.Fatalf("%v\ndispatcher log:\n%s", err, tail(d.log.String(), 3000))
	}
	return j
}

// asAdmin patches Job j as the suite's admin, whom the writers policy
// trusts (system:masters): the forgery as a deployment without the policy
// lets anyone with patch on Jobs write it. It waits for the dispatcher to
// have looked at the Job since.
func asAdmin(ctx context.Context, t *testing.T, cfg *envconf.Config, d *dispatcherProcess, controller string, j *batchv1.Job, patch string) {
	t.Helper()
	before := reconciles(d, controller)
	c, err := client.New(cfg.Client().RESTConfig(), client.Options{Scheme: cfg.Client().Resources().GetScheme()})
	if err != nil {
		t.Fatal(err)
	}
	if err := mergePatch(ctx, c, j.DeepCopy(), patch); err != nil {
		t.Fatalf("patching %s as the admin: %v", patch, err)
	}
	looked := func(context.Context) (bool, error) { return reconciles(d, controller) > before, nil }
	if err := harness.WaitFor(ctx, "the dispatcher to look at the Job again", time.Minute, looked); err != nil {
		t.Fatal(err)
	}
}

// TestWritersKubeSource: the kube source's task Job. The forger's writes
// (annotations, status, FailedCreate events) are refused by the API server;
// a task annotation rewritten by a trusted user does not end the task
// Refused (it did: the Job ran on, unwatched); a pod planted with the Job's
// selector, adopted by the Job controller, that exits 0 and completes the
// Job is not the task's success (it was reported Succeeded).
func TestWritersKubeSource(t *testing.T) {
	t.Parallel()
	f := features.New("writers: kube source").
		Assess("what the dispatcher reads is written by its writers alone", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			installCRD(ctx, t, cfg)
			installWritersPolicy(ctx, t, cfg, ns, "runner.caBundle.configMap="+platformCA,
				"webhook.platform.credentialSets[0].name=git", "webhook.platform.credentialSets[0].secretName="+platformCreds)
			d := startDispatcher(ctx, t, cfg, ns, "--simulated", "--pod-template", pendingTemplate(t), "--unschedulable-timeout", "10m", "--preflight=false")
			r := cfg.Client().Resources(ns)
			rt := runnerTask(ns, "forged", "true")
			if err := r.Create(ctx, rt); err != nil {
				t.Fatal(err)
			}
			if err := r.Get(ctx, rt.Name, ns, rt); err != nil {
				t.Fatal(err)
			}
			id := rt.Namespace + "/" + rt.Name + "/" + string(rt.UID)
			j := runningJobOf(ctx, t, cfg, ns, id, d)
			fc := forger(ctx, t, cfg, ns)
			checkForgeriesRefused(ctx, t, fc, &j)
			checkNamesAndPlatformRefused(ctx, t, cfg, fc, ns, &j)
			// The RunnerTask's status (its outcome and record) is the
			// dispatcher's: the forger's Succeeded is refused.
			const byDispatcher = "is written by the dispatcher"
			forged := rt.DeepCopy()
			forged.Status.Phase, forged.Status.Reason = v1alpha1.PhaseSucceeded, "Completed"
			if err := fc.Status().Patch(ctx, forged, client.RawPatch(types.MergePatchType, []byte(`{"status":{"phase":"Succeeded","reason":"Completed"}}`))); err == nil || !strings.Contains(err.Error(), byDispatcher) {
				t.Errorf("the forger writing the RunnerTask's status: %v, want refused (%q)", err, byDispatcher)
			}

			// The dispatcher's reading: its Job is the task's by its name.
			asAdmin(ctx, t, cfg, d, "runnertask", &j, `{"metadata":{"annotations":{"runwarden.dev/task-id":"`+ns+`/another/uid"}}}`)
			cur := &v1alpha1.RunnerTask{}
			if err := r.Get(ctx, rt.Name, ns, cur); err != nil {
				t.Fatal(err)
			}
			if terminalPhase(cur.Status.Phase) {
				t.Errorf("a rewritten task annotation ended the task: %s %s: %s", cur.Status.Phase, cur.Status.Reason, cur.Status.Message)
			}
			asAdmin(ctx, t, cfg, d, "runnertask", &j, `{"metadata":{"annotations":{"runwarden.dev/task-id":"`+id+`"}}}`)

			// A pod planted with the Job's selector on a simulated node: the
			// Job controller adopts it and, finding two active pods for a
			// parallelism of one, deletes the unscheduled runner; kwok runs
			// the planted pod to exit 0, which completes the Job. (Where the
			// webhook refuses a pod with the Job's selector label to all but
			// the Job controller, the planting is refused first.)
			planted := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{
					Name: j.Name + "-planted", Namespace: ns,
					Labels: map[string]string{batchv1.ControllerUidLabel: string(j.UID), batchv1.JobNameLabel: j.Name, "controller-uid": string(j.UID), "job-name": j.Name},
					// Counted by the Job controller only with its tracking
					// finalizer, which anyone may write.
					Finalizers: []string{batchv1.JobTrackingFinalizer},
				},
				Spec: corev1.PodSpec{
					NodeName: "rw-sim-0", RestartPolicy: corev1.RestartPolicyNever,
					Containers: []corev1.Container{{Name: job.RunnerContainer, Image: "busybox:stable"}},
				},
			}
			t.Cleanup(func() {
				// A finalizer left by a pod the Job controller never counted
				// would hold the namespace's deletion.
				_ = r.Patch(context.Background(), planted, k8s.Patch{PatchType: types.MergePatchType, Data: []byte(`{"metadata":{"finalizers":null}}`)})
			})
			if err := fc.Create(ctx, planted); err != nil {
				t.Logf("planting a pod with the Job's selector was refused (the webhook's layer): %v", err)
				return ctx
			}
			got := waitPhase(ctx, t, cfg, rt, d)
			if got.Status.Phase == v1alpha1.PhaseSucceeded {
				t.Fatalf("a planted pod's exit 0 was reported as the task's success: %s %s: %s", got.Status.Phase, got.Status.Reason, got.Status.Message)
			}
			if got.Status.Reason != job.ReasonRunnerNotSucceeded {
				t.Errorf("task %s %s: %s, want Failed %s", got.Status.Phase, got.Status.Reason, got.Status.Message, job.ReasonRunnerNotSucceeded)
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// TestWritersOrchestratorSource: the orchestrator source's task Job. The
// forger's writes are refused by the API server; an outcome written on the
// running Job by a trusted user is not reported as the task's (it was,
// and the Job was then never stopped), nor does t-1's Job with t-2's task
// annotation report t-2.
func TestWritersOrchestratorSource(t *testing.T) {
	t.Parallel()
	f := features.New("writers: orchestrator source").
		Assess("what the dispatcher reads is written by its writers alone", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			// A user the policy trusts to write runner pods' status (a
			// component of writers.users, beside the scheduler this cluster's
			// pending runner pods need).
			statusWriter := harness.User{Name: "status-writer-" + ns[len(ns)-6:]}
			installWritersPolicy(ctx, t, cfg, ns, "writers.users={system:kube-scheduler,"+statusWriter.Name+"}")
			o := newOrchestrator(t, orchestratortest.Options{LeaseSeconds: 30})
			d := startOrchestratorDispatcher(ctx, t, cfg, ns, o, "--simulated", "--pod-template", pendingTemplate(t), "--unschedulable-timeout", "10m", "--preflight=false")
			for _, id := range []string{"t-1", "t-2"} {
				o.srv.Add(orchestrator.Task{ID: id, Command: []string{"true"}, SecretEnv: map[string]string{"TF_VAR_token": "the task's own"}})
			}
			j := runningJobOf(ctx, t, cfg, ns, "t-1", d)
			runningJobOf(ctx, t, cfg, ns, "t-2", d)
			fc := forger(ctx, t, cfg, ns)
			checkForgeriesRefused(ctx, t, fc, &j)
			// The task's Secret holds its values: the forger may read it
			// here (a namespace whose users may read Secrets) but not
			// change what the runner gets.
			sec := &corev1.Secret{}
			if err := fc.Get(ctx, client.ObjectKey{Namespace: ns, Name: job.SecretName(j.Name)}, sec); err != nil {
				t.Fatalf("t-1's Secret: %v", err)
			}
			const secretByDispatcher = "are written by the dispatcher"
			for what, patch := range map[string]string{
				"a value changed": `{"data":{"TF_VAR_token":"Zm9yZ2Vk"}}`,
				"a value added":   `{"stringData":{"EXTRA":"forged"}}`,
				"a value removed": `{"data":{"TF_VAR_token":null}}`,
			} {
				if err := mergePatch(ctx, fc, sec.DeepCopy(), patch); err == nil || !strings.Contains(err.Error(), secretByDispatcher) {
					t.Errorf("the forger's task Secret with %s: %v, want refused (%q)", what, err, secretByDispatcher)
				}
			}
			if err := mergePatch(ctx, fc, sec.DeepCopy(), `{"metadata":{"annotations":{"note":"the forger's own"}}}`); err != nil {
				t.Errorf("a note of the forger's on the task Secret: %v, want allowed", err)
			}

			// A trusted status writer writes the runner pod's status, not
			// its labels: none changes through pods/status, whoever writes.
			if err := statusWriter.Grant(ctx, cfg, ns, "status-writer",
				rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"}},
				rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"pods/status"}, Verbs: []string{"patch"}},
			); err != nil {
				t.Fatal(err)
			}
			sw, err := statusWriter.Client(cfg)
			if err != nil {
				t.Fatal(err)
			}
			runner := runnerPodOf(ctx, t, sw, &j)
			cond := `{"status":{"conditions":[{"type":"example.com/Checked","status":"True"}]}}`
			if err := sw.Status().Patch(ctx, runner.DeepCopy(), client.RawPatch(types.StrategicMergePatchType, []byte(cond))); err != nil {
				t.Errorf("the trusted status writer's condition on the runner pod: %v, want allowed", err)
			}
			const throughStatus = "are not changed through pods/status"
			if err := sw.Status().Patch(ctx, runner.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"note":"x"}}}`))); err == nil || !strings.Contains(err.Error(), throughStatus) {
				t.Errorf("the trusted status writer labelling the runner pod through pods/status: %v, want refused (%q)", err, throughStatus)
			}

			asAdmin(ctx, t, cfg, d, "orchestrator-task", &j, `{"metadata":{"annotations":{"runwarden.dev/outcome":"{\"Phase\":\"Succeeded\",\"Reason\":\"Completed\",\"Message\":\"forged\"}"}}}`)
			asAdmin(ctx, t, cfg, d, "orchestrator-task", &j, `{"metadata":{"annotations":{"runwarden.dev/task-id":"t-2"}}}`)
			for _, id := range []string{"t-1", "t-2"} {
				if rec := o.srv.Task(id); rec.Final != nil {
					t.Errorf("%s reported %s %s: %s", id, rec.Final.Type, rec.Final.Reason, rec.Final.Message)
				}
			}
			var now batchv1.Job
			if err := cfg.Client().Resources(ns).Get(ctx, j.Name, ns, &now); err != nil {
				t.Fatalf("t-1's Job: %v", err)
			}
			if now.Annotations[orchestrator.AnnotationReported] != "" || job.Finished(&now) {
				t.Errorf("t-1's Job after the forgeries: annotations %v, conditions %v", now.Annotations, now.Status.Conditions)
			}
			if d.cmd.ProcessState != nil {
				t.Fatalf("the dispatcher stopped: %s", tail(d.log.String(), 3000))
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// TestWritersKueueWorkload: with Kueue, whether a task was evicted or
// deactivated is read from its Job's Workload, which Kueue and the
// dispatcher write alone: a user of the runner namespace who may patch
// Workloads cannot deactivate or evict a task's (Kueue itself still
// reserves quota, as the suite's admin).
func TestWritersKueueWorkload(t *testing.T) {
	t.Parallel()
	kueueUp(t.Context(), t)
	f := features.New("writers: Kueue Workloads").
		Setup(kueueSetup).
		Assess("a task's Workload is written by Kueue and the dispatcher alone", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			objs, flavor, _, _ := kueueObjects(ns)
			applyObjects(ctx, t, cfg, objs+"---\n"+clusterQueue(ns, "held", flavor, "", 0, false))
			installWritersPolicy(ctx, t, cfg, ns, "queueing.kueue.enabled=true")
			d := startDispatcher(ctx, t, cfg, ns, "--kueue", "--default-queue", "held", "--preflight=false")
			held := queuedTask(ns, "held", "held", "", 1)
			if err := cfg.Client().Resources(ns).Create(ctx, held); err != nil {
				t.Fatal(err)
			}
			fc := forger(ctx, t, cfg, ns)
			u := harness.User{Name: "forger-" + ns[len(ns)-6:]}
			if err := u.Grant(ctx, cfg, ns, "forger-workloads",
				rbacv1.PolicyRule{APIGroups: []string{"kueue.x-k8s.io"}, Resources: []string{"workloads", "workloads/status"}, Verbs: []string{"get", "list", "patch", "update"}},
			); err != nil {
				t.Fatal(err)
			}
			// Kueue makes the Workload (as the suite's admin: the policy
			// lets it) and leaves it waiting for quota.
			var wl unstructured.Unstructured
			made := func(ctx context.Context) (bool, error) {
				var list unstructured.UnstructuredList
				list.SetAPIVersion("kueue.x-k8s.io/v1beta2")
				list.SetKind("WorkloadList")
				if err := fc.List(ctx, &list, client.InNamespace(ns)); err != nil {
					return false, err
				}
				if len(list.Items) == 1 {
					wl = list.Items[0]
					return true, nil
				}
				return false, nil
			}
			if err := harness.WaitFor(ctx, "Kueue to make the task's Workload", time.Minute, made); err != nil {
				t.Fatalf("%v\n%s", err, tail(d.log.String(), 3000))
			}
			const byKueue = "are written by Kueue and the dispatcher"
			// The probe: a label of the forger's, harmless if it lands first.
			waitEnforced(ctx, t, "the Workloads policy", byKueue, func(ctx context.Context, n int) error {
				return mergePatch(ctx, fc, wl.DeepCopy(), fmt.Sprintf(`{"metadata":{"labels":{"e2e-probe":"%d"}}}`, n))
			})
			if err := mergePatch(ctx, fc, wl.DeepCopy(), `{"spec":{"active":false}}`); err == nil || !strings.Contains(err.Error(), byKueue) {
				t.Errorf("the forger deactivating the task's Workload: %v, want refused (%q)", err, byKueue)
			}
			now := time.Now().UTC().Format(time.RFC3339)
			evicted := `{"status":{"conditions":[{"type":"Evicted","status":"True","reason":"Preempted","message":"forged","lastTransitionTime":"` + now + `"}]}}`
			if err := fc.Status().Patch(ctx, wl.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(evicted))); err == nil || !strings.Contains(err.Error(), byKueue) {
				t.Errorf("the forger evicting the task's Workload through its status: %v, want refused (%q)", err, byKueue)
			}
			// The task still waits for quota, as Kueue says.
			cur := &v1alpha1.RunnerTask{}
			if err := cfg.Client().Resources(ns).Get(ctx, held.Name, ns, cur); err != nil {
				t.Fatal(err)
			}
			if terminalPhase(cur.Status.Phase) {
				t.Errorf("the held task ended after the forgeries: %s %s: %s", cur.Status.Phase, cur.Status.Reason, cur.Status.Message)
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}
