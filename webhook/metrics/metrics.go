// Package metrics holds the webhook's Prometheus metrics, registered with
// controller-runtime's registry so the manager's /metrics serves them.
// Every label has a bounded set of values.
package metrics

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"math"
	"os"
	"regexp"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/runwarden/runwarden/webhook/policy"
)

// Recorder records admissions, denials and policy reloads.
type Recorder struct {
	admissions *prometheus.CounterVec
	latency    prometheus.Histogram
	reloads    *prometheus.CounterVec
	timeouts   prometheus.Counter
	denials    *prometheus.CounterVec
	decisions  *prometheus.CounterVec
	policyInfo *prometheus.GaugeVec
	cache      *prometheus.GaugeVec

	reg prometheus.Registerer

	rulesMu sync.Mutex
	rules   map[string]bool // rule labels in use
}

// New makes the metrics and registers them with reg (controller-runtime's
// registry when nil).
func New(reg prometheus.Registerer) *Recorder {
	if reg == nil {
		reg = crmetrics.Registry
	}
	r := &Recorder{
		rules: map[string]bool{},
		admissions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runwarden_webhook_admissions_total",
			Help: "Admission requests by result: mutated, allowed, denied, skipped (not a runner pod), error.",
		}, []string{"result"}),
		latency: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "runwarden_webhook_admission_duration_seconds",
			Help:    "Time to answer an admission request, policy evaluation included.",
			Buckets: []float64{0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5},
		}),
		reloads: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runwarden_webhook_policy_reloads_total",
			Help: "Policy reload attempts after the first load, by result: success, or failure (the last good set stays in force).",
		}, []string{"result"}),
		timeouts: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "runwarden_webhook_policy_reload_timeouts_total",
			Help: "Policy reloads refused because an evaluation (a test, the probe decision) ran past --policy-timeout; each is also a reload failure.",
		}),
		denials: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runwarden_webhook_denials_total",
			Help: "Rule violations by rule and action: deny (the pod was refused), warn (admitted with a warning), dryrun (admitted, the user told nothing).",
		}, []string{"rule", "action"}),
		decisions: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "runwarden_webhook_policy_decisions_total",
			Help: "Decisions of the policies by source: cache (pods whose parts the policies read were seen before), evaluation (a full evaluation of the policies).",
		}, []string{"source"}),
		policyInfo: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "runwarden_webhook_policy_info",
			Help: "The policy set in force: 1 for its digest.",
		}, []string{"digest"}),
		cache: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "runwarden_webhook_decision_cache_enabled",
			Help: "Whether the policy set in force caches its decisions: 1 (reason none), or 0 with the form that turned the cache off (whole-input, impure-builtin, with-impure-builtin, with-target, builtin-name; the log names the file and line).",
		}, []string{"reason"}),
	}
	// The series of every known label value exist from the start, at 0, so
	// rates and alerts see their first increase.
	for _, result := range []string{"success", "failure"} {
		r.reloads.WithLabelValues(result)
	}
	for _, result := range []string{"mutated", "allowed", "denied", "skipped", "error"} {
		r.admissions.WithLabelValues(result)
	}
	for _, source := range []policy.Source{policy.FromCache, policy.FromEvaluation} {
		r.decisions.WithLabelValues(string(source))
	}
	reg.MustRegister(r.admissions, r.latency, r.reloads, r.timeouts, r.denials, r.decisions, r.policyInfo, r.cache)
	r.reg = reg
	return r
}

// WatchCertificate serves the expiry of the serving certificate in the PEM
// file at path (read at each scrape: rotation replaces the file) as
// runwarden_webhook_certificate_expiry_timestamp_seconds; NaN while the
// file cannot be read.
func (r *Recorder) WatchCertificate(path string) error {
	return r.reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "runwarden_webhook_certificate_expiry_timestamp_seconds",
		Help: "When the webhook's serving certificate expires (Unix seconds).",
	}, func() float64 {
		t, err := notAfter(path)
		if err != nil {
			return math.NaN()
		}
		return float64(t.Unix())
	}))
}

// notAfter is the expiry of the first certificate in a PEM file.
func notAfter(path string) (time.Time, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return time.Time{}, err
	}
	for {
		var block *pem.Block
		block, b = pem.Decode(b)
		if block == nil {
			return time.Time{}, fmt.Errorf("%s: no certificate", path)
		}
		if block.Type == "CERTIFICATE" {
			c, err := x509.ParseCertificate(block.Bytes)
			if err != nil {
				return time.Time{}, fmt.Errorf("%s: %w", path, err)
			}
			return c.NotAfter, nil
		}
	}
}

// Admission records one answered request.
func (r *Recorder) Admission(result string, d time.Duration) {
	r.admissions.WithLabelValues(result).Inc()
	r.latency.Observe(d.Seconds())
}

// Decision records one decision of the policies by its source.
func (r *Recorder) Decision(source policy.Source) {
	r.decisions.WithLabelValues(string(source)).Inc()
}

var ruleName = regexp.MustCompile(`^[a-z0-9][a-z0-9-]{0,62}$`)

// maxRules bounds the distinct rule labels of the denials metric.
const maxRules = 64

// Violation records one violation of a rule, with its action (deny, warn
// or dryrun). Names that are not short kebab-case words, and any name after
// the first maxRules (a rule named from its input, such as "quota-" and the
// namespace), are counted as "other", and so is an action that is not one,
// so a policy cannot grow the label set without bound: at most
// (maxRules+1) x 4 series.
func (r *Recorder) Violation(rule, action string) {
	if !ruleName.MatchString(rule) || !r.knownRule(rule) {
		rule = "other"
	}
	switch action {
	case policy.ActionDeny, policy.ActionWarn, policy.ActionDryrun:
	default:
		action = "other"
	}
	r.denials.WithLabelValues(rule, action).Inc()
}

func (r *Recorder) knownRule(rule string) bool {
	r.rulesMu.Lock()
	defer r.rulesMu.Unlock()
	if r.rules[rule] {
		return true
	}
	if len(r.rules) >= maxRules {
		return false
	}
	r.rules[rule] = true
	return true
}

// Loaded records the digest of the set put in force at start, which is not
// a reload.
func (r *Recorder) Loaded(digest string) {
	r.policyInfo.Reset()
	r.policyInfo.WithLabelValues(digest).Set(1)
}

// DecisionCache records whether the set in force caches its decisions:
// off is nil when it does (1, reason "none"), else why not (0, reason its
// form). The reason is one of policy.CacheOffForms, "other" for any other
// value, never a file name: one series at a time, of a handful of label
// values.
func (r *Recorder) DecisionCache(off *policy.CacheOff) {
	r.cache.Reset()
	if off == nil {
		r.cache.WithLabelValues(CacheOn).Set(1)
		return
	}
	reason := string(off.Form)
	if !slices.Contains(policy.CacheOffForms(), off.Form) {
		reason = "other"
	}
	r.cache.WithLabelValues(reason).Set(0)
}

// CacheOn is the reason of runwarden_webhook_decision_cache_enabled while
// the cache is on.
const CacheOn = "none"

// Reload records a reload attempt and, on success, the new set's digest.
// A failure that is a timeout (errors.Is policy.ErrTimeout) counts in the
// timeouts too.
func (r *Recorder) Reload(digest string, err error) {
	if err != nil {
		r.reloads.WithLabelValues("failure").Inc()
		if errors.Is(err, policy.ErrTimeout) {
			r.timeouts.Inc()
		}
		return
	}
	r.reloads.WithLabelValues("success").Inc()
	r.Loaded(digest)
}
