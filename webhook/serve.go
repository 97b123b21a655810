package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
	"k8s.io/utils/clock"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/manager"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/controller-runtime/pkg/webhook"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/internal/kube"
	"github.com/runwarden/runwarden/internal/logging"
	"github.com/runwarden/runwarden/internal/memlimit"
	rwadmission "github.com/runwarden/runwarden/webhook/admission"
	"github.com/runwarden/runwarden/webhook/audit"
	"github.com/runwarden/runwarden/webhook/cert"
	"github.com/runwarden/runwarden/webhook/metrics"
	"github.com/runwarden/runwarden/webhook/policy"
)

// Paths the webhook serves.
const (
	MutatePath   = "/mutate-pods"
	ValidatePath = "/validate-pods"
)

// serveConfig is the parsed command line of `serve`.
type serveConfig struct {
	bindAddress    string
	port           int
	certDir        string
	certMode       string
	certHosts      []string
	mutatingName   string
	validatingName string
	policyDir      string
	reloadInterval time.Duration
	policyTimeout  time.Duration
	pod            podRef
	configFile     string
	metricsAddr    string
	healthAddr     string
	kubeconfig     string
	logLevel       string
	namespace      string
	shutdownDelay  time.Duration
	jobController  []string
	resolverImage  string
	resolverPull   string
	reports        reportConfig

	// policyTestsTimeout bounds all of a set's tests as it loads.
	policyTestsTimeout time.Duration
}

// reportConfig are the flags of the PolicyReports.
type reportConfig struct {
	enabled    bool
	interval   time.Duration
	since      time.Duration
	maxResults int
}

