package job

import (
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/runwarden/runwarden/internal/contract"
)

func succeededJob(name string, age time.Duration, reported bool) *batchv1.Job {
	j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{
		Name: name, Namespace: "ns", Labels: map[string]string{contract.LabelDispatcher: "d"},
		CreationTimestamp: metav1.NewTime(time.Now().Add(-age)), Annotations: map[string]string{},
	}}
	if reported {
		j.Annotations[AnnotationReported] = "true"
	}
	j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
	return j
}

// Only Jobs whose outcome is reported count towards the limit and may go,
// the one just marked (Marked) included; the oldest go first.
func TestPruneHistoryKeepsUnreportedJobs(t *testing.T) {
	t.Parallel()
	c := fake.NewClientBuilder().WithObjects(
		succeededJob("oldest-unreported", 4*time.Hour, false),
		succeededJob("old", 3*time.Hour, true),
		succeededJob("middle", 2*time.Hour, true),
		succeededJob("just-marked", time.Hour, false),
	).Build()
	if next, err := PruneHistory(t.Context(), c, History{Namespace: "ns", DispatcherID: "d", Succeeded: 2, Failed: 2, Marked: "just-marked"}); err != nil || !next.IsZero() {
		t.Fatalf("prune: next %v, %v", next, err)
	}
	if got := jobNames(t, c); !got["oldest-unreported"] || got["old"] || !got["middle"] || !got["just-marked"] || len(got) != 3 {
		t.Errorf("left %v; want the unreported Job kept and the oldest reported one deleted", got)
	}
}

// A Job kept until a later time (AnnotationKeepUntil) outlives the limit
// until then, still counting; a prune after that time deletes it.
func TestPruneHistoryKeepsJobsUntilTheirKeepTime(t *testing.T) {
	t.Parallel()
	now := time.Now()
	kept := succeededJob("kept", 3*time.Hour, true)
	kept.Annotations[AnnotationKeepUntil] = now.Add(time.Minute).UTC().Format(time.RFC3339)
	c := fake.NewClientBuilder().WithObjects(
		succeededJob("oldest", 4*time.Hour, true),
		kept,
		succeededJob("newest", time.Hour, true),
	).Build()
	h := History{Namespace: "ns", DispatcherID: "d", Succeeded: 1, Failed: 1, Now: now}
	next, err := PruneHistory(t.Context(), c, h)
	if err != nil {
		t.Fatal(err)
	}
	if want := KeepUntil(kept); !next.Equal(want) {
		t.Errorf("next prune at %v, want the kept Job's keep time %v", next, want)
	}
	if got := jobNames(t, c); got["oldest"] || !got["kept"] || !got["newest"] || len(got) != 2 {
		t.Errorf("before its keep time: left %v; want kept and newest", got)
	}
	h.Now = now.Add(2 * time.Minute)
	if next, err := PruneHistory(t.Context(), c, h); err != nil || !next.IsZero() {
		t.Fatalf("second prune: next %v, %v", next, err)
	}
	if got := jobNames(t, c); got["kept"] || !got["newest"] || len(got) != 1 {
		t.Errorf("after its keep time: left %v; want newest only", got)
	}
}

// jobNames is the set of the Jobs' names.
func jobNames(t *testing.T, c client.Client) map[string]bool {
	t.Helper()
	var jobs batchv1.JobList
	if err := c.List(t.Context(), &jobs); err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, j := range jobs.Items {
		got[j.Name] = true
	}
	return got
}
