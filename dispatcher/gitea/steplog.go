package gitea

import (
	"encoding/json"
	"strings"
	"time"

	runnerv1 "code.gitea.io/actions-proto-go/runner/v1"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/runwarden/runwarden/internal/steps"
)

// maxRow is the longest row Gitea stores (its MaxLineSize); a longer line
// is cut there.
const maxRow = 64 * 1024

// stepLog turns a runner pod's log, line by line, into what Gitea shows:
// the log's rows, each step's state with the rows that are its own, and
// the job's outputs. Marker lines (internal/steps) are not rows: they say
// where a step starts and ends and how. What the pod's steps say of
// themselves is the job's own account, as any runner's is; the job's
// result is the pod's exit code, which the dispatcher reads from the pod's
// status, not from its log.
type stepLog struct {
	marker string
	// rows are the log's rows from index base on: those before it Gitea
	// holds, and they are not kept (a job may print millions).
	rows []*runnerv1.LogRow
	base int64
	// size is the bytes the rows take (rowSize each).
	size    int
	steps   []*runnerv1.StepState
	outputs map[string]string
}

// rowOverhead is what a row takes beside its content (the row, its
// timestamp and the pointer to it), so that a log of empty lines counts
// too.
const rowOverhead = 96

func rowSize(r *runnerv1.LogRow) int { return len(r.GetContent()) + rowOverhead }

func newStepLog(marker string, n int) *stepLog {
	l := &stepLog{marker: marker, steps: make([]*runnerv1.StepState, n), outputs: map[string]string{}}
	for i := range l.steps {
		l.steps[i] = &runnerv1.StepState{Id: int64(i)}
	}
	return l
}

// add reads one line of the pod's log, written at t.
func (l *stepLog) add(line string, t time.Time) {
	if rest, ok := strings.CutPrefix(line, l.marker+" "); ok {
		var e steps.Event
		if err := json.Unmarshal([]byte(rest), &e); err == nil && l.event(e, t) {
			return
		}
	}
	l.addRow(line, t)
}

// addRow adds a row of content, cut at maxRow.
func (l *stepLog) addRow(content string, t time.Time) {
	if len(content) > maxRow {
		content = content[:maxRow]
	}
	r := &runnerv1.LogRow{Time: timestamppb.New(t), Content: content}
	l.rows = append(l.rows, r)
	l.size += rowSize(r)
}

// event applies a marker; false when it names no step of the job (then
// the line is a row like any other).
func (l *stepLog) event(e steps.Event, t time.Time) bool {
	switch e.Kind {
	case "start", "end":
		if e.Step < 0 || e.Step >= len(l.steps) {
			return false
		}
		s := l.steps[e.Step]
		if e.Kind == "start" {
			s.StartedAt = timestamppb.New(t)
			s.LogIndex = l.count()
			return true
		}
		s.Result = result(e.Result)
		if s.StartedAt != nil {
			s.StoppedAt = timestamppb.New(t)
			s.LogLength = l.count() - s.LogIndex
		}
		return true
	case "outputs":
		for k, v := range e.Outputs {
			l.outputs[k] = v
		}
		return true
	case "job":
		// The job's result is the pod's exit code, read from its status.
		return true
	}
	return false
}

// finish ends the steps the log left open when the job ended with
// result: a step that started and did not end ends with the job (a
// cancelled or timed-out job's last step), one that never started is
// skipped (the job ended before it), so Gitea shows no step running.
func (l *stepLog) finish(r runnerv1.Result, t time.Time) {
	for _, s := range l.steps {
		if s.Result != runnerv1.Result_RESULT_UNSPECIFIED {
			continue
		}
		if s.StartedAt == nil {
			s.Result = runnerv1.Result_RESULT_SKIPPED
			continue
		}
		s.Result = r
		if r == runnerv1.Result_RESULT_SUCCESS {
			// A step the log never ended did not succeed, whatever the pod
			// said.
			s.Result = runnerv1.Result_RESULT_FAILURE
		}
		s.StoppedAt = timestamppb.New(t)
		s.LogLength = l.count() - s.LogIndex
	}
}

// count is how many rows the log has had.
func (l *stepLog) count() int64 { return l.base + int64(len(l.rows)) }

// pending is the rows from index from on, at most n and, but for the
// first, at most bytes of them.
func (l *stepLog) pending(from int64, n, bytes int) []*runnerv1.LogRow {
	i := int(max(from-l.base, 0))
	if i >= len(l.rows) {
		return nil
	}
	end, size := i, 0
	for end < len(l.rows) && end-i < n {
		size += rowSize(l.rows[end])
		if end > i && size > bytes {
			break
		}
		end++
	}
	return l.rows[i:end]
}

// drop forgets the rows before index to, which Gitea holds.
func (l *stepLog) drop(to int64) {
	k := min(max(to-l.base, 0), int64(len(l.rows)))
	if k == 0 {
		return
	}
	for _, r := range l.rows[:k] {
		l.size -= rowSize(r)
	}
	l.rows = append([]*runnerv1.LogRow(nil), l.rows[k:]...)
	l.base += k
}

// result is a result as Gitea's protocol names it.
func result(r string) runnerv1.Result {
	switch r {
	case steps.Success:
		return runnerv1.Result_RESULT_SUCCESS
	case steps.Failure:
		return runnerv1.Result_RESULT_FAILURE
	case steps.Cancelled:
		return runnerv1.Result_RESULT_CANCELLED
	case steps.Skipped:
		return runnerv1.Result_RESULT_SKIPPED
	}
	return runnerv1.Result_RESULT_UNSPECIFIED
}
