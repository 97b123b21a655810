package main

import (
	"errors"
	"flag"
	"fmt"
	"math"
	"os"
	"regexp"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/runner"
)

// config is the parsed command line.
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

	// templateObject is --pod-template-object, NAMESPACE/NAME.
	templateObject string

	// sourceName is --source; source is that source, its flags checked.
	sourceName string
	source     runner.Source
	queue      queueFlags
}

// lists are the flags parse reads as text and turns into their values.
type lists struct {
	envAllow, repoAllow string
	priorities          priorityFlag
}

// bind defines the shared flags on fs, into c and l, and the flags of
// every source offered, into each.
func (c *config) bind(fs *flag.FlagSet, l *lists, srcs *runner.Sources) {
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
	fs.DurationVar(&c.unschedulable, "unschedulable-timeout", 5*time.Minute, "fail a task whose pod stays unschedulable this long")
	fs.DurationVar(&c.secretGCWait, "secret-gc-wait", job.DefaultSecretWait, "how long a task whose Secret name is held by a Secret of a deleted Job waits for the garbage collector to remove it, before it is refused (the Secret is then someone else's); raise it where the garbage collector lags")
	fs.StringVar(&l.envAllow, "env-allow", "", "comma-separated glob patterns of the env variable names a task may set (default: none)")
	fs.StringVar(&l.repoAllow, "repo-allow", "", "comma-separated regular expressions a task's repository URL must match one of (default: any)")
	fs.StringVar(&c.namespace, "namespace", "", "the namespace whose RunnerTasks are run (default: all), and where orchestrator and Gitea tasks' Jobs run (required with --source=orchestrator and --source=gitea)")
	fs.StringVar(&c.metricsAddr, "metrics-bind-address", ":8080", `address of /metrics ("0" disables)`)
	fs.StringVar(&c.healthAddr, "health-probe-bind-address", ":8081", "address of /healthz and /readyz")
	fs.StringVar(&c.pprofAddr, "pprof-bind-address", "", `address of Go's /debug/pprof profiles (default "": off)`)
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig (default: $KUBECONFIG when set, else in-cluster, else ~/.kube/config)")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.BoolVar(&c.leader.elect, "leader-elect", false, "run as one of several replicas: only the replica holding the Lease runwarden-dispatcher-<--dispatcher-id> in --leader-elect-namespace dispatches; the others stand by (healthy, not ready) and take over when it goes")
	fs.StringVar(&c.leader.namespace, "leader-elect-namespace", "", "where the replicas' Lease is kept (required with --leader-elect; not --namespace): a namespace where only the dispatcher may write Leases, since whoever may change it decides whether any replica dispatches")
	fs.DurationVar(&c.leader.lease, "leader-elect-lease-duration", 15*time.Second, "how long a standby waits, after the leader last renewed, before it takes the lease")
	fs.DurationVar(&c.leader.renew, "leader-elect-renew-deadline", 10*time.Second, "how long after it sent its last renewal a leader that cannot renew stops writing to the cluster, and gives up the lead")
	fs.DurationVar(&c.leader.retry, "leader-elect-retry-period", time.Second, "how often candidates try to take or renew the lease")
	fs.BoolVar(&c.queue.kueue, "kueue", false, "queue tasks through Kueue: each Job is made suspended with the kueue.x-k8s.io/queue-name (and priority-class) labels and runs when Kueue admits it; --max-concurrent then counts admitted Jobs")
	fs.IntVar(&c.queue.maxQueued, "max-queued", 100, "with --kueue, Jobs of this dispatcher waiting in Kueue at once; more tasks wait at their source")
	fs.StringVar(&c.queue.defaultQueue, "default-queue", "", "with --kueue, the LocalQueue of tasks that name none (a task with neither is refused)")
	fs.StringVar(&c.queue.defaultPriorityClass, "default-priority-class", "", "the priority class of tasks that name none")
	fs.Var(l.priorities, "priority-class", "without --kueue, a priority class tasks may name, as NAME=VALUE (repeat the flag): waiting tasks start higher value first, then oldest first; with --kueue, tasks name Kueue WorkloadPriorityClasses instead")
	fs.BoolVar(&c.version, "version", false, "print the version and exit")
	fs.StringVar(&c.sourceName, "source", srcs.Default(), "where tasks come from: "+srcs.Usage())
	fs.StringVar(&c.testRunner, "test-runner", "", "instead of serving: run one runner Job from --pod-template in --namespace with this shell script, print its log, and exit 0 if it succeeded (what helm test runs: only the dispatcher may make runner Jobs)")
	srcs.Bind(fs)
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
		ns, _, err := parseObjectRef(c.templateObject)
		if err != nil {
			return fmt.Errorf("--pod-template-object %w", err)
		}
		if err := (runner.Shared{Namespace: c.namespace}).Outside("--pod-template-object", c.templateObject, ns, "write PodTemplates"); err != nil {
			return err
		}
	}
	if c.qps <= 0 || c.burst < 1 {
		return fmt.Errorf("--kube-api-qps %g, --kube-api-burst %d: must be more than 0", c.qps, c.burst)
	}
	if c.secretDelivery != "envFile" && c.secretDelivery != "files" {
		return fmt.Errorf("--secret-delivery %q: use envFile or files, as the platform configuration's secretDelivery", c.secretDelivery)
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

// limits are the limits every task source runs under.
func (c config) limits() runner.Options {
	return runner.Options{
		MaxConcurrent: c.maxConcurrent, MaxQueued: c.queue.maxQueued, UnschedulableTimeout: c.unschedulable, SecretGCWait: c.secretGCWait,
		SucceededHistory: c.keepSucceeded, FailedHistory: c.keepFailed,
	}
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
