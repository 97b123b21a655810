package gitea

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"code.gitea.io/actions-proto-go/runner/v1/runnerv1connect"
	"connectrpc.com/connect"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/runner"
)

// instanceTask is one task of a Gitea instance, as sweep sees it.
type instanceTask struct {
	ours     bool
	result   runnerv1.Result
	rows     []string
	archived bool
	probes   int
}

// instanceServer is a Gitea instance's runner API over several tasks, as
// Gitea v1.26.0 answers UpdateTask and UpdateLog for a task ID: another
// runner's task is refused, an ID it does not hold is "resource does not
// exist", an ended task answers its result and changes no more, and an
// ended log takes no more rows.
type instanceServer struct {
	runnerv1connect.UnimplementedRunnerServiceHandler
	mu    sync.Mutex
	tasks map[int64]*instanceTask
}

func (s *instanceServer) task(id int64) (*instanceTask, error) {
	t, ok := s.tasks[id]
	switch {
	case !ok:
		return nil, errors.New("update task: resource does not exist")
	case !t.ours:
		return nil, errors.New("update task: invalid runner for task")
	}
	return t, nil
}

func (s *instanceServer) UpdateTask(_ context.Context, req *connect.Request[runnerv1.UpdateTaskRequest]) (*connect.Response[runnerv1.UpdateTaskResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := req.Msg.GetState()
	t, err := s.task(st.GetId())
	if err != nil {
		return nil, err
	}
	if st.GetResult() == runnerv1.Result_RESULT_UNSPECIFIED {
		t.probes++
	} else if t.result == runnerv1.Result_RESULT_UNSPECIFIED {
		t.result = st.GetResult()
	}
	return connect.NewResponse(&runnerv1.UpdateTaskResponse{State: &runnerv1.TaskState{Id: st.GetId(), Result: t.result}}), nil
}

func (s *instanceServer) UpdateLog(_ context.Context, req *connect.Request[runnerv1.UpdateLogRequest]) (*connect.Response[runnerv1.UpdateLogResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	t, err := s.task(req.Msg.GetTaskId())
	if err != nil {
		return nil, err
	}
	if t.archived {
		return nil, errors.New("update log: log file has been archived")
	}
	for _, r := range req.Msg.GetRows() {
		t.rows = append(t.rows, r.GetContent())
	}
	t.archived = req.Msg.GetNoMore()
	return connect.NewResponse(&runnerv1.UpdateLogResponse{AckIndex: int64(len(t.rows))}), nil
}

// TestSweepEndsTheTasksWithoutAJob: after a restart, the tasks Gitea
// handed this runner past its newest Job that have no Job (lost between
// FetchTask's answer and the Job's creation) are reported failed with the
// reason; another runner's tasks, ended ones and a hole among the IDs are
// left as they are, and sweep stops where Gitea holds no more tasks.
func TestSweepEndsTheTasksWithoutAJob(t *testing.T) {
	j, pod := finishedJob(t)
	j.Annotations[job.AnnotationReported] = "true"
	srv := &instanceServer{tasks: map[int64]*instanceTask{
		6:  {ours: true},
		7:  {ours: true, result: runnerv1.Result_RESULT_SUCCESS},
		8:  {},
		9:  {ours: true},
		10: {ours: true, result: runnerv1.Result_RESULT_SUCCESS},
		12: {ours: true},
		13: {},
	}}
	c := serveRunnerAPI(t, srv)
	kube := fake.NewClientBuilder().WithObjects(j, pod).Build()
	s := New(Options{Client: c, Kube: kube, Jobs: job.Options{DispatcherID: "d"}, Namespace: "runners", Logs: fileLogs("")})
	if err := s.restore(t.Context()); err != nil {
		t.Fatal(err)
	}
	if s.last != 7 {
		t.Fatalf("the newest Job's task: %d, want 7", s.last)
	}
	s.sweep(t.Context())
	for id, want := range map[int64]runnerv1.Result{6: runnerv1.Result_RESULT_UNSPECIFIED, 7: runnerv1.Result_RESULT_SUCCESS, 9: runnerv1.Result_RESULT_FAILURE, 10: runnerv1.Result_RESULT_SUCCESS, 12: runnerv1.Result_RESULT_FAILURE} {
		task := srv.tasks[id]
		if task.result != want {
			t.Errorf("task %d: %v, want %v", id, task.result, want)
		}
		lost := want == runnerv1.Result_RESULT_FAILURE
		if got := slices.ContainsFunc(task.rows, func(r string) bool { return r == lostLine }); got != lost || (!lost && len(task.rows) > 0) {
			t.Errorf("task %d's log: %q; want the lost job's line: %v", id, task.rows, lost)
		}
	}
	if srv.tasks[6].probes != 0 {
		t.Errorf("task 6, before the newest Job's, was asked about %d times", srv.tasks[6].probes)
	}

	// A dispatcher with no Job asks nothing: it has no ID to start from.
	srv.tasks[14] = &instanceTask{ours: true}
	empty := New(Options{Client: c, Kube: fake.NewClientBuilder().Build(), Jobs: job.Options{DispatcherID: "d"}, Namespace: "runners", Logs: fileLogs("")})
	if err := empty.restore(t.Context()); err != nil {
		t.Fatal(err)
	}
	empty.sweep(t.Context())
	if task := srv.tasks[14]; task.probes != 0 || task.result != runnerv1.Result_RESULT_UNSPECIFIED {
		t.Errorf("with no Job, task 14 was asked about %d times, result %v", task.probes, task.result)
	}
}

// TestRestoreEndsAJobMadeBeforeItsPlan: a Job made awaiting its Secret
// (the job's plan) and never resumed, as when the dispatcher stopped
// between the two, cannot run: Gitea gave the plan once. A restart reports
// its task failed saying so and deletes the Job, rather than report a
// suspended Job as running for ever. The mark on a Job that is not
// suspended is not believed: that Job is taken up as any other.
func TestRestoreEndsAJobMadeBeforeItsPlan(t *testing.T) {
	j, _ := finishedJob(t)
	j.Status = batchv1.JobStatus{}
	j.Spec.Suspend = ptr.To(true)
	j.Annotations[job.AnnotationAwaitingSecret] = "true"
	srv := &instanceServer{tasks: map[int64]*instanceTask{7: {ours: true}}}
	c := serveRunnerAPI(t, srv)
	kube := fake.NewClientBuilder().WithObjects(j).Build()
	s := New(Options{Client: c, Kube: kube, Jobs: job.Options{DispatcherID: "d"}, Namespace: "runners", Logs: fileLogs("")})
	if err := s.restore(t.Context()); err != nil {
		t.Fatal(err)
	}
	if task := srv.tasks[7]; task.result != runnerv1.Result_RESULT_FAILURE || !slices.Contains(task.rows, unstoredLine) {
		t.Errorf("task 7: %v, log %q; want failed with the reason", task.result, task.rows)
	}
	if err := kube.Get(t.Context(), client.ObjectKeyFromObject(j), &batchv1.Job{}); !apierrors.IsNotFound(err) {
		t.Errorf("the Job made before its plan: %v, want it deleted", err)
	}
	if s.free() == 0 || s.last != 7 {
		t.Errorf("free %d, last %d: want no slot held, the sweep to start past task 7", s.free(), s.last)
	}
	// Again, as after a restart between the report and the deletion:
	// Gitea keeps the first result and the archived log.
	if err := kube.Create(t.Context(), func() *batchv1.Job { c := j.DeepCopy(); c.ResourceVersion = ""; return c }()); err != nil {
		t.Fatal(err)
	}
	if err := s.restore(t.Context()); err != nil {
		t.Fatal(err)
	}
	if n := len(srv.tasks[7].rows); n != 1 {
		t.Errorf("task 7's log has %d rows after a second report, want 1", n)
	}

	// Resumed (not suspended), the mark is not believed.
	resumed, _ := finishedJob(t)
	resumed.Annotations[job.AnnotationAwaitingSecret] = "true"
	kube = fake.NewClientBuilder().WithObjects(resumed).Build()
	s = New(Options{Client: c, Kube: kube, Jobs: job.Options{DispatcherID: "d"}, Namespace: "runners", Logs: fileLogs("")})
	if err := s.restore(t.Context()); err != nil {
		t.Fatal(err)
	}
	if err := kube.Get(t.Context(), client.ObjectKeyFromObject(resumed), &batchv1.Job{}); err != nil {
		t.Errorf("a resumed Job with the mark: %v, want it kept", err)
	}
}

// TestRestoreHoldsTheSlotOfAJobBeingDeleted: a Job being deleted (a
// foreground deletion keeps it while its pod stops, and the pod may run
// meanwhile) holds its task's slot after a restart until it is gone, as
// with the other sources; then its task is reported failed, deleted before
// it finished, and the slot frees.
func TestRestoreHoldsTheSlotOfAJobBeingDeleted(t *testing.T) {
	j, pod := finishedJob(t)
	j.Status = batchv1.JobStatus{Active: 1}
	j.DeletionTimestamp = ptr.To(metav1.Now())
	j.Finalizers = []string{metav1.FinalizerDeleteDependents}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
		Name: job.RunnerContainer, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
	}}}
	srv := &instanceServer{tasks: map[int64]*instanceTask{7: {ours: true}}}
	c := serveRunnerAPI(t, srv)
	kube := fake.NewClientBuilder().WithObjects(j, pod).Build()
	s := New(Options{Client: c, Kube: kube, Jobs: job.Options{DispatcherID: "d"}, Namespace: "runners", Logs: fileLogs(""),
		ReportInterval: 10 * time.Millisecond, Options: runner.Options{MaxConcurrent: 1}})
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	if err := s.restore(ctx); err != nil {
		t.Fatal(err)
	}
	if n := s.free(); n != 0 {
		t.Errorf("%d slots free while the Job being deleted is there, want 0", n)
	}
	var gone batchv1.Job
	if err := kube.Get(ctx, client.ObjectKeyFromObject(j), &gone); err != nil {
		t.Fatal(err)
	}
	gone.Finalizers = nil
	if err := kube.Update(ctx, &gone); err != nil {
		t.Fatal(err)
	}
	s.goroutines.Wait()
	if ctx.Err() != nil {
		t.Fatal("the report did not end once the Job was gone")
	}
	if got := srv.tasks[7].result; got != runnerv1.Result_RESULT_FAILURE {
		t.Errorf("task 7: %v, want failed (its Job deleted before it finished)", got)
	}
	if n := s.free(); n != 1 {
		t.Errorf("%d slots free once the Job is gone, want 1", n)
	}
}
