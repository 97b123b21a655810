package gitea

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"time"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"
	batchv1 "k8s.io/api/batch/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/dispatcher/job"
)

// logWait bounds how long a task's report waits, once its Job is over,
// for the rest of the pod's log.
const logWait = 30 * time.Second

// reporter runs one task's report: every ReportInterval it reads the
// task's Job and sends Gitea the log rows and step states the pod's log
// has added (which keeps the task alive at Gitea, and tells the dispatcher
// when Gitea ended it: a cancel), and once the Job is over the job's
// outputs and result. The log is followed from its start, so a reporter
// that takes a task up after a restart rebuilds what the one before held;
// Gitea keeps the rows it has and takes the rest.
type reporter struct {
	s   *Source
	rec record
	key types.NamespacedName
	log logr.Logger

	mu    sync.Mutex
	steps *stepLog
	// lines is how many lines of the pod's log were read: a follow that
	// broke starts again past them.
	lines int
	// following is set while the log is followed; ended once the log
	// reached its end (the container ended).
	following, ended bool
	followed         chan struct{}

	// ack is how many rows Gitea holds.
	ack int64
	// closed is set once the end's rows are added and the open steps
	// ended.
	closed bool
	// waited is set once a round saw the Job before its runner ran;
	// runningAt is when a round first saw it run (zero before): what the
	// Recorder's Started and Ran measure.
	waited    bool
	runningAt time.Time
	// counted is set once the task's end is counted.
	counted bool
	// flush is signalled when the log's reader wants its rows sent now: it
	// waits, maxHeld bytes of rows Gitea does not hold read, or it read the
	// log's end; room when Gitea took some.
	flush, room chan struct{}
}

// maxHeld bounds the bytes of rows a task's reporter holds that Gitea
// does not: past it, the log's reader waits for Gitea to take some, and
// the pod's log waits on its node. A job printing faster than Gitea takes
// its log, or while Gitea is down, does not grow the dispatcher.
const maxHeld = 4 << 20

// maxBatchBytes bounds one UpdateLog call's rows (but for a first row
// alone, at most maxRow).
const maxBatchBytes = 1 << 20

func (r *reporter) run(ctx context.Context) {
	r.steps = newStepLog(r.rec.Marker, r.rec.Steps)
	r.flush, r.room = make(chan struct{}, 1), make(chan struct{}, 1)
	// The log's reader ends with the report.
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	tick := r.s.clock.NewTicker(r.s.opts.ReportInterval)
	defer tick.Stop()
	for {
		done, err := r.round(ctx)
		if done || ctx.Err() != nil {
			return
		}
		if err != nil {
			r.log.Error(err, "reporting the task to gitea")
		}
		r.wait(ctx, tick.C())
	}
}

// wait waits for the tick; the rows of a log reader that holds maxHeld,
// or read the log's end, are sent meanwhile.
func (r *reporter) wait(ctx context.Context, tick <-chan time.Time) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			return
		case <-r.flush:
			if err := r.sendLog(ctx, false); err != nil && ctx.Err() == nil {
				r.log.Error(err, "sending the task's log to gitea")
			}
		}
	}
}

// round reads the Job once and reports; done once the task is over at
// Gitea.
func (r *reporter) round(ctx context.Context) (done bool, err error) {
	j, out, err := r.outcome(ctx)
	if err != nil {
		return false, err
	}
	done, err = r.report(ctx, j, out)
	if taskGone(err) {
		// Its run deleted at Gitea, or the task given to another runner
		// (this one registered anew): no report will ever be taken. The
		// Job goes rather than hold its slot for ever.
		r.log.Info("gitea no longer holds the task as this runner's; deleting its Job", "why", err.Error())
		return r.remove(ctx, j)
	}
	return done, err
}

// report reports the task once, its Job j in outcome out.
func (r *reporter) report(ctx context.Context, j *batchv1.Job, out job.Outcome) (done bool, err error) {
	if j != nil && (out.Running || out.Phase != "") {
		r.follow(ctx, j)
	}
	r.seen(j, out)
	if out.Phase == "" {
		res, err := r.update(ctx, nil, false)
		if err != nil {
			return false, err
		}
		if res != runnerv1.Result_RESULT_UNSPECIFIED {
			// Gitea ended the task (cancelled there, or over before a
			// restart): the Job goes, its Secret with it.
			r.log.Info("gitea ended the task; deleting its Job", "result", res.String())
			return r.remove(ctx, j)
		}
		return false, nil
	}
	return r.finish(ctx, j, out)
}

