package job

import (
	"context"
	"errors"
	"slices"
	"strings"
	"testing"

	batchv1 "k8s.io/api/batch/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// With Kueue, a task's Job carries its LocalQueue and priority class (its
// own, else the defaults) and is made suspended for Kueue to admit; a task
// with no queue at all, or a name that is no object name, is refused.
// Without Kueue, a priority class must be one the dispatcher knows.
func TestBuildQueues(t *testing.T) {
	t.Parallel()
	kueue := Queueing{Kueue: true, DefaultQueue: "shared", DefaultPriorityClass: "routine"}
	for _, c := range []struct {
		name               string
		q                  Queueing
		queue, class       string
		wantQueue, wantPri string
		err                string
	}{
		{name: "task's own", q: kueue, queue: "team-a", class: "urgent", wantQueue: "team-a", wantPri: "urgent"},
		{name: "defaults", q: kueue, wantQueue: "shared", wantPri: "routine"},
		{name: "no queue", q: Queueing{Kueue: true}, err: "names no queue and the dispatcher has no default queue"},
		{name: "bad queue name", q: kueue, queue: "Team_A", err: `queue "Team_A" is not a valid object name`},
		{name: "without Kueue, known class", q: Queueing{Priorities: map[string]int32{"high": 1}}, queue: "ignored", class: "high"},
		{name: "without Kueue, unknown class", q: Queueing{Priorities: map[string]int32{"high": 1, "low": 0}}, class: "urgent", err: `priority class "urgent" is not one this dispatcher knows (high, low)`},
		{name: "without Kueue, no classes", class: "urgent", err: "this dispatcher knows no priority classes"},
	} {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			o := options(t)
			o.Queueing = c.q
			tk := task()
			tk.Queue, tk.PriorityClass = c.queue, c.class
			j, _, err := Build(tk, o)
			if c.err != "" {
				if !errors.Is(err, ErrInvalidTask) || !strings.Contains(err.Error(), c.err) {
					t.Fatalf("Build: %v, want %q", err, c.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if j.Labels[LabelQueueName] != c.wantQueue || j.Labels[LabelPriorityClass] != c.wantPri {
				t.Errorf("labels %v, want queue %q and priority class %q", j.Labels, c.wantQueue, c.wantPri)
			}
			if suspended := ptr.Deref(j.Spec.Suspend, false); suspended != c.q.Kueue {
				t.Errorf("suspend %v with Kueue %v", suspended, c.q.Kueue)
			}
		})
	}
}

// With Kueue, a Job whose task has a Secret joins its queue only once the
// Secret is made, and stays suspended for Kueue: Kueue would admit a Job
// awaiting its Secret, and ignores one without a queue.
func TestCreateQueuesAfterTheSecret(t *testing.T) {
	t.Parallel()
	o := options(t)
	o.Queueing = Queueing{Kueue: true, DefaultQueue: "team-a"}
	j, secret, err := Build(task(), o)
	if err != nil {
		t.Fatal(err)
	}
	var labelsAtCreate map[string]string
	rec := &calls{}
	c := withGC(t, rec)
	wrapped := recordingCreate{Client: c, seen: func(j *batchv1.Job) { labelsAtCreate = j.Labels }}
	if _, err := Create(t.Context(), wrapped, j, secret, CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, queued := labelsAtCreate[LabelQueueName]; queued {
		t.Errorf("the Job was made with its queue label, before its Secret: %v", labelsAtCreate)
	}
	var got batchv1.Job
	if err := c.Get(t.Context(), client.ObjectKeyFromObject(j), &got); err != nil {
		t.Fatal(err)
	}
	if got.Labels[LabelQueueName] != "team-a" || !ptr.Deref(got.Spec.Suspend, false) || got.Annotations[AnnotationAwaitingSecret] != "" || !Queued(&got) {
		t.Errorf("after Create: labels %v, suspend %v, annotations %v; want queued in team-a, suspended for Kueue", got.Labels, got.Spec.Suspend, got.Annotations)
	}
	if want := []string{"create *v1.Job", "create secret (job suspended=true)", "patch *v1.Job"}; !slices.Equal(rec.log, want) {
		t.Errorf("writes %q, want %q", rec.log, want)
	}
}

// recordingCreate hands each Job it creates to seen.
type recordingCreate struct {
	client.Client
	seen func(*batchv1.Job)
}

func (r recordingCreate) Create(ctx context.Context, obj client.Object, opts ...client.CreateOption) error {
	if j, ok := obj.(*batchv1.Job); ok {
		r.seen(j.DeepCopy())
	}
	return r.Client.Create(ctx, obj, opts...)
}

// A Workload Kueue evicted after admitting it (its Evicted condition, or
// an eviction its scheduling stats keep once it is admitted again) is the
// task's end: Preempted, or Evicted for another cause.
func TestEvicted(t *testing.T) {
	t.Parallel()
	wl := func(status map[string]any) *unstructured.Unstructured {
		return &unstructured.Unstructured{Object: map[string]any{"status": status}}
	}
	for _, c := range []struct {
		name   string
		wl     *unstructured.Unstructured
		reason string
		ok     bool
	}{
		{"waiting", wl(map[string]any{"conditions": []any{map[string]any{"type": "QuotaReserved", "status": "False", "reason": "Pending"}}}), "", false},
		{"preempted", wl(map[string]any{"conditions": []any{map[string]any{"type": "Evicted", "status": "True", "reason": "Preempted", "message": "Preempted to accommodate"}}}), "Preempted", true},
		{"admitted again", wl(map[string]any{
			"conditions":      []any{map[string]any{"type": "Evicted", "status": "False", "reason": "QuotaReserved"}},
			"schedulingStats": map[string]any{"evictions": []any{map[string]any{"reason": "Preempted", "count": int64(1)}}},
		}), "Preempted", true},
		{"pods not ready", wl(map[string]any{"conditions": []any{map[string]any{"type": "Evicted", "status": "True", "reason": "PodsReadyTimeout"}}}), "PodsReadyTimeout", true},
	} {
		reason, _, ok := evicted(c.wl)
		if ok != c.ok || reason != c.reason {
			t.Errorf("%s: evicted %v (%q), want %v (%q)", c.name, ok, reason, c.ok, c.reason)
		}
	}
}
