package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/go-logr/logr"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	"k8s.io/client-go/kubernetes"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/leaderelection/resourcelock"
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
	"github.com/runwarden/runwarden/dispatcher/orchestrator"
	"github.com/runwarden/runwarden/dispatcher/preflight"
	"github.com/runwarden/runwarden/dispatcher/runner"
	"github.com/runwarden/runwarden/internal/kube"
	"github.com/runwarden/runwarden/internal/logging"
	"github.com/runwarden/runwarden/internal/memlimit"
	"github.com/runwarden/runwarden/internal/version"
)

// config is the parsed command line.
// leaderFlags configure leader election among replicas.
type leaderFlags struct {
	elect bool
	// namespace holds the Lease; default: --namespace.
	namespace           string
	lease, renew, retry time.Duration
}

type config struct {
	id            string
	template      string
	maxConcurrent int
	deadline      time.Duration
	unschedulable time.Duration
	secretGCWait  time.Duration
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
	pprofAddr     string
	kubeconfig    string
	logLevel      string
	version       bool
	testRunner    string
	leader        leaderFlags

	// secretDelivery is the platform's secretDelivery, as the webhook
	// reads it: envFile or files.
	secretDelivery string

	// keepLogBytes is how much of a finished RunnerTask's log the kube
	// source keeps in a ConfigMap.
	keepLogBytes int
	// templateObject is --pod-template-object, NAMESPACE/NAME.
	templateObject string

	source string
	orch   orchestratorFlags
	queue  queueFlags
}

// queueFlags say how tasks wait for a slot.
type queueFlags struct {
	kueue                bool
	maxQueued            int
	defaultQueue         string
	defaultPriorityClass string
	priorities           map[string]int32
}

// orchestratorFlags configure the orchestrator task source.
type orchestratorFlags struct {
	url          string
	keyFile      string
	keyID        string
	tokenFile    string
	exchangeFile string
	caFile       string
	proxy        string
	pollWait     time.Duration
	retryMax     time.Duration
	streamLogs   bool
}