// seen counts the runner's start, the wait from the Job's creation, once a
// round saw the Job waiting and then a later one saw its runner run. A
// reporter that takes a running task up after a restart counts neither its
// start nor its run, nor does one whose runner started and ended between
// two rounds.
func (r *reporter) seen(j *batchv1.Job, out job.Outcome) {
	switch {
	case j == nil || !r.runningAt.IsZero():
	case !out.Running && out.Phase == "":
		r.waited = true
	case out.Running && r.waited:
		r.runningAt = r.s.clock.Now()
		r.s.opts.Recorder.Started(r.runningAt.Sub(j.CreationTimestamp.Time))
	}
}

// outcome is the task's Job and how it went; a nil Job is one deleted
// before it was over.
func (r *reporter) outcome(ctx context.Context) (*batchv1.Job, job.Outcome, error) {
	j := &batchv1.Job{}
	err := r.s.opts.Kube.Get(ctx, r.key, j)
	if apierrors.IsNotFound(err) {
		// Not in the cache: not seen yet, or gone.
		err = r.s.opts.Reader.Get(ctx, r.key, j)
		// A Job of the task's name that is not this dispatcher's runner Job
		// of the task is someone else's, made after the task's was deleted:
		// the task's Job is gone all the same (and the other is left alone).
		if apierrors.IsNotFound(err) || (err == nil && !job.IsRunnerJobFor(j, taskID(r.rec.Task), r.s.opts.Jobs.DispatcherID)) {
			return nil, job.Outcome{Phase: job.PhaseFailed, Reason: job.ReasonFailed, Message: "the Job was deleted before it finished"}, nil
		}
		if err == nil {
			return j, job.Outcome{}, nil
		}
	}
	if err != nil {
		return nil, job.Outcome{}, err
	}
	out, err := r.s.observer.Outcome(ctx, j)
	return j, out, err
}

// finish reports the task's end: the rest of the log, the steps the log
// left open ended with the job, the dispatcher's reason when the Job
// failed of its own (a pod that could not start, the deadline), the
// outputs and the result. Then the Job is settled, or deleted when its pod
// is stopped rather than ended.
func (r *reporter) finish(ctx context.Context, j *batchv1.Job, out job.Outcome) (bool, error) {
	r.awaitLog(ctx)
	res := resultOf(out)
	if !r.closed {
		// Once: a final report that failed is sent again as it was.
		var lines []string
		if res != runnerv1.Result_RESULT_SUCCESS && out.Reason != job.ReasonNonZeroExit {
			// Not the steps' own failure (they said theirs): why the Job
			// ended, in runwarden's bounded reasons.
			lines = append(lines, reasonLine(out))
		}
		if j != nil {
			rec, err := job.ReadRecord(ctx, r.s.opts.Kube, j)
			if err != nil {
				return false, err
			}
			lines = append(lines, recordLines(rec)...)
		}
		now := r.s.clock.Now()
		r.mu.Lock()
		for _, l := range lines {
			r.steps.addRow(l, now)
		}
		r.steps.finish(res, now)
		r.closed = true
		r.mu.Unlock()
	}
	if _, err := r.update(ctx, &res, true); err != nil {
		return false, err
	}
	if !r.counted {
		// Once: a settle that fails has the result sent again.
		r.counted = true
		r.s.opts.Recorder.Finished(out.Phase, out.Reason)
		if !r.runningAt.IsZero() {
			r.s.opts.Recorder.Ran(out.Phase, r.s.clock.Now().Sub(r.runningAt))
		}
		r.log.Info("reported the task's result to gitea", "result", res.String())
	}
	if j == nil {
		return true, nil
	}
	if out.Stop {
		return r.remove(ctx, j)
	}
	if _, err := r.s.settler.Settle(ctx, j, time.Time{}); err != nil {
		return false, err
	}
	return true, nil
}

// remove deletes the Job, its pods first (its Secret goes with it), and
// waits until it is gone: the task holds its slot while its pod may run.
func (r *reporter) remove(ctx context.Context, j *batchv1.Job) (bool, error) {
	if j == nil {
		return true, nil
	}
	err := r.s.opts.Kube.Delete(ctx, j, client.Preconditions{UID: &j.UID}, client.PropagationPolicy(metav1.DeletePropagationForeground))
	if client.IgnoreNotFound(err) != nil && !apierrors.IsConflict(err) {
		return false, err
	}
	for {
		err := r.s.opts.Reader.Get(ctx, r.key, &batchv1.Job{})
		if apierrors.IsNotFound(err) {
			return true, nil
		}
		if ctx.Err() != nil {
			return false, ctx.Err()
		}
		r.s.wait(ctx, time.Second)
	}
}

// maxBatch is the most rows one UpdateLog call carries (Gitea's own
// runner sends what it has; a step printing a million lines would make
// one request of hundreds of megabytes).
const maxBatch = 5000

