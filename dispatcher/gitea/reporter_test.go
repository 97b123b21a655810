package gitea

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"code.gitea.io/actions-proto-go/runner/v1/runnerv1connect"
	"connectrpc.com/connect"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/runner"
	"github.com/runwarden/runwarden/internal/clocktest"
	"github.com/runwarden/runwarden/internal/contract"
)

// taskServer is Gitea's side of one task as its runner API keeps it
// (routers/api/actions/runner of Gitea v1.26.0): the rows acknowledged,
// the log archived by no_more, the state final once a result came.
type taskServer struct {
	runnerv1connect.UnimplementedRunnerServiceHandler
	mu       sync.Mutex
	rows     []string
	archived bool
	result   runnerv1.Result
	steps    []*runnerv1.StepState
	outputs  map[string]string
	finals   int
	// loseFinal drops the answer to the first final UpdateTask, stored.
	loseFinal bool
	// gone answers every call as Gitea does once the task's run was
	// deleted.
	gone bool
	// down fails UpdateLog calls (logDown) or UpdateTask calls (taskDown)
	// as a Gitea whose database is away.
	logDown, taskDown bool
	// batches are the row counts of the UpdateLog calls.
	batches []int
	// onLog, when set, is called with each UpdateLog call's rows.
	onLog func(rows []*runnerv1.LogRow)
}

var errGone = errors.New("rpc error: code = Internal desc = update task: resource does not exist")

func (s *taskServer) UpdateLog(_ context.Context, req *connect.Request[runnerv1.UpdateLogRequest]) (*connect.Response[runnerv1.UpdateLogResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return nil, errGone
	}
	if s.logDown {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the database is away"))
	}
	ack := int64(len(s.rows))
	m := req.Msg
	s.batches = append(s.batches, len(m.Rows))
	if s.onLog != nil {
		s.onLog(m.Rows)
	}
	if len(m.Rows) == 0 || m.Index > ack || m.Index+int64(len(m.Rows)) <= ack {
		return connect.NewResponse(&runnerv1.UpdateLogResponse{AckIndex: ack}), nil
	}
	if s.archived {
		return nil, errors.New("rpc error: code = AlreadyExists desc = log file has been archived")
	}
	for _, r := range m.Rows[ack-m.Index:] {
		s.rows = append(s.rows, r.GetContent())
	}
	s.archived = m.NoMore
	return connect.NewResponse(&runnerv1.UpdateLogResponse{AckIndex: int64(len(s.rows))}), nil
}

func (s *taskServer) UpdateTask(_ context.Context, req *connect.Request[runnerv1.UpdateTaskRequest]) (*connect.Response[runnerv1.UpdateTaskResponse], error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.gone {
		return nil, errGone
	}
	if s.taskDown {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the database is away"))
	}
	st := req.Msg.GetState()
	if s.result == runnerv1.Result_RESULT_UNSPECIFIED {
		s.steps = st.GetSteps()
		if st.GetResult() != runnerv1.Result_RESULT_UNSPECIFIED {
			s.result = st.GetResult()
			s.finals++
			for k, v := range req.Msg.GetOutputs() {
				if _, ok := s.outputs[k]; !ok {
					s.outputs[k] = v
				}
			}
			if s.loseFinal {
				s.loseFinal = false
				return nil, errors.New("the answer was lost")
			}
		}
	}
	return connect.NewResponse(&runnerv1.UpdateTaskResponse{State: &runnerv1.TaskState{Id: st.GetId(), Result: s.result}}), nil
}

type fileLogs string

func (f fileLogs) Follow(context.Context, string, string, string) (io.ReadCloser, error) {
	return io.NopCloser(strings.NewReader(string(f))), nil
}

func (f fileLogs) Tail(context.Context, string, string, string, int) ([]byte, error) {
	return []byte(f), nil
}

const testMarker = "::runwarden-test::"

