package orchestrator

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	testclock "k8s.io/utils/clock/testing"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/runner"
	"github.com/runwarden/runwarden/internal/contract"
)

// A lease of a task this process let go, delivered again, is not taken for
// a new task; nor is a lease without IDs. (Other leases start a Job and
// are covered by the e2e suite on a real API server.)
func TestTakeIgnoresEndedAndMalformedLeases(t *testing.T) {
	t.Parallel()
	s := New(Options{})
	s.log = logr.Discard()
	ended, _, _, _ := s.leases.take(Lease{LeaseID: "l-1", Epoch: 1, Task: Task{ID: "t-1"}}, s.clock.Now(), time.Minute, true)
	s.leases.forget(ended)
	s.take(t.Context(), []Lease{
		{LeaseID: "l-1", Epoch: 1, Task: Task{ID: "t-1"}},
		{LeaseID: "", Epoch: 1, Task: Task{ID: "t-2"}},
		{LeaseID: "l-3", Epoch: 1, Task: Task{ID: ""}},
	}, 10)
	if _, _, _, held := s.leases.capacity(10, 100); len(held) != 0 {
		t.Errorf("tasks taken: %v", held)
	}
}

// The memory of ended leases keeps the newest maxEnded.
func TestEndedLeasesAreBounded(t *testing.T) {
	t.Parallel()
	// One goroutine: the table is not shared, so its lock is not needed.
	lt := newLeaseTable(false)
	for i := range maxEnded + 10 {
		lt.rememberLocked(fmt.Sprintf("l-%d", i))
	}
	lt.rememberLocked("l-20") // already held: no second entry
	if n, order := len(lt.ended), len(lt.endedOrder); n != maxEnded || order != maxEnded {
		t.Fatalf("%d ended leases held (%d in order), want %d", n, order, maxEnded)
	}
	for _, id := range []string{"l-0", "l-9"} {
		if lt.hasEnded(id) {
			t.Errorf("oldest lease %s still held", id)
		}
	}
	for _, id := range []string{"l-10", fmt.Sprintf("l-%d", maxEnded+9)} {
		if !lt.hasEnded(id) {
			t.Errorf("lease %s forgotten", id)
		}
	}
}

// The preflight's Job, left behind by a restart during the preflight,
// carries the dispatcher's label but is no task's: it is never adopted
// (it was, and reported to the orchestrator as task "preflight/...").
func TestPreflightJobIsNotAdopted(t *testing.T) {
	t.Parallel()
	s := New(Options{})
	// Suspended, as job.Create leaves a Job awaiting its Secret.
	mk := func(name string, ann map[string]string) *batchv1.Job {
		return &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "runners", Annotations: ann}, Spec: batchv1.JobSpec{Suspend: ptr.To(true)}}
	}
	if got, v := s.adopt(mk("rw-preflight", map[string]string{contract.TaskID: "preflight/d-1/0a1b2c3d", job.AnnotationPreflight: "true"})); got != nil {
		t.Errorf("the preflight Job was adopted as task %q", v.id)
	}
	if got, v := s.adopt(mk(job.Name("t-1"), map[string]string{contract.TaskID: "t-1", AnnotationLeaseID: "l-1", AnnotationLeaseEpoch: "2"})); got == nil || v.id != "t-1" || v.epoch != 2 {
		t.Errorf("a task's Job was not adopted: %+v", v)
	}
	// A Job awaiting its Secret never ran, and the Secret's values are
	// gone with the process that had them: it is started over, not tracked.
	if got, v := s.adopt(mk(job.Name("t-2"), map[string]string{contract.TaskID: "t-2", AnnotationLeaseID: "l-2", job.AnnotationAwaitingSecret: "true"})); got != nil {
		t.Errorf("a Job awaiting its Secret was adopted as task %q", v.id)
	}
}

