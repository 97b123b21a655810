package runner

import "time"

// Recorder counts what a task source does with Jobs; see package metrics.
// A source that counts more (leases, polls) declares its own interface
// embedding this one.
type Recorder interface {
	// JobCreated: a task's Job was made.
	JobCreated()
	// Finished: a task ended in phase, for reason.
	Finished(phase, reason string)
	// Running: n of this dispatcher's tasks hold a slot.
	Running(n int)
	// Started: a task's runner runs, wait after the task was taken.
	Started(wait time.Duration)
	// Ran: a task that ran ended in phase after d.
	Ran(phase string, d time.Duration)
}

// NoRecorder counts nothing: the default Recorder.
type NoRecorder struct{}

var _ Recorder = NoRecorder{}

// JobCreated implements Recorder.
func (NoRecorder) JobCreated() {}

// Finished implements Recorder.
func (NoRecorder) Finished(string, string) {}

// Running implements Recorder.
func (NoRecorder) Running(int) {}

// Started implements Recorder.
func (NoRecorder) Started(time.Duration) {}

// Ran implements Recorder.
func (NoRecorder) Ran(string, time.Duration) {}
