package gitea

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/clock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/runner"
	"github.com/runwarden/runwarden/internal/contract"
	"github.com/runwarden/runwarden/internal/steps"
)

// Options configure a Source.
type Options struct {
	// Options are the limits every source shares (package runner):
	// MaxConcurrent bounds the tasks taken at once.
	runner.Options
	// Client speaks Gitea's runner protocol. Required.
	Client *Client
	// Kube reads (from the manager's label-filtered cache) and writes the
	// cluster. Required.
	Kube client.Client
	// Reader reads the API server directly: the runner identity's Secret,
	// Warning events, a Job the cache has not seen. Default: Kube.
	Reader client.Reader
	// Jobs says how Jobs are built, with the dispatcher's pod template.
	// Required.
	Jobs job.Options
	// StepsImage is the image of the steps program's init container (the
	// dispatcher's): each job's template is shaped with it (PodTemplate).
	// Required.
	StepsImage string
	// Templates are the PodTemplate objects of runs-on labels that do not
	// run with the dispatcher's template; each is read when a job is
	// taken.
	Templates map[string]types.NamespacedName
	// Namespace is where the Jobs run. Required.
	Namespace string
	// Labels are the runner labels declared to Gitea: it hands this runner
	// the jobs whose runs-on labels are all among them. Those without a
	// template in Templates run with the dispatcher's. Required.
	Labels []string
	// Identity is the Secret that keeps the runner's registration.
	// Required.
	Identity types.NamespacedName
	// RunnerName is the name the runner registers under. Required.
	RunnerName string
	// RegistrationToken reads Gitea's runner registration token, needed
	// only while no identity is kept.
	RegistrationToken func() (string, error)
	// FetchInterval is how often Gitea is asked for a task while a slot
	// is free. Default: 2s.
	FetchInterval time.Duration
	// ReportInterval is how often a task's log and steps are sent to
	// Gitea, which is also when the dispatcher learns that the task was
	// cancelled. Default: 3s.
	ReportInterval time.Duration
	// RunForkPullRequests runs the jobs of pull requests Gitea gives no
	// secrets (untrustedPullRequest); without it they are refused.
	RunForkPullRequests bool
	// Logs reads the runner pods' logs. Required.
	Logs runner.LogReader
	// Recorder counts. Default: none.
	Recorder Recorder
}

// Recorder counts what the source does; see package metrics. Started's
// wait runs from the Job's creation (when Gitea handed the task over),
// Ran's from when the reporter saw the runner run.
type Recorder interface {
	runner.Recorder
	// SourceError: a call to Gitea failed: op is fetch, report or log.
	SourceError(op string)
	// Polled: Gitea answered a FetchTask at t.
	Polled(t time.Time)
}

// noRecorder counts nothing: the default Recorder.
type noRecorder struct{ runner.NoRecorder }

func (noRecorder) SourceError(string) {}
func (noRecorder) Polled(time.Time)   {}

func (o *Options) setDefaults() {
	o.SetDefaults()
	if o.Reader == nil {
		o.Reader = o.Kube
	}
	if o.FetchInterval <= 0 {
		o.FetchInterval = 2 * time.Second
	}
	if o.ReportInterval <= 0 {
		o.ReportInterval = 3 * time.Second
	}
	if o.Recorder == nil {
		o.Recorder = noRecorder{}
	}
}

// Source runs the Gitea Actions jobs handed to it, as a Gitea runner, one
// Job each. Its record of a task is the task's Job (the Gitea task ID, the
// number of steps and the log marker in its annotations) and the task's
// Secret (the plan, with the job's secrets and token); Gitea holds the
// rest (the log rows it acknowledged, the steps' states, the result).
type Source struct {
	opts     Options
	clock    clock.WithTicker
	observer job.Observer
	settler  runner.Settler
	log      logr.Logger

	mu sync.Mutex
	// tasks are the tasks taken and not yet over, by Gitea task ID: each
	// holds a running slot.
	tasks map[int64]bool
	// last is the highest Gitea task ID of this dispatcher's Jobs at
	// start (0: none): where sweep begins.
	last int64
	// goroutines are the tasks' reporters; Start waits for them.
	goroutines sync.WaitGroup
}

