package kube

import (
	"bytes"
	"context"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/dispatcher/job"
)

func TestLastBytes(t *testing.T) {
	t.Parallel()
	log := strings.Repeat("0123456789", 50_000) + "the end\n"
	got, err := lastBytes(strings.NewReader(log), 1000)
	if err != nil || string(got) != log[len(log)-1000:] {
		t.Fatalf("last bytes: %d bytes ending %q, %v", len(got), got[len(got)-8:], err)
	}
	got, err = lastBytes(strings.NewReader("short"), 1000)
	if err != nil || string(got) != "short" {
		t.Fatalf("a short log: %q, %v", got, err)
	}
}

// fakeLogs serves one log for every container.
type fakeLogs struct{ log []byte }

func (f fakeLogs) Tail(_ context.Context, _, _, _ string, limit int) ([]byte, error) {
	return lastBytes(bytes.NewReader(f.log), limit)
}

// A finished task keeps the end of its runner's log in a ConfigMap the
// RunnerTask owns, named in its status: it outlives the Job and its pod.
// A log that is not text is kept as binary data.
func TestFinishedTaskKeepsItsLog(t *testing.T) {
	t.Parallel()
	for _, c := range []struct {
		name string
		log  []byte
		text bool
	}{{"text", []byte("planned 3 changes\napplied\n"), true}, {"binary", []byte{0xff, 0xfe, 'x'}, false}} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			rt := runnerTask("a", "uid-a")
			j := runnerJobOf(rt)
			j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
			pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: j.Name + "-x", Namespace: "runners", Labels: map[string]string{batchv1.JobNameLabel: j.Name}}}
			api := fake.NewClientBuilder().WithScheme(taskScheme(t)).WithStatusSubresource(&v1alpha1.RunnerTask{}).WithObjects(rt, j, pod).Build()
			r := New(Options{Client: api, Jobs: job.Options{DispatcherID: "d1"}, Logs: fakeLogs{c.log}, KeepLogBytes: 16})
			if err := r.finish(t.Context(), rt, j, job.Outcome{Phase: job.PhaseSucceeded, Reason: job.ReasonCompleted}); err != nil {
				t.Fatal(err)
			}
			var got v1alpha1.RunnerTask
			if err := api.Get(t.Context(), key("a"), &got); err != nil || got.Status.LogConfigMap != LogConfigMapName(j.Name) {
				t.Fatalf("status log ConfigMap %q (%v)", got.Status.LogConfigMap, err)
			}
			var cm corev1.ConfigMap
			if err := api.Get(t.Context(), key(got.Status.LogConfigMap), &cm); err != nil {
				t.Fatal(err)
			}
			want := c.log[max(0, len(c.log)-16):]
			kept := []byte(cm.Data["log"])
			if !c.text {
				kept = cm.BinaryData["log"]
			}
			if !bytes.Equal(kept, want) {
				t.Errorf("kept %q, want %q", kept, want)
			}
			if owner := metav1.GetControllerOf(&cm); owner == nil || owner.UID != rt.UID {
				t.Errorf("the log's owner %+v, want the RunnerTask", owner)
			}
		})
	}
}
