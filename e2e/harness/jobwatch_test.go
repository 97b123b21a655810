package harness

import (
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
	"k8s.io/utils/ptr"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/orchestrator"
	"github.com/runwarden/runwarden/internal/contract"
)

// watchedJob is a Job of dispatcher d-1 for task, running unless changed.
func watchedJob(name, task string, change func(*batchv1.Job)) *batchv1.Job {
	j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{
		Name: name, Namespace: "ns", UID: types.UID("uid-" + name),
		Labels:      map[string]string{contract.LabelDispatcher: "d-1", contract.TaskID: task},
		Annotations: map[string]string{contract.TaskID: task},
	}}
	if change != nil {
		change(j)
	}
	return j
}

// podOf is a pod the Job controller made for j.
func podOf(j *batchv1.Job, name string) *corev1.Pod {
	return &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: name, Namespace: "ns", UID: types.UID("uid-" + name),
		Labels:          map[string]string{contract.TaskID: j.Labels[contract.TaskID]},
		Annotations:     map[string]string{contract.TaskID: j.Annotations[contract.TaskID]},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: j.Name, UID: j.UID, Controller: ptr.To(true)}},
	}}
}

func finished(j *batchv1.Job) {
	j.Status.Conditions = []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}
}

// The watch finds each breach of its two rules from the events alone, and
// counts only the Jobs that can still run.
func TestJobWatch(t *testing.T) {
	t.Parallel()
	running := func() *batchv1.Job { return watchedJob("a", "task-a", nil) }
	tests := []struct {
		name string
		objs []func() any
		// wantMost is the most Jobs of d-1 held at once; wantViolation
		// what each violation says, in order.
		wantMost      int
		wantViolation []string
	}{
		{
			name:          "two running Jobs with one slot",
			objs:          []func() any{func() any { return running() }, func() any { return watchedJob("b", "task-b", nil) }},
			wantMost:      2,
			wantViolation: []string{"after Job b added"},
		},
		{
			name:     "a finished Job frees its slot",
			objs:     []func() any{func() any { return watchedJob("f", "task-f", finished) }, func() any { return running() }},
			wantMost: 1,
		},
		{
			name: "a Job suspended with its outcome recorded frees its slot",
			objs: []func() any{func() any {
				return watchedJob("s", "task-s", func(j *batchv1.Job) {
					j.Spec.Suspend = ptr.To(true)
					j.Annotations[orchestrator.AnnotationOutcome] = `{"Phase":"Cancelled"}`
				})
			}, func() any { return running() }},
			wantMost: 1,
		},
		{
			name: "a Job suspended awaiting its Secret holds its slot",
			objs: []func() any{func() any {
				return watchedJob("w", "task-w", func(j *batchv1.Job) {
					j.Spec.Suspend = ptr.To(true)
					j.Annotations[job.AnnotationAwaitingSecret] = "true"
				})
			}, func() any { return running() }},
			wantMost:      2,
			wantViolation: []string{"awaiting its Secret"},
		},
		{
			name: "a Job being deleted holds its slot",
			objs: []func() any{func() any {
				return watchedJob("d", "task-d", func(j *batchv1.Job) { j.DeletionTimestamp = ptr.To(metav1.Now()) })
			}, func() any { return running() }},
			wantMost:      2,
			wantViolation: []string{"deleting since"},
		},
		{
			name: "the preflight's Job is no task's",
			objs: []func() any{func() any {
				return watchedJob("p", "preflight/d-1/x", func(j *batchv1.Job) { j.Annotations[job.AnnotationPreflight] = "true" })
			}, func() any { return running() }},
			wantMost: 1,
		},
		{
			name:     "pods of one Job",
			objs:     []func() any{func() any { return running() }, func() any { return podOf(running(), "a-1") }, func() any { return podOf(running(), "a-2") }},
			wantMost: 1,
		},
		{
			name: "a task with pods of two Jobs",
			objs: []func() any{
				func() any { return watchedJob("a", "task-a", finished) }, func() any { return podOf(running(), "a-1") },
				func() any { return podOf(watchedJob("a2", "task-a", nil), "a2-1") },
			},
			wantViolation: []string{"task task-a (task-a) has pods of two Jobs: pod a2-1 of Job a2 (uid uid-a2) added"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cs := fake.NewClientset()
			// The fake's watch starts from now, not from the list's
			// version: create nothing before both watches are open.
			watching := make(chan struct{}, 2)
			cs.PrependWatchReactor("*", func(k8stesting.Action) (bool, watch.Interface, error) {
				watching <- struct{}{}
				return false, nil, nil
			})
			w := watchJobs(t.Context(), t, cs, "ns", 1)
			for range 2 {
				select {
				case <-watching:
				case <-time.After(10 * time.Second):
					t.Fatal("the watches did not open within 10 s")
				}
			}
			for _, o := range tt.objs {
				var err error
				switch o := o().(type) {
				case *batchv1.Job:
					_, err = cs.BatchV1().Jobs("ns").Create(t.Context(), o, metav1.CreateOptions{})
				case *corev1.Pod:
					_, err = cs.CoreV1().Pods("ns").Create(t.Context(), o, metav1.CreateOptions{})
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			r := w.Stop(t.Context())
			if r.Missed != nil {
				t.Fatal(r.Missed)
			}
			if r.Most["d-1"] != tt.wantMost {
				t.Errorf("at most %d Jobs held a slot, want %d", r.Most["d-1"], tt.wantMost)
			}
			if len(r.Violations) != len(tt.wantViolation) {
				t.Fatalf("violations:\n%s\nwant %d", strings.Join(r.Violations, "\n"), len(tt.wantViolation))
			}
			for i, want := range tt.wantViolation {
				if !strings.Contains(r.Violations[i], want) {
					t.Errorf("violation %q does not say %q", r.Violations[i], want)
				}
			}
			jobs, pods := 0, 0
			for _, o := range tt.objs {
				if _, ok := o().(*batchv1.Job); ok {
					jobs++
				} else {
					pods++
				}
			}
			want := map[string]int{}
			if jobs > 0 {
				want["Job added"] = jobs
			}
			if pods > 0 {
				want["Pod added"] = pods
			}
			if diff := cmp.Diff(want, r.Events); diff != "" {
				t.Errorf("events (-want +got):\n%s", diff)
			}
		})
	}
}