// A Job left awaiting its Secret by a stop is deleted and its lease handed
// back, so the task starts again from a new lease with its values.
func TestStartOverDeletesAndHandsBack(t *testing.T) {
	t.Parallel()
	released := make(chan string, 1)
	c, err := NewClient(ClientOptions{URL: "https://orch.example", DispatcherID: "d-1", Transport: roundTrip(func(r *http.Request) (*http.Response, error) {
		var req ReleaseRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		released <- fmt.Sprintf("%s epoch %d", r.URL.Path, req.Epoch)
		return &http.Response{StatusCode: http.StatusNoContent, Body: http.NoBody, Header: http.Header{}, Request: r}, nil
	})})
	if err != nil {
		t.Fatal(err)
	}
	left := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "rw-t-1", Namespace: "runners", UID: "u-1", Annotations: map[string]string{
		contract.TaskID: "t-1", AnnotationLeaseID: "l-1", AnnotationLeaseEpoch: "4", job.AnnotationAwaitingSecret: "true",
	}}}
	kube := fake.NewClientBuilder().WithObjects(left).Build()
	s := New(Options{Client: c, Kube: kube})
	s.log = logr.Discard()
	s.startOver(t.Context(), []*batchv1.Job{left})
	if err := kube.Get(t.Context(), client.ObjectKeyFromObject(left), &batchv1.Job{}); !apierrors.IsNotFound(err) {
		t.Errorf("the Job awaiting its Secret: %v, want deleted", err)
	}
	select {
	case got := <-released:
		if got != "/v1/leases/l-1:release epoch 4" {
			t.Errorf("released %s", got)
		}
	default:
		t.Error("the lease was not handed back")
	}
}

// A lease delivered late with an older epoch than the task's lease held
// (a re-delivery of the lease before a hand-back) does not replace it;
// a newer one does.
func TestTakeKeepsTheNewerLease(t *testing.T) {
	t.Parallel()
	s := New(Options{})
	s.log = logr.Discard()
	// creating: the Job is not there yet, so a lease taken is not written
	// to it.
	held, _, _, _ := s.leases.take(Lease{LeaseID: "l-3", Epoch: 3, LeaseSeconds: 60, Task: Task{ID: "t-1"}}, s.clock.Now(), time.Minute, true)
	check := func(when, leaseID string, epoch int64) {
		t.Helper()
		got, v, _ := s.leases.held("t-1")
		if got != held || v.leaseID != leaseID || v.epoch != epoch {
			t.Errorf("%s: holding lease %s epoch %d, want %s epoch %d", when, v.leaseID, v.epoch, leaseID, epoch)
		}
	}
	s.take(t.Context(), []Lease{{LeaseID: "l-2", Epoch: 2, LeaseSeconds: 60, Task: Task{ID: "t-1"}}}, 10)
	check("after an older lease", "l-3", 3)
	s.take(t.Context(), []Lease{{LeaseID: "l-4", Epoch: 4, LeaseSeconds: 60, Task: Task{ID: "t-1"}}}, 10)
	check("after a newer lease", "l-4", 4)
}

// roundTrip is an http.RoundTripper from a function.
type roundTrip func(*http.Request) (*http.Response, error)

func (f roundTrip) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// Leases beyond the capacity the poll asked for are handed back, not taken.
func TestTakeHandsBackLeasesBeyondTheCapacityAskedFor(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	released := map[string]ReleaseRequest{}
	done := make(chan struct{}, 2)
	c, err := NewClient(ClientOptions{URL: "https://orch.example", DispatcherID: "d-1", Transport: roundTrip(func(r *http.Request) (*http.Response, error) {
		var req ReleaseRequest
		_ = json.NewDecoder(r.Body).Decode(&req)
		mu.Lock()
		released[r.URL.Path] = req
		mu.Unlock()
		done <- struct{}{}
		return &http.Response{StatusCode: http.StatusNoContent, Body: http.NoBody, Header: http.Header{}, Request: r}, nil
	})})
	if err != nil {
		t.Fatal(err)
	}
	s := New(Options{Client: c})
	s.log = logr.Discard()
	s.take(t.Context(), []Lease{
		{LeaseID: "l-1", Epoch: 1, LeaseSeconds: 60, Task: Task{ID: "t-1"}},
		{LeaseID: "l-2", Epoch: 3, LeaseSeconds: 60, Task: Task{ID: "t-2"}},
	}, 0)
	for range 2 {
		select {
		case <-done:
		case <-t.Context().Done():
			t.Fatal("the leases were not handed back")
		}
	}
	if _, _, _, held := s.leases.capacity(10, 100); len(held) != 0 {
		t.Errorf("tasks taken beyond the capacity: %v", held)
	}
	mu.Lock()
	defer mu.Unlock()
	want := map[string]ReleaseRequest{
		"/v1/leases/l-1:release": {DispatcherID: "d-1", Epoch: 1},
		"/v1/leases/l-2:release": {DispatcherID: "d-1", Epoch: 3},
	}
	if diff := cmp.Diff(want, released); diff != "" {
		t.Errorf("releases (-want +got):\n%s", diff)
	}
}

