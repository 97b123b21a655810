package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"
	"time"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/cache"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/healthz"
	ctrllog "sigs.k8s.io/controller-runtime/pkg/log"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/dispatcher/job"
	rwkube "github.com/runwarden/runwarden/dispatcher/kube"
	"github.com/runwarden/runwarden/dispatcher/metrics"
	"github.com/runwarden/runwarden/internal/kube"
	"github.com/runwarden/runwarden/internal/logging"
	"github.com/runwarden/runwarden/internal/version"
)

// config is the parsed command line.
type config struct {
	id            string
	template      string
	maxConcurrent int
	deadline      time.Duration
	unschedulable time.Duration
	keepSucceeded int
	keepFailed    int
	qps           float64
	burst         int
	preflight     bool
	preflightWait time.Duration
	ttl           time.Duration
	envAllow      []string
	repoAllow     []*regexp.Regexp
	namespace     string
	metricsAddr   string
	healthAddr    string
	kubeconfig    string
	logLevel      string
	version       bool
}

func parse(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	var c config
	var envAllow, repoAllow string
	fs := flag.NewFlagSet("runwarden-dispatcher", flag.ContinueOnError)
	fs.SetOutput(stderr)
	defaultID := getenv("POD_NAME")
	if defaultID == "" {
		defaultID, _ = os.Hostname()
	}
	fs.StringVar(&c.id, "dispatcher-id", defaultID, "this dispatcher's name on its Jobs (default $POD_NAME, then the host name)")
	fs.StringVar(&c.template, "pod-template", "", "the platform's runner pod template (a PodTemplateSpec, YAML); it must have a container named main")
	fs.IntVar(&c.maxConcurrent, "max-concurrent", 10, "tasks running at once; more wait")
	fs.DurationVar(&c.deadline, "default-deadline", time.Hour, "activeDeadlineSeconds of tasks that set none")
	fs.DurationVar(&c.ttl, "job-ttl", 24*time.Hour, "ttlSecondsAfterFinished of the Jobs")
	fs.Float64Var(&c.qps, "kube-api-qps", 50, "requests per second to the API server, sustained")
	fs.IntVar(&c.burst, "kube-api-burst", 100, "requests to the API server in a burst")
	fs.BoolVar(&c.preflight, "preflight", true, "at start, prove with a throwaway Job that a runner pod is admitted in --namespace (RBAC, Pod Security, webhooks, quota); exit naming the cause if not")
	fs.DurationVar(&c.preflightWait, "preflight-timeout", 2*time.Minute, "how long the preflight Job's pod may take to appear")
	fs.IntVar(&c.keepSucceeded, "succeeded-history", 50, "finished Jobs of succeeded tasks kept per namespace")
	fs.IntVar(&c.keepFailed, "failed-history", 100, "finished Jobs of failed tasks kept per namespace")
	fs.DurationVar(&c.unschedulable, "unschedulable-timeout", 5*time.Minute, "fail a task whose pod stays unschedulable this long")
	fs.StringVar(&envAllow, "env-allow", "", "comma-separated glob patterns of the env variable names a task may set (default: none)")
	fs.StringVar(&repoAllow, "repo-allow", "", "comma-separated regular expressions a task's repository URL must match one of (default: any)")
	fs.StringVar(&c.namespace, "namespace", "", "watch RunnerTasks in this namespace only (default: all)")
	fs.StringVar(&c.metricsAddr, "metrics-bind-address", ":8080", `address of /metrics ("0" disables)`)
	fs.StringVar(&c.healthAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig (default: in-cluster, then $KUBECONFIG)")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&c.version, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.version {
		return c, nil
	}
	if c.id == "" {
		return c, errors.New("--dispatcher-id is empty and no host name is known")
	}
	if errs := validLabel(c.id); errs != "" {
		return c, fmt.Errorf("--dispatcher-id %q: %s", c.id, errs)
	}
	if c.keepSucceeded < 1 || c.keepFailed < 1 {
		return c, fmt.Errorf("--succeeded-history and --failed-history must be at least 1")
	}
	if c.maxConcurrent < 1 {
		return c, fmt.Errorf("--max-concurrent %d: must be at least 1", c.maxConcurrent)
	}
	c.envAllow = splitList(envAllow)
	for _, p := range splitList(repoAllow) {
		re, err := regexp.Compile(p)
		if err != nil {
			return c, fmt.Errorf("--repo-allow %q: %w", p, err)
		}
		c.repoAllow = append(c.repoAllow, re)
	}
	return c, nil
}

func validLabel(v string) string {
	if _, err := labels.Parse("x=" + v); err != nil || len(v) > 63 {
		return "must be a valid label value (63 characters at most: letters, digits, '-', '_', '.')"
	}
	return ""
}

