package kube

import (
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/runwarden/runwarden/dispatcher/job"
)

func runningJob(name string) *batchv1.Job {
	return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{
		Name: name, Namespace: "runners", Labels: map[string]string{job.LabelDispatcher: "d1"},
	}}
}

func finishedJob(name string) *batchv1.Job {
	j := runningJob(name)
	j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
	return j
}

func key(name string) types.NamespacedName {
	return types.NamespacedName{Namespace: "runners", Name: name}
}

// A restarted dispatcher counts the Jobs already running before it starts
// any: the slots they hold are not handed out again.
func TestCapacityCountsRunningJobsBeforeTheFirstStart(t *testing.T) {
	t.Parallel()
	c := fake.NewClientBuilder().WithObjects(runningJob("a"), runningJob("b"), finishedJob("c")).Build()
	r := New(Options{Client: c, Jobs: job.Options{DispatcherID: "d1"}, MaxConcurrent: 2})
	ok, n, err := r.reserve(t.Context(), key("new"))
	if err != nil || ok || n != 2 {
		t.Fatalf("reserve with 2 of 2 slots held by running Jobs: ok %v, taken %d, %v; want refused, 2", ok, n, err)
	}
}

// Reservations beyond the last count are counted too, so parallel starts
// never exceed the limit before the cache shows their Jobs.
func TestCapacityCountsReservations(t *testing.T) {
	t.Parallel()
	c := fake.NewClientBuilder().WithObjects(runningJob("a")).Build()
	r := New(Options{Client: c, Jobs: job.Options{DispatcherID: "d1"}, MaxConcurrent: 3})
	for i, name := range []string{"x", "y"} {
		if ok, _, err := r.reserve(t.Context(), key(name)); err != nil || !ok {
			t.Fatalf("reserve %d: ok %v, %v", i, ok, err)
		}
	}
	if ok, n, _ := r.reserve(t.Context(), key("z")); ok || n != 3 {
		t.Fatalf("a fourth start with 1 running and 2 reserved of 3: ok %v, taken %d", ok, n)
	}
}

// A task that finished before the cache ever showed its Job (deleted,
// cancelled, stopped) gives its slot back.
func TestFinishedTaskGivesItsSlotBack(t *testing.T) {
	t.Parallel()
	c := fake.NewClientBuilder().Build()
	r := New(Options{Client: c, Jobs: job.Options{DispatcherID: "d1"}, MaxConcurrent: 1})
	if ok, _, err := r.reserve(t.Context(), key("a")); err != nil || !ok {
		t.Fatalf("first reserve: ok %v, %v", ok, err)
	}
	if ok, _, _ := r.reserve(t.Context(), key("b")); ok {
		t.Fatal("a second task started with the only slot reserved")
	}
	if err := r.recount(t.Context(), key("a")); err != nil {
		t.Fatal(err)
	}
	if ok, _, err := r.reserve(t.Context(), key("b")); err != nil || !ok {
		t.Fatalf("after the first task finished: ok %v, %v; want the slot back", ok, err)
	}
}