func parseServe(args []string, stderr io.Writer) (serveConfig, error) {
	var c serveConfig
	var hosts string
	jobController := strings.Join(rwadmission.DefaultJobControllerUsers, ",")
	fs := flag.NewFlagSet("runwarden-webhook serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.bindAddress, "bind-address", "", "address the webhook server listens on (default: all)")
	fs.IntVar(&c.port, "port", 9443, "port of the webhook server (TLS)")
	fs.StringVar(&c.certDir, "cert-dir", "/tmp/runwarden-webhook/certs", "folder holding tls.crt and tls.key")
	fs.StringVar(&c.certMode, "cert-mode", "self", `"self": generate a CA and serving certificate in --cert-dir, keep the webhook configurations' caBundle current, rotate before expiry; "provided": use the files in --cert-dir as they are (cert-manager, a Secret)`)
	fs.StringVar(&hosts, "cert-hosts", "", "comma-separated DNS names and IPs of the self-managed certificate, e.g. runwarden-webhook.runwarden.svc (required with --cert-mode=self)")
	fs.StringVar(&c.mutatingName, "mutating-webhook-configuration", "", "MutatingWebhookConfiguration whose caBundle is kept current (--cert-mode=self)")
	fs.StringVar(&c.validatingName, "validating-webhook-configuration", "", "ValidatingWebhookConfiguration whose caBundle is kept current (--cert-mode=self)")
	fs.StringVar(&c.policyDir, "policies", "", "policy folder to load and watch (default: the shipped policies, embedded)")
	fs.DurationVar(&c.reloadInterval, "policy-reload-interval", 2*time.Second, "how often the policy folder is checked for changes")
	fs.DurationVar(&c.policyTimeout, "policy-timeout", policy.DefaultTimeout, "deadline of each policy decision, the probe decision of a set being loaded included (each of its tests has 30s); keep it below the webhook configurations' timeoutSeconds (5 s in the chart)")
	fs.DurationVar(&c.policyTestsTimeout, "policy-tests-timeout", policy.DefaultTestsTimeout, "deadline of all of a set's tests together as it loads (at start and each reload; each test has 30s, and the first past it stops the rest): past it the set is refused")
	fs.StringVar(&c.pod.name, "pod-name", "", "this webhook's pod, which a refused policy reload is reported on as a Warning Event (the chart sets it from the downward API; empty: no Event, the log and metrics only)")
	fs.StringVar(&c.pod.namespace, "pod-namespace", "", "namespace of --pod-name")
	fs.StringVar(&c.pod.uid, "pod-uid", "", "UID of --pod-name, so that kubectl describe pod lists the Events")
	fs.StringVar(&c.configFile, "config", "", "platform configuration file (YAML) handed to the policies as input.config")
	fs.StringVar(&c.metricsAddr, "metrics-bind-address", ":8080", `address of /metrics ("0" disables)`)
	fs.StringVar(&c.healthAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	fs.StringVar(&c.namespace, "runner-namespace", "", "the one namespace whose runner pods this webhook admits: it caches that Namespace and its service accounts only (so it needs read access to no more) and refuses runner pods elsewhere (default: every namespace, cluster-wide caches)")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig (default: $KUBECONFIG when set, else in-cluster, else ~/.kube/config)")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&c.shutdownDelay, "shutdown-delay", 5*time.Second, "on SIGTERM, keep serving this long with /readyz failing, so the API server stops calling this pod before it closes (0: stop at once)")
	fs.StringVar(&c.resolverImage, "resolver-image", "", "runwarden image whose runwarden-webhook resolves runner pods' secret references in an init container (runwarden-secrets); empty: references reach the runner as written")
	fs.StringVar(&c.resolverPull, "resolver-image-pull-policy", "", "pull policy of --resolver-image: Always, IfNotPresent or Never (default: the cluster's)")
	fs.StringVar(&jobController, "job-controller-users", jobController, "comma-separated users the Job controller creates pods as: only their pods, for a Job of runwarden's dispatcher, may carry the label runwarden.dev/runner")
	fs.BoolVar(&c.reports.enabled, "policy-reports", false, "write a PolicyReport (wgpolicyk8s.io/v1alpha2) in --runner-namespace: the recent runner pods' result per rule under the set in force; the replicas elect the one that writes with the Lease "+reportLease+" in --pod-namespace")
	fs.DurationVar(&c.reports.interval, "policy-report-interval", 5*time.Minute, "how often the PolicyReport is written")
	fs.DurationVar(&c.reports.since, "policy-report-since", 24*time.Hour, "the PolicyReport covers the runner pods created in this last while (0: all)")
	fs.IntVar(&c.reports.maxResults, "policy-report-max-results", audit.DefaultMaxResults, "at most this many results in the PolicyReport: the oldest pods' are left out, whole")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := c.reports.check(c); err != nil {
		return c, err
	}
	c.certHosts, c.jobController = splitList(hosts), splitList(jobController)
	if len(c.jobController) == 0 {
		return c, errors.New("--job-controller-users is empty: no pod could be a runner pod")
	}
	switch c.certMode {
	case "self":
		if len(c.certHosts) == 0 {
			return c, errors.New("--cert-mode=self needs --cert-hosts (the names the API server calls the webhook by)")
		}
	case "provided":
	default:
		return c, fmt.Errorf("--cert-mode %q: use self or provided", c.certMode)
	}
	if c.reloadInterval <= 0 {
		return c, fmt.Errorf("--policy-reload-interval %s: must be more than 0", c.reloadInterval)
	}
	if c.policyTimeout <= 0 {
		return c, fmt.Errorf("--policy-timeout %s: must be more than 0", c.policyTimeout)
	}
	if c.policyTestsTimeout <= 0 {
		return c, fmt.Errorf("--policy-tests-timeout %s: must be more than 0", c.policyTestsTimeout)
	}
	if (c.pod.name == "") != (c.pod.namespace == "") {
		return c, errors.New("--pod-name and --pod-namespace go together: set both (the chart does) or neither")
	}
	if c.shutdownDelay < 0 {
		return c, fmt.Errorf("--shutdown-delay %s: must not be negative", c.shutdownDelay)
	}
	if c.namespace != "" {
		if errs := validation.IsDNS1123Label(c.namespace); len(errs) > 0 {
			return c, fmt.Errorf("--runner-namespace %q: %s", c.namespace, strings.Join(errs, "; "))
		}
	}
	if c.port < 1 || c.port > 65535 {
		return c, fmt.Errorf("--port %d: out of range", c.port)
	}
	switch corev1.PullPolicy(c.resolverPull) {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		return c, fmt.Errorf("--resolver-image-pull-policy %q: use Always, IfNotPresent or Never", c.resolverPull)
	}
	return c, nil
}

// check refuses report flags that cannot work.
func (r reportConfig) check(c serveConfig) error {
	switch {
	case !r.enabled:
		return nil
	case c.namespace == "":
		return errors.New("--policy-reports needs --runner-namespace: the report is that namespace's")
	case c.pod.namespace == "":
		return errors.New("--policy-reports needs --pod-namespace: the replicas elect the one that writes with a Lease there")
	case r.interval <= 0:
		return fmt.Errorf("--policy-report-interval %s: must be more than 0", r.interval)
	case r.maxResults <= 0 || r.since < 0:
		return errors.New("--policy-report-max-results must be more than 0 and --policy-report-since not negative")
	}
	return nil
}

// cacheOptions are the manager's cache settings: the handler only reads
// namespaces and service accounts, so the cache hands out its own objects
// instead of copies; with a namespace, it holds that Namespace (selected by
// name, which RBAC can grant by resourceNames) and the service accounts in
// it, not the whole cluster's. With a role mapping ConfigMap named by the
// platform configuration (rwadmission.RoleMappingConfigMap), it holds that
// one ConfigMap, selected by namespace and name.
func cacheOptions(namespace string, platform map[string]any) cache.Options {
	nsOpts := cache.ByObject{UnsafeDisableDeepCopy: ptr.To(true)}
	saOpts := cache.ByObject{UnsafeDisableDeepCopy: ptr.To(true)}
	if namespace != "" {
		nsOpts.Field = fields.OneTermEqualSelector("metadata.name", namespace)
		saOpts.Namespaces = map[string]cache.Config{namespace: {}}
	}
	by := map[client.Object]cache.ByObject{
		&corev1.Namespace{}:      nsOpts,
		&corev1.ServiceAccount{}: saOpts,
	}
	if ref, ok := rwadmission.RoleMappingConfigMap(platform); ok {
		by[&corev1.ConfigMap{}] = cache.ByObject{
			UnsafeDisableDeepCopy: ptr.To(true),
			Namespaces:            map[string]cache.Config{ref.Namespace: {}},
			Field:                 fields.OneTermEqualSelector("metadata.name", ref.Name),
		}
	}
	return cache.Options{ByObject: by}
}

// cachedKinds are the objects the handler reads from the cache.
func cachedKinds(platform map[string]any) []client.Object {
	kinds := []client.Object{&corev1.Namespace{}, &corev1.ServiceAccount{}}
	if _, ok := rwadmission.RoleMappingConfigMap(platform); ok {
		kinds = append(kinds, &corev1.ConfigMap{})
	}
	return kinds
}

// readPlatformConfig reads the platform configuration file, and checks its
// enforcement (the action per rule).
func readPlatformConfig(path string) (map[string]any, error) {
	if path == "" {
		return map[string]any{}, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("reading the platform configuration: %w", err)
	}
	cfg := map[string]any{}
	if err := yaml.Unmarshal(b, &cfg); err != nil {
		return nil, fmt.Errorf("platform configuration %s: %w", path, err)
	}
	if err := policy.CheckEnforcement(cfg); err != nil {
		return nil, fmt.Errorf("platform configuration %s: %w", path, err)
	}
	return cfg, nil
}

func serve(ctx context.Context, args []string, _, stderr io.Writer) int {
	c, err := parseServe(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "runwarden-webhook: %v\n", err)
		return 2
	}
	logger, err := logging.New(c.logLevel, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "runwarden-webhook: %v\n", err)
		return 2
	}
	ctrllog.SetLogger(logger)
	ctx = logr.NewContext(ctx, logger)
	if err := serveWith(ctx, c); err != nil {
		logger.Error(err, "webhook stopped")
		return 1
	}
	return 0
}

