package main

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/go-logr/logr"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/uuid"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	"k8s.io/utils/clock"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/manager"

	rwadmission "github.com/runwarden/runwarden/webhook/admission"
	"github.com/runwarden/runwarden/webhook/audit"
	"github.com/runwarden/runwarden/webhook/policy"
)

// reportLease is the Lease the webhook replicas elect the one that writes
// PolicyReports with.
const reportLease = "runwarden-webhook-policy-reports"

// reportFieldOwner is the field manager of the reports.
const reportFieldOwner = "runwarden-webhook"

// reportWriter writes the runner namespace's PolicyReport every interval:
// the recent runner pods admitted by the set in force, with the audit's own
// evaluation (audit.Evaluator, as `policy audit`). Only the replica that
// holds the Lease writes; the others wait to take it over.
type reportWriter struct {
	reader    client.Reader // the API server: pods and Jobs are not cached
	writer    client.Client
	policies  rwadmission.Policies
	evaluator func(*policy.Set) *audit.Evaluator
	namespace string
	// since is how far back pods are reported; maxResults bounds a
	// report (audit.ReportOptions.MaxResults).
	since      time.Duration
	maxResults int
	interval   time.Duration
	clock      clock.WithTicker
}

var _ manager.LeaderElectionRunnable = (*reportWriter)(nil)

// NeedLeaderElection is false: the writer elects its own leader (elect),
// so that losing the Lease stops the reports, not the webhook.
func (w *reportWriter) NeedLeaderElection() bool { return false }

// Start writes a report at once, then every interval, until ctx ends.
func (w *reportWriter) Start(ctx context.Context) error {
	t := w.clock.NewTicker(w.interval)
	defer t.Stop()
	for {
		if err := w.write(ctx); err != nil {
			logr.FromContextOrDiscard(ctx).Error(err, "writing the policy report", "namespace", w.namespace)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
	}
}

// write evaluates the recent runner pods with the set in force and applies
// the report.
func (w *reportWriter) write(ctx context.Context) error {
	set := w.policies.Current()
	ev := w.evaluator(set)
	var since time.Time
	if w.since > 0 {
		since = w.clock.Now().Add(-w.since)
	}
	rec, err := audit.ListRunners(ctx, w.reader, w.namespace, since)
	if err != nil {
		return err
	}
	// Each pod has a result at least: more pods than results are never
	// reported.
	subjects := audit.Subjects(rec.Jobs, rec.Pods, w.maxResults)
	pods := make([]audit.Evaluated, 0, len(subjects))
	for _, s := range subjects {
		o, err := ev.Evaluate(ctx, s)
		if err != nil {
			return err
		}
		pods = append(pods, audit.Evaluated{Subject: s, Outcome: o})
	}
	r := audit.BuildReport(w.namespace, pods, audit.ReportOptions{
		Set: set, Rules: ev.Rules(), MaxResults: w.maxResults, Now: w.clock.Now(),
		Labels: map[string]string{"app.kubernetes.io/managed-by": "runwarden"},
	})
	obj, err := runtime.DefaultUnstructuredConverter.ToUnstructured(&r)
	if err != nil {
		return fmt.Errorf("encoding the policy report: %w", err)
	}
	u := &unstructured.Unstructured{Object: obj}
	if err := w.writer.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(reportFieldOwner), client.ForceOwnership); err != nil {
		return fmt.Errorf("writing PolicyReport %s/%s (is the chart's CRD installed, with policyReports.enabled?): %w", w.namespace, audit.ReportName, err)
	}
	return nil
}

// electedRunnable runs r while this replica holds the Lease
// namespace/name, and stands by for it again when it loses it.
type electedRunnable struct {
	r                   manager.Runnable
	cfg                 *rest.Config
	namespace, name     string
	identity            string
	lease, renew, retry time.Duration
}

var _ manager.LeaderElectionRunnable = (*electedRunnable)(nil)

// newElected elects with the Lease in namespace; the identity is the
// host name (the pod's) and a random suffix.
func newElected(r manager.Runnable, cfg *rest.Config, namespace string) *electedRunnable {
	host, _ := os.Hostname()
	return &electedRunnable{
		r: r, cfg: cfg, namespace: namespace, name: reportLease, identity: host + "_" + string(uuid.NewUUID()),
		lease: 30 * time.Second, renew: 20 * time.Second, retry: 5 * time.Second,
	}
}

// NeedLeaderElection is false: it elects by itself.
func (e *electedRunnable) NeedLeaderElection() bool { return false }

// Start stands for the Lease until ctx ends.
func (e *electedRunnable) Start(ctx context.Context) error {
	cs, err := kubernetes.NewForConfig(e.cfg)
	if err != nil {
		return fmt.Errorf("making the Lease client: %w", err)
	}
	lock, err := resourcelock.New(resourcelock.LeasesResourceLock, e.namespace, e.name, cs.CoreV1(), cs.CoordinationV1(),
		resourcelock.ResourceLockConfig{Identity: e.identity})
	if err != nil {
		return fmt.Errorf("making the Lease lock %s/%s: %w", e.namespace, e.name, err)
	}
	logger := logr.FromContextOrDiscard(ctx).WithValues("lease", e.namespace+"/"+e.name)
	for ctx.Err() == nil {
		leaderelection.RunOrDie(ctx, leaderelection.LeaderElectionConfig{
			Lock: lock, LeaseDuration: e.lease, RenewDeadline: e.renew, RetryPeriod: e.retry, ReleaseOnCancel: true,
			Name: e.name,
			Callbacks: leaderelection.LeaderCallbacks{
				OnStartedLeading: func(ctx context.Context) {
					logger.Info("leading: writing policy reports")
					if err := e.r.Start(ctx); err != nil {
						logger.Error(err, "policy reports stopped")
					}
				},
				OnStoppedLeading: func() { logger.Info("no longer leading: policy reports stop") },
			},
		})
	}
	return nil
}
