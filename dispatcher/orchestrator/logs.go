package orchestrator

import (
	"context"
	"errors"
	"io"
	"strconv"
	"sync"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/internal/contract"
)

// Log streaming bounds: a chunk is sent when it is full or has waited
// flushEvery; the final report waits up to logGrace for the log's end.
const (
	flushEvery = time.Second
	logGrace   = 10 * time.Second
	// openAttempts is how often a log that cannot be opened is tried
	// before it is given up (nodes that serve no logs).
	openAttempts = 5
)

// logStream sends one runner container's log to the orchestrator, in
// order, in chunks of at most MaxLogChunk bytes: memory per stream is
// bounded by two chunks.
type logStream struct {
	// stopped is closed by stop; done when the stream ended.
	stopped chan struct{}
	done    chan struct{}

	mu      sync.Mutex
	opened  bool
	finalAt time.Time
}

func (l *logStream) stop() {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.stopped:
	default:
		close(l.stopped)
	}
}

// streamLogs starts streaming the task's log once, if log streaming is on.
// Start runs the stream, until the task is let go or the source stops.
func (s *Source) streamLogs(ctx context.Context, t *task, j *batchv1.Job) {
	if s.opts.Logs == nil {
		return
	}
	l := s.leases.openLogs(t, func() *logStream {
		return &logStream{stopped: make(chan struct{}), done: make(chan struct{})}
	})
	if l == nil {
		return
	}
	// The caller goes on using j (a patch decodes into it): copy what the
	// stream needs, which is what tells the Job's own pods (job.IsPodOf).
	own := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Namespace: j.Namespace, Name: j.Name, UID: j.UID,
		Labels: map[string]string{contract.TaskID: j.Labels[contract.TaskID]}}}
	run := func(root context.Context) {
		defer close(l.done)
		sctx, cancel := context.WithCancel(root)
		var watch sync.WaitGroup
		defer watch.Wait()
		defer cancel()
		watch.Go(func() {
			select {
			case <-l.stopped:
				cancel()
			case <-sctx.Done():
			}
		})
		s.runLogs(sctx, t, l, own)
	}
	select {
	case s.streams <- run:
	case <-s.stopped:
		close(l.done)
	case <-ctx.Done():
		close(l.done)
	}
}