// serveWith serves the admission webhook until ctx ends, then drains.
func serveWith(ctx context.Context, c serveConfig) error {
	platform, err := readPlatformConfig(c.configFile)
	if err != nil {
		return err
	}
	if ref, ok := rwadmission.RoleMappingConfigMap(platform); ok && c.namespace != "" && ref.Namespace == c.namespace {
		return fmt.Errorf("the role mapping ConfigMap %s (workloadIdentity.aws.roleMappingConfigMap) is in the runner namespace (--runner-namespace), where whoever may write ConfigMaps there would choose every runner's IAM role: keep it in a namespace of the platform's (kube-system, as the EKS pod identity webhook)", ref)
	}
	restCfg, err := kube.RestConfig(c.kubeconfig)
	if err != nil {
		return err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	rec := metrics.New(nil)
	if err := rec.WatchCertificate(filepath.Join(c.certDir, "tls.crt")); err != nil {
		return err
	}
	events, stopEvents, err := podEvents(ctx, restCfg, c.pod)
	if err != nil {
		return err
	}
	defer stopEvents()
	store, err := loadPolicies(ctx, c, platform, rec, events)
	if err != nil {
		return err
	}
	certs, err := selfSignedCerts(ctx, c, restCfg, scheme)
	if err != nil {
		return err
	}
	mgr, err := newManager(ctx, c, restCfg, scheme, platform)
	if err != nil {
		return err
	}
	// mctx is the manager's: it ends when the shutdown delay is over (see
	// drainOnShutdown).
	mctx, stop := context.WithCancel(context.WithoutCancel(ctx))
	defer stop()
	// GetWebhookServer also adds the server to the manager's runnables.
	server := mgr.GetWebhookServer()
	registerHandlers(ctx, c, mgr, server, store, platform, rec, mctx.Done())
	for _, step := range []func() error{
		func() error { return addRunnables(mgr, store, certs) },
		func() error { return addReports(c, mgr, restCfg, store, platform) },
		func() error { return addReadyChecks(ctx, mgr, server, platform) },
		func() error { return drainOnShutdown(ctx, mctx, stop, mgr, c.shutdownDelay) },
	} {
		if err := step(); err != nil {
			return err
		}
	}
	logr.FromContextOrDiscard(ctx).Info("serving", "address", net.JoinHostPort(c.bindAddress, fmt.Sprint(c.port)), "paths", []string{MutatePath, ValidatePath}, "goMemoryLimit", memlimit.Current())
	return mgr.Start(mctx)
}

// selfSignedCerts, with --cert-mode=self, makes the serving certificate
// and the webhooks' CA bundle, and returns the manager that renews them;
// nil otherwise.
func selfSignedCerts(ctx context.Context, c serveConfig, restCfg *rest.Config, scheme *runtime.Scheme) (*cert.Manager, error) {
	if c.certMode != "self" {
		return nil, nil
	}
	direct, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	certs, err := cert.New(cert.Options{
		Dir: c.certDir, Hosts: c.certHosts, Client: direct,
		MutatingWebhooks: nonEmpty(c.mutatingName), ValidatingWebhooks: nonEmpty(c.validatingName),
	})
	if err != nil {
		return nil, err
	}
	if err := certs.Ensure(ctx); err != nil {
		return nil, err
	}
	return certs, nil
}

// newManager makes the manager: its webhook server, cache, metrics and
// probes.
func newManager(ctx context.Context, c serveConfig, restCfg *rest.Config, scheme *runtime.Scheme, platform map[string]any) (manager.Manager, error) {
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: c.metricsAddr},
		HealthProbeBindAddress: c.healthAddr,
		WebhookServer:          webhook.NewServer(webhook.Options{Host: c.bindAddress, Port: c.port, CertDir: c.certDir}),
		Cache:                  cacheOptions(c.namespace, platform),
		// Runnables get the context's values (the logger) but not its
		// cancellation: on SIGTERM the manager stops them in its own order,
		// the webhook server last. It cancels the server's context before
		// the server drains, so requests get contexts of their own (Detached).
		BaseContext: func() context.Context { return context.WithoutCancel(ctx) },
	})
	if err != nil {
		return nil, fmt.Errorf("making the manager: %w", err)
	}
	return mgr, nil
}