// parse reads the command line into a config, with its defaults filled in
// and checked.
func parse(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	var c config
	var l lists
	fs := flag.NewFlagSet("runwarden-dispatcher", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c.bind(fs, &l)
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.version {
		return c, nil
	}
	for _, step := range []func() error{
		func() error { return c.defaultID(getenv) },
		c.checkLimits,
		func() error { return c.queue.check(l.priorities) },
		c.checkDurations,
		func() error { return c.leader.check(c.namespace) },
		c.checkSource(fs),
		func() error { return c.readLists(l) },
	} {
		if err := step(); err != nil {
			return c, err
		}
	}
	return c, nil
}

// lists are the flags parse reads as text and turns into their values.
type lists struct {
	envAllow, repoAllow string
	priorities          priorityFlag
}

// bind defines the flags on fs, into c and l.
func (c *config) bind(fs *flag.FlagSet, l *lists) {
	l.priorities = priorityFlag{}
	fs.StringVar(&c.id, "dispatcher-id", "", "this dispatcher's name on its Jobs (default $POD_NAME, then the host name); keep it stable: a dispatcher carries on only with Jobs of its own ID")
	fs.StringVar(&c.template, "pod-template", "", "the platform's runner pod template (a PodTemplateSpec, YAML); it must have a container named main")
	fs.StringVar(&c.templateObject, "pod-template-object", "", "instead of --pod-template: a PodTemplate object, NAMESPACE/NAME, read from the API server and watched: an edit takes effect for the next task, and one that is not a valid runner template is refused (logged, counted), the last good one staying in force")
	fs.IntVar(&c.maxConcurrent, "max-concurrent", 10, "tasks running at once; more wait")
	fs.DurationVar(&c.deadline, "default-deadline", time.Hour, "activeDeadlineSeconds of tasks that set none")
	fs.DurationVar(&c.ttl, "job-ttl", 24*time.Hour, "ttlSecondsAfterFinished of the Jobs, set once the outcome is recorded")
	fs.Float64Var(&c.qps, "kube-api-qps", 50, "requests per second to the API server, sustained")
	fs.IntVar(&c.burst, "kube-api-burst", 100, "requests to the API server in a burst")
	fs.BoolVar(&c.preflight, "preflight", true, "at start, prove with a throwaway Job that a runner pod is admitted in --namespace (RBAC, Pod Security, webhooks, quota); exit naming the cause if not")
	fs.DurationVar(&c.preflightWait, "preflight-timeout", 2*time.Minute, "how long the preflight Job's pod may take to appear")
	fs.StringVar(&c.secretDelivery, "secret-delivery", "envFile", `how the platform delivers resolved secret references, as its configuration's secretDelivery says: "envFile" or "files" (then a cluster without EnvFiles is expected, and the preflight says so at info level)`)
	fs.IntVar(&c.keepSucceeded, "succeeded-history", 50, "finished Jobs of succeeded tasks kept per namespace")
	fs.IntVar(&c.keepFailed, "failed-history", 100, "finished Jobs of failed tasks kept per namespace")
	fs.IntVar(&c.keepLogBytes, "keep-log-bytes", 256*1024, "with --source=kube, how much of the end of a finished task's runner log is kept in a ConfigMap (status.logConfigMap) after its Job is gone; 0 keeps none")
	fs.DurationVar(&c.unschedulable, "unschedulable-timeout", 5*time.Minute, "fail a task whose pod stays unschedulable this long")
	fs.DurationVar(&c.secretGCWait, "secret-gc-wait", job.DefaultSecretWait, "how long a task whose Secret name is held by a Secret of a deleted Job waits for the garbage collector to remove it, before it is refused (the Secret is then someone else's); raise it where the garbage collector lags")
	fs.StringVar(&l.envAllow, "env-allow", "", "comma-separated glob patterns of the env variable names a task may set (default: none)")
	fs.StringVar(&l.repoAllow, "repo-allow", "", "comma-separated regular expressions a task's repository URL must match one of (default: any)")
	fs.StringVar(&c.namespace, "namespace", "", "the namespace whose RunnerTasks are run (default: all), and where orchestrator tasks' Jobs run (required with --source=orchestrator)")
	fs.StringVar(&c.metricsAddr, "metrics-bind-address", ":8080", `address of /metrics ("0" disables)`)
	fs.StringVar(&c.healthAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	fs.StringVar(&c.pprofAddr, "pprof-bind-address", "", `address of Go's /debug/pprof profiles (default "": off)`)
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig (default: $KUBECONFIG when set, else in-cluster, else ~/.kube/config)")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&c.leader.elect, "leader-elect", false, "run as one of several replicas: only the replica holding the Lease runwarden-dispatcher-<--dispatcher-id> in --leader-elect-namespace dispatches; the others stand by (healthy, not ready) and take over when it goes")
	fs.StringVar(&c.leader.namespace, "leader-elect-namespace", "", "where the replicas' Lease is kept (default --namespace); keep it where only the dispatcher may write Leases: whoever may change it decides whether any replica dispatches")
	fs.DurationVar(&c.leader.lease, "leader-elect-lease-duration", 15*time.Second, "how long a standby waits, after the leader last renewed, before it takes the lease")
	fs.DurationVar(&c.leader.renew, "leader-elect-renew-deadline", 10*time.Second, "how long after it sent its last renewal a leader that cannot renew stops writing to the cluster, and gives up the lead")
	fs.DurationVar(&c.leader.retry, "leader-elect-retry-period", time.Second, "how often candidates try to take or renew the lease")
	fs.BoolVar(&c.queue.kueue, "kueue", false, "queue tasks through Kueue: each Job is made suspended with the kueue.x-k8s.io/queue-name (and priority-class) labels and runs when Kueue admits it; --max-concurrent then counts admitted Jobs")
	fs.IntVar(&c.queue.maxQueued, "max-queued", 100, "with --kueue, Jobs of this dispatcher waiting in Kueue at once; more tasks wait at their source")
	fs.StringVar(&c.queue.defaultQueue, "default-queue", "", "with --kueue, the LocalQueue of tasks that name none (a task with neither is refused)")
	fs.StringVar(&c.queue.defaultPriorityClass, "default-priority-class", "", "the priority class of tasks that name none")
	fs.Var(l.priorities, "priority-class", "without --kueue, a priority class tasks may name, as NAME=VALUE (repeat the flag): waiting tasks start higher value first, then oldest first; with --kueue, tasks name Kueue WorkloadPriorityClasses instead")
	fs.BoolVar(&c.version, "version", false, "print the version and exit")
	fs.StringVar(&c.source, "source", "kube", "where tasks come from: kube (RunnerTask objects) or orchestrator (a remote orchestrator over HTTPS)")
	fs.StringVar(&c.orch.url, "orchestrator-url", "", "the orchestrator's base URL (https), for --source=orchestrator")
	fs.StringVar(&c.orch.keyFile, "orchestrator-key", "", "Ed25519 private key (PKCS #8 PEM) that signs this dispatcher's short-lived JWTs, one per request")
	fs.StringVar(&c.orch.keyID, "orchestrator-key-id", "", "kid of the JWTs: the name the orchestrator registered this dispatcher's public key under; it takes a JWT only for the dispatcher that key is registered for (default: the dispatcher ID)")
	fs.StringVar(&c.orch.tokenFile, "orchestrator-token-file", "", "file holding a static bearer token, read again when it changes")
	fs.StringVar(&c.orch.exchangeFile, "orchestrator-exchange-token-file", "", "projected service account token exchanged at the orchestrator for its own token")
	fs.StringVar(&c.orch.caFile, "orchestrator-ca", "", "PEM bundle of CAs trusted for the orchestrator, besides the system's")
	fs.StringVar(&c.orch.proxy, "orchestrator-proxy", "", "HTTPS proxy URL for the orchestrator (default: $HTTPS_PROXY and $NO_PROXY)")
	fs.DurationVar(&c.orch.pollWait, "poll-wait", 30*time.Second, "how long the orchestrator may hold a poll")
	fs.DurationVar(&c.orch.retryMax, "retry-max-delay", time.Minute, "longest wait between retries when the orchestrator is unreachable (exponential from 1s, full jitter)")
	fs.BoolVar(&c.orch.streamLogs, "stream-logs", true, "send the runner container's log to the orchestrator")
	fs.StringVar(&c.testRunner, "test-runner", "", "instead of serving: run one runner Job from --pod-template in --namespace with this shell script, print its log, and exit 0 if it succeeded (what helm test runs: only the dispatcher may make runner Jobs)")
}

// defaultID fills in the dispatcher ID ($POD_NAME, then the host name) and
// checks it.
func (c *config) defaultID(getenv func(string) string) error {
	if c.id == "" {
		c.id = getenv("POD_NAME")
	}
	if c.id == "" {
		c.id, _ = os.Hostname()
	}
	if c.id == "" {
		return errors.New("--dispatcher-id is empty and no host name is known")
	}
	if errs := validLabel(c.id); errs != "" {
		return fmt.Errorf("--dispatcher-id %q: %s", c.id, errs)
	}
	return nil
}

// checkLimits checks the limits, the pod template flags and the API
// client's rate.
func (c *config) checkLimits() error {
	if c.keepSucceeded < 1 || c.keepFailed < 1 {
		return fmt.Errorf("--succeeded-history and --failed-history must be at least 1")
	}
	if c.maxConcurrent < 1 {
		return fmt.Errorf("--max-concurrent %d: must be at least 1", c.maxConcurrent)
	}
	if c.templateObject != "" {
		if c.template != "" {
			return errors.New("--pod-template and --pod-template-object: give one")
		}
		if _, _, err := parseObjectRef(c.templateObject); err != nil {
			return fmt.Errorf("--pod-template-object %w", err)
		}
	}
	if c.keepLogBytes < 0 || c.keepLogBytes > 900*1024 {
		return fmt.Errorf("--keep-log-bytes %d: between 0 and %d (a ConfigMap holds at most 1 MiB)", c.keepLogBytes, 900*1024)
	}
	if c.qps <= 0 || c.burst < 1 {
		return fmt.Errorf("--kube-api-qps %g, --kube-api-burst %d: must be more than 0", c.qps, c.burst)
	}
	if c.secretDelivery != "envFile" && c.secretDelivery != "files" {
		return fmt.Errorf("--secret-delivery %q: use envFile or files, as the platform configuration's secretDelivery", c.secretDelivery)
	}
	return nil
}

// check checks how tasks wait, and keeps the priority classes.
func (q *queueFlags) check(priorities priorityFlag) error {
	if q.maxQueued < 1 {
		return fmt.Errorf("--max-queued %d: must be at least 1", q.maxQueued)
	}
	q.priorities = priorities
	for flagName, v := range map[string]string{"--default-queue": q.defaultQueue, "--default-priority-class": q.defaultPriorityClass} {
		if v != "" && len(validation.IsDNS1123Subdomain(v)) > 0 {
			return fmt.Errorf("%s %q: not a valid object name", flagName, v)
		}
	}
	if q.kueue && len(priorities) > 0 {
		return errors.New("--priority-class: with --kueue, tasks name Kueue WorkloadPriorityClasses, whose values Kueue holds; leave --priority-class out")
	}
	if !q.kueue && q.defaultQueue != "" {
		return errors.New("--default-queue needs --kueue")
	}
	if !q.kueue && q.defaultPriorityClass != "" {
		if _, ok := priorities[q.defaultPriorityClass]; !ok {
			return fmt.Errorf("--default-priority-class %q: not one of the --priority-class names", q.defaultPriorityClass)
		}
	}
	return nil
}

// checkDurations checks the durations that become a Job's whole seconds.
func (c *config) checkDurations() error {
	for _, d := range []struct {
		flag string
		v    time.Duration
	}{{"--default-deadline", c.deadline}, {"--job-ttl", c.ttl}, {"--unschedulable-timeout", c.unschedulable}, {"--preflight-timeout", c.preflightWait}, {"--secret-gc-wait", c.secretGCWait}} {
		// Jobs take whole seconds: less than one would be none, which
		// the Job builder replaces with its default.
		if d.v < time.Second {
			return fmt.Errorf("%s %s: must be at least 1s", d.flag, d.v)
		}
	}
	if c.ttl.Seconds() > math.MaxInt32 {
		return fmt.Errorf("--job-ttl %s: must be at most %ds (a Job's ttlSecondsAfterFinished)", c.ttl, math.MaxInt32)
	}
	return nil
}

// check checks leader election's flags; the Lease's namespace defaults to
// namespace (--namespace).
func (l *leaderFlags) check(namespace string) error {
	if !l.elect {
		return nil
	}
	if l.namespace == "" {
		l.namespace = namespace
	}
	if l.namespace == "" {
		return errors.New("--leader-elect needs --leader-elect-namespace or --namespace, where the replicas' Lease is kept")
	}
	if l.retry <= 0 || l.retry >= l.renew || l.renew >= l.lease {
		return fmt.Errorf("--leader-elect-retry-period %s, --leader-elect-renew-deadline %s, --leader-elect-lease-duration %s: each must be shorter than the next", l.retry, l.renew, l.lease)
	}
	return nil
}

// checkSource checks the task source's flags: the orchestrator's only
// with --source=orchestrator, --namespace where it is needed.
func (c *config) checkSource(fs *flag.FlagSet) func() error {
	return func() error {
		if c.testRunner != "" && c.namespace == "" {
			return errors.New("--test-runner needs --namespace, where runner Jobs run")
		}
		if err := c.orch.check(c.source, c.namespace); err != nil {
			return err
		}
		if c.source == "orchestrator" {
			return nil
		}
		var set []string
		fs.Visit(func(f *flag.Flag) {
			if orchestratorOnly[f.Name] {
				set = append(set, "--"+f.Name)
			}
		})
		if len(set) > 0 {
			return fmt.Errorf("%s: need --source=orchestrator", strings.Join(set, ", "))
		}
		return nil
	}
}

// readLists reads the allow-lists.
func (c *config) readLists(l lists) error {
	c.envAllow = splitList(l.envAllow)
	for _, p := range splitList(l.repoAllow) {
		re, err := regexp.Compile(p)
		if err != nil {
			return fmt.Errorf("--repo-allow %q: %w", p, err)
		}
		c.repoAllow = append(c.repoAllow, re)
	}
	return nil
}

// limits are the limits both task sources run under.
func (c config) limits() runner.Options {
	return runner.Options{
		MaxConcurrent: c.maxConcurrent, MaxQueued: c.queue.maxQueued, UnschedulableTimeout: c.unschedulable, SecretGCWait: c.secretGCWait,
		SucceededHistory: c.keepSucceeded, FailedHistory: c.keepFailed,
	}
}

// orchestratorOnly are the flags that only the orchestrator source reads.
var orchestratorOnly = map[string]bool{
	"orchestrator-url": true, "orchestrator-key": true, "orchestrator-key-id": true,
	"orchestrator-token-file": true, "orchestrator-exchange-token-file": true, "orchestrator-ca": true,
	"orchestrator-proxy": true, "poll-wait": true, "retry-max-delay": true, "stream-logs": true,
}

func (o orchestratorFlags) check(source, namespace string) error {
	auth := 0
	for _, f := range []string{o.keyFile, o.tokenFile, o.exchangeFile} {
		if f != "" {
			auth++
		}
	}
	switch source {
	case "kube":
		return nil
	case "orchestrator":
	default:
		return fmt.Errorf("--source %q: must be kube or orchestrator", source)
	}
	switch {
	case o.url == "":
		return errors.New("--source=orchestrator needs --orchestrator-url")
	case namespace == "":
		return errors.New("--source=orchestrator needs --namespace, where its Jobs run")
	case auth == 0:
		return errors.New("--source=orchestrator needs one of --orchestrator-key, --orchestrator-token-file and --orchestrator-exchange-token-file")
	case auth > 1:
		return errors.New("--orchestrator-key, --orchestrator-token-file and --orchestrator-exchange-token-file: give only one")
	case o.pollWait < time.Second:
		return fmt.Errorf("--poll-wait %s: must be at least 1s", o.pollWait)
	case o.retryMax < time.Second:
		return fmt.Errorf("--retry-max-delay %s: must be at least 1s", o.retryMax)
	}
	return nil
}

func validLabel(v string) string {
	return strings.Join(validation.IsValidLabelValue(v), "; ")
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
	if c.testRunner != "" {
		if err := testRunner(ctx, c, tmpl, stdout); err != nil {
			fmt.Fprintf(stderr, "runwarden-dispatcher: %v\n", err)
			return 1
		}
		return 0
	}
	if err := serve(ctx, c, tmpl); err != nil {
		logger.Error(err, "dispatcher stopped")
		return 1
	}
	return 0
}

// loadTemplateObject reads --pod-template-object, if given.
func loadTemplateObject(ctx context.Context, c config, restCfg *rest.Config) (*templateStore, error) {
	if c.templateObject == "" {
		return nil, nil
	}
	ns, name, err := parseObjectRef(c.templateObject)
	if err != nil {
		return nil, err
	}
	cs, err := kubernetes.NewForConfig(restCfg)
	if err != nil {
		return nil, err
	}
	s := &templateStore{namespace: ns, name: name, client: cs, log: logr.FromContextOrDiscard(ctx)}
	if err := s.load(ctx, cs); err != nil {
		return nil, err
	}
	return s, nil
}

// testRunner runs --test-runner's one runner Job.
func testRunner(ctx context.Context, c config, tmpl corev1.PodTemplateSpec, stdout io.Writer) error {
	restCfg, err := kube.RestConfig(c.kubeconfig)
	if err != nil {
		return err
	}
	if templates, err := loadTemplateObject(ctx, c, restCfg); err != nil {
		return err
	} else if templates != nil {
		tmpl = templates.Current()
	}
	cl, err := client.New(restCfg, client.Options{})
	if err != nil {
		return err
	}
	logs, err := corev1client.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	return preflight.TestRunner(ctx, preflight.TestRunnerOptions{
		Options: preflight.Options{Client: cl, Namespace: c.namespace,
			Jobs: job.Options{DispatcherID: c.id, Template: tmpl, DefaultDeadline: int64(c.deadline.Seconds()), TTLSecondsAfterFinished: int32(c.ttl.Seconds())}},
		Logs: runner.PodLogs{Client: logs}, Script: c.testRunner, Out: stdout,
	})
}

// serve runs the dispatcher until ctx ends: the preflight, then a manager
// running the task source.
func serve(ctx context.Context, c config, tmpl corev1.PodTemplateSpec) error {
	restCfg, err := kube.RestConfig(c.kubeconfig)
	if err != nil {
		return err
	}
	restCfg.QPS, restCfg.Burst = float32(c.qps), c.burst
	scheme, err := newScheme()
	if err != nil {
		return err
	}
	templates, err := loadTemplateObject(ctx, c, restCfg)
	if err != nil {
		return err
	}
	jobOpts := c.jobOptions(tmpl, templates)
	if err := runPreflight(ctx, c, restCfg, scheme, jobOpts); err != nil {
		return err
	}
	lock, kubeClient, err := c.fencing(restCfg)
	if err != nil {
		return err
	}
	mgr, err := newManager(ctx, c, restCfg, scheme, lock)
	if err != nil {
		return err
	}
	recorder := metrics.New(nil, c.maxConcurrent)
	recorder.Leading(!c.leader.elect)
	if templates != nil {
		// Every replica follows the template, so a new leader starts with
		// the one in force.
		templates.rec = recorder
		go templates.watch(ctx, templates.client)
	}
	if c.leader.elect {
		logr.FromContextOrDiscard(ctx).Info("standing by until this replica leads", "lease", c.leader.namespace+"/runwarden-dispatcher-"+c.id)
		go awaitLead(ctx, mgr, recorder)
	}
	if c.source == "orchestrator" {
		err = setupOrchestrator(mgr, kubeClient(mgr), restCfg, c, jobOpts, recorder)
	} else {
		err = setupKube(mgr, kubeClient(mgr), restCfg, c, jobOpts, recorder)
	}
	if err != nil {
		return err
	}
	if err := addProbes(mgr, c.leader.elect); err != nil {
		return err
	}
	logr.FromContextOrDiscard(ctx).Info("dispatching tasks", "source", c.source, "dispatcher", c.id, "maxConcurrent", c.maxConcurrent, "goMemoryLimit", memlimit.Current())
	return mgr.Start(ctx)
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
	own := labels.SelectorFromSet(labels.Set{job.LabelDispatcher: c.id})
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

// jobOptions say how the dispatcher builds Jobs.
func (c config) jobOptions(tmpl corev1.PodTemplateSpec, templates *templateStore) job.Options {
	o := job.Options{
		DispatcherID: c.id, Template: tmpl,
		DefaultDeadline:         int64(c.deadline.Seconds()),
		TTLSecondsAfterFinished: int32(c.ttl.Seconds()),
		EnvAllowList:            c.envAllow,
		RepoAllowList:           c.repoAllow,
		Queueing: job.Queueing{
			Kueue: c.queue.kueue, DefaultQueue: c.queue.defaultQueue,
			DefaultPriorityClass: c.queue.defaultPriorityClass, Priorities: c.queue.priorities,
		},
	}
	if templates != nil {
		o.Templates = templates.Current
	}
	return o
}

// runPreflight proves a runner pod is admitted in --namespace (see package
// preflight), unless --preflight=false or there is no --namespace.
func runPreflight(ctx context.Context, c config, restCfg *rest.Config, scheme *runtime.Scheme, jobOpts job.Options) error {
	logger := logr.FromContextOrDiscard(ctx)
	switch {
	case !c.preflight:
		return nil
	case c.namespace == "":
		logger.Info("preflight skipped: it needs --namespace, the namespace runner Jobs run in")
		return nil
	}
	direct, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return err
	}
	start := time.Now()
	if err := preflight.Run(ctx, preflight.Options{Client: direct, Jobs: jobOpts, Namespace: c.namespace, Timeout: c.preflightWait}); err != nil {
		return err
	}
	logger.Info("preflight passed: a runner pod was admitted", "namespace", c.namespace, "took", time.Since(start).Round(time.Millisecond).String())
	logEnvFiles(logger, preflight.EnvFiles(ctx, preflight.Options{Client: direct, Jobs: jobOpts, Namespace: c.namespace}), c.secretDelivery)
	return nil
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

// setupKube adds the RunnerTask source to the manager.
func setupKube(mgr ctrl.Manager, kc client.Client, restCfg *rest.Config, c config, jobOpts job.Options, recorder *metrics.Recorder) error {
	logs, err := corev1client.NewForConfig(restCfg)
	if err != nil {
		return err
	}
	r := rwkube.New(rwkube.Options{
		Options:      c.limits(),
		Logs:         runner.PodLogs{Client: logs},
		KeepLogBytes: c.keepLogBytes,
		Client:       kc,
		Jobs:         jobOpts,
		Reader:       mgr.GetAPIReader(),
		Recorder:     recorder,
	})
	return r.SetupWithManager(mgr)
}

// setupOrchestrator adds the orchestrator task source to the manager.
func setupOrchestrator(mgr ctrl.Manager, kc client.Client, restCfg *rest.Config, c config, jobOpts job.Options, recorder *metrics.Recorder) error {
	var auth orchestrator.Authenticator
	switch {
	case c.orch.keyFile != "":
		key, err := orchestrator.LoadEd25519Key(c.orch.keyFile)
		if err != nil {
			return err
		}
		kid := c.orch.keyID
		if kid == "" {
			kid = c.id
		}
		auth = &orchestrator.JWT{Key: key, KeyID: kid, Subject: c.id, Audience: c.orch.url}
	case c.orch.tokenFile != "":
		auth = &orchestrator.TokenFile{Path: c.orch.tokenFile}
	default:
		auth = &orchestrator.Exchange{Path: c.orch.exchangeFile}
	}
	oc, err := orchestrator.NewClient(orchestrator.ClientOptions{
		URL: c.orch.url, DispatcherID: c.id, Auth: auth, CAFile: c.orch.caFile, Proxy: c.orch.proxy,
	})
	if err != nil {
		return err
	}
	var logs runner.LogReader
	if c.orch.streamLogs {
		cs, err := corev1client.NewForConfig(restCfg)
		if err != nil {
			return err
		}
		logs = runner.PodLogs{Client: cs}
	}
	src := orchestrator.New(orchestrator.Options{
		Options: c.limits(),
		Client:  oc, Kube: kc, Reader: mgr.GetAPIReader(), Jobs: jobOpts, Namespace: c.namespace,
		PollWait: c.orch.pollWait,
		Backoff:  orchestrator.Backoff{Base: time.Second, Max: c.orch.retryMax},
		Logs:     logs, Recorder: recorder,
	})
	return src.SetupWithManager(mgr)
}

// resourceLock is lock as leader election takes it: nil without one.
func resourceLock(lock *fencedLock) resourcelock.Interface {
	if lock == nil {
		return nil
	}
	return lock
}

// logEnvFiles reports the preflight's EnvFiles check: a cluster without
// EnvFiles is an error only when the platform delivers secret values in env
// files; with secretDelivery: files it is what the platform chose for.
func logEnvFiles(logger logr.Logger, err error, delivery string) {
	switch {
	case errors.Is(err, preflight.ErrNoEnvFiles) && delivery == "files":
		logger.Info("this cluster does not take env files; runner variables holding secret references are delivered as files, as the platform configuration's secretDelivery: files says", "reason", err.Error())
	case errors.Is(err, preflight.ErrNoEnvFiles):
		logger.Error(err, "runner variables holding secret references cannot be resolved into env files on this cluster; set the platform configuration's secretDelivery: files (webhook.platform.secretDelivery) to deliver them as files (docs/secrets.md)")
	case err != nil:
		logger.Error(err, "could not check whether the cluster takes env files")
	}
}

// priorityFlag collects repeated --priority-class NAME=VALUE flags.
type priorityFlag map[string]int32

func (p priorityFlag) String() string {
	names := make([]string, 0, len(p))
	for k, v := range p {
		names = append(names, fmt.Sprintf("%s=%d", k, v))
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}

func (p priorityFlag) Set(s string) error {
	name, value, ok := strings.Cut(s, "=")
	if !ok || name == "" {
		return fmt.Errorf("%q: want NAME=VALUE, e.g. high=1000", s)
	}
	if errs := validation.IsDNS1123Subdomain(name); len(errs) > 0 {
		return fmt.Errorf("%q: %s: %s", s, name, strings.Join(errs, "; "))
	}
	v, err := strconv.ParseInt(value, 10, 32)
	if err != nil {
		return fmt.Errorf("%q: the value must be a whole number (32 bits): %w", s, err)
	}
	if _, dup := p[name]; dup {
		return fmt.Errorf("%q: priority class %s given twice", s, name)
	}
	p[name] = int32(v)
	return nil
}