// New returns a Source.
func New(opts Options) *Source {
	opts.setDefaults()
	return &Source{
		opts:     opts,
		clock:    opts.Clock,
		observer: runner.NewObserver(opts.Options, opts.Kube, opts.Reader, false),
		settler:  runner.Settler{Client: opts.Kube, Jobs: opts.Jobs, Options: opts.Options},
		tasks:    map[int64]bool{},
		log:      logr.Discard(),
	}
}

// SetupWithManager runs the source on the manager, once this replica
// leads.
func (s *Source) SetupWithManager(mgr ctrl.Manager) error {
	s.log = mgr.GetLogger().WithName("gitea")
	return mgr.Add(s)
}

// Start implements manager.Runnable: the runner's identity (registered the
// first time), its labels declared, the tasks of this dispatcher's Jobs
// taken up again, then tasks fetched while a slot is free, until ctx ends.
// Jobs are left running when it returns; its goroutines have ended.
func (s *Source) Start(ctx context.Context) error {
	defer s.goroutines.Wait()
	id, err := LoadIdentity(ctx, s.opts.Reader, s.opts.Kube, s.opts.Identity, s.register)
	if err != nil {
		return err
	}
	s.opts.Client.SetIdentity(id)
	if err := s.opts.Client.Declare(ctx, s.opts.Labels); err != nil && !IsUnimplemented(err) {
		if IsUnregistered(err) {
			return fmt.Errorf("gitea does not know the runner %q kept in %s (removed there?): delete that Secret to register again: %w", id.Name, s.opts.Identity, err)
		}
		return fmt.Errorf("declaring the runner's labels to gitea: %w", err)
	}
	s.log.Info("runner declared to gitea", "runner", id.Name, "labels", s.opts.Labels)
	if err := s.restore(ctx); err != nil {
		return err
	}
	s.sweep(ctx)
	return s.fetchLoop(ctx)
}

// lostLine is the log line of a task sweep ends.
const lostLine = "runwarden: this job was handed to the runner as its dispatcher stopped, before its Job was made: Gitea gives a job's workflow, secrets and token once, so it cannot run; run it again"

// sweepProbes bounds the task IDs sweep asks Gitea about; sweepEnd is how
// many IDs in a row Gitea does not hold that end it (a deleted run's tasks
// leave holes).
const sweepProbes, sweepEnd = 256, 8

// sweep ends the tasks Gitea handed this runner that no Job was made for:
// a dispatcher stopped between Gitea's answer to FetchTask and the Job's
// creation. Gitea gives a task's workflow, secrets and token in that
// answer only, and has no call that lists a runner's tasks, so such a job
// cannot be run; left alone it fails after ten minutes without a word.
// Task IDs grow across the instance: sweep asks Gitea, with a state that
// changes nothing, about each ID past the newest of this dispatcher's Jobs
// until Gitea holds none, and reports each that is this runner's, not
// ended and not taken as failed, saying why. Another runner's task is
// refused to it, and an ended one answers its result.
func (s *Source) sweep(ctx context.Context) {
	if s.last == 0 {
		// No Job to start from (a new runner, or none kept): a task
		// lost so fails at Gitea after its ten minutes.
		return
	}
	lost, missing := 0, 0
	for id := s.last + 1; id <= s.last+sweepProbes && missing < sweepEnd; id++ {
		resp, err := s.opts.Client.UpdateTask(ctx, &runnerv1.TaskState{Id: id}, nil)
		switch {
		case ctx.Err() != nil:
			return
		case noSuchTask(err):
			missing++
			continue
		case err != nil && taskGone(err):
			missing = 0
			continue
		case err != nil:
			s.log.Error(err, "sweeping the tasks handed to this runner: given up", "task", id)
			return
		}
		missing = 0
		s.mu.Lock()
		taken := s.tasks[id]
		s.mu.Unlock()
		if taken || resp.GetState().GetResult() != runnerv1.Result_RESULT_UNSPECIFIED {
			continue
		}
		lost++
		s.log.Info("a task handed to this runner has no Job: reported failed", "task", id)
		s.opts.Recorder.Finished(job.PhaseFailed, "Lost")
		s.final(ctx, id, runnerv1.Result_RESULT_FAILURE, nil, []string{lostLine})
	}
	s.log.Info("swept the tasks handed to this runner", "after", s.last, "lost", lost)
}