// finishedJob is task 7's Job as Build makes it, finished with its pod's
// runner exiting 0.
func finishedJob(t *testing.T) (*batchv1.Job, *corev1.Pod) {
	t.Helper()
	opts := job.Options{DispatcherID: "d", Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: job.RunnerContainer, Image: "runner"}}}}}
	j, _, err := job.Build(job.Task{ID: taskID(7), Namespace: "runners"}, opts)
	if err != nil {
		t.Fatal(err)
	}
	record{Task: 7, Steps: 2, Marker: testMarker}.annotate(j)
	now := metav1.Now()
	j.UID = "job-uid"
	j.Status = batchv1.JobStatus{StartTime: &now, CompletionTime: &now, Succeeded: 1, Conditions: []batchv1.JobCondition{
		{Type: batchv1.JobSuccessCriteriaMet, Status: corev1.ConditionTrue},
		{Type: batchv1.JobComplete, Status: corev1.ConditionTrue},
	}}
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: j.Name + "-abcde", Namespace: j.Namespace,
			Labels:          map[string]string{batchv1.JobNameLabel: j.Name, contract.LabelRunner: "true", contract.TaskID: j.Labels[contract.TaskID]},
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: j.Name, UID: j.UID, Controller: ptr.To(true)}},
		},
		Status: corev1.PodStatus{Phase: corev1.PodSucceeded, ContainerStatuses: []corev1.ContainerStatus{{
			Name: job.RunnerContainer, Image: "runner@sha256:aa", ImageID: "docker.io/library/runner@sha256:aa",
			State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}},
		}}},
	}
	return j, pod
}

// reportFixture is a cluster holding j and its pod, and a client of srv
// as Gitea's runner API.
func reportFixture(t *testing.T, srv *taskServer, j *batchv1.Job, pod *corev1.Pod) (client.Client, *Client) {
	t.Helper()
	kube := fake.NewClientBuilder().WithObjects(j, pod).WithStatusSubresource(j).
		WithIndex(&corev1.Event{}, "involvedObject.name", func(o client.Object) []string { return []string{o.(*corev1.Event).InvolvedObject.Name} }).Build()
	return kube, serveRunnerAPI(t, srv)
}

// serveRunnerAPI serves srv as Gitea's runner API until the test ends and
// returns a registered runner's client of it.
func serveRunnerAPI(t *testing.T, srv runnerv1connect.RunnerServiceHandler) *Client {
	t.Helper()
	path, h := runnerv1connect.NewRunnerServiceHandler(srv)
	mux := http.NewServeMux()
	mux.Handle("/api/actions"+path, http.StripPrefix("/api/actions", h))
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)
	c := NewClient(hs.Client(), hs.URL)
	c.SetIdentity(Identity{UUID: "u", Token: "t"})
	return c
}