// logsPending tells whether the final report should wait for the log: the
// stream is open and has not ended, within a grace period.
func (s *Source) logsPending(t *task) bool {
	l := s.leases.logStream(t)
	if l == nil {
		return false
	}
	select {
	case <-l.done:
		return false
	default:
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if !l.opened {
		return false
	}
	if l.finalAt.IsZero() {
		l.finalAt = s.clock.Now()
	}
	return s.clock.Now().Sub(l.finalAt) < logGrace
}

func (s *Source) runLogs(ctx context.Context, t *task, l *logStream, j *batchv1.Job) {
	namespace := j.Namespace
	var offset int64
	failures := 0
	for ctx.Err() == nil && failures < openAttempts {
		pod := s.runnerPod(ctx, j)
		if pod == "" {
			failures++
			s.wait(ctx, s.opts.Backoff.Delay(failures, nil))
			continue
		}
		rc, err := s.opts.Logs.Follow(ctx, namespace, pod, job.RunnerContainer)
		if err != nil {
			failures++
			s.wait(ctx, s.opts.Backoff.Delay(failures, nil))
			continue
		}
		l.mu.Lock()
		l.opened = true
		l.mu.Unlock()
		failures = 0
		n, err := s.copyLog(ctx, t, rc, offset)
		offset = n
		if err != nil {
			// The orchestrator refused the log (a gap or a bad chunk):
			// stop sending it; the task itself goes on.
			s.log.Error(err, "streaming the runner log stopped", "task", t.id)
			return
		}
		if s.containerDone(ctx, j, pod) {
			if err := s.sendChunk(ctx, t, LogChunk{Offset: offset, Final: true}); err != nil && ctx.Err() == nil {
				s.log.Error(err, "sending the end of the runner log", "task", t.id)
			}
			return
		}
		// The stream broke while the container runs: open it again and
		// skip what was sent.
		s.wait(ctx, time.Second)
	}
}

// runnerPod names the scheduled pod of Job j's own (job.IsPodOf): the log
// of a pod planted with the Job's job-name label is never sent as the
// task's.
func (s *Source) runnerPod(ctx context.Context, j *batchv1.Job) string {
	pods, err := job.PodsOf(ctx, s.opts.Kube, j, true)
	if err != nil {
		return ""
	}
	for _, p := range pods {
		if p.Spec.NodeName != "" {
			return p.Name
		}
	}
	return ""
}

// containerDone tells whether the runner container of pod, Job j's, has
// ended; a pod gone, or of that name but no longer j's, has.
func (s *Source) containerDone(ctx context.Context, j *batchv1.Job, pod string) bool {
	p := &corev1.Pod{}
	if err := s.opts.Kube.Get(ctx, client.ObjectKey{Namespace: j.Namespace, Name: pod}, p); err != nil || !job.IsPodOf(j, p) {
		return true // gone
	}
	for _, c := range p.Status.ContainerStatuses {
		if c.Name == job.RunnerContainer {
			return c.State.Terminated != nil
		}
	}
	return p.Status.Phase == corev1.PodSucceeded || p.Status.Phase == corev1.PodFailed
}

// copyLog reads the log, skipping the first skip bytes (sent before the
// stream broke), and sends the rest in chunks. It returns the offset
// reached, once it closed r and its reader ended.
func (s *Source) copyLog(ctx context.Context, t *task, r io.ReadCloser, skip int64) (int64, error) {
	var reader sync.WaitGroup
	quit := make(chan struct{})
	defer reader.Wait()
	defer func() {
		// Before the wait: the reader's send and read in flight end.
		close(quit)
		_ = r.Close()
	}()
	if skip > 0 {
		n, err := io.CopyN(io.Discard, r, skip)
		if err != nil {
			return n, nil
		}
	}
	offset := skip
	reads := make(chan []byte)
	readErr := make(chan error, 1)
	reader.Go(func() {
		buf := make([]byte, 32<<10)
		for {
			n, err := r.Read(buf)
			if n > 0 {
				b := make([]byte, n)
				copy(b, buf[:n])
				select {
				case reads <- b:
				case <-quit:
					return
				}
			}
			if err != nil {
				readErr <- err
				return
			}
		}
	})
	pending := make([]byte, 0, MaxLogChunk)
	flush := func() error {
		for len(pending) > 0 {
			n := min(len(pending), MaxLogChunk)
			if err := s.sendChunk(ctx, t, LogChunk{Offset: offset, Data: pending[:n]}); err != nil {
				return err
			}
			offset += int64(n)
			pending = pending[n:]
		}
		pending = make([]byte, 0, MaxLogChunk)
		return nil
	}
	tick := s.clock.NewTicker(flushEvery)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			return offset, nil
		case b := <-reads:
			pending = append(pending, b...)
			if len(pending) >= MaxLogChunk {
				if err := flush(); err != nil {
					return offset, err
				}
			}
		case <-tick.C():
			if err := flush(); err != nil {
				return offset, err
			}
		case rerr := <-readErr:
			// The reader hands over every byte before its error.
			if !errors.Is(rerr, io.EOF) {
				s.log.V(1).Info("runner log stream broke; opening it again", "task", t.id, "error", rerr.Error())
			}
			return offset, flush()
		}
	}
}

// sendChunk sends one chunk, retrying while the orchestrator is
// unreachable or the lease is being handed back; a refusal is returned.
func (s *Source) sendChunk(ctx context.Context, t *task, c LogChunk) error {
	for attempt := 0; ; attempt++ {
		v, _ := s.leases.view(t)
		c.Epoch = v.epoch
		c.IdempotencyKey = v.id + "/log/" + strconv.FormatInt(c.Offset, 10)
		err := s.opts.Client.Log(ctx, t.id, c)
		if err == nil {
			return nil
		}
		s.opts.Recorder.SourceError("log")
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if IsConflict(err) {
			// A stale epoch: the lease was handed back meanwhile (send
			// again with the new one) or is gone and not handed back yet
			// (wait for it; a task given to another holder is forgotten,
			// which ends this stream).
			v, _ := s.leases.view(t)
			reissued, lost := v.epoch != c.Epoch, v.lost()
			if reissued {
				continue
			}
			if lost {
				s.wait(ctx, s.opts.Backoff.Delay(attempt, err))
				continue
			}
			return err
		}
		if !IsRetryable(err) {
			return err
		}
		s.wait(ctx, s.opts.Backoff.Delay(attempt, err))
	}
}