// FuzzLeaseToJob feeds arbitrary lease JSON through what the dispatcher does
// with a lease: decoding, then building the Job. It never panics, and a Job
// it builds names no Secret but the task's own, runs in the dispatcher's
// namespace, and carries the task's secret values only in that Secret.
func FuzzLeaseToJob(f *testing.F) {
	for _, s := range []string{
		`{"leaseId":"l-1","epoch":1,"task":{"id":"t-1","image":"runner:1","env":[{"name":"TF_VAR_a","value":"${vault:a/b.c@ns}"}]}}`,
		`{"leaseId":"l-1","epoch":1,"task":{"id":"t-1","secretEnv":{"TF_VAR_token":"s3cr3t"}}}`,
		`{"leaseId":"l-1","task":{"id":"t/../x","namespace":"kube-system","env":[{"name":"K","value":"v","valueFrom":{"secretKeyRef":{"name":"aws","key":"k"}}}]}}`,
		`{"task":{"id":"t","resources":{"limits":{"memory":"1Gi"}},"activeDeadlineSeconds":-1}}`,
	} {
		f.Add([]byte(s))
	}
	opts := job.Options{
		DispatcherID: "d-1", EnvAllowList: []string{"TF_*", "K"},
		Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "runner:1"}}}},
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		var l Lease
		if json.Unmarshal(b, &l) != nil {
			return
		}
		j, secret, err := leaseJob(l, "runners", opts)
		if err != nil {
			if !errors.Is(err, job.ErrInvalidTask) && !errors.Is(err, job.ErrEnvNotAllowed) && !errors.Is(err, job.ErrRepoNotAllowed) && !errors.Is(err, job.ErrInvalidTemplate) {
				t.Fatalf("a task refused without a reason a caller can tell: %v", err)
			}
			return
		}
		if j.Namespace != "runners" || (secret != nil && secret.Namespace != "runners") {
			t.Fatalf("the task's Job runs in namespace %q (Secret %v), not the dispatcher's", j.Namespace, secret)
		}
		for _, e := range l.Task.Env {
			if len(e.ValueFrom) > 0 && string(e.ValueFrom) != "null" {
				t.Fatalf("env %s sends a valueFrom and was not refused", e.Name)
			}
		}
		raw, _ := json.Marshal(j)
		for _, v := range l.Task.SecretEnv {
			if len(v) >= 8 && strings.Contains(string(raw), v) {
				t.Fatalf("secret value %q is in the Job", v)
			}
		}
		for _, c := range j.Spec.Template.Spec.Containers {
			for _, e := range c.Env {
				if e.ValueFrom == nil {
					continue
				}
				if e.ValueFrom.SecretKeyRef == nil || secret == nil || e.ValueFrom.SecretKeyRef.Name != secret.Name || secret.Name != job.SecretName(j.Name) {
					t.Fatalf("env %s of the Job reads %+v, not the task's own Secret", e.Name, e.ValueFrom)
				}
			}
		}
	})
}

func TestPlainEnv(t *testing.T) {
	t.Parallel()
	var task Task
	if err := json.Unmarshal([]byte(`{"id":"t","env":[{"name":"A","value":"a"},{"name":"K","valueFrom":{"secretKeyRef":{"name":"aws","key":"k"}}}]}`), &task); err != nil {
		t.Fatal(err)
	}
	if err := plainEnv(task); !errors.Is(err, job.ErrEnvSource) || !strings.Contains(err.Error(), "env[1] (K): valueFrom is not part of the protocol") {
		t.Errorf("a task sending valueFrom: %v", err)
	}
	task.Env = task.Env[:1]
	if err := plainEnv(task); err != nil {
		t.Errorf("a task with plain values: %v", err)
	}
}