// TestReportAfterRestartsInTheFinalUpdate: a task's report is sent once
// whatever stops it. The first reporter's final UpdateTask is stored at
// Gitea but its answer lost; it tries again and Gitea answers with the
// result it holds. A second reporter, as after a restart before the Job
// was marked, reads the whole log again: Gitea keeps its rows once, its
// archived log refuses nothing it already has, and the result stays the
// first.
func TestReportAfterRestartsInTheFinalUpdate(t *testing.T) {
	j, pod := finishedJob(t)
	srv := &taskServer{outputs: map[string]string{}, loseFinal: true}
	kube, c := reportFixture(t, srv, j, pod)
	log := strings.Join([]string{
		"setting up",
		testMarker + ` {"kind":"start","step":0}`,
		"one",
		testMarker + ` {"kind":"end","step":0,"result":"success","outcome":"success"}`,
		testMarker + ` {"kind":"start","step":1}`,
		"two",
		testMarker + ` {"kind":"end","step":1,"result":"success","outcome":"success"}`,
		testMarker + ` {"kind":"outputs","outputs":{"out":"ok"}}`,
		testMarker + ` {"kind":"job","result":"success"}`,
	}, "\n") + "\n"
	s := New(Options{Options: runner.Options{}, Client: c, Kube: kube, Jobs: job.Options{DispatcherID: "d"}, Namespace: "runners",
		ReportInterval: 10 * time.Millisecond, Logs: fileLogs(log)})
	rec, err := readRecord(j)
	if err != nil {
		t.Fatal(err)
	}
	report := func() {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		defer cancel()
		r := &reporter{s: s, rec: rec, key: client.ObjectKeyFromObject(j), log: s.log}
		r.run(ctx)
		if ctx.Err() != nil {
			t.Fatal("the report did not end")
		}
	}
	report()
	// As after a restart between the final report and the mark.
	if err := kube.Patch(t.Context(), j, client.RawPatch("application/merge-patch+json", []byte(`{"metadata":{"annotations":{"runwarden.dev/reported":null}}}`))); err != nil {
		t.Fatal(err)
	}
	report()

	srv.mu.Lock()
	defer srv.mu.Unlock()
	// The log's lines, then the record: the pod, and its containers'
	// images as the node ran them.
	want := "setting up|one|two|runwarden: record: pod " + pod.Name + " on node (none); template " + j.Annotations[job.AnnotationTemplateDigest] +
		"; pod spec (not recorded: no runwarden webhook admitted it); policies (none)|runwarden: record: container main ran runner@sha256:aa (docker.io/library/runner@sha256:aa)"
	if got := strings.Join(srv.rows, "|"); got != want {
		t.Errorf("Gitea's rows:\n%s\nwant each line once:\n%s", got, want)
	}
	if srv.result != runnerv1.Result_RESULT_SUCCESS || srv.finals != 1 || srv.outputs["out"] != "ok" || !srv.archived {
		t.Errorf("Gitea holds %v (%d finals), outputs %v, archived %v", srv.result, srv.finals, srv.outputs, srv.archived)
	}
	if len(srv.steps) != 2 || srv.steps[0].GetLogIndex() != 1 || srv.steps[0].GetLogLength() != 1 || srv.steps[1].GetLogIndex() != 2 || srv.steps[1].GetResult() != runnerv1.Result_RESULT_SUCCESS {
		t.Errorf("Gitea's steps: %v", srv.steps)
	}
	var got batchv1.Job
	if err := kube.Get(t.Context(), client.ObjectKeyFromObject(j), &got); err != nil || got.Annotations[job.AnnotationReported] == "" {
		t.Errorf("the Job is not marked reported (%v): %v", err, got.Annotations)
	}
}