// update sends Gitea the rows it does not hold (sendLog), then every
// step's state, with the result and the outputs when result is set; it
// returns the task's result as Gitea holds it.
func (r *reporter) update(ctx context.Context, result *runnerv1.Result, final bool) (runnerv1.Result, error) {
	if err := r.sendLog(ctx, final); err != nil {
		return 0, err
	}
	r.mu.Lock()
	state := &runnerv1.TaskState{Id: r.rec.Task, Steps: r.steps.snapshot()}
	var outputs map[string]string
	if result != nil {
		state.Result = *result
		state.StoppedAt = stamp(r.s.clock.Now())
		outputs = r.steps.outputs
	}
	r.mu.Unlock()
	res, err := r.s.opts.Client.UpdateTask(ctx, state, outputs)
	if err != nil {
		r.s.callFailed("report", err)
		return 0, err
	}
	return res.GetState().GetResult(), nil
}

// sendLog sends Gitea the rows it does not hold, in calls of at most
// maxBatch rows and maxBatchBytes, the last with no_more when final.
func (r *reporter) sendLog(ctx context.Context, final bool) error {
	for {
		r.mu.Lock()
		index := r.ack
		rows := r.steps.pending(index, maxBatch, maxBatchBytes)
		last := index+int64(len(rows)) >= r.steps.count()
		r.mu.Unlock()
		if len(rows) == 0 && !final {
			break
		}
		noMore := final && last
		if noMore && len(rows) == 0 && index == 0 {
			// Gitea commits a log only with rows.
			rows = []*runnerv1.LogRow{row("runwarden: the job wrote no log", r.s.clock.Now())}
		}
		if len(rows) == 0 {
			// Final, every row held: the log was ended by an earlier
			// call whose answer came.
			break
		}
		ack, err := r.s.opts.Client.UpdateLog(ctx, r.rec.Task, index, rows, noMore)
		if noMore && isArchived(err) {
			// Ended by an earlier call whose answer was lost.
			break
		}
		if err != nil {
			r.s.callFailed("log", err)
			return err
		}
		r.mu.Lock()
		r.ack = ack
		r.steps.drop(ack)
		r.mu.Unlock()
		if ack > index {
			select {
			case r.room <- struct{}{}:
			default:
			}
		}
		if last || ack <= index {
			// All sent, or Gitea took none (it answers its own count for
			// a gap): the next update goes on from its answer.
			return nil
		}
	}
	return nil
}

// follow starts reading the pod's log, unless it is read or was read to
// its end.
func (r *reporter) follow(ctx context.Context, j *batchv1.Job) {
	r.mu.Lock()
	if r.following || r.ended {
		r.mu.Unlock()
		return
	}
	r.mu.Unlock()
	pods, err := job.PodsOf(ctx, r.s.opts.Kube, j, true)
	if err != nil || len(pods) == 0 {
		return
	}
	pod := pods[0].Name
	r.mu.Lock()
	r.following = true
	r.followed = make(chan struct{})
	done := r.followed
	r.mu.Unlock()
	r.s.goroutines.Go(func() {
		defer close(done)
		err := r.read(ctx, pod)
		r.mu.Lock()
		r.following = false
		r.ended = r.ended || err == nil
		r.mu.Unlock()
		if err == nil {
			r.flushNow()
		}
		if err != nil && ctx.Err() == nil {
			r.log.V(1).Info("reading the runner's log; trying again", "pod", pod, "error", err.Error())
		}
	})
}

// read follows the pod's runner log until it ends, past the lines read
// before.
func (r *reporter) read(ctx context.Context, pod string) error {
	rc, err := r.s.opts.Logs.Follow(ctx, r.key.Namespace, pod, job.RunnerContainer)
	if err != nil {
		return err
	}
	defer func() { _ = rc.Close() }()
	r.mu.Lock()
	skip := r.lines
	r.mu.Unlock()
	return readLines(rc, func(line string) error {
		if skip > 0 {
			skip--
			return nil
		}
		r.mu.Lock()
		if r.closed {
			// The report's end is made: what the log says later is not
			// the job's (a log that did not end in time).
			r.mu.Unlock()
			return nil
		}
		r.lines++
		r.steps.add(line, r.s.clock.Now())
		held := r.steps.size
		r.mu.Unlock()
		for held > maxHeld {
			r.flushNow()
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-r.room:
			}
			r.mu.Lock()
			held = r.steps.size
			r.mu.Unlock()
		}
		return nil
	})
}

// flushNow asks for the rows read to be sent now.
func (r *reporter) flushNow() {
	select {
	case r.flush <- struct{}{}:
	default:
	}
}