// register registers this dispatcher as a Gitea runner.
func (s *Source) register(ctx context.Context) (Identity, error) {
	if s.opts.RegistrationToken == nil {
		return Identity{}, fmt.Errorf("no runner identity in %s and no registration token to register one", s.opts.Identity)
	}
	token, err := s.opts.RegistrationToken()
	if err != nil {
		return Identity{}, err
	}
	id, err := s.opts.Client.Register(ctx, s.opts.RunnerName, token, s.opts.Labels)
	if err != nil {
		return Identity{}, fmt.Errorf("registering the runner %q at gitea: %w", s.opts.RunnerName, err)
	}
	s.log.Info("registered at gitea", "runner", id.Name, "uuid", id.UUID)
	return id, nil
}

// restore takes up again the task of every Job of this dispatcher that is
// not reported: its reporter follows the pod's log from its start, so the
// steps' states are rebuilt, and sends Gitea what it has not acknowledged.
func (s *Source) restore(ctx context.Context) error {
	var jobs batchv1.JobList
	if err := s.opts.Reader.List(ctx, &jobs, client.InNamespace(s.opts.Namespace), client.MatchingLabels{contract.LabelDispatcher: s.opts.Jobs.DispatcherID}); err != nil {
		return fmt.Errorf("listing this dispatcher's jobs: %w", err)
	}
	n := 0
	for i := range jobs.Items {
		j := &jobs.Items[i]
		rec, err := readRecord(j)
		if err != nil {
			s.log.Info("a Job of this dispatcher is no Gitea task's; left alone", "job", j.Name, "why", err.Error())
			continue
		}
		s.last = max(s.last, rec.Task)
		if job.AwaitingSecret(j) {
			// Made, and the dispatcher stopped before the Job was resumed:
			// its Secret, the job's plan, may never have been made, and
			// Gitea gives the plan once. Reported failed saying so, then
			// deleted (a Secret it has goes with it), never run.
			if err := s.unstored(ctx, rec, j); err != nil {
				return err
			}
			continue
		}
		if j.Annotations[job.AnnotationReported] != "" && job.Finished(j) {
			continue
		}
		// A Job being deleted is taken up too: its pod may run until it
		// is gone, and its task is reported once it is.
		if !s.reserve(rec.Task) {
			continue
		}
		s.report(ctx, rec, client.ObjectKeyFromObject(j))
		n++
	}
	s.log.Info("took up the tasks of this dispatcher's Jobs", "tasks", n)
	return nil
}

// unstoredLine is the log line of a task whose Job was made awaiting its
// plan's Secret and not resumed.
const unstoredLine = "runwarden: this job's dispatcher stopped while making its Job, before the job's plan was stored with it: Gitea gives a job's workflow, secrets and token once, so it cannot run; run it again"

// unstored reports the task of Job j, made awaiting its Secret and never
// resumed, failed with unstoredLine, and deletes j. A report sent before a
// restart is sent again harmlessly: Gitea keeps the first result.
func (s *Source) unstored(ctx context.Context, rec record, j *batchv1.Job) error {
	s.log.Info("a Job made before its plan was stored: its task reported failed, the Job deleted", "task", rec.Task, "job", j.Name)
	s.opts.Recorder.Finished(job.PhaseFailed, "Lost")
	s.final(ctx, rec.Task, runnerv1.Result_RESULT_FAILURE, nil, []string{unstoredLine})
	err := s.opts.Kube.Delete(ctx, j, client.Preconditions{UID: &j.UID}, client.PropagationPolicy(metav1.DeletePropagationBackground))
	if client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
		return fmt.Errorf("deleting Job %s, made before its task's plan was stored: %w", j.Name, err)
	}
	return nil
}

// fetchLoop asks Gitea for a task every FetchInterval while a slot is
// free. Gitea answers only when its tasks changed since the version sent
// (tasks_version); after a task the version sent is 0 so that it looks
// again at once.
func (s *Source) fetchLoop(ctx context.Context) error {
	var version int64
	tick := s.clock.NewTicker(s.opts.FetchInterval)
	defer tick.Stop()
	for {
		if s.free() > 0 {
			task, v, err := s.opts.Client.FetchTask(ctx, version)
			switch {
			case ctx.Err() != nil:
				return nil
			case err != nil && IsUnregistered(err):
				return fmt.Errorf("gitea no longer knows this runner (removed there?): delete %s to register again: %w", s.opts.Identity, err)
			case err != nil:
				s.opts.Recorder.SourceError("fetch")
				s.log.Error(err, "fetching a task from gitea")
			case task != nil:
				s.opts.Recorder.Polled(s.clock.Now())
				version = 0
				if s.reserve(task.GetId()) {
					s.take(ctx, task)
				}
				continue
			default:
				s.opts.Recorder.Polled(s.clock.Now())
				version = max(version, v)
			}
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tick.C():
		}
	}
}