// TestReportOfALongLog: a step's 12,345 lines reach Gitea once each, in
// UpdateLog calls of at most maxBatch rows, the last ending the log; the
// reporter keeps none of the rows Gitea acknowledged, and the step's rows
// are counted from its start.
func TestReportOfALongLog(t *testing.T) {
	j, pod := finishedJob(t)
	srv := &taskServer{outputs: map[string]string{}}
	kube, c := reportFixture(t, srv, j, pod)
	const n = 12345
	lines := []string{testMarker + ` {"kind":"start","step":0}`}
	for i := range n {
		lines = append(lines, fmt.Sprintf("line %d", i))
	}
	lines = append(lines, testMarker+` {"kind":"end","step":0,"result":"success","outcome":"success"}`, testMarker+` {"kind":"job","result":"success"}`)
	s := New(Options{Client: c, Kube: kube, Jobs: job.Options{DispatcherID: "d"}, Namespace: "runners",
		ReportInterval: time.Hour, Logs: fileLogs(strings.Join(lines, "\n") + "\n")})
	rec, err := readRecord(j)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	r := &reporter{s: s, rec: rec, key: client.ObjectKeyFromObject(j), log: s.log}
	r.run(ctx)
	if ctx.Err() != nil {
		t.Fatal("the report did not end")
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	// The lines, then the record's two.
	if len(srv.rows) != n+2 || srv.rows[0] != "line 0" || srv.rows[n-1] != fmt.Sprintf("line %d", n-1) || !srv.archived {
		t.Errorf("Gitea holds %d rows (archived %v), want %d lines and the record's 2", len(srv.rows), srv.archived, n)
	}
	for _, b := range srv.batches {
		if b > maxBatch {
			t.Errorf("an UpdateLog call of %d rows, more than %d: batches %v", b, maxBatch, srv.batches)
		}
	}
	if len(srv.batches) < 3 {
		t.Errorf("batches %v: want the rows in at least 3 calls", srv.batches)
	}
	if l := r.steps; len(l.rows) != 0 || l.count() != n+2 {
		t.Errorf("the reporter keeps %d rows of %d, want none once Gitea holds them", len(l.rows), l.count())
	}
	if len(srv.steps) != 2 || srv.steps[0].GetLogIndex() != 0 || srv.steps[0].GetLogLength() != n {
		t.Errorf("Gitea's step: %v, want its %d rows from index 0", srv.steps, n)
	}
}

// TestReportOfATaskGoneAtGitea: a task whose run was deleted at Gitea is
// answered "does not exist" for ever; its report ends and its Job, still
// running, is deleted rather than hold a slot for ever.
func TestReportOfATaskGoneAtGitea(t *testing.T) {
	j, pod := finishedJob(t)
	j.Status = batchv1.JobStatus{Active: 1}
	pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
		Name: job.RunnerContainer, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
	}}}
	srv := &taskServer{outputs: map[string]string{}, gone: true}
	kube, c := reportFixture(t, srv, j, pod)
	rc := &countingRecorder{}
	s := New(Options{Client: c, Kube: kube, Jobs: job.Options{DispatcherID: "d"}, Namespace: "runners",
		ReportInterval: 10 * time.Millisecond, Logs: fileLogs("one\n"), Recorder: rc})
	rec, err := readRecord(j)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	(&reporter{s: s, rec: rec, key: client.ObjectKeyFromObject(j), log: s.log}).run(ctx)
	if ctx.Err() != nil {
		t.Fatal("the report did not end")
	}
	if err := kube.Get(t.Context(), client.ObjectKeyFromObject(j), &batchv1.Job{}); err == nil {
		t.Error("the Job of a task gone at Gitea is still there")
	}
	// Gitea's answer, not a failure to reach it: no source error.
	rc.mu.Lock()
	defer rc.mu.Unlock()
	if len(rc.errors) != 0 {
		t.Errorf("source errors %v for a task gone at Gitea, want none", rc.errors)
	}
}

// TestReportHoldsABoundedLog: a job printing 18 MiB in long lines, faster
// than Gitea takes them, does not grow the dispatcher: the log's reader
// holds at most 4 MiB of rows Gitea does not hold (maxHeld, and one line
// more) and waits for Gitea to take some, each UpdateLog call carries at
// most maxBatchBytes, and every line reaches Gitea once, in order, both
// while the Job runs (the rows sent as the reader fills, not at the next
// report, an hour away) and once it is over.
func TestReportHoldsABoundedLog(t *testing.T) {
	const n = 300
	var log strings.Builder
	for i := range n {
		fmt.Fprintf(&log, "%04d %s\n", i, strings.Repeat("x", 60<<10))
	}
	for _, running := range []bool{true, false} {
		t.Run(map[bool]string{true: "running", false: "finished"}[running], func(t *testing.T) {
			j, pod := finishedJob(t)
			if running {
				j.Status = batchv1.JobStatus{Active: 1}
				pod.Status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
					Name: job.RunnerContainer, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
				}}}
			}
			srv := &taskServer{outputs: map[string]string{}}
			kube, c := reportFixture(t, srv, j, pod)
			s := New(Options{Client: c, Kube: kube, Jobs: job.Options{DispatcherID: "d"}, Namespace: "runners",
				ReportInterval: time.Hour, Logs: fileLogs(log.String())})
			rec, err := readRecord(j)
			if err != nil {
				t.Fatal(err)
			}
			r := &reporter{s: s, rec: rec, key: client.ObjectKeyFromObject(j), log: s.log}
			ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
			defer cancel()
			allIn := make(chan struct{})
			var most, biggest, seen int
			srv.onLog = func(rows []*runnerv1.LogRow) {
				r.mu.Lock()
				most = max(most, r.steps.size)
				r.mu.Unlock()
				size := 0
				for _, row := range rows {
					size += rowSize(row)
				}
				if len(rows) > 1 {
					biggest = max(biggest, size)
				}
				if seen += len(rows); seen >= n && running {
					// The rows are held once this call returns.
					defer cancel()
					close(allIn)
				}
			}
			r.run(ctx)
			if running {
				select {
				case <-allIn:
				default:
					t.Fatalf("the report ended with %d of %d lines at Gitea", seen, n)
				}
			} else if ctx.Err() != nil {
				t.Fatal("the report did not end")
			}
			srv.mu.Lock()
			defer srv.mu.Unlock()
			if len(srv.rows) < n {
				t.Fatalf("Gitea holds %d rows, want %d", len(srv.rows), n)
			}
			for i := range n {
				if !strings.HasPrefix(srv.rows[i], fmt.Sprintf("%04d x", i)) {
					t.Fatalf("row %d is %.10q", i, srv.rows[i])
				}
			}
			// 4 MiB as docs/gitea.md says, and the line read past it.
			if limit := 4<<20 + maxRow + rowOverhead; most > limit {
				t.Errorf("the reporter held %d bytes of rows Gitea did not hold, more than %d", most, limit)
			}
			if biggest > maxBatchBytes {
				t.Errorf("an UpdateLog call of %d bytes of rows, more than %d", biggest, maxBatchBytes)
			}
		})
	}
}