// registerHandlers registers the mutating and validating handlers.
// stopping closes once the manager stops the server: from then on a
// cancelled request context is the server's doing, not the client's.
func registerHandlers(ctx context.Context, c serveConfig, mgr manager.Manager, server webhook.Server, store *policy.Store, platform map[string]any, rec *metrics.Recorder, stopping <-chan struct{}) {
	resolver := resolverOf(c)
	if resolver == nil {
		logr.FromContextOrDiscard(ctx).Info("no --resolver-image: secret references reach runner pods as written, unresolved")
	}
	for path, mutate := range map[string]bool{MutatePath: true, ValidatePath: false} {
		h := rwadmission.New(rwadmission.Options{Policies: store, Reader: rwadmission.CacheThenLive(mgr.GetClient(), mgr.GetAPIReader()), Config: platform, Mutate: mutate, Recorder: rec, Namespace: c.namespace,
			Jobs: mgr.GetAPIReader(), Pods: mgr.GetAPIReader(), JobControllerUsers: c.jobController, Resolver: resolver,
		})
		server.Register(path, rwadmission.Serve(h, 0, stopping))
	}
}

// resolverOf is the secret references' resolver of --resolver-image, or
// nil.
func resolverOf(c serveConfig) *rwadmission.Resolver {
	if c.resolverImage == "" {
		return nil
	}
	return &rwadmission.Resolver{Image: c.resolverImage, PullPolicy: corev1.PullPolicy(c.resolverPull)}
}

