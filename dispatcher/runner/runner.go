// Package runner is what the dispatcher's task sources share: the limits
// and their defaults (Options), the capacity rule (Capacity), what a source
// reports (Recorder), settling a finished task's Job (Settler), reading a
// runner's log (LogReader) and observing a Job (NewObserver); and what a
// source offers the dispatcher's command line (Source: its flags, their
// checks, its setup on the manager; Sources: the ones offered, --source).
//
// The contract: a task source (package kube for RunnerTask objects, package
// orchestrator for a remote orchestrator, or another orchestrator's
// protocol) owns its intake and its record of a task (a RunnerTask's
// status, an orchestrator's lease and events); it builds each task's Job
// with package job and leaves everything else here, so every source counts
// capacity, ends Jobs and reads logs the same way. Nothing here holds
// state: a source passes in what it holds (its Jobs, its tasks' slots) and
// keeps its own locks. Time comes from Options.Clock.
package runner

import (
	"time"

	"k8s.io/utils/clock"
)

// Options are the limits every task source runs under.
type Options struct {
	// MaxConcurrent is how many of this dispatcher's tasks may run at once
	// (with Kueue: be admitted; no new task is taken while that many are).
	// Default: 10.
	MaxConcurrent int
	// MaxQueued is, with Kueue, how many of this dispatcher's Jobs may wait
	// in Kueue at once. Default: 100.
	MaxQueued int
	// Workers is how many tasks are reconciled, and Jobs created, at once.
	// Default: 16: each reconcile makes a few API requests, and the client
	// sends 50 a second (--kube-api-qps), so more workers would only wait
	// on its rate limiter.
	Workers int
	// RequeueAfter is how soon a task that waits or runs is looked at again
	// besides the watches: the safety net for what shows in events and the
	// clock rather than in a watched object. Default: 5s.
	RequeueAfter time.Duration
	// UnschedulableTimeout fails a task whose pod stays unschedulable this
	// long. Default: 5m.
	UnschedulableTimeout time.Duration
	// SecretGCWait is how long a task whose Secret name is held by a
	// Secret of a deleted Job waits for the garbage collector to remove
	// it, before that Secret is taken for someone else's and the task is
	// refused. Default: job.DefaultSecretWait (30s).
	SecretGCWait time.Duration
	// SucceededHistory and FailedHistory are how many finished Jobs of each
	// kind are kept per namespace; older ones are deleted (their TTL
	// removes them anyway). Default: 50 and 100.
	SucceededHistory, FailedHistory int
	// Clock tells the time wherever it decides something (status times,
	// timeouts, history) and paces what a source waits for (polls,
	// renewals, retries). Default: the real clock.
	Clock clock.WithTicker
}

// SetDefaults fills in the defaults of the fields left zero. Sources call
// it from their own option defaults.
func (o *Options) SetDefaults() {
	if o.MaxConcurrent <= 0 {
		o.MaxConcurrent = 10
	}
	if o.MaxQueued <= 0 {
		o.MaxQueued = 100
	}
	if o.Workers <= 0 {
		o.Workers = 16
	}
	if o.RequeueAfter <= 0 {
		o.RequeueAfter = 5 * time.Second
	}
	if o.UnschedulableTimeout <= 0 {
		o.UnschedulableTimeout = 5 * time.Minute
	}
	if o.SucceededHistory <= 0 {
		o.SucceededHistory = 50
	}
	if o.FailedHistory <= 0 {
		o.FailedHistory = 100
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
}