// countingRecorder keeps what the source counts.
type countingRecorder struct {
	noRecorder
	mu       sync.Mutex
	started  []time.Duration
	ran      []string
	finished []string
	errors   []string
	polled   int
	// counted is signalled after each count, when made.
	counted chan struct{}
}

func (c *countingRecorder) signal() {
	if c.counted != nil {
		select {
		case c.counted <- struct{}{}:
		default:
		}
	}
}

func (c *countingRecorder) Started(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.started = append(c.started, d)
}

func (c *countingRecorder) Ran(phase string, d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.ran = append(c.ran, phase+" "+d.String())
}

func (c *countingRecorder) Finished(phase, reason string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.finished = append(c.finished, phase+" "+reason)
}

func (c *countingRecorder) SourceError(op string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.errors = append(c.errors, op)
	c.signal()
}

func (c *countingRecorder) Polled(time.Time) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.polled++
	c.signal()
}

// TestReportCountsTheRunnersWaitAndRun: the histograms every source feeds
// (package metrics), from the Gitea source's report rounds: the wait from
// the Job's creation to its runner seen running, and the run from then to
// the report of its end, each once, though the Job's settling fails and
// its end is reported again; a reporter that first meets the runner
// running (as after a restart) counts neither.
func TestReportCountsTheRunnersWaitAndRun(t *testing.T) {
	finished, donePod := finishedJob(t)
	created := time.Date(2026, 11, 29, 10, 0, 0, 0, time.UTC)
	finished.CreationTimestamp = metav1.NewTime(created)
	pending := finished.DeepCopy()
	pending.Status = batchv1.JobStatus{Active: 1}
	pendingPod := donePod.DeepCopy()
	pendingPod.Status = corev1.PodStatus{Phase: corev1.PodPending}
	runningPod := donePod.DeepCopy()
	runningPod.Status = corev1.PodStatus{Phase: corev1.PodRunning, ContainerStatuses: []corev1.ContainerStatus{{
		Name: job.RunnerContainer, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}},
	}}}
	srv := &taskServer{outputs: map[string]string{}}
	kube, c := reportFixture(t, srv, pending, pendingPod)
	// The Job's settling (its reported mark) fails once: the end is sent
	// again and must not be counted again.
	failOnce := true
	kube = interceptor.NewClient(kube.(client.WithWatch), interceptor.Funcs{
		Patch: func(ctx context.Context, cl client.WithWatch, obj client.Object, patch client.Patch, opts ...client.PatchOption) error {
			if _, ok := obj.(*batchv1.Job); ok && failOnce {
				failOnce = false
				return errors.New("the API server is away")
			}
			return cl.Patch(ctx, obj, patch, opts...)
		},
	})
	clk := clocktest.New(created.Add(5 * time.Second))
	rc := &countingRecorder{}
	s := New(Options{Options: runner.Options{Clock: clk}, Client: c, Kube: kube, Jobs: job.Options{DispatcherID: "d"}, Namespace: "runners",
		ReportInterval: time.Hour, Logs: fileLogs("one\n"), Recorder: rc})
	rec, err := readRecord(finished)
	if err != nil {
		t.Fatal(err)
	}
	r := &reporter{s: s, rec: rec, key: client.ObjectKeyFromObject(finished), log: s.log}
	r.flush, r.room = make(chan struct{}, 1), make(chan struct{}, 1)
	r.steps = newStepLog(rec.Marker, rec.Steps)
	round := func(want bool) {
		t.Helper()
		done, err := r.round(t.Context())
		if done != want {
			t.Fatalf("round: done %v (%v), want %v", done, err, want)
		}
	}
	setPod := func(p *corev1.Pod) {
		t.Helper()
		if err := kube.Status().Update(t.Context(), p); err != nil {
			t.Fatal(err)
		}
	}
	round(false) // waiting
	setPod(runningPod)
	round(false) // running, 5s after the Job's creation
	round(false)
	clk.Step(7 * time.Second)
	setPod(donePod)
	cur := &batchv1.Job{}
	if err := kube.Get(t.Context(), client.ObjectKeyFromObject(finished), cur); err != nil {
		t.Fatal(err)
	}
	cur.Status = finished.Status
	if err := kube.Status().Update(t.Context(), cur); err != nil {
		t.Fatal(err)
	}
	round(false) // the end reported, its settling failed
	round(true)  // the end reported again, settled

	restarted := &reporter{s: s, rec: rec, key: client.ObjectKeyFromObject(finished), log: s.log}
	restarted.seen(cur, job.Outcome{Running: true})

	rc.mu.Lock()
	defer rc.mu.Unlock()
	got := fmt.Sprint(rc.started, rc.ran, rc.finished)
	if want := fmt.Sprint([]time.Duration{5 * time.Second}, []string{"Succeeded 7s"}, []string{"Succeeded Completed"}); got != want {
		t.Errorf("counted %s, want %s", got, want)
	}
}