// free is how many more tasks may be taken: every task taken holds a
// running slot until its report ends, which is once its Job can no longer
// run (reported finished, or deleted and gone).
func (s *Source) free() int {
	s.mu.Lock()
	n := len(s.tasks)
	s.mu.Unlock()
	s.opts.Recorder.Running(n)
	c := s.opts.Capacity(false)
	return c.Free(c.Add(runner.Load{}, runner.Running, n))
}

// take runs a task Gitea handed out, its slot reserved: it makes the
// task's Job and Secret at once (Gitea counts the task as this runner's
// from its answer on, and fails it after ten minutes without word), or
// reports why it does not run. Tasks are taken one at a time, between
// fetches: making Jobs from several goroutines measured slower
// (BenchmarkGiteaJobs, docs/benchmarks.md), the reports of the tasks in
// flight contending with FetchTask in Gitea's database, and it widens the
// window in which a stopped dispatcher loses tasks Gitea handed out.
func (s *Source) take(ctx context.Context, task *runnerv1.Task) {
	if key, ok := s.makeJob(ctx, task); ok {
		s.report(ctx, key.rec, key.key)
		return
	}
	s.release(task.GetId())
}

// made is a task whose Job was made.
type made struct {
	rec record
	key types.NamespacedName
}

// makeJob makes the task's Job, or reports why it does not run (false).
func (s *Source) makeJob(ctx context.Context, task *runnerv1.Task) (made, bool) {
	log := s.log.WithValues("task", task.GetId())
	gj, err := ReadJob(task.GetWorkflowPayload())
	if err != nil {
		s.refuse(ctx, task.GetId(), err)
		return made{}, false
	}
	tmpl, err := Template(gj.RunsOn, s.labelTemplates())
	if err != nil {
		s.refuse(ctx, task.GetId(), err)
		return made{}, false
	}
	opts, err := s.jobOptions(ctx, tmpl)
	if err != nil {
		s.refuse(ctx, task.GetId(), &Refusal{Step: -1, Reason: err.Error()})
		return made{}, false
	}
	plan := PlanFor(task, gj)
	if why := untrustedPullRequest(plan.Context); why != "" && !s.opts.RunForkPullRequests {
		s.refuse(ctx, task.GetId(), &Refusal{Step: -1, Reason: fmt.Sprintf(
			"a job of %s is not run by this runner: its code would run in a runner pod with the platform's identity and template; the platform runs such jobs with --gitea-fork-pull-requests=run (chart: dispatcher.gitea.forkPullRequests)", why)})
		return made{}, false
	}
	runs, err := steps.JobRuns(&plan)
	if err != nil {
		s.refuse(ctx, task.GetId(), &Refusal{Step: -1, Reason: "the job's if: " + err.Error()})
		return made{}, false
	}
	if !runs {
		log.Info("the job's if: is false; reported skipped")
		s.skip(ctx, task.GetId(), len(plan.Steps))
		return made{}, false
	}
	jt, err := Task(task.GetId(), s.opts.Namespace, gj, plan)
	if err != nil {
		s.refuse(ctx, task.GetId(), err)
		return made{}, false
	}
	rec := record{Task: task.GetId(), Steps: len(plan.Steps), Marker: plan.Marker}
	j, secret, err := job.Build(jt, opts)
	if err != nil {
		s.refuse(ctx, task.GetId(), &Refusal{Step: -1, Reason: err.Error()})
		return made{}, false
	}
	rec.annotate(j)
	for attempt := 0; ; attempt++ {
		_, err = job.Create(ctx, s.opts.Kube, j, secret, job.CreateOptions{SecretWait: s.opts.SecretGCWait})
		if err == nil || job.IsPermanent(err) || attempt == 4 || ctx.Err() != nil {
			break
		}
		log.Error(err, "creating the task's Job; trying again")
		s.wait(ctx, time.Duration(attempt+1)*time.Second)
	}
	if err != nil {
		s.refuse(ctx, task.GetId(), &Refusal{Step: -1, Reason: "its Job could not be made: " + err.Error()})
		return made{}, false
	}
	s.opts.Recorder.JobCreated()
	log.Info("made the task's Job", "job", j.Name, "steps", rec.Steps)
	return made{rec: rec, key: client.ObjectKeyFromObject(j)}, true
}

