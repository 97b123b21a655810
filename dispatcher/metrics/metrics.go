// Package metrics holds the dispatcher's Prometheus metrics, registered with
// controller-runtime's registry so the manager's /metrics serves them. Label
// values come from bounded sets (phases and the dispatcher's reasons).
package metrics

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Recorder records what the dispatcher does.
type Recorder struct {
	created  prometheus.Counter
	finished *prometheus.CounterVec
	running  prometheus.Gauge
	capacity prometheus.Gauge
	leased   prometheus.Counter
	renewals prometheus.Counter
	errors   *prometheus.CounterVec
	leader   prometheus.Gauge
	wait     prometheus.Histogram
	duration *prometheus.HistogramVec
	polled   prometheus.Gauge
	reloads  *prometheus.CounterVec
}

// Buckets of the task histograms: a task waits from a second to an hour,
// and runs from seconds (a plan) to hours (a large apply).
var (
	waitBuckets     = []float64{0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}
	durationBuckets = []float64{5, 15, 30, 60, 120, 300, 600, 1200, 1800, 3600, 7200, 14400}
)

// New makes the metrics and registers them with reg (controller-runtime's
// registry when nil).
func New(reg prometheus.Registerer, capacity int) *Recorder {
	if reg == nil {
		reg = crmetrics.Registry
	}
	r := &Recorder{
		created: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "runwarden_dispatcher_jobs_created_total",
			Help: "Jobs created for tasks (an adopted Job is not counted again).",
		}),
		finished: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runwarden_dispatcher_tasks_finished_total",
			Help: "Tasks finished, by phase and reason.",
		}, []string{"phase", "reason"}),
		running: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "runwarden_dispatcher_tasks_running",
			Help: "This dispatcher's unfinished Jobs, as last counted.",
		}),
		capacity: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "runwarden_dispatcher_capacity",
			Help: "How many tasks may run at once.",
		}),
	}
	r.leased = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "runwarden_dispatcher_tasks_leased_total",
		Help: "Task leases taken from the orchestrator (a duplicate delivery is not counted).",
	})
	r.renewals = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "runwarden_dispatcher_lease_renew_failures_total",
		Help: "Lease renewals that failed (network, server error, or the lease was gone).",
	})
	r.errors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "runwarden_dispatcher_source_errors_total",
		Help: "Failed requests to the task source, by operation (orchestrator: poll, renew, report, log; Gitea: fetch, report, log).",
	}, []string{"op"})
	r.leader = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "runwarden_dispatcher_leader",
		Help: "1 while this replica leads (dispatches tasks), 0 while it stands by (--leader-elect).",
	})
	r.wait = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "runwarden_dispatcher_task_queue_wait_seconds",
		Help:    "From a task's submission (a RunnerTask made, a lease taken) to its runner running: waiting for a slot, for Kueue, for the pod to start.",
		Buckets: waitBuckets,
	})
	r.duration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "runwarden_dispatcher_task_duration_seconds",
		Help:    "How long tasks ran, from their runner running to their end, by phase.",
		Buckets: durationBuckets,
	}, []string{"phase"})
	r.polled = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "runwarden_dispatcher_last_poll_success_timestamp_seconds",
		Help: "When the task source last answered a poll (the orchestrator's poll, Gitea's FetchTask; Unix seconds); 0 before the first, and for the kube source.",
	})
	r.reloads = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "runwarden_dispatcher_template_reloads_total",
		Help: "Changes of the watched PodTemplate (--pod-template-object) by result: success, or failure (not a valid runner template, or deleted; the last good one stays in force).",
	}, []string{"result"})
	// The series of every known label value exist from the start, at 0, so
	// rates and alerts see their first increase.
	for _, op := range []string{"poll", "renew", "report", "log", "fetch"} {
		r.errors.WithLabelValues(op)
	}
	for _, result := range []string{"success", "failure"} {
		r.reloads.WithLabelValues(result)
	}
	r.capacity.Set(float64(capacity))
	reg.MustRegister(r.created, r.finished, r.running, r.capacity, r.leased, r.renewals, r.errors, r.leader, r.wait, r.duration, r.polled, r.reloads)
	return r
}

// Started records that a task's runner runs, wait after its submission.
func (r *Recorder) Started(wait time.Duration) { r.wait.Observe(wait.Seconds()) }

// Ran records how long a task that ran took, by its final phase.
func (r *Recorder) Ran(phase string, d time.Duration) {
	r.duration.WithLabelValues(phase).Observe(d.Seconds())
}

// Polled records a poll the orchestrator answered, at t.
func (r *Recorder) Polled(t time.Time) { r.polled.Set(float64(t.Unix())) }

// Leading sets whether this replica leads.
func (r *Recorder) Leading(yes bool) {
	if yes {
		r.leader.Set(1)
		return
	}
	r.leader.Set(0)
}

// JobCreated counts a created Job.
func (r *Recorder) JobCreated() { r.created.Inc() }

// Finished counts a finished task.
func (r *Recorder) Finished(phase, reason string) { r.finished.WithLabelValues(phase, reason).Inc() }

// Running sets the number of running tasks.
func (r *Recorder) Running(n int) { r.running.Set(float64(n)) }

// Leased counts leases taken.
func (r *Recorder) Leased(n int) { r.leased.Add(float64(n)) }

// RenewFailed counts a failed lease renewal.
func (r *Recorder) RenewFailed() { r.renewals.Inc() }

// SourceError counts a failed request to the task source; op is one of
// poll, renew, report and log.
func (r *Recorder) SourceError(op string) { r.errors.WithLabelValues(op).Inc() }

// TemplateReload counts a change of the watched pod template by result.
func (r *Recorder) TemplateReload(result string) { r.reloads.WithLabelValues(result).Inc() }