func splitList(s string) []string {
	var out []string
	for _, p := range strings.Split(s, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

func readTemplate(path string) (corev1.PodTemplateSpec, error) {
	var t corev1.PodTemplateSpec
	if path == "" {
		return t, nil
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return t, fmt.Errorf("reading the pod template: %w", err)
	}
	if err := yaml.UnmarshalStrict(b, &t); err != nil {
		return t, fmt.Errorf("pod template %s: %w", path, err)
	}
	if err := job.ValidateTemplate(t); err != nil {
		return t, fmt.Errorf("pod template %s: %w", path, err)
	}
	return t, nil
}

func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parse(args, os.Getenv, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "runwarden-dispatcher: %v\n", err)
		return 2
	}
	if c.version {
		fmt.Fprintf(stdout, "runwarden-dispatcher %s\n", version.String())
		return 0
	}
	tmpl, err := readTemplate(c.template)
	if err != nil {
		fmt.Fprintf(stderr, "runwarden-dispatcher: %v\n", err)
		return 2
	}
	logger, err := logging.New(c.logLevel, stderr)
	if err != nil {
		fmt.Fprintf(stderr, "runwarden-dispatcher: %v\n", err)
		return 2
	}
	ctrllog.SetLogger(logger)
	ctx = logr.NewContext(ctx, logger)
	if err := serve(ctx, c, tmpl); err != nil {
		logger.Error(err, "dispatcher stopped")
		return 1
	}
	return 0
}

func serve(ctx context.Context, c config, tmpl corev1.PodTemplateSpec) error {
	restCfg, err := kube.RestConfig(c.kubeconfig)
	if err != nil {
		return err
	}
	restCfg.QPS, restCfg.Burst = float32(c.qps), c.burst
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := v1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	own := labels.SelectorFromSet(labels.Set{job.LabelDispatcher: c.id})
	cacheOpts := cache.Options{ByObject: map[client.Object]cache.ByObject{
		// Only this dispatcher's Jobs and pods are watched.
		&batchv1.Job{}: {Label: own},
		&corev1.Pod{}:  {Label: own},
	}}
	if c.namespace != "" {
		cacheOpts.DefaultNamespaces = map[string]cache.Config{c.namespace: {}}
	}
	jobOpts := job.Options{
		DispatcherID: c.id, Template: tmpl,
		DefaultDeadline:         int64(c.deadline.Seconds()),
		TTLSecondsAfterFinished: int32(c.ttl.Seconds()),
		EnvAllowList:            c.envAllow,
		RepoAllowList:           c.repoAllow,
	}
	logger := logr.FromContextOrDiscard(ctx)
	switch {
	case !c.preflight:
	case c.namespace == "":
		logger.Info("preflight skipped: it needs --namespace, the namespace runner Jobs run in")
	default:
		direct, err := client.New(restCfg, client.Options{Scheme: scheme})
		if err != nil {
			return err
		}
		start := time.Now()
		if err := rwkube.Preflight(ctx, rwkube.PreflightOptions{Client: direct, Jobs: jobOpts, Namespace: c.namespace, Timeout: c.preflightWait}); err != nil {
			return err
		}
		logger.Info("preflight passed: a runner pod was admitted", "namespace", c.namespace, "took", time.Since(start).Round(time.Millisecond).String())
	}
	mgr, err := ctrl.NewManager(restCfg, ctrl.Options{
		Scheme:                 scheme,
		Cache:                  cacheOpts,
		Metrics:                metricsserver.Options{BindAddress: c.metricsAddr},
		HealthProbeBindAddress: c.healthAddr,
		BaseContext:            func() context.Context { return ctx },
	})
	if err != nil {
		return fmt.Errorf("making the manager: %w", err)
	}
	r := rwkube.New(rwkube.Options{
		Client:               mgr.GetClient(),
		Jobs:                 jobOpts,
		MaxConcurrent:        c.maxConcurrent,
		UnschedulableTimeout: c.unschedulable,
		Events:               mgr.GetAPIReader(),
		SucceededHistory:     c.keepSucceeded,
		FailedHistory:        c.keepFailed,
		Recorder:             metrics.New(nil, c.maxConcurrent),
	})
	if err := r.SetupWithManager(mgr); err != nil {
		return err
	}
	if err := mgr.AddHealthzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	if err := mgr.AddReadyzCheck("ping", healthz.Ping); err != nil {
		return err
	}
	logger.Info("dispatching RunnerTasks", "dispatcher", c.id, "maxConcurrent", c.maxConcurrent)
	return mgr.Start(ctx)
}
