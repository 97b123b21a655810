package runner

import (
	"testing"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
)

func TestCapacityCountsSlots(t *testing.T) {
	t.Parallel()
	slots := []Slot{None, Making, Making, Queued, Running, Running, Running}
	tests := []struct {
		name  string
		kueue bool
		want  Load
	}{
		// Without Kueue a Job is made to run, and nothing waits in Kueue.
		{"without kueue", false, Load{Running: 6}},
		// With Kueue a Job is made suspended: it waits in Kueue until
		// admitted.
		{"with kueue", true, Load{Running: 3, Queued: 3}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := Capacity{MaxConcurrent: 10, MaxQueued: 100, Kueue: tt.kueue}
			var got Load
			for _, s := range slots {
				got = c.Add(got, s, 1)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("load (-want +got):\n%s", diff)
			}
		})
	}
}

func TestCapacityFreeAndFull(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		kueue    bool
		load     Load
		wantFree int
		wantFull string
	}{
		{"room", false, Load{Running: 3}, 2, ""},
		{"running full", false, Load{Running: 5}, 0, "5 of 5 tasks running"},
		{"over full frees nothing", false, Load{Running: 7}, 0, "7 of 5 tasks running"},
		{"queued does not count without kueue", false, Load{Running: 1, Queued: 50}, 4, ""},
		{"kueue: the queue's room bounds the free slots", true, Load{Running: 1, Queued: 1}, 1, ""},
		{"kueue: admitted full", true, Load{Running: 5}, 0, "5 of 5 tasks admitted"},
		{"kueue: queue full", true, Load{Running: 1, Queued: 2}, 0, "2 of 2 tasks queued in Kueue"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := Options{MaxConcurrent: 5, MaxQueued: 2}.Capacity(tt.kueue)
			if got := c.Free(tt.load); got != tt.wantFree {
				t.Errorf("Free(%+v) = %d, want %d", tt.load, got, tt.wantFree)
			}
			if got := c.Full(tt.load); got != tt.wantFull {
				t.Errorf("Full(%+v) = %q, want %q", tt.load, got, tt.wantFull)
			}
		})
	}
}

func TestJobSlot(t *testing.T) {
	t.Parallel()
	done := batchv1.JobStatus{Conditions: []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}}
	tests := []struct {
		name  string
		job   batchv1.Job
		kueue bool
		want  Slot
	}{
		{"running", batchv1.Job{}, false, Running},
		{"finished", batchv1.Job{Status: done}, false, None},
		// Its pods may run until it is gone.
		{"being deleted holds its slot", batchv1.Job{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: ptr.To(metav1.Now())}}, true, Running},
		{"being deleted while queued in kueue", batchv1.Job{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: ptr.To(metav1.Now())}, Spec: batchv1.JobSpec{Suspend: ptr.To(true)}}, true, Queued},
		{"being deleted and finished", batchv1.Job{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: ptr.To(metav1.Now())}, Status: done}, false, None},
		{"suspended with kueue waits", batchv1.Job{Spec: batchv1.JobSpec{Suspend: ptr.To(true)}}, true, Queued},
		{"suspended without kueue holds its slot", batchv1.Job{Spec: batchv1.JobSpec{Suspend: ptr.To(true)}}, false, Running},
		{"suspended and finished", batchv1.Job{Spec: batchv1.JobSpec{Suspend: ptr.To(true)}, Status: done}, true, None},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := (Capacity{Kueue: tt.kueue}).JobSlot(&tt.job); got != tt.want {
				t.Errorf("JobSlot = %d, want %d", got, tt.want)
			}
		})
	}
}
