//go:build e2e

package e2e

import (
	"context"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/e2e-framework/klient/k8s"
	"sigs.k8s.io/e2e-framework/klient/wait/conditions"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	"github.com/runwarden/runwarden/e2e/harness"
)

// Labels and taint of the simulated runner pool node (hack/cluster/nodes.yaml).
const (
	poolLabel     = "runwarden.dev/pool"
	poolValue     = "runner"
	simulatedNode = "kwok.x-k8s.io/node"
)

// TestSmokeJobCompletes proves the harness drives a real control plane: the
// real Job controller creates the pod, the real scheduler binds it, and it
// completes on a simulated node.
func TestSmokeJobCompletes(t *testing.T) {
	t.Parallel()
	f := features.New("job completes on a simulated node").
		Assess("job reaches Complete", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			r := cfg.Client().Resources(ns)
			job := &batchv1.Job{
				ObjectMeta: metav1.ObjectMeta{Name: "smoke", Namespace: ns},
				Spec: batchv1.JobSpec{
					BackoffLimit: ptr.To[int32](0),
					Template: corev1.PodTemplateSpec{
						ObjectMeta: metav1.ObjectMeta{Labels: map[string]string{"app": "smoke"}},
						Spec: corev1.PodSpec{
							RestartPolicy: corev1.RestartPolicyNever,
							Containers:    []corev1.Container{{Name: "main", Image: "busybox:stable", Command: []string{"true"}}},
						},
					},
				},
			}
			if err := r.Create(ctx, job); err != nil {
				t.Fatalf("creating job: %v", err)
			}
			cond := conditions.New(r).JobConditionMatch(job, batchv1.JobComplete, corev1.ConditionTrue)
			if err := harness.WaitFor(ctx, "job smoke to complete", time.Minute, cond); err != nil {
				t.Fatal(err)
			}

			var pods corev1.PodList
			if err := r.List(ctx, &pods, func(o *metav1.ListOptions) { o.LabelSelector = "app=smoke" }); err != nil {
				t.Fatalf("listing pods: %v", err)
			}
			if len(pods.Items) != 1 {
				t.Fatalf("job smoke has %d pods, want 1", len(pods.Items))
			}
			nodeName := pods.Items[0].Spec.NodeName
			var node corev1.Node
			if err := r.Get(ctx, nodeName, "", &node); err != nil {
				t.Fatalf("getting node %q of pod %s: %v", nodeName, pods.Items[0].Name, err)
			}
			if node.Annotations[simulatedNode] != "fake" {
				t.Errorf("pod ran on node %s, which is not a simulated node (annotations %v)", nodeName, node.Annotations)
			}
			if node.Labels[poolLabel] == poolValue {
				t.Errorf("pod without a toleration ran on the tainted runner pool node %s", nodeName)
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}

// TestSmokeRunnerPoolNeedsToleration proves the runner pool node is really
// tainted: a pod that selects the pool without the toleration stays
// Unschedulable, and the same pod with the toleration lands on the pool.
func TestSmokeRunnerPoolNeedsToleration(t *testing.T) {
	t.Parallel()
	poolPod := func(ns, name string, tolerate bool) *corev1.Pod {
		p := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: ns},
			Spec: corev1.PodSpec{
				RestartPolicy: corev1.RestartPolicyNever,
				NodeSelector:  map[string]string{poolLabel: poolValue},
				Containers:    []corev1.Container{{Name: "main", Image: "busybox:stable", Command: []string{"true"}}},
			},
		}
		if tolerate {
			p.Spec.Tolerations = []corev1.Toleration{{
				Key: poolLabel, Operator: corev1.TolerationOpEqual, Value: poolValue, Effect: corev1.TaintEffectNoSchedule,
			}}
		}
		return p
	}
	f := features.New("runner pool needs its toleration").
		Assess("without toleration the pod is Unschedulable", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			r := cfg.Client().Resources(ns)
			pod := poolPod(ns, "no-toleration", false)
			if err := r.Create(ctx, pod); err != nil {
				t.Fatalf("creating pod: %v", err)
			}
			unschedulable := conditions.New(r).ResourceMatch(pod, func(o k8s.Object) bool {
				for _, c := range o.(*corev1.Pod).Status.Conditions {
					if c.Type == corev1.PodScheduled && c.Status == corev1.ConditionFalse && c.Reason == corev1.PodReasonUnschedulable {
						return true
					}
				}
				return false
			})
			if err := harness.WaitFor(ctx, "pod no-toleration to be Unschedulable", time.Minute, unschedulable); err != nil {
				t.Fatal(err)
			}
			if err := r.Get(ctx, pod.Name, ns, pod); err != nil {
				t.Fatalf("getting pod: %v", err)
			}
			if pod.Spec.NodeName != "" {
				t.Errorf("pod without toleration was bound to %s", pod.Spec.NodeName)
			}
			return ctx
		}).
		Assess("with toleration the pod runs on the pool node", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
			ns := harness.Namespace(ctx)
			r := cfg.Client().Resources(ns)
			pod := poolPod(ns, "with-toleration", true)
			if err := r.Create(ctx, pod); err != nil {
				t.Fatalf("creating pod: %v", err)
			}
			cond := conditions.New(r).PodConditionMatch(pod, corev1.PodScheduled, corev1.ConditionTrue)
			if err := harness.WaitFor(ctx, "pod with-toleration to be scheduled", time.Minute, cond); err != nil {
				t.Fatal(err)
			}
			if err := r.Get(ctx, pod.Name, ns, pod); err != nil {
				t.Fatalf("getting pod: %v", err)
			}
			var node corev1.Node
			if err := r.Get(ctx, pod.Spec.NodeName, "", &node); err != nil {
				t.Fatalf("getting node %q: %v", pod.Spec.NodeName, err)
			}
			if node.Labels[poolLabel] != poolValue {
				t.Errorf("pod was bound to %s, want a node labelled %s=%s", node.Name, poolLabel, poolValue)
			}
			return ctx
		}).Feature()
	testenv.Test(t, f)
}
