package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/metrics"
	"github.com/runwarden/runwarden/dispatcher/runner"
	"github.com/runwarden/runwarden/internal/contract"
)

// leaderFlags configure leader election among replicas.
type leaderFlags struct {
	elect bool
	// namespace holds the Lease; default: --namespace.
	namespace           string
	lease, renew, retry time.Duration
}

// check checks leader election's flags. The Lease decides which replica
// dispatches, so it is never kept in namespace (--namespace), where runner
// pods may write Leases (a task's state backend does).
func (l *leaderFlags) check(namespace string) error {
	if !l.elect {
		return nil
	}
	if l.namespace == "" {
		return errors.New("--leader-elect needs --leader-elect-namespace, where the replicas' Lease is kept: a namespace where only the platform writes Leases (the chart: its release namespace)")
	}
	if err := (runner.Shared{Namespace: namespace}).Outside("--leader-elect-namespace", l.namespace, l.namespace, "write Leases (a runner's state backend may)"); err != nil {
		return err
	}
	if l.retry <= 0 || l.retry >= l.renew || l.renew >= l.lease {
		return fmt.Errorf("--leader-elect-retry-period %s, --leader-elect-renew-deadline %s, --leader-elect-lease-duration %s: each must be shorter than the next", l.retry, l.renew, l.lease)
	}
	return nil
}

// newScheme holds the API types the dispatcher reads and writes.
func newScheme() (*runtime.Scheme, error) {
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return nil, err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return nil, err
	}
	return scheme, nil
}

// cacheOptions say what the manager's cache holds.
func (c config) cacheOptions() cache.Options {
	own := labels.SelectorFromSet(labels.Set{contract.LabelDispatcher: c.id})
	opts := cache.Options{
		// The cache holds every Job and pod in flight: leave out what the
		// dispatcher never reads.
		DefaultTransform: cache.TransformStripManagedFields(),
		ByObject: map[client.Object]cache.ByObject{
			// Only this dispatcher's Jobs and pods are watched, trimmed to
			// what it reads.
			&batchv1.Job{}: {Label: own, Transform: job.CacheTransform()},
			&corev1.Pod{}:  {Label: own, Transform: job.CacheTransform()},
		}}
	if c.namespace != "" {
		opts.DefaultNamespaces = map[string]cache.Config{c.namespace: {}}
	}
	return opts
}

// fencing is, with --leader-elect, the fenced lock and a client whose
// writes stop when the lease may be lost; without, no lock and the
// manager's client.
func (c config) fencing(restCfg *rest.Config) (*fencedLock, func(ctrl.Manager) client.Client, error) {
	plain := func(mgr ctrl.Manager) client.Client { return mgr.GetClient() }
	if !c.leader.elect {
		return nil, plain, nil
	}
	lock, err := newFencedLock(restCfg, c.leader.namespace, "runwarden-dispatcher-"+c.id, c.leader.renew)
	if err != nil {
		return nil, nil, err
	}
	return lock, func(mgr ctrl.Manager) client.Client {
		// The manager's client has no request timeout (one on restCfg
		// would end the cache's watches too): each write gets its
		// deadline from the fence instead.
		return fencedClient{Client: mgr.GetClient(), left: func() time.Duration { return lock.left(c.leader.renew) }}
	}, nil
}

// newManager makes the manager: its cache, metrics and probes, and leader
// election among replicas.
func newManager(ctx context.Context, c config, restCfg *rest.Config, scheme *runtime.Scheme, lock *fencedLock) (ctrl.Manager, error) {
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                 scheme,
		Cache:                  c.cacheOptions(),
		Metrics:                metricsserver.Options{BindAddress: c.metricsAddr},
		HealthProbeBindAddress: c.healthAddr,
		PprofBindAddress:       c.pprofAddr,
		BaseContext:            func() context.Context { return ctx },
		// Only the leader runs the sources; a replica stopped gracefully
		// hands the lease over at once.
		LeaderElection:                c.leader.elect,
		LeaderElectionID:              "runwarden-dispatcher-" + c.id,
		LeaderElectionNamespace:       c.leader.namespace,
		LeaderElectionReleaseOnCancel: true,
		// A nil *fencedLock would be an interface that is not nil.
		LeaderElectionResourceLockInterface: resourceLock(lock),
		LeaseDuration:                       &c.leader.lease,
		RenewDeadline:                       &c.leader.renew,
		RetryPeriod:                         &c.leader.retry,
	})
	if err != nil {
		return nil, fmt.Errorf("making the manager: %w", err)
	}
	return mgr, nil
}

// awaitLead logs and counts this replica taking the lead.
func awaitLead(ctx context.Context, mgr ctrl.Manager, recorder *metrics.Recorder) {
	select {
	case <-mgr.Elected():
		recorder.Leading(true)
		logr.FromContextOrDiscard(ctx).Info("leading: dispatching tasks")
	case <-ctx.Done():
	}
}

// addProbes adds /healthz and /readyz; with leader election a standby is
// healthy but not ready: only the leader dispatches.
func addProbes(mgr ctrl.Manager, elect bool) error {
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if !elect {
		return nil
	}
	return mgr.AddReadyzCheck("leader", func(*http.Request) error {
		select {
		case <-mgr.Elected():
			return nil
		default:
			return errors.New("standing by: another replica leads")
		}
	})
}

// resourceLock is lock as leader election takes it: nil without one.
func resourceLock(lock *fencedLock) resourcelock.Interface {
	if lock == nil {
		return nil
	}
	return lock
}
