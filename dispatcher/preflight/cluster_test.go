package preflight

import (
	"context"
	"io"
	"maps"
	"strings"
	"sync"
	"testing"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/internal/clocktest"
)

// cluster is a fake API server for the preflight's Jobs: it gives each
// object a UID, as the API server does, tells the test of each Job made,
// and plays the Job controller as the test says (onJob).
type cluster struct {
	client.WithWatch
	// jobs receives each Job created, once it is stored.
	jobs chan *batchv1.Job
	// onJob, if set, runs as each Job is created: the Job controller's
	// answer (a pod, a warning event).
	onJob func(ctx context.Context, c client.WithWatch, j *batchv1.Job) error
	// onLook, if set, runs before the n-th list of pods (a look for the
	// Job's pod), n counted from 1.
	onLook func(ctx context.Context, c client.WithWatch, n int) error

	mu      sync.Mutex
	created int
	looks   int
}

func newCluster(t *testing.T) *cluster {
	t.Helper()
	cl := &cluster{jobs: make(chan *batchv1.Job, 16)}
	cl.WithWatch = fake.NewClientBuilder().
		WithStatusSubresource(&batchv1.Job{}).
		WithIndex(&corev1.Event{}, "involvedObject.name", func(o client.Object) []string {
			return []string{o.(*corev1.Event).InvolvedObject.Name}
		}).
		WithInterceptorFuncs(interceptor.Funcs{Create: cl.create, List: cl.list}).
		Build()
	return cl
}

func (cl *cluster) create(ctx context.Context, c client.WithWatch, o client.Object, opts ...client.CreateOption) error {
	if o.GetUID() == "" {
		o.SetUID(types.UID("uid-" + o.GetName()))
	}
	if err := c.Create(ctx, o, opts...); err != nil {
		return err
	}
	j, ok := o.(*batchv1.Job)
	if !ok {
		return nil
	}
	cl.mu.Lock()
	cl.created++
	cl.mu.Unlock()
	if cl.onJob != nil {
		if err := cl.onJob(ctx, c, j); err != nil {
			return err
		}
	}
	cl.jobs <- j.DeepCopy()
	return nil
}

func (cl *cluster) list(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
	if _, ok := list.(*corev1.PodList); ok {
		cl.mu.Lock()
		cl.looks++
		n := cl.looks
		cl.mu.Unlock()
		if cl.onLook != nil {
			if err := cl.onLook(ctx, c, n); err != nil {
				return err
			}
		}
	}
	return c.List(ctx, list, opts...)
}

// lookedAtPods is how many times the pods were listed.
func (cl *cluster) lookedAtPods() int {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.looks
}

// jobsMade is how many Jobs were created.
func (cl *cluster) jobsMade() int {
	cl.mu.Lock()
	defer cl.mu.Unlock()
	return cl.created
}

// noJobsLeft fails the test unless every Job made was deleted.
func (cl *cluster) noJobsLeft(t *testing.T) {
	t.Helper()
	var jobs batchv1.JobList
	if err := cl.List(t.Context(), &jobs); err != nil || len(jobs.Items) != 0 {
		t.Errorf("%d Jobs left (%v), want every throwaway Job deleted", len(jobs.Items), err)
	}
}

// nextJob is the next Job created, within a deadline.
func (cl *cluster) nextJob(t *testing.T) *batchv1.Job {
	t.Helper()
	select {
	case j := <-cl.jobs:
		return j
	case <-time.After(10 * time.Second):
		t.Fatal("no Job was created within 10 s")
		return nil
	}
}

// admit makes Job j's pod, as the Job controller does when admission lets
// it (job.IsPodOf counts it).
func admit(ctx context.Context, c client.Client, j *batchv1.Job) error {
	pod := &corev1.Pod{ObjectMeta: metav1.ObjectMeta{
		Name: j.Name + "-abcde", Namespace: j.Namespace,
		Labels:          map[string]string{batchv1.JobNameLabel: j.Name},
		OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: j.Name, UID: j.UID, Controller: ptr.To(true)}},
	}}
	maps.Copy(pod.Labels, j.Spec.Template.Labels)
	return c.Create(ctx, pod)
}

// warn records a FailedCreate warning event on Job j, as the Job
// controller does when it cannot make its pod.
func warn(ctx context.Context, c client.Client, j *batchv1.Job, msg string) error {
	return warnAbout(ctx, c, j, "Job", msg)
}

// warnAbout makes a FailedCreate warning about an object of kind with j's
// name and UID.
func warnAbout(ctx context.Context, c client.Client, j *batchv1.Job, kind, msg string) error {
	return c.Create(ctx, &corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: j.Name + "." + strings.ToLower(kind+"-"+string(j.UID)), Namespace: j.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: kind, Namespace: j.Namespace, Name: j.Name, UID: j.UID},
		Type:           corev1.EventTypeWarning, Reason: "FailedCreate", Message: msg,
	})
}

// jobOptions build Jobs from a template with a runner container.
func jobOptions() job.Options {
	return job.Options{DispatcherID: "d-1", Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
		Containers: []corev1.Container{{Name: job.RunnerContainer, Image: "runner:1"}},
	}}}
}

// start is a check (Run, TestRunner) running in the background; its
// error arrives on done.
type start struct {
	done chan error
}

func run(t *testing.T, check func(context.Context) error) *start {
	t.Helper()
	s := &start{done: make(chan error, 1)}
	go func() { s.done <- check(t.Context()) }()
	return s
}

// running fails the test if the check has returned.
func (s *start) running(t *testing.T, when string) {
	t.Helper()
	select {
	case err := <-s.done:
		t.Fatalf("%s: the check returned %v; want it still waiting", when, err)
	default:
	}
}

// result is what the check returned, within a deadline.
func (s *start) result(t *testing.T) error {
	t.Helper()
	select {
	case err := <-s.done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatal("the check did not return within 10 s")
		return nil
	}
}

// step steps clk by d once n timers wait on it: the check has made its
// next wait. Run waits on three while a Job's pod is looked for (its
// timeout, the Job's window, the next look) and on two between Jobs (its
// timeout, the next Job); TestRunner on two (its timeout, the next look).
func step(t *testing.T, clk *clocktest.Clock, n int, d time.Duration) {
	t.Helper()
	if err := clk.WaitForWaiters(n, 10*time.Second); err != nil {
		t.Fatal(err)
	}
	clk.Step(d)
}

// logs is a runner.LogReader that serves one log for every container.
type logs string

func (l logs) Follow(context.Context, string, string, string) (io.ReadCloser, error) {
	return io.NopCloser(strings.NewReader(string(l))), nil
}

func (l logs) Tail(context.Context, string, string, string, int) ([]byte, error) {
	return []byte(l), nil
}