// TestReportCountsGiteasFailures: a log or report call Gitea fails counts
// as a source error of its kind, the one that failed.
func TestReportCountsGiteasFailures(t *testing.T) {
	for _, tt := range []struct {
		logDown, taskDown bool
		want              string
	}{{logDown: true, want: "log"}, {taskDown: true, want: "report"}} {
		j, pod := finishedJob(t)
		srv := &taskServer{outputs: map[string]string{}, logDown: tt.logDown, taskDown: tt.taskDown}
		kube, c := reportFixture(t, srv, j, pod)
		rc := &countingRecorder{}
		s := New(Options{Client: c, Kube: kube, Jobs: job.Options{DispatcherID: "d"}, Namespace: "runners",
			ReportInterval: time.Hour, Logs: fileLogs("one\n"), Recorder: rc})
		rec, err := readRecord(j)
		if err != nil {
			t.Fatal(err)
		}
		r := &reporter{s: s, rec: rec, key: client.ObjectKeyFromObject(j), log: s.log}
		r.flush, r.room = make(chan struct{}, 1), make(chan struct{}, 1)
		r.steps = newStepLog(rec.Marker, rec.Steps)
		if done, err := r.round(t.Context()); done || err == nil {
			t.Fatalf("a round with Gitea down: done %v, %v", done, err)
		}
		rc.mu.Lock()
		// One for each call that failed (the log's end is sent as soon as
		// it is read, and again with the result).
		if len(rc.errors) == 0 || slices.ContainsFunc(rc.errors, func(op string) bool { return op != tt.want }) || len(rc.finished) != 0 {
			t.Errorf("Gitea failing (log %v, task %v): source errors %v, finished %v; want only %s, none finished", tt.logDown, tt.taskDown, rc.errors, rc.finished, tt.want)
		}
		rc.mu.Unlock()
	}
}

// pollServer answers FetchTask with no task, or fails every call.
type pollServer struct {
	runnerv1connect.UnimplementedRunnerServiceHandler
	fail bool
}