// A lease delivered again after its task ended, to a process that never
// held it (a new leader, a restart), finds the task's Job marked reported
// under that lease: the Job is the record, and no second Job is made. A
// new lease of the same task (another ID) is not taken for a duplicate.
func TestStartIgnoresALeaseItsJobRecordsAsEnded(t *testing.T) {
	t.Parallel()
	opts := job.Options{
		DispatcherID: "d-1",
		Template:     corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: "main", Image: "runner:1"}}}},
	}
	ended := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: job.Name("t-1"), Namespace: "runners", Labels: map[string]string{contract.LabelDispatcher: "d-1"}, Annotations: map[string]string{
		contract.TaskID: "t-1", AnnotationLeaseID: "l-1", AnnotationLeaseEpoch: "1", AnnotationReported: "true",
	}}, Status: batchv1.JobStatus{Conditions: []batchv1.JobCondition{{Type: batchv1.JobComplete, Status: corev1.ConditionTrue}}}} // finished, as a reported Job is (reportedMark)
	kube := fake.NewClientBuilder().WithObjects(ended).Build()
	s := New(Options{Kube: kube, Namespace: "runners", Jobs: opts})
	s.log = logr.Discard()
	l := Lease{LeaseID: "l-1", Epoch: 1, LeaseSeconds: 60, Task: Task{ID: "t-1", Command: []string{"true"}}}
	tk, _, _, _ := s.leases.take(l, s.clock.Now(), time.Minute, true)
	s.start(t.Context(), tk, l)
	var jobs batchv1.JobList
	if err := kube.List(t.Context(), &jobs); err != nil {
		t.Fatal(err)
	}
	if len(jobs.Items) != 1 || jobs.Items[0].Annotations[AnnotationReported] != "true" {
		t.Errorf("Jobs after the late lease: %+v, want the reported one alone, untouched", jobs.Items)
	}
	_, _, held := s.leases.held("t-1")
	remembered := s.leases.hasEnded("l-1")
	if held || !remembered {
		t.Errorf("task held %v, lease remembered as ended %v; want let go and remembered", held, remembered)
	}
	if !s.endedBefore(t.Context(), client.ObjectKeyFromObject(ended), l) {
		t.Error("the lease the Job was reported under is not seen as ended")
	}
	if s.endedBefore(t.Context(), client.ObjectKeyFromObject(ended), Lease{LeaseID: "l-2", Epoch: 2}) {
		t.Error("another lease of the task is seen as ended")
	}
}

// A new lease that arrives past its expiry by more than a poll wait is not
// started: its events would be refused, and the record of its task's end
// may be gone. One within that margin is.
func TestTakeIgnoresLeasesExpiredOnArrival(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 12, 0, 0, 0, time.UTC)
	s := New(Options{PollWait: 30 * time.Second, Options: runner.Options{Clock: testclock.NewFakeClock(now), Workers: 1}})
	s.log = logr.Discard()
	s.slots <- struct{}{} // no start runs: the test looks at what take holds
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	s.take(ctx, []Lease{
		{LeaseID: "l-1", Epoch: 1, LeaseSeconds: 60, ExpiresAt: now.Add(-31 * time.Second), Task: Task{ID: "t-1"}},
		{LeaseID: "l-2", Epoch: 1, LeaseSeconds: 60, ExpiresAt: now.Add(-29 * time.Second), Task: Task{ID: "t-2"}},
		{LeaseID: "l-3", Epoch: 1, LeaseSeconds: 60, ExpiresAt: now.Add(time.Minute), Task: Task{ID: "t-3"}},
	}, 10)
	_, _, _, held := s.leases.capacity(10, 100)
	slices.Sort(held)
	if diff := cmp.Diff([]string{"t-2", "t-3"}, held); diff != "" {
		t.Errorf("tasks taken (-want +got):\n%s", diff)
	}
}
