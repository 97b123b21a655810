package runner

import (
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clocktesting "k8s.io/utils/clock/testing"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/internal/contract"
)

var start = time.Date(2026, 11, 26, 12, 0, 0, 0, time.UTC)

func finishedJob(name string, created time.Time, annotations map[string]string) *batchv1.Job {
	return &batchv1.Job{
		ObjectMeta: metav1.ObjectMeta{
			Name: name, Namespace: "ns", Labels: map[string]string{contract.LabelDispatcher: "d"},
			CreationTimestamp: metav1.NewTime(created), Annotations: annotations,
		},
		Status: batchv1.JobStatus{Conditions: []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}},
	}
}

func jobs(t *testing.T, c client.Client) map[string]map[string]string {
	t.Helper()
	var list batchv1.JobList
	if err := c.List(t.Context(), &list); err != nil {
		t.Fatal(err)
	}
	got := map[string]map[string]string{}
	for _, j := range list.Items {
		got[j.Name] = j.Annotations
	}
	return got
}

// Settling marks the Job reported (with its keep-until, by the injected
// clock) and prunes the history by that clock: a Job beyond the limit that
// is still to be kept stays until the clock passes its keep-until, and
// Settle says when that is.
func TestSettleMarksAndPrunesByTheClock(t *testing.T) {
	t.Parallel()
	clk := clocktesting.NewFakeClock(start)
	keep := start.Add(90 * time.Second).Format(time.RFC3339)
	c := fake.NewClientBuilder().WithObjects(
		finishedJob("old-kept", start.Add(-3*time.Hour), map[string]string{job.AnnotationReported: "true", job.AnnotationKeepUntil: keep}),
		finishedJob("middle", start.Add(-2*time.Hour), map[string]string{job.AnnotationReported: "true"}),
		finishedJob("new", start.Add(-time.Hour), map[string]string{}),
	).Build()
	s := Settler{Client: c, Jobs: job.Options{DispatcherID: "d"}, Options: Options{SucceededHistory: 1, Clock: clk}}
	s.Options.SetDefaults()

	var j batchv1.Job
	if err := c.Get(t.Context(), client.ObjectKey{Namespace: "ns", Name: "new"}, &j); err != nil {
		t.Fatal(err)
	}
	requeue, err := s.Settle(t.Context(), &j, start.Add(time.Hour))
	if err != nil || requeue != 90*time.Second {
		t.Fatalf("settle: requeue %v, %v; want 1m30s: old-kept may go then", requeue, err)
	}
	want := map[string]map[string]string{
		"old-kept": {job.AnnotationReported: "true", job.AnnotationKeepUntil: keep},
		"new":      {job.AnnotationReported: "true", job.AnnotationKeepUntil: start.Add(time.Hour).Format(time.RFC3339)},
	}
	if diff := cmp.Diff(want, jobs(t, c)); diff != "" {
		t.Fatalf("after settling (-want +got):\n%s", diff)
	}

	clk.SetTime(start.Add(89 * time.Second))
	if requeue, err := s.Prune(t.Context(), &j); err != nil || requeue != time.Second {
		t.Fatalf("prune before the keep-until: requeue %v, %v; want 1s", requeue, err)
	}
	clk.SetTime(start.Add(90 * time.Second))
	if requeue, err := s.Prune(t.Context(), &j); err != nil || requeue != 0 {
		t.Fatalf("prune at the keep-until: requeue %v, %v; want none", requeue, err)
	}
	delete(want, "old-kept")
	if diff := cmp.Diff(want, jobs(t, c)); diff != "" {
		t.Errorf("after the keep-until (-want +got):\n%s", diff)
	}
}

// A Job marked reported already keeps its mark and keep-until: settling it
// again (a reconcile once the mark reaches the cache) only prunes.
func TestSettleMarksOnce(t *testing.T) {
	t.Parallel()
	first := start.Add(time.Minute).Format(time.RFC3339)
	j := finishedJob("done", start, map[string]string{job.AnnotationReported: "true", job.AnnotationKeepUntil: first})
	c := fake.NewClientBuilder().WithObjects(j).Build()
	s := Settler{Client: c, Jobs: job.Options{DispatcherID: "d"}, Options: Options{Clock: clocktesting.NewFakeClock(start)}}
	s.Options.SetDefaults()
	if _, err := s.Settle(t.Context(), j, start.Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if got := jobs(t, c)["done"][job.AnnotationKeepUntil]; got != first {
		t.Errorf("keep-until %q, want the first mark's %q", got, first)
	}
}

// The Observer reads Kueue Workloads only with Kueue, and from the API
// server, never from the cache; its clock is the options'.
func TestNewObserverReadsWorkloadsOnlyWithKueue(t *testing.T) {
	t.Parallel()
	cache, api := fake.NewClientBuilder().Build(), fake.NewClientBuilder().Build()
	clk := clocktesting.NewFakeClock(start)
	o := Options{Clock: clk}
	o.SetDefaults()
	for _, kueue := range []bool{false, true} {
		obs := NewObserver(o, cache, api, kueue)
		if obs.Client != cache || obs.Events != api || obs.UnschedulableTimeout != 5*time.Minute || !obs.Now().Equal(start) {
			t.Errorf("kueue %v: observer %+v: want pods from the cache, events from the API server, the options' timeout and clock", kueue, obs)
		}
		if (obs.Workloads != nil) != kueue || (kueue && obs.Workloads != api) {
			t.Errorf("kueue %v: Workloads %v; want the API server with Kueue only", kueue, obs.Workloads)
		}
	}
}