func (s pollServer) FetchTask(context.Context, *connect.Request[runnerv1.FetchTaskRequest]) (*connect.Response[runnerv1.FetchTaskResponse], error) {
	if s.fail {
		return nil, connect.NewError(connect.CodeUnavailable, errors.New("the database is down"))
	}
	return connect.NewResponse(&runnerv1.FetchTaskResponse{TasksVersion: 3}), nil
}

// TestFetchLoopCounts: Gitea's answers to FetchTask are what the
// dispatcher's last-poll gauge shows, its failures what the source-errors
// counter (and its alert) counts as fetch.
func TestFetchLoopCounts(t *testing.T) {
	for _, fail := range []bool{false, true} {
		rc := &countingRecorder{counted: make(chan struct{}, 1)}
		s := New(Options{Client: serveRunnerAPI(t, pollServer{fail: fail}), Kube: fake.NewClientBuilder().Build(), Jobs: job.Options{DispatcherID: "d"},
			Namespace: "runners", FetchInterval: time.Millisecond, Logs: fileLogs(""), Recorder: rc})
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- s.fetchLoop(ctx) }()
		counted := func() bool {
			rc.mu.Lock()
			defer rc.mu.Unlock()
			return len(rc.errors) >= 3 || rc.polled >= 3
		}
		timeout := time.After(10 * time.Second)
		for !counted() {
			select {
			case <-timeout:
				t.Fatalf("failing %v: not counted in 10s", fail)
			case err := <-done:
				t.Fatalf("the fetch loop ended: %v", err)
			case <-rc.counted:
			}
		}
		cancel()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		rc.mu.Lock()
		if fail && (rc.polled != 0 || slices.ContainsFunc(rc.errors, func(op string) bool { return op != "fetch" })) ||
			!fail && len(rc.errors) != 0 {
			t.Errorf("failing %v: polled %d, errors %v", fail, rc.polled, rc.errors)
		}
		rc.mu.Unlock()
	}
}

// TestReportOfAJobOfItsNameMadeByAnother: a Job the cache does not hold,
// read from the API server under the task's Job's name, is the task's only
// if it is this dispatcher's runner Job of the task. One someone made
// there after the task's Job was deleted is not followed (the task would
// never be reported, its slot held, and a cancel would delete the other's
// Job): the task's Job was deleted before it finished.
func TestReportOfAJobOfItsNameMadeByAnother(t *testing.T) {
	own, _ := finishedJob(t)
	own.Status = batchv1.JobStatus{}
	other := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: own.Name, Namespace: own.Namespace, UID: "other",
		Annotations: map[string]string{contract.TaskID: taskID(7)}}}
	labelled := other.DeepCopy()
	labelled.Labels = map[string]string{contract.LabelDispatcher: "d"}
	for _, tt := range []struct {
		name string
		live *batchv1.Job
		// ours is whether the Job read is taken for the task's.
		ours bool
	}{
		{name: "the task's own Job, not in the cache yet", live: own, ours: true},
		{name: "another's Job of the name", live: other},
		{name: "another's Job of the name with the dispatcher's label", live: labelled},
	} {
		t.Run(tt.name, func(t *testing.T) {
			s := New(Options{Kube: fake.NewClientBuilder().Build(), Reader: fake.NewClientBuilder().WithObjects(tt.live.DeepCopy()).Build(),
				Jobs: job.Options{DispatcherID: "d"}, Namespace: "runners"})
			rec, err := readRecord(own)
			if err != nil {
				t.Fatal(err)
			}
			j, out, err := (&reporter{s: s, rec: rec, key: client.ObjectKeyFromObject(own), log: s.log}).outcome(t.Context())
			if err != nil {
				t.Fatal(err)
			}
			if tt.ours {
				if j == nil || j.UID != own.UID || out.Phase != "" {
					t.Errorf("the task's own Job read past the cache: %v, %+v; want it, no outcome yet", j, out)
				}
				return
			}
			if j != nil || out.Phase != job.PhaseFailed || !strings.Contains(out.Message, "deleted before it finished") {
				t.Errorf("another's Job of the name: %v, %+v; want none, the task failed as deleted", j, out)
			}
		})
	}
}