// addReports, with --policy-reports, adds the PolicyReport writer, which
// runs on the replica that holds its Lease.
func addReports(c serveConfig, mgr manager.Manager, restCfg *rest.Config, store *policy.Store, platform map[string]any) error {
	if !c.reports.enabled {
		return nil
	}
	look := rwadmission.ClusterLookups(rwadmission.CacheThenLive(mgr.GetClient(), mgr.GetAPIReader()), nil)
	w := &reportWriter{
		reader: mgr.GetAPIReader(), writer: mgr.GetClient(), policies: store, namespace: c.namespace,
		evaluator: func(s *policy.Set) *audit.Evaluator {
			return audit.NewEvaluator(audit.Options{Set: s, Config: platform, JobControllerUsers: c.jobController, Resolver: resolverOf(c), Lookups: look})
		},
		since: c.reports.since, maxResults: c.reports.maxResults, interval: c.reports.interval, clock: clock.RealClock{},
	}
	return mgr.Add(newElected(w, restCfg, c.pod.namespace))
}

// addRunnables adds the policy reloads and, with self-signed certificates,
// their renewal to the manager.
func addRunnables(mgr manager.Manager, store *policy.Store, certs *cert.Manager) error {
	if err := mgr.Add(manager.RunnableFunc(store.Run)); err != nil {
		return err
	}
	if certs == nil {
		return nil
	}
	return mgr.Add(manager.RunnableFunc(func(ctx context.Context) error { return certs.Run(ctx, time.Hour) }))
}

// addReadyChecks adds /healthz, and /readyz once the server serves and
// the caches the handler reads hold their objects.
func addReadyChecks(ctx context.Context, mgr manager.Manager, server webhook.Server, platform map[string]any) error {
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("webhook", server.StartedChecker()); err != nil {
		return err
	}
	// The handler reads namespaces and service accounts (and the role
	// mapping ConfigMap) from the cache. Their informers start with the
	// manager (not on the first request), and the pod is ready only once
	// they hold their objects: before, a request would fail and the pod be
	// refused.
	for _, obj := range cachedKinds(platform) {
		if _, err := mgr.GetCache().GetInformer(ctx, obj, cache.BlockUntilSynced(false)); err != nil {
			return fmt.Errorf("watching %T: %w", obj, err)
		}
	}
	return mgr.AddReadyzCheck("caches", func(req *http.Request) error {
		ctx, cancel := context.WithTimeout(req.Context(), time.Second)
		defer cancel()
		if !mgr.GetCache().WaitForCacheSync(ctx) {
			return errors.New("the namespace and service account caches are not synced yet")
		}
		return nil
	})
}

// drainOnShutdown serves on, not ready, for delay once ctx ends, then
// stops the manager (stop ends mctx). On SIGTERM the pod leaves the
// Service's endpoints, but the API server keeps calling it until that
// reaches it: stopping at once refused runner pods (failurePolicy Fail) on
// every rolling update.
func drainOnShutdown(ctx, mctx context.Context, stop context.CancelFunc, mgr manager.Manager, delay time.Duration) error {
	var draining atomic.Bool
	if err := mgr.AddReadyzCheck("shutdown", func(*http.Request) error {
		if draining.Load() {
			return errors.New("shutting down")
		}
		return nil
	}); err != nil {
		return err
	}
	go func() {
		select {
		case <-ctx.Done():
		case <-mctx.Done():
			return
		}
		draining.Store(true)
		logr.FromContextOrDiscard(ctx).Info("shutting down: serving on until the delay is over", "delay", delay)
		t := time.NewTimer(delay)
		defer t.Stop()
		select {
		case <-t.C:
		case <-mctx.Done():
		}
		stop()
	}()
	return nil
}

// loadPolicies loads the first policy set and returns the store that
// reloads it. The first load is not a reload: it sets the policy_info
// metric, and only later reloads count in policy_reloads_total. Each
// reload is reported (see reloadReport); events may be nil.
func loadPolicies(ctx context.Context, c serveConfig, platform map[string]any, rec *metrics.Recorder, events *podEventRecorder) (*policy.Store, error) {
	logger := logr.FromContextOrDiscard(ctx)
	report := reloadReport{log: logger, rec: rec, events: events, platform: platform}
	store, err := policy.NewStore(ctx, policy.StoreOptions{
		Dir:      c.policyDir,
		Interval: c.reloadInterval,
		Load:     policy.Options{Timeout: c.policyTimeout, TestsTimeout: c.policyTestsTimeout},
		OnReload: report.report,
	})
	if err != nil {
		return nil, fmt.Errorf("loading the policies: %w", err)
	}
	first := store.Current()
	rec.Loaded(first.Digest)
	logger.Info("policies loaded", "origin", first.Origin, "digest", first.Digest, "tests", first.Tests)
	report.checkEnforcement(first)
	report.decisionCache(first)
	return store, nil
}

func nonEmpty(s string) []string {
	if s == "" {
		return nil
	}
	return []string{s}
}
