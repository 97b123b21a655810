//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/e2e-framework/klient/k8s"
	"sigs.k8s.io/e2e-framework/klient/k8s/resources"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/kube"
	"github.com/runwarden/runwarden/dispatcher/orchestrator"
	"github.com/runwarden/runwarden/dispatcher/orchestrator/orchestratortest"
	"github.com/runwarden/runwarden/e2e/harness"
	"github.com/runwarden/runwarden/internal/contract"
)

// The attacks of docs/security.md, each run on the real API server as a user
// holding only the RBAC its actor has, each showing the message that user
// sees.

// taskAuthor is a user who may only write RunnerTasks in one namespace:
// what a platform grants the teams that submit tasks.
func taskAuthor(ctx context.Context, t *testing.T, cfg *envconf.Config, ns string) harness.User {
	t.Helper()
	u := harness.User{Name: "task-author-" + ns[len(ns)-6:]}
	if err := u.Grant(ctx, cfg, ns, "task-author", rbacv1.PolicyRule{
		APIGroups: []string{"runwarden.dev"}, Resources: []string{"runnertasks"},
		Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"},
	}); err != nil {
		t.Fatal(err)
	}
	return u
}

// TestSecurityTaskEnvIsData: a task author cannot make the dispatcher's Job
// read a Secret, a ConfigMap or a mounted file into the task's env; the
// RunnerTask CRD refuses it with a message naming the variables.
func TestSecurityTaskEnvIsData(t *testing.T) {
	t.Parallel()
	f := features.New("task env is data").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			installCRD(ctx, t, cfg)
			return ctx
		}).
		Assess("the CRD refuses env read from cluster objects", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			c, err := taskAuthor(ctx, t, cfg, ns).Client(cfg)
			if err != nil {
				t.Fatal(err)
			}
			sources := map[string]*corev1.EnvVarSource{
				"secretKeyRef":    {SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "aws-creds"}, Key: "aws_secret_access_key"}},
				"configMapKeyRef": {ConfigMapKeyRef: &corev1.ConfigMapKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "platform"}, Key: "k"}},
				"fileKeyRef":      {FileKeyRef: &corev1.FileKeySelector{VolumeName: "aws-iam-token", Path: "token", Key: "token"}},
			}
			for field, src := range sources {
				rt := runnerTask(ns, "steal-"+strings.ToLower(field), "env")
				rt.Spec.Env = append(rt.Spec.Env, corev1.EnvVar{Name: "STOLEN", ValueFrom: src})
				err := c.Create(ctx, rt)
				if err == nil || !strings.Contains(err.Error(), "env STOLEN: a task variable carries a value") ||
					!strings.Contains(err.Error(), "secretKeyRef, configMapKeyRef and fileKeyRef are refused") {
					t.Errorf("RunnerTask with env valueFrom.%s: error %v, want the CRD's refusal naming STOLEN", field, err)
				}
			}
			own := runnerTask(ns, "own-fields", "env")
			own.Spec.Env = append(own.Spec.Env,
				corev1.EnvVar{Name: "POD", ValueFrom: &corev1.EnvVarSource{FieldRef: &corev1.ObjectFieldSelector{FieldPath: "metadata.name"}}},
				corev1.EnvVar{Name: "MEM", ValueFrom: &corev1.EnvVarSource{ResourceFieldRef: &corev1.ResourceFieldSelector{Resource: "limits.memory"}}})
			if err := c.Create(ctx, own); err != nil {
				t.Errorf("RunnerTask with env from the pod's own fields: %v", err)
			}
			var got v1alpha1.RunnerTaskList
			if err := c.List(ctx, &got, client.InNamespace(ns)); err != nil || len(got.Items) != 1 {
				t.Errorf("the task author sees %d RunnerTasks (%v), want only own-fields", len(got.Items), err)
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// TestSecurityTaskSecretRefs: a task author cannot climb out of the secret
// names its namespace may read with path tricks: a reference with a ".."
// segment is malformed and denied before any policy pattern sees it, and
// the task ends AdmissionRejected with the webhook's message.
func TestSecurityTaskSecretRefs(t *testing.T) {
	t.Parallel()
	f := features.New("task secret references").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			installCRD(ctx, t, cfg)
			if err := harness.LabelNamespace(ctx, cfg, runnerNamespaceLabel, "enabled"); err != nil {
				t.Fatal(err)
			}
			return ctx
		}).
		Assess("a reference with a .. segment is refused", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			annotateNamespace(ctx, t, cfg, ns, "runwarden.dev/secret-patterns", "vault:"+ns+":team-a/**")
			startWebhook(ctx, t, cfg)
			d := startDispatcher(ctx, t, cfg, ns, "--simulated")
			c, err := taskAuthor(ctx, t, cfg, ns).Client(cfg)
			if err != nil {
				t.Fatal(err)
			}
			rt := runnerTask(ns, "climb", "true")
			rt.Spec.Env = append(rt.Spec.Env, corev1.EnvVar{Name: "TF_VAR_db_password", Value: "${vault:team-a/../team-b/db.password@" + ns + "}"})
			if err := c.Create(ctx, rt); err != nil {
				t.Fatal(err)
			}
			got := waitPhase(ctx, t, cfg, rt, d)
			if got.Status.Reason != job.ReasonAdmission || !strings.Contains(got.Status.Message, "denied the request") ||
				!strings.Contains(got.Status.Message, "env TF_VAR_db_password: malformed secret reference ${vault:team-a/../team-b/db.password@"+ns+"}") {
				t.Errorf("task with a climbing reference: %s/%s %q, want AdmissionRejected naming the malformed reference", got.Status.Phase, got.Status.Reason, got.Status.Message)
			} else {
				t.Logf("the task author sees: %s: %s", got.Status.Reason, got.Status.Message)
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// undecidedPolicy is added to the e2e webhook's policies: a namespace
// annotation makes the policies unable to decide (two values for one
// complete rule: an evaluation error), or deny every runner pod.
const undecidedPolicy = `package runwarden.admission

undecided := 1 if ns_annotations["e2e.runwarden.dev/policy"] == "undecided"

undecided := 2 if ns_annotations["e2e.runwarden.dev/policy"] == "undecided"

warning contains "undecided" if undecided

violations contains violation("e2e-deny", "", "", "every runner pod of this namespace is denied") if {
	ns_annotations["e2e.runwarden.dev/policy"] == "deny"
}
`

// annotateNamespace sets (or, with value "", removes) an annotation of ns.
func annotateNamespace(ctx context.Context, t *testing.T, cfg *envconf.Config, ns, key, value string) {
	t.Helper()
	patch := fmt.Sprintf(`{"metadata":{"annotations":{%q:%q}}}`, key, value)
	if value == "" {
		patch = fmt.Sprintf(`{"metadata":{"annotations":{%q:null}}}`, key)
	}
	obj := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}
	if err := cfg.Client().Resources().Patch(ctx, obj, k8s.Patch{PatchType: types.MergePatchType, Data: []byte(patch)}); err != nil {
		t.Fatal(err)
	}
}

// failedCreate is the message of the newest FailedCreate event of a Job and
// how often it was seen.
func failedCreate(ctx context.Context, cfg *envconf.Config, ns, jobName string) (string, int32) {
	var events corev1.EventList
	if err := cfg.Client().Resources(ns).List(ctx, &events); err != nil {
		return "", 0
	}
	var msg string
	var count int32
	for _, e := range events.Items {
		if e.InvolvedObject.Kind == "Job" && e.InvolvedObject.Name == jobName && e.Reason == "FailedCreate" {
			msg, count = e.Message, count+max(e.Count, 1)
		}
	}
	return msg, count
}

// TestSecurityUndecidedIsNotDenied: a webhook that cannot decide (its
// policies fail to evaluate) answers with an HTTP error, which the API server
// reports as a failed call, not as a denial; the Job controller retries, the
// dispatcher waits, and the task's pod is made once the webhook decides
// again. A real denial still ends the task AdmissionRejected at once. Both
// classifications are checked on the real API server's wording.
func TestSecurityUndecidedIsNotDenied(t *testing.T) {
	t.Parallel()
	f := features.New("undecided is not denied").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			installCRD(ctx, t, cfg)
			if err := harness.LabelNamespace(ctx, cfg, runnerNamespaceLabel, "enabled"); err != nil {
				t.Fatal(err)
			}
			return ctx
		}).
		Assess("undecided is retried, denied is final", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			w := startWebhook(ctx, t, cfg)
			if err := os.WriteFile(filepath.Join(w.policyDir, "undecided.rego"), []byte(undecidedPolicy), 0o644); err != nil {
				t.Fatal(err)
			}
			reloaded := func(context.Context) (bool, error) {
				return strings.Contains(w.metric(t, "runwarden_webhook_policy_reloads_total"), `result="success"} 1`), nil
			}
			if err := harness.WaitFor(ctx, "the webhook to load the test policy", 30*time.Second, reloaded); err != nil {
				t.Fatalf("%v\n%s\nwebhook log:\n%s", err, w.metric(t, "runwarden_webhook_policy_reloads_total"), w.log.String())
			}
			d := startDispatcher(ctx, t, cfg, ns, "--simulated")
			r := cfg.Client().Resources(ns)

			annotateNamespace(ctx, t, cfg, ns, "e2e.runwarden.dev/policy", "undecided")
			rt := runnerTask(ns, "undecided", "true")
			if err := r.Create(ctx, rt); err != nil {
				t.Fatal(err)
			}
			jobName := job.Name(kube.TaskID(rt))
			var msg string
			retried := func(ctx context.Context) (bool, error) {
				var n int32
				msg, n = failedCreate(ctx, cfg, ns, jobName)
				return n >= 2, nil
			}
			if err := harness.WaitFor(ctx, "the Job controller to try the pod twice", time.Minute, retried); err != nil {
				t.Fatalf("%v (last FailedCreate: %q)\nwebhook log:\n%s", err, msg, w.log.String())
			}
			if !strings.Contains(msg, "failed calling webhook") || !strings.Contains(msg, "runwarden webhook could not decide") ||
				strings.Contains(msg, "denied the request") || job.DeniedByAdmission(msg) {
				t.Errorf("FailedCreate of an undecided pod: %q; want a failed call, not a denial", msg)
			}
			if err := r.Get(ctx, rt.Name, ns, rt); err != nil || terminalPhase(rt.Status.Phase) {
				t.Errorf("task while the webhook cannot decide: %+v (%v), want it still waiting", rt.Status, err)
			}

			annotateNamespace(ctx, t, cfg, ns, "e2e.runwarden.dev/policy", "")
			admitted := func(ctx context.Context) (bool, error) {
				var pods corev1.PodList
				err := r.List(ctx, &pods, resources.WithLabelSelector("job-name="+jobName))
				return err == nil && len(pods.Items) > 0, nil
			}
			if err := harness.WaitFor(ctx, "the Job controller to make the pod once the webhook decides", 2*time.Minute, admitted); err != nil {
				t.Fatalf("%v\ndispatcher log:\n%s", err, d.log.String())
			}
			if err := r.Get(ctx, rt.Name, ns, rt); err != nil || rt.Status.Reason == job.ReasonAdmission {
				t.Errorf("task after the webhook decided: %+v (%v)", rt.Status, err)
			}

			annotateNamespace(ctx, t, cfg, ns, "e2e.runwarden.dev/policy", "deny")
			denied := runnerTask(ns, "denied", "true")
			if err := r.Create(ctx, denied); err != nil {
				t.Fatal(err)
			}
			got := waitPhase(ctx, t, cfg, denied, d)
			if got.Status.Reason != job.ReasonAdmission || !strings.Contains(got.Status.Message, "denied the request") ||
				!strings.Contains(got.Status.Message, "e2e-deny: every runner pod of this namespace is denied") {
				t.Errorf("denied task: %+v, want AdmissionRejected with the policy's message", got.Status)
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// TestSecurityOrchestratorLimits: what an orchestrator sends cannot take
// the dispatcher past its limits. A task too large for a Secret, for the API
// server (413) or for etcd ends Refused and frees its slot,
// instead of being retried for ever while its lease is renewed; leases
// beyond the capacity a poll asked for are handed back, so no more than
// --max-concurrent Jobs run, and every task still runs exactly once.
func TestSecurityOrchestratorLimits(t *testing.T) {
	t.Parallel()
	f := features.New("orchestrator limits").
		Assess("oversized tasks are refused, extra leases handed back", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			o := newOrchestrator(t, orchestratortest.Options{LeaseSeconds: 30, Faults: orchestratortest.Faults{OverDeliver: 3}})
			watch := harness.WatchJobs(ctx, t, cfg, ns, 1)
			d := startOrchestratorDispatcher(ctx, t, cfg, ns, o, "--simulated", "--max-concurrent", "1", "--succeeded-history", "20")
			o.srv.Add(
				orchestrator.Task{ID: "past-secret-limit", Command: []string{"true"}, SecretEnv: map[string]string{"TF_VAR_blob": strings.Repeat("x", 3<<19)}},
				orchestrator.Task{ID: "past-etcd", Command: []string{"true"}, Env: []orchestrator.EnvVar{{Name: "TF_VAR_blob", Value: strings.Repeat("x", 2<<20)}}},
				orchestrator.Task{ID: "past-api-server", Command: []string{"true"}, Env: []orchestrator.EnvVar{{Name: "TF_VAR_blob", Value: strings.Repeat("y", 3<<20+512<<10)}}},
			)
			ids := orchestratorTasks(o.srv, "after", 6)
			waitAllDone(ctx, t, o.srv, 9, 3*time.Minute, d)
			for id, want := range map[string]string{
				"past-secret-limit": "may not be more than 1048576 bytes", "past-api-server": "Request entity too large",
				// Past etcd's limit, the v1.36 and v1.37 API servers try the write
				// again and refuse their own second defaulting of the Job
				// (a new controller-uid) as invalid: final all the same.
				"past-etcd": `Job.batch "rw-past-etcd-30f2f8bec1" is invalid`,
			} {
				rec := o.srv.Task(id)
				if rec.Final.Type != orchestrator.EventFailed || rec.Final.Reason != job.ReasonRefused || !strings.Contains(rec.Final.Message, want) || rec.FinalStored != 1 {
					t.Errorf("task %s: final %+v, want failed, Refused, naming %q; leases %+v\ndispatcher log:\n%s", id, rec.Final, want, rec.Leases, logLines(d.log.String(), id, 20))
				}
				if n := len(jobsFor(ctx, t, cfg, ns, id)); n != 0 {
					t.Errorf("task %s: %d Jobs", id, n)
				}
			}
			checkExactlyOnce(ctx, t, cfg, ns, o.srv, ids)
			watch.Check(ctx, t)
			released := 0
			for _, rec := range o.srv.Tasks() {
				released += rec.Releases
			}
			if o.srv.Stats().CapacityViolations == 0 || released == 0 {
				t.Errorf("%d polls over-delivered and %d leases were handed back; the test did not exercise over-delivery", o.srv.Stats().CapacityViolations, released)
			}
			t.Logf("%d over-delivering polls, %d leases handed back", o.srv.Stats().CapacityViolations, released)
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// logLines returns up to n lines of log that mention what, each cut to 600
// characters.
func logLines(log, what string, n int) string {
	var out []string
	for _, l := range strings.Split(log, "\n") {
		if strings.Contains(l, what) && len(out) < n {
			out = append(out, l[:min(len(l), 600)])
		}
	}
	return strings.Join(out, "\n")
}

// securityPlatformConfig is the e2e platform configuration with an
// allow-list of registries.
const securityPlatformConfig = webhookPlatformConfig + `
shape:
  allowedRegistries: [registry.example.com]
`

// TestSecurityPodCreator: a user who may create and change pods in a runner
// namespace (but not Jobs) gets nothing from runwarden: a pod claiming the
// runner label is refused whether bare or with a forged owner reference to
// a real runner Job; a pod without the label still gets the shape rules; a
// running runner's image cannot be changed (TestSecurityAfterAdmission has
// the rest of what is frozen), and no debug container can be added to it.
func TestSecurityPodCreator(t *testing.T) {
	t.Parallel()
	f := features.New("pod creator").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			if err := harness.LabelNamespace(ctx, cfg, runnerNamespaceLabel, "enabled"); err != nil {
				t.Fatal(err)
			}
			sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runner", Namespace: harness.Namespace(ctx)}}
			if err := cfg.Client().Resources().Create(ctx, sa); err != nil {
				t.Fatal(err)
			}
			return ctx
		}).
		Assess("claims, shape, updates and debug containers are refused", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			w := startWebhookWith(ctx, t, cfg, securityPlatformConfig)
			u := harness.User{Name: "intruder-" + ns[len(ns)-6:]}
			if err := u.Grant(ctx, cfg, ns, "pod-creator", rbacv1.PolicyRule{
				APIGroups: []string{""}, Resources: []string{"pods", "pods/ephemeralcontainers"},
				Verbs: []string{"get", "list", "create", "update", "patch"},
			}); err != nil {
				t.Fatal(err)
			}
			c, err := u.Client(cfg)
			if err != nil {
				t.Fatal(err)
			}
			withImage := func(p *corev1.Pod) *corev1.Pod {
				p.Spec.Containers[0].Image = "registry.example.com/runner:1"
				return p
			}

			if err := c.Create(ctx, withImage(runnerPodFor(ns, "bare-claim", false))); err == nil ||
				!strings.Contains(err.Error(), `claims the label runwarden.dev/runner: "true"`) || !strings.Contains(err.Error(), "it is created by "+u.Name+", not by the Job controller") {
				t.Errorf("a bare pod claiming the runner label: %v", err)
			}

			// A real runner Job (as the dispatcher makes it), and a pod
			// that names it as its controller.
			j := runnerJobFor(ns, "real-runner", false)
			j.Spec.Template.Spec.Containers[0].Image = "registry.example.com/runner:1"
			runner, failure := jobPod(ctx, t, cfg, j)
			if runner == nil {
				t.Fatalf("the runner Job's pod: %s\nwebhook log:\n%s", failure, w.log.String())
			}
			if len(runner.Spec.InitContainers) == 0 || containerEnv(runner.Spec.InitContainers[0])["VAULT_TOKEN"] == "" {
				t.Errorf("the Job controller's runner pod lacks its resolver's credentials: %+v", runner.Spec.InitContainers)
			}
			forged := withImage(runnerPodFor(ns, "forged-owner", false))
			forged.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: j.Name, UID: j.UID, Controller: ptr.To(true)}}
			if err := c.Create(ctx, forged); err == nil || !strings.Contains(err.Error(), "not by the Job controller") {
				t.Errorf("a pod with a forged owner reference to a runner Job: %v", err)
			}
			// Without the runner label too: a pod made with the Job as its
			// controller, or with the Job controller's finalizer, would pass
			// for the Job's pod once labelled (through pods/status: the
			// chart's writers policy).
			plainOwned := withImage(runnerPodFor(ns, "forged-owner-plain", false))
			plainOwned.Labels = map[string]string{"app": "tool"}
			plainOwned.OwnerReferences = forged.OwnerReferences
			if err := c.Create(ctx, plainOwned); err == nil || !strings.Contains(err.Error(), "is made by the Job controller") {
				t.Errorf("a plain pod with a forged owner reference to a runner Job: %v", err)
			}
			plainTracked := withImage(runnerPodFor(ns, "forged-finalizer-plain", false))
			plainTracked.Labels = map[string]string{"app": "tool"}
			plainTracked.Finalizers = []string{batchv1.JobTrackingFinalizer}
			if err := c.Create(ctx, plainTracked); err == nil || !strings.Contains(err.Error(), "is the Job controller's") {
				t.Errorf("a plain pod with the Job controller's finalizer: %v", err)
				_ = c.Patch(ctx, plainTracked, client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"finalizers":null}}`)))
			}
			// Nor through a Job of one's own whose selector (chosen with
			// spec.manualSelector) names the runner Job's UID: the Job
			// controller's pods for it are refused, so none can be released
			// to the runner Job to adopt.
			selector := map[string]string{batchv1.ControllerUidLabel: string(j.UID), "app": "decoy"}
			decoy := &batchv1.Job{
				ObjectMeta: metav1.ObjectMeta{Name: "decoy", Namespace: ns},
				Spec: batchv1.JobSpec{
					ManualSelector: ptr.To(true), Selector: &metav1.LabelSelector{MatchLabels: selector},
					Template: corev1.PodTemplateSpec{
						ObjectMeta: metav1.ObjectMeta{Labels: selector},
						Spec:       corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "main", Image: "registry.example.com/runner:1"}}},
					},
				},
			}
			if err := cfg.Client().Resources(ns).Create(ctx, decoy); err != nil {
				t.Fatalf("a Job whose selector names the runner Job's UID: %v", err)
			}
			var msg string
			refused := func(ctx context.Context) (bool, error) {
				msg, _ = failedCreate(ctx, cfg, ns, decoy.Name)
				return strings.Contains(msg, "names another Job than the pod's own"), nil
			}
			if err := harness.WaitFor(ctx, "the decoy Job's pod to be refused", time.Minute, refused); err != nil {
				t.Errorf("%v (last FailedCreate: %q)", err, msg)
			}

			privileged := withImage(runnerPodFor(ns, "privileged-plain", true))
			privileged.Labels = map[string]string{"app": "tool"}
			if err := c.Create(ctx, privileged); err == nil || !strings.Contains(err.Error(), "no-privileged") {
				t.Errorf("a privileged pod without the runner label: %v", err)
			}
			elsewhere := runnerPodFor(ns, "plain-elsewhere", false)
			elsewhere.Labels = map[string]string{"app": "tool"}
			elsewhere.Spec.Containers[0].Image = "evil.example.net/tool:1"
			if err := c.Create(ctx, elsewhere); err == nil || !strings.Contains(err.Error(), "allowed-registries") {
				t.Errorf("a pod without the runner label from another registry: %v", err)
			}

			// The running runner's image, changed by the intruder. Patches
			// carry no resourceVersion: the pod's status and the Job
			// controller's finalizer change under the test, and an update
			// would meet a conflict before it met the webhook.
			intrude := func(what, want string, change func(*corev1.Pod), sub ...string) {
				t.Helper()
				current := &corev1.Pod{}
				if err := c.Get(ctx, client.ObjectKeyFromObject(runner), current); err != nil {
					t.Fatal(err)
				}
				before := current.DeepCopy()
				change(current)
				var err error
				if len(sub) > 0 {
					err = c.SubResource(sub[0]).Patch(ctx, current, client.MergeFrom(before))
				} else {
					err = c.Patch(ctx, current, client.MergeFrom(before))
				}
				if err == nil || !strings.Contains(err.Error(), want) {
					t.Errorf("%s: %v", what, err)
				}
			}
			intrude("changing a runner pod's image", "spec.containers[main].image of a runner pod cannot be changed", func(p *corev1.Pod) {
				p.Spec.Containers[0].Image = "evil.example.net/runner:1"
			})
			intrude("taking the runner label off a runner pod", "cannot be added to or removed from a pod", func(p *corev1.Pod) {
				p.Labels["runwarden.dev/runner"] = "false"
			})
			// kubectl debug: an ephemeral container on the runner.
			intrude("adding a debug container to a runner pod", "no-ephemeral-containers", func(p *corev1.Pod) {
				p.Spec.EphemeralContainers = append(p.Spec.EphemeralContainers, corev1.EphemeralContainer{
					EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "debugger", Image: "registry.example.com/debug:1", Command: []string{"cat", "/proc/1/environ"}},
					TargetContainerName:      "main",
				})
			}, "ephemeralcontainers")
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// TestSecurityExecIntoRunners: a user who may exec into, attach to and
// port-forward to pods of a runner namespace (create on pods/exec,
// pods/attach, pods/portforward) gets no shell in a running runner pod,
// which would read main's environment and its resolved secret values as a
// debug container would: the webhook refuses the CONNECT, naming the rule.
// The same user's exec into a pod that is not a runner runs. Both pods run
// on the real node (kubectl refuses, on its side, to exec into a completed
// pod, and the simulated nodes complete Job pods at once).
func TestSecurityExecIntoRunners(t *testing.T) {
	t.Parallel()
	var u harness.User
	f := features.New("exec into runners").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			harness.RequireRealNode(ctx, t, cfg)
			ns := harness.Namespace(ctx)
			if err := harness.LabelNamespace(ctx, cfg, runnerNamespaceLabel, "enabled"); err != nil {
				t.Fatal(err)
			}
			sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "runner", Namespace: ns}}
			if err := cfg.Client().Resources().Create(ctx, sa); err != nil {
				t.Fatal(err)
			}
			u = harness.User{Name: "operator-" + ns[len(ns)-6:]}
			if err := u.Grant(ctx, cfg, ns, "pod-exec", rbacv1.PolicyRule{
				APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list"},
			}, rbacv1.PolicyRule{
				APIGroups: []string{""}, Resources: []string{"pods/exec", "pods/attach", "pods/portforward"}, Verbs: []string{"get", "create"},
			}); err != nil {
				t.Fatal(err)
			}
			// No secret store and no runner pool: the runner needs nothing
			// the real node lacks. exec.allow is left at its default, off.
			startWebhookWith(ctx, t, cfg, "{}\n")
			return ctx
		}).
		Assess("exec and attach into a running runner pod are refused", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			j := runnerJobFor(ns, "exec-target", false)
			spec := &j.Spec.Template.Spec
			spec.Containers[0].Image = realImage(ctx, t)
			spec.Containers[0].Command = []string{"/bin/sh", "-c", "sleep 120"}
			spec.Containers[0].Env = []corev1.EnvVar{{Name: "DB_PASSWORD", Value: "s3cret-in-the-runner"}}
			spec.TerminationGracePeriodSeconds = ptr.To[int64](1)
			harness.OnRealNode(spec)
			runner, failure := jobPod(ctx, t, cfg, j)
			if runner == nil {
				t.Fatalf("the runner Job's pod: %s", failure)
			}
			waitRunning(ctx, t, cfg, ns, runner.Name)
			for want, args := range map[string][]string{
				"no-exec-into-runners: exec into runner pod " + runner.Name + " (container main)": {"exec", "-n", ns, runner.Name, "-c", "main", "--", "cat", "/proc/1/environ"},
				"no-exec-into-runners: attach to runner pod " + runner.Name + " (container main)": {"attach", "-n", ns, runner.Name, "-c", "main"},
			} {
				out, err := suite.Kubectl(ctx, cfg, append([]string{"--as", u.Name, "--as-group", "system:authenticated"}, args...)...)
				if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "platform configuration exec.allow") ||
					strings.Contains(out, "s3cret-in-the-runner") {
					t.Errorf("kubectl %s into running runner pod %s: %v (output %q); want it refused by no-exec-into-runners", args[0], runner.Name, err, out)
				}
			}
			return ctx
		}).
		Assess("exec into a pod that is not a runner runs", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			tool := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "tool", Namespace: ns, Labels: map[string]string{"app": "tool"}},
				Spec: corev1.PodSpec{
					RestartPolicy:                 corev1.RestartPolicyNever,
					TerminationGracePeriodSeconds: ptr.To[int64](1),
					Containers:                    []corev1.Container{{Name: "main", Image: realImage(ctx, t), Command: []string{"/bin/sh", "-c", "sleep 120"}}},
				},
			}
			harness.OnRealNode(&tool.Spec)
			if err := cfg.Client().Resources().Create(ctx, tool); err != nil {
				t.Fatalf("creating a pod that is not a runner: %v", err)
			}
			waitRunning(ctx, t, cfg, ns, tool.Name)
			out, err := suite.Kubectl(ctx, cfg, "--as", u.Name, "--as-group", "system:authenticated",
				"exec", "-n", ns, tool.Name, "-c", "main", "--", "sh", "-c", "echo exec-$((40+2))")
			if err != nil || out != "exec-42\n" {
				t.Errorf("kubectl exec into a pod that is not a runner = %q, %v; want exec-42", out, err)
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// realImage is the runner image, as the real node holds it.
func realImage(ctx context.Context, t *testing.T) string {
	t.Helper()
	image, err := suite.ImageRef(ctx, "runner")
	if err != nil {
		t.Fatal(err)
	}
	return image
}

// waitRunning waits until pod name runs.
func waitRunning(ctx context.Context, t *testing.T, cfg *envconf.Config, ns, name string) {
	t.Helper()
	running := func(ctx context.Context) (bool, error) {
		p := &corev1.Pod{}
		if err := cfg.Client().Resources().Get(ctx, name, ns, p); err != nil {
			return false, err
		}
		return p.Status.Phase == corev1.PodRunning, nil
	}
	if err := harness.WaitFor(ctx, "pod "+name+" to run", 2*time.Minute, running); err != nil {
		t.Fatal(err)
	}
}

// TestSecurityDispatcherBounds: the chart's ValidatingAdmissionPolicies,
// on the real API server. Only the dispatcher's service account makes Jobs
// whose pods carry the runner label; its Jobs are named rw-..., name no
// Secret but their own (rw-secret-<Job>) and the pod template's, and run as
// the runner service account; its Secrets are Opaque, named rw-secret-<Job>,
// labelled with their task and owned by that Job. A compromised dispatcher
// is held to that: a Job named after a platform Secret (vault-token) reads
// nothing. Once made, a runner Job's spec is changed by the dispatcher and
// Kueue alone: another user with update on Jobs cannot steer a queued
// runner's pod to a node of their choosing. A runner Job waits only in the
// LocalQueues, with the WorkloadPriorityClasses, its namespace allows.
func TestSecurityDispatcherBounds(t *testing.T) {
	t.Parallel()
	f := features.New("dispatcher bounds").
		Assess("the chart's admission policies refuse what the dispatcher may not make", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			release := "rw-system-" + ns[len(ns)-6:]
			kueue := harness.User{Name: "kueue-controller-" + ns[len(ns)-6:]}
			out, err := newHelm(t, cfg, "helm4").run(ctx, "template", "rel", filepath.Join(suite.RepoRoot, "charts", "runwarden"),
				"--namespace", release, "--set", "runnerNamespace="+ns, "--set", "images.pullSecrets[0].name=regcred",
				"--set", "queueing.kueue.enabled=true", "--set", "queueing.kueue.defaultQueue=runners", "--set", "queueing.defaultPriorityClass=routine",
				"--set", "queueing.kueue.controllerUsers[0]="+kueue.Name,
				"--show-only", "templates/admission-policy.yaml")
			if err != nil {
				t.Fatalf("helm template: %v\n%s", err, out)
			}
			for _, doc := range strings.Split(out, "\n---\n") {
				obj := &unstructured.Unstructured{}
				if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil || obj.GetKind() == "" {
					continue
				}
				if err := cfg.Client().Resources().Create(ctx, obj); err != nil {
					t.Fatalf("creating %s %s: %v", obj.GetKind(), obj.GetName(), err)
				}
				t.Cleanup(func() { _ = cfg.Client().Resources().Delete(context.Background(), obj) })
			}
			dispatcher := harness.User{Name: "system:serviceaccount:" + release + ":rel-runwarden-dispatcher"}
			other := harness.User{Name: "team-admin-" + ns[len(ns)-6:]}
			rules := []rbacv1.PolicyRule{
				{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"create", "get", "patch", "delete"}},
				{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}},
			}
			if err := dispatcher.Grant(ctx, cfg, ns, "dispatcher", rules...); err != nil {
				t.Fatal(err)
			}
			if err := other.Grant(ctx, cfg, ns, "team-admin", rules...); err != nil {
				t.Fatal(err)
			}
			if err := kueue.Grant(ctx, cfg, ns, "kueue", rules[0]); err != nil {
				t.Fatal(err)
			}
			kc, err := kueue.Client(cfg)
			if err != nil {
				t.Fatal(err)
			}
			dc, err := dispatcher.Client(cfg)
			if err != nil {
				t.Fatal(err)
			}
			oc, err := other.Client(cfg)
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			runnerJob := func(mut func(*corev1.PodSpec)) *batchv1.Job {
				n++
				j := runnerJobFor(ns, fmt.Sprintf("rw-task-%d", n), false)
				j.Spec.Template.Spec.ServiceAccountName = "runwarden-runner"
				if mut != nil {
					mut(&j.Spec.Template.Spec)
				}
				return j
			}
			// The API server loads new policies within a few seconds.
			enforced := func(ctx context.Context) (bool, error) {
				err := oc.Create(ctx, runnerJob(nil))
				return err != nil && strings.Contains(err.Error(), "only the dispatcher"), nil
			}
			if err := harness.WaitFor(ctx, "the admission policies to be enforced", time.Minute, enforced); err != nil {
				t.Fatal(err)
			}
			if err := oc.Create(ctx, runnerJob(nil)); err == nil || !strings.Contains(err.Error(), "only the dispatcher (system:serviceaccount:"+release+":rel-runwarden-dispatcher) may make Jobs whose pods carry runwarden.dev/runner, not "+other.Name) {
				t.Errorf("another user's runner Job: %v", err)
			}
			labelled := runnerJob(nil)
			delete(labelled.Spec.Template.Labels, "runwarden.dev/runner")
			if err := oc.Create(ctx, labelled); err == nil || !strings.Contains(err.Error(), "only the dispatcher (system:serviceaccount:"+release+":rel-runwarden-dispatcher) may make Jobs labelled runwarden.dev/dispatcher, not "+other.Name) {
				t.Errorf("another user's Job with the dispatcher's label: %v", err)
			}
			plain := runnerJob(nil)
			delete(plain.Spec.Template.Labels, "runwarden.dev/runner")
			delete(plain.Labels, "runwarden.dev/dispatcher")
			plain.Spec.Suspend = ptr.To(true)
			if err := oc.Create(ctx, plain); err != nil {
				t.Errorf("another user's Job without the runner or dispatcher label: %v", err)
			}
			// A suspended Job's pod labels may change: not into a runner's,
			// nor may the Job take the dispatcher's label.
			for what, patch := range map[string]string{
				"pods into runners":    `{"spec":{"template":{"metadata":{"labels":{"runwarden.dev/runner":"true"}}}}}`,
				"the dispatcher label": `{"metadata":{"labels":{"runwarden.dev/dispatcher":"e2e"}}}`,
			} {
				if err := oc.Patch(ctx, plain.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(patch))); err == nil || !strings.Contains(err.Error(), "only the dispatcher") {
					t.Errorf("another user changing a Job's %s: %v", what, err)
				}
			}

			own := runnerJob(nil)
			own.Spec.Template.Spec.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "regcred"}}
			own.Spec.Template.Spec.Containers[0].Env = append(own.Spec.Template.Spec.Containers[0].Env, corev1.EnvVar{Name: "TF_VAR_token", ValueFrom: &corev1.EnvVarSource{
				SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: job.SecretName(own.Name)}, Key: "TF_VAR_token"},
			}})
			if err := dc.Create(ctx, own); err != nil {
				t.Errorf("the dispatcher's Job naming its own Secret and the pull secret: %v", err)
			}

			// A Job named after a Secret of the platform's, naming that
			// Secret as "its own": the name of each of the dispatcher's
			// Jobs begins rw-, and a Job's own Secret is rw-secret-<its
			// name>, which the chart keeps every platform Secret's name
			// from (TestRefusesBadValues).
			secretRef := func(name string) func(*corev1.PodSpec) {
				return func(s *corev1.PodSpec) {
					s.Containers[0].Env = append(s.Containers[0].Env, corev1.EnvVar{Name: "K", ValueFrom: &corev1.EnvVarSource{
						SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: name}, Key: "k"},
					}})
				}
			}
			named := func(name string, mut func(*corev1.PodSpec)) *batchv1.Job {
				j := runnerJob(mut)
				j.Name = name
				return j
			}
			for _, tt := range []struct {
				what string
				j    *batchv1.Job
				want string
			}{
				{what: "named after the Vault token Secret, naming it", j: named("vault-token", secretRef("vault-token")),
					want: "a Job of the dispatcher is named rw-... (its names for tasks), not vault-token"},
				{what: "named after the store credentials, naming them by envFrom", j: named("aws-creds", func(s *corev1.PodSpec) {
					s.Containers[0].EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "aws-creds"}}}}
				}), want: "is named rw-... (its names for tasks), not aws-creds"},
				{what: "named rw- plus the Secret, naming the Secret", j: named("rw-vault-token", secretRef("vault-token")),
					want: "a Job of the dispatcher names no Secret but its own (rw-secret-<the Job's name>)"},
				{what: "naming a Secret of its own name, as tasks' Secrets were once named", j: named("rw-vault-token", secretRef("rw-vault-token")),
					want: "names no Secret but its own (rw-secret-<the Job's name>)"},
				{what: "named like a task's Secret, naming a Secret of its own name", j: named("rw-secret-vault-token", secretRef("rw-secret-vault-token")),
					want: "names no Secret but its own (rw-secret-<the Job's name>)"},
				{what: "naming another Job's task Secret", j: named("rw-mine", secretRef(job.SecretName(own.Name))),
					want: "names no Secret but its own (rw-secret-<the Job's name>)"},
				{what: "naming the Secret by a projected volume", j: named("rw-vault-token", func(s *corev1.PodSpec) {
					s.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{{
						Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "vault-token"}},
					}}}}}}
				}), want: "names no Secret but its own (rw-secret-<the Job's name>)"},
			} {
				if err := dc.Create(ctx, tt.j, client.DryRunAll); err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("the dispatcher's Job %s: %v, want %q", tt.what, err, tt.want)
				}
			}
			if err := dc.Create(ctx, named("rw-vault-token", secretRef("rw-secret-rw-vault-token")), client.DryRunAll); err != nil {
				t.Errorf("the dispatcher's Job rw-vault-token naming its own Secret rw-secret-rw-vault-token: %v", err)
			}

			// A runner Job waiting in Kueue, suspended: another user with
			// update on Jobs may not place its pod, which will hold the
			// runner's credentials, nor change anything of its spec. The
			// dispatcher and Kueue's controller may.
			queued := runnerJob(nil)
			queued.Spec.Suspend = ptr.To(true)
			if err := dc.Create(ctx, queued); err != nil {
				t.Fatalf("the dispatcher's suspended runner Job: %v", err)
			}
			wantSpec := "the spec of runner Job " + queued.Name + " (its pod template: placement, containers, volumes; suspend) is changed by the dispatcher (system:serviceaccount:" +
				release + ":rel-runwarden-dispatcher) and Kueue (" + kueue.Name + ") alone, not " + other.Name
			for _, tt := range []struct{ what, patch string }{
				{"node selector", `{"spec":{"template":{"spec":{"nodeSelector":{"kubernetes.io/hostname":"attacker-node"}}}}}`},
				{"tolerations", `{"spec":{"template":{"spec":{"tolerations":[{"key":"attacker","operator":"Exists"}]}}}}`},
				{"affinity", `{"spec":{"template":{"spec":{"affinity":{"nodeAffinity":{"requiredDuringSchedulingIgnoredDuringExecution":{"nodeSelectorTerms":[{"matchExpressions":[{"key":"kubernetes.io/hostname","operator":"In","values":["attacker-node"]}]}]}}}}}}}`},
				{"pod labels", `{"spec":{"template":{"metadata":{"labels":{"team":"a"}}}}}`},
				{"suspend", `{"spec":{"suspend":false}}`},
				{"runner label, taken off", `{"spec":{"template":{"metadata":{"labels":{"runwarden.dev/runner":null}}}}}`},
			} {
				if err := oc.Patch(ctx, queued.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(tt.patch))); err == nil || !strings.Contains(err.Error(), wantSpec) {
					t.Errorf("another user changing a queued runner Job's %s: %v, want %q", tt.what, err, wantSpec)
				}
			}
			if err := oc.Patch(ctx, queued.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"team":"a"}}}`))); err != nil {
				t.Errorf("another user labelling a queued runner Job (its metadata, not its spec): %v", err)
			}
			for who, c := range map[string]client.Client{"Kueue's controller": kc, "the dispatcher": dc} {
				if err := c.Patch(ctx, queued.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"spec":{"template":{"spec":{"nodeSelector":{"pool":"runners"}}}}}`)), client.DryRunAll); err != nil {
					t.Errorf("%s placing a queued runner Job on its nodes: %v", who, err)
				}
			}

			// Queues and priority classes: the chart's defaults, until the
			// namespace lists its own.
			inQueue := func(queue, class string) *batchv1.Job {
				j := runnerJob(nil)
				j.Spec.Suspend = ptr.To(true)
				j.Labels["kueue.x-k8s.io/queue-name"] = queue
				if class != "" {
					j.Labels["kueue.x-k8s.io/priority-class"] = class
				}
				return j
			}
			queueRefused := func(queue string) string {
				return "runner Jobs in namespace " + ns + " wait in LocalQueue " + queue
			}
			for _, tt := range []struct {
				what         string
				queue, class string
				want         string // empty: allowed
			}{
				{what: "the default queue and class", queue: "runners", class: "routine"},
				{what: "the default queue, no class", queue: "runners"},
				{what: "another queue", queue: "team-b", want: queueRefused("runners") + " (namespace annotation runwarden.dev/allowed-queues, else the default runners), not team-b"},
				{what: "another class", queue: "runners", class: "urgent",
					want: "runner Jobs in namespace " + ns + " have WorkloadPriorityClass routine (namespace annotation runwarden.dev/allowed-priority-classes, else the default routine), not urgent"},
			} {
				err := dc.Create(ctx, inQueue(tt.queue, tt.class), client.DryRunAll)
				if tt.want == "" && err != nil || tt.want != "" && (err == nil || !strings.Contains(err.Error(), tt.want)) {
					t.Errorf("the dispatcher's Job in %s: %v, want %q", tt.what, err, tt.want)
				}
			}
			// The dispatcher adds the queue labels to a Job it made awaiting
			// its Secret: an update, held to the same lists.
			awaiting := runnerJob(nil)
			awaiting.Spec.Suspend = ptr.To(true)
			if err := dc.Create(ctx, awaiting); err != nil {
				t.Fatal(err)
			}
			if err := dc.Patch(ctx, awaiting.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"kueue.x-k8s.io/queue-name":"team-b"}}}`))); err == nil ||
				!strings.Contains(err.Error(), queueRefused("runners")) {
				t.Errorf("the dispatcher queueing its Job in another queue: %v", err)
			}
			annotateNamespace(ctx, t, cfg, ns, "runwarden.dev/allowed-queues", "team-a, team-b")
			annotateNamespace(ctx, t, cfg, ns, "runwarden.dev/allowed-priority-classes", "urgent")
			// The API server's policies read the namespace from its cache.
			listed := func(ctx context.Context) (bool, error) {
				return dc.Create(ctx, inQueue("team-b", "urgent"), client.DryRunAll) == nil, nil
			}
			if err := harness.WaitFor(ctx, "the namespace's queue lists to be read", time.Minute, listed); err != nil {
				t.Fatal(err)
			}
			for _, tt := range []struct{ queue, class, want string }{
				{queue: "runners", want: queueRefused("team-a, team-b") + " (namespace annotation runwarden.dev/allowed-queues, else the default runners), not runners"},
				{queue: "team-a", class: "routine", want: "have WorkloadPriorityClass urgent (namespace annotation runwarden.dev/allowed-priority-classes, else the default routine), not routine"},
			} {
				if err := dc.Create(ctx, inQueue(tt.queue, tt.class), client.DryRunAll); err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("the dispatcher's Job in queue %q, class %q under the namespace's lists: %v, want %q", tt.queue, tt.class, err, tt.want)
				}
			}
			if err := dc.Patch(ctx, awaiting.DeepCopy(), client.RawPatch(types.MergePatchType, []byte(`{"metadata":{"labels":{"kueue.x-k8s.io/queue-name":"team-a"}}}`))); err != nil {
				t.Errorf("the dispatcher queueing its Job in a queue the namespace lists: %v", err)
			}
			for what, mut := range map[string]func(*corev1.PodSpec){
				"env": func(s *corev1.PodSpec) {
					s.Containers[0].Env = append(s.Containers[0].Env, corev1.EnvVar{Name: "K", ValueFrom: &corev1.EnvVarSource{
						SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "aws-creds"}, Key: "k"},
					}})
				},
				"envFrom": func(s *corev1.PodSpec) {
					s.Containers[0].EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: "aws-creds"}}}}
				},
				"volume": func(s *corev1.PodSpec) {
					s.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{Secret: &corev1.SecretVolumeSource{SecretName: "aws-creds"}}}}
				},
				"projected volume": func(s *corev1.PodSpec) {
					s.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{Sources: []corev1.VolumeProjection{{
						Secret: &corev1.SecretProjection{LocalObjectReference: corev1.LocalObjectReference{Name: "aws-creds"}},
					}}}}}}
				},
				"pull secret": func(s *corev1.PodSpec) {
					s.ImagePullSecrets = []corev1.LocalObjectReference{{Name: "aws-creds"}}
				},
				"CSI volume's publish Secret": func(s *corev1.PodSpec) {
					s.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{CSI: &corev1.CSIVolumeSource{
						Driver: "secrets-store.csi.k8s.io", NodePublishSecretRef: &corev1.LocalObjectReference{Name: "aws-creds"},
					}}}}
				},
				"Azure File volume": func(s *corev1.PodSpec) {
					s.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{AzureFile: &corev1.AzureFileVolumeSource{
						SecretName: "aws-creds", ShareName: "share",
					}}}}
				},
				"CephFS volume": func(s *corev1.PodSpec) {
					s.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{CephFS: &corev1.CephFSVolumeSource{
						Monitors: []string{"10.0.0.9:6789"}, SecretRef: &corev1.LocalObjectReference{Name: "aws-creds"},
					}}}}
				},
				"FlexVolume": func(s *corev1.PodSpec) {
					s.Volumes = []corev1.Volume{{Name: "v", VolumeSource: corev1.VolumeSource{FlexVolume: &corev1.FlexVolumeSource{
						Driver: "example.com/flex", SecretRef: &corev1.LocalObjectReference{Name: "aws-creds"},
					}}}}
				},
				"init container": func(s *corev1.PodSpec) {
					s.InitContainers = []corev1.Container{{Name: "i", Image: "busybox:stable", Env: []corev1.EnvVar{{Name: "K", ValueFrom: &corev1.EnvVarSource{
						SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "aws-creds"}, Key: "k"},
					}}}}}
				},
			} {
				if err := dc.Create(ctx, runnerJob(mut)); err == nil || !strings.Contains(err.Error(), "a Job of the dispatcher names no Secret but its own") {
					t.Errorf("the dispatcher's Job naming another Secret in its %s: %v", what, err)
				}
			}
			if err := dc.Create(ctx, runnerJob(func(s *corev1.PodSpec) { s.ServiceAccountName = "namespace-admin" })); err == nil || !strings.Contains(err.Error(), "runs as the runner service account (runwarden-runner)") {
				t.Errorf("the dispatcher's Job under another service account: %v", err)
			}

			token := &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: "rw-task-token", Namespace: ns, Annotations: map[string]string{corev1.ServiceAccountNameKey: "namespace-admin"}},
				Type:       corev1.SecretTypeServiceAccountToken,
			}
			if err := dc.Create(ctx, token); err == nil || !strings.Contains(err.Error(), "a Secret of the dispatcher is Opaque") {
				t.Errorf("the dispatcher minting a service-account token Secret: %v", err)
			}
			ownedBy := func(name string, j *batchv1.Job) *corev1.Secret {
				return &corev1.Secret{
					ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns, Labels: map[string]string{contract.TaskID: "t"},
						OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: j.Name, UID: j.UID, Controller: ptr.To(true)}}},
					Type: corev1.SecretTypeOpaque, StringData: map[string]string{"TF_VAR_token": "x"},
				}
			}
			unowned := ownedBy(job.SecretName(own.Name), own)
			unowned.OwnerReferences = nil
			unlabelled := ownedBy(job.SecretName(own.Name), own)
			unlabelled.Labels = nil
			for _, tt := range []struct {
				what string
				s    *corev1.Secret
				want string
			}{
				{what: "without an owner", s: unowned, want: "a Secret of the dispatcher is made owned by its Job alone (rw-secret-<the Job's name>)"},
				{what: "named like its Job, as tasks' Secrets once were", s: ownedBy(own.Name, own), want: "a Secret of the dispatcher is named rw-secret-<its Job name>, not " + own.Name},
				{what: "named after the Vault token", s: ownedBy("vault-token", own), want: "is named rw-secret-<its Job name>, not vault-token"},
				{what: "owned by another Job than its name says", s: ownedBy(job.SecretName("rw-other"), own), want: "is made owned by its Job alone"},
				{what: "without its task's label", s: unlabelled, want: "a Secret of the dispatcher is labelled with its task (runwarden.dev/task-id)"},
			} {
				if err := dc.Create(ctx, tt.s); err == nil || !strings.Contains(err.Error(), tt.want) {
					t.Errorf("the dispatcher's Secret %s: %v, want %q", tt.what, err, tt.want)
				}
			}
			if err := dc.Create(ctx, ownedBy(job.SecretName(own.Name), own)); err != nil {
				t.Errorf("the dispatcher's Opaque Secret owned by its Job: %v", err)
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// TestSecurityDispatcherSecrets: the dispatcher runs tasks with secret
// values holding only the chart's Role, whose only verb on Secrets is
// create, under the chart's admission policies: each Secret is made owned
// by its Job, and the Job runs only once it exists. A Secret planted ahead
// under a task's Secret name by another user of the namespace is never
// used: the task ends Refused naming it, no Job is left, and the planted
// Secret is untouched.
func TestSecurityDispatcherSecrets(t *testing.T) {
	t.Parallel()
	f := features.New("dispatcher secrets").
		Assess("create-only on Secrets, and a planted Secret never adopted", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			release := "rws-system-" + ns[len(ns)-6:]
			// The e2e dispatcher's pods run as the namespace's default
			// service account: the chart is rendered to say so.
			out, err := newHelm(t, cfg, "helm4").run(ctx, "template", "rws", filepath.Join(suite.RepoRoot, "charts", "runwarden"),
				"--namespace", release, "--set", "runnerNamespace="+ns, "--set", "runner.serviceAccount.name=default",
				"--show-only", "templates/rbac.yaml", "--show-only", "templates/admission-policy.yaml")
			if err != nil {
				t.Fatalf("helm template: %v\n%s", err, out)
			}
			var rules []rbacv1.PolicyRule
			for _, doc := range strings.Split(out, "\n---\n") {
				obj := &unstructured.Unstructured{}
				if err := yaml.Unmarshal([]byte(doc), &obj.Object); err != nil || obj.GetKind() == "" {
					continue
				}
				switch {
				case obj.GetKind() == "Role" && obj.GetName() == "rws-runwarden-dispatcher":
					var role rbacv1.Role
					if err := yaml.Unmarshal([]byte(doc), &role); err != nil {
						t.Fatal(err)
					}
					rules = role.Rules
				case strings.HasPrefix(obj.GetKind(), "ValidatingAdmissionPolicy"):
					if err := cfg.Client().Resources().Create(ctx, obj); err != nil {
						t.Fatalf("creating %s %s: %v", obj.GetKind(), obj.GetName(), err)
					}
					t.Cleanup(func() { _ = cfg.Client().Resources().Delete(context.Background(), obj) })
				}
			}
			for _, r := range rules {
				if slices.Contains(r.Resources, "secrets") && !slices.Equal(r.Verbs, []string{"create"}) {
					t.Errorf("the chart's dispatcher Role has %v on Secrets, want create alone", r.Verbs)
				}
			}
			dispatcher := harness.User{Name: "system:serviceaccount:" + release + ":rws-runwarden-dispatcher"}
			if err := dispatcher.Grant(ctx, cfg, ns, "dispatcher", rules...); err != nil {
				t.Fatal(err)
			}
			dc, err := dispatcher.Client(cfg)
			if err != nil {
				t.Fatal(err)
			}
			// The API server loads new policies within a few seconds.
			enforced := func(ctx context.Context) (bool, error) {
				err := dc.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "probe", Namespace: ns}, Type: corev1.SecretTypeOpaque}, client.DryRunAll)
				return err != nil && strings.Contains(err.Error(), "a Secret of the dispatcher is named rw-secret-<its Job name>, not probe"), nil
			}
			if err := harness.WaitFor(ctx, "the admission policies to be enforced", time.Minute, enforced); err != nil {
				t.Fatal(err)
			}

			// Another user of the namespace plants a Secret under the name
			// of a task's Secret (rw-secret- and the Job's name, from the task ID).
			planter := harness.User{Name: "team-admin-" + ns[len(ns)-6:]}
			if err := planter.Grant(ctx, cfg, ns, "team-admin", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"create"}}); err != nil {
				t.Fatal(err)
			}
			pc, err := planter.Client(cfg)
			if err != nil {
				t.Fatal(err)
			}
			planted := &corev1.Secret{
				ObjectMeta: metav1.ObjectMeta{Name: job.SecretName(job.Name("planted")), Namespace: ns},
				Type:       corev1.SecretTypeOpaque, StringData: map[string]string{"TF_VAR_token": "planted-value"},
			}
			if err := pc.Create(ctx, planted); err != nil {
				t.Fatal(err)
			}
			// And a Job under the name of another task's Job, shaped as one
			// awaiting its Secret, whose pod would read that Secret: were it
			// adopted, the task's Secret would be made for it and it resumed.
			// The admission policies keep the runner and dispatcher labels
			// off it.
			jobPlanter := harness.User{Name: "job-admin-" + ns[len(ns)-6:]}
			if err := jobPlanter.Grant(ctx, cfg, ns, "job-admin", rbacv1.PolicyRule{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"create"}}); err != nil {
				t.Fatal(err)
			}
			jc, err := jobPlanter.Client(cfg)
			if err != nil {
				t.Fatal(err)
			}
			plantedJob := runnerJobFor(ns, job.Name("planted-job"), false)
			delete(plantedJob.Labels, "runwarden.dev/dispatcher")
			delete(plantedJob.Spec.Template.Labels, "runwarden.dev/runner")
			plantedJob.Annotations = map[string]string{contract.TaskID: "planted-job", job.AnnotationAwaitingSecret: "true"}
			plantedJob.Spec.Suspend = ptr.To(true)
			plantedJob.Spec.Template.Spec.Containers[0].EnvFrom = []corev1.EnvFromSource{{SecretRef: &corev1.SecretEnvSource{LocalObjectReference: corev1.LocalObjectReference{Name: job.SecretName(plantedJob.Name)}}}}
			if err := jc.Create(ctx, plantedJob); err != nil {
				t.Fatal(err)
			}

			kubeconfig, err := dispatcher.Kubeconfig(cfg, t.TempDir())
			if err != nil {
				t.Fatal(err)
			}
			// Leases outlast the dispatcher's wait for a Secret it finds
			// taken to go (job.DefaultSecretWait, 30 s; the planted one
			// never goes): a 30 s lease, issued before that wait, ends
			// before it, and the task could be leased, and refused,
			// again, each time 30 s more.
			o := newOrchestrator(t, orchestratortest.Options{LeaseSeconds: 120})
			// A planted Secret is refused once it outlasts --secret-gc-wait
			// (default 30s), which the message names.
			d := startOrchestratorDispatcher(ctx, t, cfg, ns, o, "--simulated", "--preflight=false", "--kubeconfig", kubeconfig, "--secret-gc-wait", "10s")
			o.srv.Add(orchestrator.Task{ID: "with-secret", Command: []string{"true"}, SecretEnv: map[string]string{"TF_VAR_token": "s3cr3t-value"}})
			o.srv.Add(orchestrator.Task{ID: "planted", Command: []string{"true"}, SecretEnv: map[string]string{"TF_VAR_token": "the-task-value"}})
			o.srv.Add(orchestrator.Task{ID: "planted-job", Command: []string{"true"}, SecretEnv: map[string]string{"TF_VAR_token": "the-task-value"}})
			waitAllDone(ctx, t, o.srv, 3, 3*time.Minute, d)

			if rec := o.srv.Task("with-secret"); rec.Final == nil || rec.Final.Type != orchestrator.EventSucceeded {
				t.Errorf("the task with a secret value: final %+v\n%s", rec.Final, tail(d.log.String(), 3000))
			}
			jobs := jobsFor(ctx, t, cfg, ns, "with-secret")
			if len(jobs) != 1 {
				t.Fatalf("%d Jobs for the task with a secret value", len(jobs))
			}
			var secret corev1.Secret
			if err := cfg.Client().Resources(ns).Get(ctx, job.SecretName(jobs[0].Name), ns, &secret); err != nil {
				t.Fatalf("the task's Secret: %v", err)
			}
			if owner := metav1.GetControllerOf(&secret); owner == nil || owner.UID != jobs[0].UID || len(secret.OwnerReferences) != 1 {
				t.Errorf("Secret owners %+v, want the Job %s", secret.OwnerReferences, jobs[0].UID)
			}
			if _, awaiting := jobs[0].Annotations[job.AnnotationAwaitingSecret]; awaiting || jobs[0].Spec.Suspend == nil || *jobs[0].Spec.Suspend {
				t.Errorf("the Job was not resumed: suspend %v, annotations %v", jobs[0].Spec.Suspend, jobs[0].Annotations)
			}

			rec := o.srv.Task("planted")
			want := "secret " + planted.Name + " in namespace " + ns + " is not owned by the task's Job (still there 10s after that Job was deleted)"
			if rec.Final == nil || rec.Final.Type != orchestrator.EventFailed || rec.Final.Reason != job.ReasonRefused || !strings.Contains(rec.Final.Message, want) {
				t.Errorf("the task whose Secret name was taken: final %+v, want Refused with %q", rec.Final, want)
			} else {
				t.Logf("the orchestrator's record of the task: %s: %s", rec.Final.Reason, rec.Final.Message)
			}
			if jobs := jobsFor(ctx, t, cfg, ns, "planted"); len(jobs) != 0 {
				t.Errorf("%d Jobs left for the task whose Secret name was taken", len(jobs))
			}
			var got corev1.Secret
			if err := cfg.Client().Resources(ns).Get(ctx, planted.Name, ns, &got); err != nil {
				t.Fatalf("the planted Secret: %v", err)
			}
			if len(got.OwnerReferences) != 0 || string(got.Data["TF_VAR_token"]) != "planted-value" {
				t.Errorf("the planted Secret was changed: owners %v, data %q", got.OwnerReferences, got.Data["TF_VAR_token"])
			}

			rec = o.srv.Task("planted-job")
			want = "job " + plantedJob.Name + " in namespace " + ns + " is not a runner Job of task \"planted-job\""
			if rec.Final == nil || rec.Final.Type != orchestrator.EventFailed || rec.Final.Reason != job.ReasonRefused || !strings.Contains(rec.Final.Message, want) {
				t.Errorf("the task whose Job name was taken: final %+v, want Refused with %q", rec.Final, want)
			} else {
				t.Logf("the orchestrator's record of the task: %s: %s", rec.Final.Reason, rec.Final.Message)
			}
			var gotJob batchv1.Job
			if err := cfg.Client().Resources(ns).Get(ctx, plantedJob.Name, ns, &gotJob); err != nil {
				t.Fatalf("the planted Job: %v", err)
			}
			if gotJob.Labels["runwarden.dev/dispatcher"] != "" || !ptr.Deref(gotJob.Spec.Suspend, false) || gotJob.Annotations[job.AnnotationAwaitingSecret] != "true" {
				t.Errorf("the planted Job was adopted or resumed: labels %v, suspend %v, annotations %v", gotJob.Labels, gotJob.Spec.Suspend, gotJob.Annotations)
			}
			if err := cfg.Client().Resources(ns).Get(ctx, job.SecretName(plantedJob.Name), ns, &corev1.Secret{}); !apierrors.IsNotFound(err) {
				t.Errorf("a Secret was made for the planted Job: %v", err)
			}
			var pods corev1.PodList
			if err := cfg.Client().Resources(ns).List(ctx, &pods); err != nil {
				t.Fatal(err)
			}
			for _, p := range pods.Items {
				if p.Annotations[contract.TaskID] == "planted" || p.Labels["job-name"] == plantedJob.Name {
					t.Errorf("pod %s ran for the task whose Secret name was taken", p.Name)
				}
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// TestSecurityPlantedLogConfigMap: another user of the namespace, who may
// create ConfigMaps, plants one under the name a task's kept log had
// before (its Job's name with -log), claiming to be the task's (its owner
// reference, the dispatcher's label, the task's annotation), before the
// dispatcher runs the task. The status names the ConfigMap the dispatcher
// made, under a name the API server drew, with the runner's log; the
// planted one is left as it was.
func TestSecurityPlantedLogConfigMap(t *testing.T) {
	t.Parallel()
	f := features.New("planted log ConfigMap").
		Setup(func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			harness.RequireRealNode(ctx, t, cfg)
			installCRD(ctx, t, cfg)
			return ctx
		}).
		Assess("a planted ConfigMap is never named as the task's log", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			r := cfg.Client().Resources(ns)
			// The task exists, with its UID, before any dispatcher runs it:
			// the planter has all the time it needs.
			rt := runnerTask(ns, "logged", `echo "$GREETING from the runner"`)
			if err := r.Create(ctx, rt); err != nil {
				t.Fatal(err)
			}
			jobName := job.Name(kube.TaskID(rt))
			planter := harness.User{Name: "cm-admin-" + ns[len(ns)-6:]}
			if err := planter.Grant(ctx, cfg, ns, "cm-admin", rbacv1.PolicyRule{APIGroups: []string{""}, Resources: []string{"configmaps"}, Verbs: []string{"create"}}); err != nil {
				t.Fatal(err)
			}
			pc, err := planter.Client(cfg)
			if err != nil {
				t.Fatal(err)
			}
			planted := &corev1.ConfigMap{
				ObjectMeta: metav1.ObjectMeta{
					Name: jobName + "-log", Namespace: ns,
					Labels:      map[string]string{contract.LabelDispatcher: "e2e-" + ns[len(ns)-6:]},
					Annotations: map[string]string{contract.TaskID: kube.TaskID(rt)},
					OwnerReferences: []metav1.OwnerReference{{
						APIVersion: v1alpha1.GroupVersion.String(), Kind: "RunnerTask", Name: rt.Name, UID: rt.UID, Controller: ptr.To(true),
					}},
				},
				Data: map[string]string{"log": "all went well\n"},
			}
			if err := pc.Create(ctx, planted); err != nil {
				t.Fatal(err)
			}

			d := startDispatcher(ctx, t, cfg, ns)
			got := waitPhase(ctx, t, cfg, rt, d)
			if got.Status.Phase != v1alpha1.PhaseSucceeded || got.Status.JobName != jobName {
				t.Fatalf("task logged: status %+v", got.Status)
			}
			if got.Status.LogConfigMap == planted.Name || !strings.HasPrefix(got.Status.LogConfigMap, kube.LogConfigMapPrefix(jobName)) {
				t.Fatalf("status.logConfigMap %q; want a ConfigMap the dispatcher made (%q and the API server's 5 characters), not the planted %q",
					got.Status.LogConfigMap, kube.LogConfigMapPrefix(jobName), planted.Name)
			}
			var kept corev1.ConfigMap
			if err := r.Get(ctx, got.Status.LogConfigMap, ns, &kept); err != nil {
				t.Fatalf("the kept log: %v", err)
			}
			if owner := metav1.GetControllerOf(&kept); kept.Data["log"] != "hello from the runner\n" || owner == nil || owner.UID != rt.UID {
				t.Errorf("the kept log: %q, owner %+v; want the runner's, owned by the RunnerTask", kept.Data["log"], owner)
			}
			var after corev1.ConfigMap
			if err := r.Get(ctx, planted.Name, ns, &after); err != nil {
				t.Fatalf("the planted ConfigMap: %v", err)
			}
			if after.ResourceVersion != planted.ResourceVersion || after.Data["log"] != "all went well\n" {
				t.Errorf("the planted ConfigMap was changed: resource version %s (planted %s), log %q", after.ResourceVersion, planted.ResourceVersion, after.Data["log"])
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// TestSecurityPlantedPod: another user of the namespace, who may create
// and change pods (not Jobs), plants a pod with a running task's Job's
// job-name label and the task's labels and annotation, whose container fails (exit code 3). The dispatcher counts
// only the pods the Job controller made for the Job (job.IsPodOf): the task
// is not ended by the planted pod's failure, and its record and kept log are
// the real runner pod's. The same user cannot rewrite the record the
// webhook wrote on the runner pod, nor make that pod another task's.
func TestSecurityPlantedPod(t *testing.T) {
	t.Parallel()
	f := features.New("planted pod").
		Setup(secretsSetup).
		Assess("a planted pod neither ends nor describes the task", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			r := cfg.Client().Resources(ns)
			if err := harness.LabelNamespace(ctx, cfg, runnerNamespaceLabel, "enabled"); err != nil {
				t.Fatal(err)
			}
			w := startWebhookWith(ctx, t, cfg, "{}\n")
			// The runner goes on once the test says so: it asks the host,
			// on the real node's gateway, until it answers 200 (each ask
			// given up after 5 s: busybox's wget has no timeout of its own).
			g := startGate(t)
			rt := runnerTask(ns, "planted", fmt.Sprintf(`echo "$GREETING from the runner"; until timeout 5 wget -q -O /dev/null %s 2>/dev/null; do sleep 1; done; echo released`, g.url))
			if err := r.Create(ctx, rt); err != nil {
				t.Fatal(err)
			}
			d := startDispatcher(ctx, t, cfg, ns)

			// The task's Job and its own pod, the runner running.
			var j batchv1.Job
			var own corev1.Pod
			running := func(ctx context.Context) (bool, error) {
				cur := &v1alpha1.RunnerTask{}
				if err := r.Get(ctx, rt.Name, ns, cur); err != nil || cur.Status.JobName == "" {
					return false, nil
				}
				if terminalPhase(cur.Status.Phase) {
					return false, fmt.Errorf("the task ended before it could be attacked: %s %s: %s", cur.Status.Phase, cur.Status.Reason, cur.Status.Message)
				}
				if err := r.Get(ctx, cur.Status.JobName, ns, &j); err != nil {
					return false, nil
				}
				var pods corev1.PodList
				if err := r.List(ctx, &pods, resources.WithLabelSelector(batchv1.JobNameLabel+"="+j.Name)); err != nil {
					return false, nil
				}
				for _, p := range pods.Items {
					for _, s := range p.Status.ContainerStatuses {
						if job.IsPodOf(&j, &p) && s.Name == job.RunnerContainer && s.State.Running != nil {
							own = p
							return true, nil
						}
					}
				}
				return false, nil
			}
			if err := harness.WaitFor(ctx, "the task's runner to run", 2*time.Minute, running); err != nil {
				t.Fatalf("%v\ndispatcher log:\n%s\nwebhook log:\n%s", err, tail(d.log.String(), 3000), tail(w.log.String(), 3000))
			}
			if own.Annotations[admissionAnnotationSpecDigest] == "" {
				t.Fatalf("the runner pod carries no record of the webhook: %v", own.Annotations)
			}

			planter := harness.User{Name: "pod-planter-" + ns[len(ns)-6:]}
			if err := planter.Grant(ctx, cfg, ns, "pod-planter", rbacv1.PolicyRule{
				APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"get", "list", "create", "update", "patch"},
			}); err != nil {
				t.Fatal(err)
			}
			pc, err := planter.Client(cfg)
			if err != nil {
				t.Fatal(err)
			}
			planted := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{
					Name: j.Name + "-planted", Namespace: ns,
					// The Job's labels as anyone reading it sees them, the
					// dispatcher's among them (its cache holds only pods
					// with it). Not batch.kubernetes.io/controller-uid: the
					// Job's selector, which would have the Job controller
					// adopt the pod (see docs/security.md).
					Labels: map[string]string{
						batchv1.JobNameLabel: j.Name, "job-name": j.Name,
						contract.LabelDispatcher: j.Labels[contract.LabelDispatcher], contract.TaskID: j.Labels[contract.TaskID],
					},
					Annotations: map[string]string{contract.TaskID: kube.TaskID(rt), admissionAnnotationSpecDigest: "sha256:planted"},
					// No owner reference: one naming the Job with another UID
					// has the garbage collector delete the pod at once (the
					// unit tests of job.IsPodOf cover forged ones).
				},
				Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					// The runner's own image, on the node already: the planted
					// container fails at once, as a task's failure would show.
					Containers: []corev1.Container{{Name: job.RunnerContainer, Image: j.Spec.Template.Spec.Containers[0].Image, Command: []string{"/bin/sh", "-c", "exit 3"}}},
				},
			}
			harness.OnRealNode(&planted.Spec)
			planted.Spec.Containers[0].ImagePullPolicy = corev1.PullIfNotPresent
			if err := pc.Create(ctx, planted); err != nil {
				t.Fatalf("planting a pod with the Job's job-name label: %v", err)
			}
			pulling := func(ctx context.Context) (bool, error) {
				p := &corev1.Pod{}
				if err := r.Get(ctx, planted.Name, ns, p); err != nil {
					return false, nil
				}
				for _, s := range p.Status.ContainerStatuses {
					if f := s.State.Terminated; f != nil && f.ExitCode == 3 {
						return true, nil
					}
				}
				return false, nil
			}
			if err := harness.WaitFor(ctx, "the planted pod's container to fail with exit code 3", 2*time.Minute, pulling); err != nil {
				t.Fatal(err)
			}
			// Have the dispatcher look at the task with the planted pod's
			// status in its cache: a change to the planted pod after that
			// status reaches it after it (the task's annotation maps the
			// pod to the task), twice, each waited for by a reconcile.
			for i := range 2 {
				before := reconciles(d, "runnertask")
				p := &corev1.Pod{}
				if err := pc.Get(ctx, client.ObjectKeyFromObject(planted), p); err != nil {
					t.Fatal(err)
				}
				patched := p.DeepCopy()
				patched.Annotations["round"] = fmt.Sprint(i)
				if err := pc.Patch(ctx, patched, client.MergeFrom(p)); err != nil {
					t.Fatal(err)
				}
				looked := func(context.Context) (bool, error) { return reconciles(d, "runnertask") > before, nil }
				if err := harness.WaitFor(ctx, "the dispatcher to look at the task again", time.Minute, looked); err != nil {
					t.Fatal(err)
				}
			}
			cur := &v1alpha1.RunnerTask{}
			if err := r.Get(ctx, rt.Name, ns, cur); err != nil {
				t.Fatal(err)
			}
			if terminalPhase(cur.Status.Phase) {
				t.Fatalf("the planted pod ended the task: %s %s: %s", cur.Status.Phase, cur.Status.Reason, cur.Status.Message)
			}
			if err := r.Get(ctx, j.Name, ns, &batchv1.Job{}); err != nil {
				t.Fatalf("the task's Job after the planted pod: %v", err)
			}

			// The record the webhook wrote on the runner pod is not the
			// planter's to change; other annotations are.
			// Nor may it make the runner pod another task's (its task label,
			// its controller reference): the dispatcher tells a Job's pods
			// by them.
			change := func(f func(p *corev1.Pod)) error {
				p := &corev1.Pod{}
				if err := pc.Get(ctx, client.ObjectKeyFromObject(&own), p); err != nil {
					t.Fatal(err)
				}
				patched := p.DeepCopy()
				f(patched)
				return pc.Patch(ctx, patched, client.MergeFrom(p))
			}
			for _, c := range []struct {
				what, want string
				f          func(p *corev1.Pod)
			}{
				{"rewriting the runner pod's spec digest", "the annotation runwarden.dev/spec-digest of a runner pod cannot be changed", func(p *corev1.Pod) {
					p.Annotations[admissionAnnotationSpecDigest] = "sha256:planted"
				}},
				{"removing the runner pod's mutations", "the annotation runwarden.dev/mutations of a runner pod cannot be changed", func(p *corev1.Pod) {
					delete(p.Annotations, "runwarden.dev/mutations")
				}},
				{"adding warnings to the runner pod's record", "the annotation runwarden.dev/warnings of a runner pod cannot be changed", func(p *corev1.Pod) {
					p.Annotations["runwarden.dev/warnings"] = "all is well"
				}},
				{"changing the runner pod's task label", "the label runwarden.dev/task-id of a runner pod cannot be changed", func(p *corev1.Pod) {
					p.Labels[contract.TaskID] = "another-task"
				}},
				{"giving the runner pod another controller", "the controller reference of a runner pod cannot be changed", func(p *corev1.Pod) {
					p.OwnerReferences = []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: "rw-another", UID: "another-uid", Controller: ptr.To(true)}}
				}},
			} {
				if err := change(c.f); err == nil || !strings.Contains(err.Error(), c.want) {
					t.Errorf("%s: %v", c.what, err)
				}
			}
			if err := change(func(p *corev1.Pod) { p.Annotations["note"] = "x" }); err != nil {
				t.Errorf("a note on the runner pod: %v", err)
			}

			g.release()
			// The runner ends within seconds of the release; if not, its
			// log and the gate's count say whether it kept asking.
			ended := func(ctx context.Context) (bool, error) {
				p := &corev1.Pod{}
				if err := r.Get(ctx, own.Name, ns, p); err != nil {
					return false, nil
				}
				for _, s := range p.Status.ContainerStatuses {
					if s.Name == job.RunnerContainer && s.State.Terminated != nil {
						return true, nil
					}
				}
				return false, nil
			}
			if err := harness.WaitFor(ctx, "the runner to end after the gate's release", time.Minute, ended); err != nil {
				logs, lerr := harness.PodLogs(ctx, cfg, ns, own.Name, job.RunnerContainer)
				t.Fatalf("%v; %s\nthe runner's log (%v):\n%s", err, g, lerr, logs)
			}
			got := waitPhase(ctx, t, cfg, rt, d)
			if got.Status.Phase != v1alpha1.PhaseSucceeded {
				t.Fatalf("task planted: %s %s: %s", got.Status.Phase, got.Status.Reason, got.Status.Message)
			}
			if rec := got.Status.Record; rec == nil || rec.Pod != own.Name || rec.SpecDigest != own.Annotations[admissionAnnotationSpecDigest] {
				t.Errorf("the task's record %+v; want the runner pod %s's, spec digest %s", rec, own.Name, own.Annotations[admissionAnnotationSpecDigest])
			}
			var kept corev1.ConfigMap
			if err := r.Get(ctx, got.Status.LogConfigMap, ns, &kept); err != nil {
				t.Fatalf("the kept log %q: %v", got.Status.LogConfigMap, err)
			}
			if kept.Data["log"] != "hello from the runner\nreleased\n" {
				t.Errorf("the kept log %q, want the runner's", kept.Data["log"])
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// admissionAnnotationSpecDigest is the webhook's record of a runner pod's
// spec (webhook/contract.AnnotationSpecDigest).
const admissionAnnotationSpecDigest = "runwarden.dev/spec-digest"

// gate answers 503 until released, then 200: a runner on the real node
// waits on it (its gateway is the host).
type gate struct {
	url      string
	released chan struct{}
	once     sync.Once
	// asked counts the requests answered, before and after the release.
	asked [2]atomic.Int64
}

// String says how often the runner asked, for a test's failure.
func (g *gate) String() string {
	return fmt.Sprintf("the gate %s answered %d requests before its release and %d after", g.url, g.asked[0].Load(), g.asked[1].Load())
}

func startGate(t *testing.T) *gate {
	t.Helper()
	l, err := net.Listen("tcp", realNodeGateway+":0")
	if err != nil {
		t.Fatalf("listening on the real node's gateway: %v", err)
	}
	g := &gate{url: "http://" + l.Addr().String() + "/", released: make(chan struct{})}
	srv := &http.Server{ReadHeaderTimeout: 5 * time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		select {
		case <-g.released:
			g.asked[1].Add(1)
			w.WriteHeader(http.StatusOK)
		default:
			g.asked[0].Add(1)
			w.WriteHeader(http.StatusServiceUnavailable)
		}
	})}
	go func() { _ = srv.Serve(l) }()
	t.Cleanup(func() { _ = srv.Close() })
	return g
}

func (g *gate) release() { g.once.Do(func() { close(g.released) }) }

// reconciles is how many reconciles of the named controller the dispatcher
// has ended, by its metrics.
func reconciles(d *dispatcherProcess, controller string) int {
	resp, err := http.Get("http://" + d.metrics + "/metrics")
	if err != nil {
		return 0
	}
	defer func() { _ = resp.Body.Close() }()
	body, _ := io.ReadAll(resp.Body)
	n := 0
	for _, l := range strings.Split(string(body), "\n") {
		if !strings.HasPrefix(l, `controller_runtime_reconcile_total{controller="`+controller+`"`) {
			continue
		}
		f, _ := strconv.ParseFloat(l[strings.LastIndex(l, " ")+1:], 64)
		n += int(f)
	}
	return n
}
