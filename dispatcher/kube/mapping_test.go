package kube

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/runwarden/runwarden/internal/contract"
)

// TestPodToTask: a runner pod is mapped to the RunnerTask its annotation
// names only in the pod's own namespace, where the task's Job made it.
func TestPodToTask(t *testing.T) {
	pod := func(ns, id string) *corev1.Pod {
		p := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: "p"}}
		if id != "" {
			p.Annotations = map[string]string{contract.TaskID: id}
		}
		return p
	}
	tests := []struct {
		name string
		pod  *corev1.Pod
		want []reconcile.Request
	}{
		{"a task's pod", pod("team-a", "team-a/deploy/0b7c"), []reconcile.Request{{NamespacedName: types.NamespacedName{Namespace: "team-a", Name: "deploy"}}}},
		{"the preflight's pod", pod("team-a", "preflight/d-1/5e3a"), nil},
		{"a pod naming a task of another namespace", pod("team-a", "team-b/deploy/0b7c"), nil},
		{"no annotation", pod("team-a", ""), nil},
		{"not a task ID", pod("team-a", "team-a/deploy"), nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if diff := cmp.Diff(tt.want, podToTask(t.Context(), tt.pod)); diff != "" {
				t.Errorf("podToTask (-want +got):\n%s", diff)
			}
		})
	}
}
