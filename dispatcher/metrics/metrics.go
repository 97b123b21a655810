// Package metrics holds the dispatcher's Prometheus metrics, registered with
// controller-runtime's registry so the manager's /metrics serves them. Label
// values come from bounded sets (phases and the dispatcher's reasons).
package metrics

import (
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
}

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
		Help: "Failed requests to the task source, by operation (poll, renew, report, log).",
	}, []string{"op"})
	r.leader = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "runwarden_dispatcher_leader",
		Help: "1 while this replica leads (dispatches tasks), 0 while it stands by (--leader-elect).",
	})
	r.capacity.Set(float64(capacity))
	reg.MustRegister(r.created, r.finished, r.running, r.capacity, r.leased, r.renewals, r.errors, r.leader)
	return r
}

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