// reserve holds a running slot for task id until release; false when the
// task holds one already.
func (s *Source) reserve(id int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.tasks[id] {
		return false
	}
	s.tasks[id] = true
	return true
}

// release frees task id's slot.
func (s *Source) release(id int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	delete(s.tasks, id)
}

// report starts the reporter of a task whose Job is at key, its slot
// reserved; the slot is released when the report ends.
func (s *Source) report(ctx context.Context, rec record, key types.NamespacedName) {
	s.goroutines.Go(func() {
		defer s.release(rec.Task)
		r := &reporter{s: s, rec: rec, key: key, log: s.log.WithValues("task", rec.Task, "job", key.Name)}
		r.run(ctx)
	})
}

// refuse reports a task that does not run as failed, with why in its log.
func (s *Source) refuse(ctx context.Context, id int64, err error) {
	msg := err.Error()
	var r *Refusal
	if errors.As(err, &r) && r.Step >= 0 {
		msg = fmt.Sprintf("step %d: %s", r.Step+1, r.Reason)
	}
	s.log.Info("task refused", "task", id, "why", msg)
	s.opts.Recorder.Finished(job.PhaseFailed, "Refused")
	s.final(ctx, id, runnerv1.Result_RESULT_FAILURE, nil, []string{"runwarden: this job does not run: " + msg})
}

// skip reports a task whose job-level if: is false as skipped, with its
// steps, and no pod made.
func (s *Source) skip(ctx context.Context, id int64, n int) {
	st := make([]*runnerv1.StepState, n)
	for i := range st {
		st[i] = &runnerv1.StepState{Id: int64(i), Result: runnerv1.Result_RESULT_SKIPPED}
	}
	s.opts.Recorder.Finished("Skipped", "If")
	s.final(ctx, id, runnerv1.Result_RESULT_SKIPPED, st, nil)
}

// final reports a task that never had a Job: its log lines, then its
// result, each tried until Gitea takes it or ctx ends (a task left without
// word fails at Gitea after ten minutes).
func (s *Source) final(ctx context.Context, id int64, result runnerv1.Result, st []*runnerv1.StepState, lines []string) {
	now := s.clock.Now()
	rows := make([]*runnerv1.LogRow, len(lines))
	for i, l := range lines {
		rows[i] = row(l, now)
	}
	if len(rows) > 0 {
		s.retry(ctx, "sending the task's log", func() error {
			_, err := s.opts.Client.UpdateLog(ctx, id, 0, rows, true)
			if isArchived(err) {
				// Ended by an earlier report.
				return nil
			}
			s.callFailed("log", err)
			return err
		})
	}
	state := &runnerv1.TaskState{Id: id, Result: result, StartedAt: stamp(now), StoppedAt: stamp(now), Steps: st}
	s.retry(ctx, "reporting the task's result", func() error {
		_, err := s.opts.Client.UpdateTask(ctx, state, nil)
		s.callFailed("report", err)
		return err
	})
}

// callFailed counts a call to Gitea that failed (op: report or log), but
// for a task Gitea no longer holds, which is its answer rather than a
// failure, and for a call the dispatcher's own stop ended.
func (s *Source) callFailed(op string, err error) {
	if err != nil && !taskGone(err) && !errors.Is(err, context.Canceled) {
		s.opts.Recorder.SourceError(op)
	}
}

// retry calls f until it succeeds, ctx ends, or five tries failed.
func (s *Source) retry(ctx context.Context, what string, f func() error) bool {
	for attempt := 0; attempt < 5; attempt++ {
		err := f()
		if err == nil {
			return true
		}
		if ctx.Err() != nil {
			return false
		}
		s.log.Error(err, what, "attempt", attempt+1)
		s.wait(ctx, time.Duration(1<<attempt)*time.Second)
	}
	return false
}