// awaitLog waits, at most logWait, for the log to be read to its end.
func (r *reporter) awaitLog(ctx context.Context) {
	r.mu.Lock()
	done := r.followed
	r.mu.Unlock()
	if done == nil {
		return
	}
	t := r.s.clock.NewTimer(logWait)
	defer t.Stop()
	for {
		select {
		case <-done:
			return
		case <-t.C():
			r.log.Info("the runner's log did not end in time; reporting what was read")
			return
		case <-ctx.Done():
			return
		case <-r.flush:
			// The reader waits for Gitea to take rows: send them, and wait
			// for the log's end as long again.
			if err := r.sendLog(ctx, false); err != nil {
				r.log.Error(err, "sending the task's log to gitea")
			}
			t.Reset(logWait)
		}
	}
}

// readLines calls line for each line of rd, each cut at maxRow, until
// line returns an error.
func readLines(rd io.Reader, line func(string) error) error {
	br := bufio.NewReaderSize(rd, 64*1024)
	var buf []byte
	for {
		chunk, err := br.ReadSlice('\n')
		if len(buf) < maxRow {
			buf = append(buf, chunk[:min(len(chunk), maxRow-len(buf))]...)
		}
		switch {
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case err == nil || (errors.Is(err, io.EOF) && len(buf) > 0):
			s := string(buf)
			if n := len(s); n > 0 && s[n-1] == '\n' {
				s = s[:n-1]
			}
			if err := line(s); err != nil {
				return err
			}
			buf = buf[:0]
		}
		if err != nil && !errors.Is(err, bufio.ErrBufferFull) {
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
	}
}

// snapshot is every step's state as Gitea wants it in each update: a step
// still running has the rows so far as its own.
func (l *stepLog) snapshot() []*runnerv1.StepState {
	out := make([]*runnerv1.StepState, len(l.steps))
	for i, s := range l.steps {
		c := proto.Clone(s).(*runnerv1.StepState)
		if c.StartedAt != nil && c.Result == runnerv1.Result_RESULT_UNSPECIFIED {
			c.LogLength = l.count() - c.LogIndex
		}
		out[i] = c
	}
	return out
}

// resultOf is the Gitea result of a Job's outcome.
func resultOf(out job.Outcome) runnerv1.Result {
	switch out.Phase {
	case job.PhaseSucceeded:
		return runnerv1.Result_RESULT_SUCCESS
	case job.PhaseCancelled:
		return runnerv1.Result_RESULT_CANCELLED
	default:
		return runnerv1.Result_RESULT_FAILURE
	}
}

// reasonLine is the log row saying why a Job ended other than by its
// steps: its reason and what the Job, its pod and their events said.
func reasonLine(out job.Outcome) string {
	line := "runwarden: " + out.Reason
	if out.Message != "" {
		line += ": " + out.Message
	}
	if len(line) > maxRow {
		line = line[:maxRow]
	}
	return line
}

// recordLines are the rows that keep the task's record in its log: what
// ran (the runner pod, its node, the digests of the platform's template,
// of the pod's spec and of the policies as the webhook admitted it, and
// each container's image as the node ran it).
func recordLines(rec *v1alpha1.TaskRecord) []string {
	or := func(v, none string) string {
		if v == "" {
			return none
		}
		return v
	}
	lines := []string{fmt.Sprintf("runwarden: record: pod %s on node %s; template %s; pod spec %s; policies %s",
		or(rec.Pod, "(none made)"), or(rec.Node, "(none)"), or(rec.TemplateDigest, "(unknown)"),
		or(rec.SpecDigest, "(not recorded: no runwarden webhook admitted it)"), or(rec.PolicyDigest, "(none)"))}
	for _, im := range rec.Images {
		lines = append(lines, fmt.Sprintf("runwarden: record: container %s ran %s (%s)", im.Container, im.Image, or(im.ImageID, "no image ID")))
	}
	return lines
}

// taskGone tells an error of Gitea's saying that the task is not this
// runner's any more: its run was deleted, or the task belongs to another
// runner (Gitea v1.26.0's messages; its errors reach a runner as code
// unknown).
func taskGone(err error) bool {
	return err != nil && (strings.Contains(err.Error(), "invalid runner for task") || strings.Contains(err.Error(), "resource does not exist"))
}

// noSuchTask tells Gitea's answer for a task ID it does not hold (past
// its newest task, or of a deleted run).
func noSuchTask(err error) bool {
	return err != nil && strings.Contains(err.Error(), "resource does not exist")
}

// isArchived tells an UpdateLog refused because the log was committed: a
// final report sent again after a restart.
func isArchived(err error) bool {
	return err != nil && strings.Contains(err.Error(), "log file has been archived")
}

func row(content string, t time.Time) *runnerv1.LogRow {
	return &runnerv1.LogRow{Time: timestamppb.New(t), Content: content}
}

func stamp(t time.Time) *timestamppb.Timestamp { return timestamppb.New(t) }
