//go:build e2e

package e2e

import (
	"context"
	"strings"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	"github.com/runwarden/runwarden/e2e/harness"
)

// afterAdmissionPlatform resolves vault references in an init container (the
// one that holds the store's token) and places runners nowhere in
// particular: the running runner goes to the real node. No allowedRegistries
// (the chart's default): any image is admitted at creation.
const afterAdmissionPlatform = `
secretStores:
  vault: {enabled: true, address: "https://vault.example:8200", secretName: vault-token}
secretRefs:
  allowedPatterns: ["vault:team-a:secret/**"]
`

// TestSecurityAfterAdmission: a user of the runner namespace who may only
// patch pods (and resize them, and create pods) changes nothing runwarden
// admitted on a runner pod. On a pending runner (held by a scheduling gate)
// the resolver's image, its tolerations, its deadline and its scheduling
// gates are refused; on a running one (on the real node) main's image, the
// Job's selector and name labels, its controller reference, a second owner,
// the Job controller's finalizer and a resize (pods/resize) are refused; a
// pod planted with the Job's selector label (which would have the Job
// controller adopt it) is refused at creation. The Job controller still
// removes its finalizer: the running runner's Job completes, its pod
// counted.
func TestSecurityAfterAdmission(t *testing.T) {
	t.Parallel()
	var u harness.User
	var w *webhookProcess
	f := features.New("after admission").
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
			// patch on pods (and on pods/resize), create for the planted
			// pod; nothing else, not even get: the test reads with its own.
			u = harness.User{Name: "patcher-" + ns[len(ns)-6:]}
			if err := u.Grant(ctx, cfg, ns, "pod-patcher", rbacv1.PolicyRule{
				APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"patch", "create"},
			}, rbacv1.PolicyRule{
				APIGroups: []string{""}, Resources: []string{"pods/resize"}, Verbs: []string{"patch"},
			}); err != nil {
				t.Fatal(err)
			}
			w = startWebhookWith(ctx, t, cfg, afterAdmissionPlatform)
			return ctx
		}).
		Assess("a pending runner's spec is frozen", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			j := runnerJobFor(ns, "pending-runner", false)
			j.Spec.Template.Spec.SchedulingGates = []corev1.PodSchedulingGate{{Name: "e2e.runwarden.dev/hold"}}
			pod, failure := jobPod(ctx, t, cfg, j)
			if pod == nil {
				t.Fatalf("the pending runner: %s\nwebhook log:\n%s", failure, w.log.String())
			}
			if len(pod.Spec.InitContainers) == 0 || pod.Spec.InitContainers[0].Name != "runwarden-secrets" ||
				containerEnv(pod.Spec.InitContainers[0])["VAULT_TOKEN"] == "" {
				t.Fatalf("the pending runner has no resolver holding the store's token: %+v", pod.Spec.InitContainers)
			}
			intrude := intruder(ctx, t, cfg, u, pod)
			intrude("swapping the resolver's image on a pending runner", "spec.initContainers[runwarden-secrets].image", func(p *corev1.Pod) {
				p.Spec.InitContainers[0].Image = "evil.example.net/resolver:1"
			})
			intrude("adding a toleration to a pending runner", "spec.tolerations", func(p *corev1.Pod) {
				p.Spec.Tolerations = append(p.Spec.Tolerations, corev1.Toleration{Operator: corev1.TolerationOpExists})
			})
			intrude("setting a pending runner's activeDeadlineSeconds", "spec.activeDeadlineSeconds", func(p *corev1.Pod) {
				p.Spec.ActiveDeadlineSeconds = ptr.To[int64](5)
			})
			intrude("removing a pending runner's scheduling gate", "spec.schedulingGates", func(p *corev1.Pod) {
				p.Spec.SchedulingGates = nil
			})
			now := &corev1.Pod{}
			if err := cfg.Client().Resources(ns).Get(ctx, pod.Name, ns, now); err != nil {
				t.Fatal(err)
			}
			if img := now.Spec.InitContainers[0].Image; img != pod.Spec.InitContainers[0].Image || len(now.Spec.SchedulingGates) != 1 {
				t.Errorf("the pending runner after the attempts: resolver image %s, scheduling gates %v", img, now.Spec.SchedulingGates)
			}
			return ctx
		}).
		Assess("a running runner's spec, labels and owner are frozen", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			j := runnerJobFor(ns, "running-runner", false)
			spec := &j.Spec.Template.Spec
			spec.Containers[0].Image = realImage(ctx, t)
			// Long enough for the attempts below; the Job's completion is
			// waited for after them.
			spec.Containers[0].Command = []string{"/bin/sh", "-c", "sleep 40"}
			spec.Containers[0].Env = nil
			spec.Containers[0].Resources = corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("10m"), corev1.ResourceMemory: resource.MustParse("16Mi")},
				Limits:   corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("200m"), corev1.ResourceMemory: resource.MustParse("64Mi")},
			}
			spec.TerminationGracePeriodSeconds = ptr.To[int64](1)
			harness.OnRealNode(spec)
			pod, failure := jobPod(ctx, t, cfg, j)
			if pod == nil {
				t.Fatalf("the running runner: %s\nwebhook log:\n%s", failure, w.log.String())
			}
			waitRunning(ctx, t, cfg, ns, pod.Name)
			if err := cfg.Client().Resources(ns).Get(ctx, pod.Name, ns, pod); err != nil {
				t.Fatal(err)
			}
			intrude := intruder(ctx, t, cfg, u, pod)
			intrude("swapping main's image on a running runner", "spec.containers[main].image", func(p *corev1.Pod) {
				p.Spec.Containers[0].Image = "evil.example.net/runner:1"
			})
			// The API server takes a resize of a running Burstable pod that
			// keeps its QoS class; only the webhook refuses it.
			intrude("resizing main's CPU request (pods/resize)", "spec.containers[main].resources", func(p *corev1.Pod) {
				p.Spec.Containers[0].Resources.Requests[corev1.ResourceCPU] = resource.MustParse("150m")
			}, "resize")
			for _, l := range []string{batchv1.ControllerUidLabel, "controller-uid", batchv1.JobNameLabel, "job-name"} {
				intrude("relabelling "+l+" of a running runner", "the label "+l+" of a runner pod cannot be changed", func(p *corev1.Pod) {
					p.Labels[l] = "another"
				})
			}
			intrude("adding a second owner to a running runner", "the owner references of a runner pod cannot be changed", func(p *corev1.Pod) {
				p.OwnerReferences = append(p.OwnerReferences, metav1.OwnerReference{APIVersion: "v1", Kind: "ConfigMap", Name: "mine", UID: "0c0c0c0c-0000-0000-0000-000000000001"})
			})
			intrude("removing the Job controller's finalizer from a running runner", "the finalizer "+batchv1.JobTrackingFinalizer, func(p *corev1.Pod) {
				p.Finalizers = nil
			})
			intrude("removing a running runner's controller reference", "the controller reference of a runner pod cannot be changed", func(p *corev1.Pod) {
				p.OwnerReferences = nil
			})

			// A pod with the Job's selector label would be adopted by the
			// Job once orphan: refused at its creation.
			planted := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: "planted", Namespace: ns, Labels: map[string]string{
					batchv1.ControllerUidLabel: pod.Labels[batchv1.ControllerUidLabel], batchv1.JobNameLabel: j.Name,
				}},
				Spec: corev1.PodSpec{RestartPolicy: corev1.RestartPolicyNever, Containers: []corev1.Container{{Name: "main", Image: realImage(ctx, t), Command: []string{"true"}}}},
			}
			harness.OnRealNode(&planted.Spec)
			c, err := u.Client(cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Create(ctx, planted); err == nil || !strings.Contains(err.Error(), "the label "+batchv1.ControllerUidLabel) {
				t.Errorf("planting a pod with the runner Job's selector label: %v", err)
			}

			now := &corev1.Pod{}
			if err := cfg.Client().Resources(ns).Get(ctx, pod.Name, ns, now); err != nil {
				t.Fatal(err)
			}
			if now.Status.Phase != corev1.PodRunning {
				t.Errorf("the runner is %s after the attempts, want them all made while it runs", now.Status.Phase)
			}
			if now.Spec.Containers[0].Image != pod.Spec.Containers[0].Image || metav1.GetControllerOf(now) == nil ||
				now.Labels[batchv1.ControllerUidLabel] != string(j.UID) {
				t.Errorf("the running runner after the attempts: image %s, controller %v, labels %v", now.Spec.Containers[0].Image, metav1.GetControllerOf(now), now.Labels)
			}

			// The Job controller's own writes still go through: it counts
			// the pod and removes its finalizer.
			done := func(ctx context.Context) (bool, error) {
				cur := &batchv1.Job{}
				if err := cfg.Client().Resources(ns).Get(ctx, j.Name, ns, cur); err != nil {
					return false, err
				}
				p := &corev1.Pod{}
				if err := cfg.Client().Resources(ns).Get(ctx, pod.Name, ns, p); err != nil {
					return false, err
				}
				return cur.Status.Succeeded == 1 && len(p.Finalizers) == 0, nil
			}
			if err := harness.WaitFor(ctx, "the runner's Job to count its pod and the Job controller to remove its finalizer", 2*time.Minute, done); err != nil {
				t.Fatalf("%v\nwebhook log:\n%s", err, tail(w.log.String(), 3000))
			}
			var pods corev1.PodList
			if err := cfg.Client().Resources(ns).List(ctx, &pods, func(o *metav1.ListOptions) { o.LabelSelector = batchv1.JobNameLabel + "=" + j.Name }); err != nil {
				t.Fatal(err)
			}
			if len(pods.Items) != 1 {
				t.Errorf("Job %s has %d pods, want its one runner", j.Name, len(pods.Items))
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// intruder returns a function that patches pod as u (who may not read it:
// the pod is read with the suite's own client) and checks the API server
// refuses the change with a message naming want. sub names a subresource.
func intruder(ctx context.Context, t *testing.T, cfg *envconf.Config, u harness.User, pod *corev1.Pod) func(what, want string, change func(*corev1.Pod), sub ...string) {
	c, err := u.Client(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return func(what, want string, change func(*corev1.Pod), sub ...string) {
		t.Helper()
		current := &corev1.Pod{}
		if err := cfg.Client().Resources(pod.Namespace).Get(ctx, pod.Name, pod.Namespace, current); err != nil {
			t.Fatal(err)
		}
		before := current.DeepCopy()
		change(current)
		// A merge patch without resourceVersion: the pod's status changes
		// under the test, and an update would meet a conflict first.
		var err error
		if len(sub) > 0 {
			err = c.SubResource(sub[0]).Patch(ctx, current, client.MergeFrom(before))
		} else {
			err = c.Patch(ctx, current, client.MergeFrom(before))
		}
		if err == nil || !strings.Contains(err.Error(), want) || !strings.Contains(err.Error(), "runwarden") {
			t.Errorf("%s: %v; want it refused by runwarden, naming %s", what, err, want)
		}
	}
}