// wait waits d on the source's clock, or until ctx ends.
func (s *Source) wait(ctx context.Context, d time.Duration) {
	t := s.clock.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C():
	}
}

// dispatcherTemplate names the dispatcher's own pod template among the
// templates of labels (the others are NAMESPACE/NAME).
const dispatcherTemplate = "the dispatcher's pod template"

// labelTemplates maps each declared label to its template's name.
func (s *Source) labelTemplates() map[string]string {
	m := make(map[string]string, len(s.opts.Labels))
	for _, l := range s.opts.Labels {
		m[l] = dispatcherTemplate
		if key, ok := s.opts.Templates[l]; ok {
			m[l] = key.String()
		}
	}
	return m
}

// jobOptions are the Job options of a job run with the template named
// tmpl: the dispatcher's, or a label's PodTemplate object read now;
// shaped for the steps program either way.
func (s *Source) jobOptions(ctx context.Context, tmpl string) (job.Options, error) {
	opts := s.opts.Jobs
	base := opts.Template
	if opts.Templates != nil {
		base = opts.Templates()
	}
	if tmpl != dispatcherTemplate {
		ns, name, _ := strings.Cut(tmpl, "/")
		var pt corev1.PodTemplate
		if err := s.opts.Reader.Get(ctx, types.NamespacedName{Namespace: ns, Name: name}, &pt); err != nil {
			return opts, fmt.Errorf("the runner template %s: %w", tmpl, err)
		}
		base = job.TemplateOf(&pt)
		if err := job.ValidateTemplate(base); err != nil {
			return opts, fmt.Errorf("the runner template %s: %w", tmpl, err)
		}
	}
	shaped, err := PodTemplate(base, s.opts.StepsImage)
	if err != nil {
		return opts, err
	}
	opts.Template, opts.Templates = shaped, nil
	return opts, nil
}

// AnnotationTask is the annotation of a Gitea task's Job that keeps what
// its reporter needs after a restart: the Gitea task ID, the number of
// steps, and the marker of the steps program's lines in the pod's log.
const AnnotationTask = "runwarden.dev/gitea-task"

// maxSteps bounds the steps of a recorded task, so a damaged record
// cannot make the reporter hold and send an unbounded list.
const maxSteps = 1000

type record struct {
	Task   int64
	Steps  int
	Marker string
}

func (r record) annotate(j *batchv1.Job) {
	j.Annotations[AnnotationTask] = fmt.Sprintf("%d/%d/%s", r.Task, r.Steps, r.Marker)
}

// readRecord reads a Gitea task's Job's record. Who writes it: the
// dispatcher, when it makes the Job; the chart's writers policy lets no
// one else change a runner Job's runwarden.dev/ annotations. It is
// believed only if the Job's name is its task's (job.IsNamedFor), so a
// record moved to another task's Job is not taken for that task's; what
// else a rewritten record changes is how the job's steps show at Gitea,
// never its result, which is the pod's exit code.
func readRecord(j *batchv1.Job) (record, error) {
	raw := j.Annotations[AnnotationTask]
	parts := strings.SplitN(raw, "/", 3)
	if raw == "" || len(parts) != 3 {
		return record{}, fmt.Errorf("no %s annotation", AnnotationTask)
	}
	id, err := strconv.ParseInt(parts[0], 10, 64)
	if err != nil || id <= 0 {
		return record{}, fmt.Errorf("%s %q: bad task ID", AnnotationTask, raw)
	}
	n, err := strconv.Atoi(parts[1])
	if err != nil || n < 0 || n > maxSteps {
		return record{}, fmt.Errorf("%s %q: bad number of steps", AnnotationTask, raw)
	}
	if !strings.HasPrefix(parts[2], "::runwarden-") || !strings.HasSuffix(parts[2], "::") {
		return record{}, fmt.Errorf("%s %q: bad marker", AnnotationTask, raw)
	}
	if !job.IsNamedFor(j, taskID(id)) || j.Annotations[contract.TaskID] != taskID(id) {
		return record{}, fmt.Errorf("%s %q: the Job is not named for that task", AnnotationTask, raw)
	}
	return record{Task: id, Steps: n, Marker: parts[2]}, nil
}

// taskID is the dispatcher's task ID of Gitea task id.
func taskID(id int64) string { return "gitea-" + strconv.FormatInt(id, 10) }
