package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/policies"
	rwadmission "github.com/runwarden/runwarden/webhook/admission"
	"github.com/runwarden/runwarden/webhook/audit"
	"github.com/runwarden/runwarden/webhook/policy"
)

// timeoutUsage is the help of policy eval's --timeout flag.
const timeoutUsage = "deadline of each policy decision, as the webhook's --policy-timeout"

func loadSet(ctx context.Context, dir string, opts policy.Options) (*policy.Set, error) {
	if dir == "" {
		return policy.Load(ctx, policies.FS, "embedded policies", opts)
	}
	return policy.Load(ctx, os.DirFS(dir), dir, opts)
}

func readYAML(path string, into any) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	if err := yaml.UnmarshalStrict(b, into); err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	return nil
}

// evalConfig is the parsed command line of `policy eval`.
type evalConfig struct {
	podFile, oldPodFile, subResource string
	nsFile, saFile, jobFile          string
	cfgFile, policyDir               string
	user                             string
	jobUsers                         []string
	runnerNamespace                  string
	resolverImage, resolverPull      string
	timeout                          time.Duration
}

// defaultResolverImage is the chart's webhook image, registry and name,
// with no tag: eval shows the resolver's init container as the chart's
// webhook adds it.
const defaultResolverImage = "localhost/runwarden/webhook"

func parseEval(args []string, stderr io.Writer) (evalConfig, error) {
	var c evalConfig
	jobUsers := strings.Join(rwadmission.DefaultJobControllerUsers, ",")
	fs := flag.NewFlagSet("runwarden-webhook policy eval", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: runwarden-webhook policy eval --pod FILE [flags]

Admits a pod as the webhook does, with the same code: the mutating handler
(the runner label's earned check, the policies, the secret references'
resolver init container, the mutations, the record annotations), then the
validating handler on its result, as the API server calls them. It prints
the policies' decision, the action of each violation ("# action deny: ...",
warn or dryrun, from the platform configuration's enforcement) and the pod
as admitted. What only the cluster could
tell and no file gives (the namespace, the service account, the pod's Job)
is printed as "# NOT CHECKED: ...", with how eval went on without it.
Exit status: 0 admitted, 1 denied, 2 bad arguments or files, 3 the
webhook could not decide (the policies do not load, or fail to evaluate).

Flags:
`)
		fs.PrintDefaults()
	}
	fs.StringVar(&c.podFile, "pod", "", "pod manifest (YAML) to admit, as the API server sends it (required)")
	fs.StringVar(&c.oldPodFile, "old-pod", "", "the pod before an update: the request is an UPDATE of it to --pod (default: a CREATE)")
	fs.StringVar(&c.subResource, "subresource", "", `the request's subresource with --old-pod: "ephemeralcontainers" (kubectl debug), "status" (not checked by the webhook), or none`)
	fs.StringVar(&c.nsFile, "namespace", "", "the pod's Namespace manifest: its labels and annotations (default: not checked, none)")
	fs.StringVar(&c.saFile, "service-account", "", "the pod's ServiceAccount manifest: its annotations (default: not checked, none)")
	fs.StringVar(&c.jobFile, "job", "", "the Job that owns the pod (its controller reference): the runner label is earned only for a Job of runwarden's dispatcher (default: not checked, taken as earned)")
	fs.StringVar(&c.cfgFile, "config", "", "platform configuration (YAML), as the webhook's --config")
	fs.StringVar(&c.policyDir, "policies", "", "policy folder (default: the shipped policies)")
	// Runner pods are created by the Job controller, not the dispatcher.
	fs.StringVar(&c.user, "user", rwadmission.DefaultJobControllerUsers[0], "requesting user policies see as input.user.username (runner pods are created by the Job controller; a pod labelled runwarden.dev/runner that another user creates is refused, as the webhook refuses it)")
	fs.StringVar(&jobUsers, "job-controller-users", jobUsers, "comma-separated users the Job controller creates pods as, as the webhook's flag")
	fs.StringVar(&c.runnerNamespace, "runner-namespace", "", "the one namespace whose runner pods the webhook admits, as the webhook's flag (default: every namespace)")
	fs.StringVar(&c.resolverImage, "resolver-image", defaultResolverImage, "image of the init container that resolves secret references, as the webhook's flag (the chart passes the webhook's own image); empty: references reach the runner as written")
	fs.StringVar(&c.resolverPull, "resolver-image-pull-policy", "", "pull policy of --resolver-image, as the webhook's flag")
	fs.DurationVar(&c.timeout, "timeout", policy.DefaultTimeout, timeoutUsage)
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if c.podFile == "" {
		return c, errors.New("--pod is required")
	}
	if c.subResource != "" && c.oldPodFile == "" {
		return c, fmt.Errorf("--subresource %s: only an UPDATE has one; give --old-pod", c.subResource)
	}
	switch corev1.PullPolicy(c.resolverPull) {
	case "", corev1.PullAlways, corev1.PullIfNotPresent, corev1.PullNever:
	default:
		return c, fmt.Errorf("--resolver-image-pull-policy %q: use Always, IfNotPresent or Never", c.resolverPull)
	}
	c.jobUsers = splitList(jobUsers)
	return c, nil
}

// policyEval admits a pod as the webhook does and prints the decision and
// the pod as admitted. It exits 1 when the pod would be denied, 2 for bad
// arguments or files, 3 when the webhook could not decide (the policies do
// not load, or their evaluation fails): a check that expects a denial must
// not pass on broken policies.
func policyEval(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parseEval(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "runwarden-webhook policy eval: %v\n", err)
		return 2
	}
	req, look, err := readEvalFiles(c)
	if err != nil {
		fmt.Fprintf(stderr, "runwarden-webhook policy eval: %v\n", err)
		return 2
	}
	cfg, err := readPlatformConfig(c.cfgFile)
	if err != nil {
		fmt.Fprintf(stderr, "runwarden-webhook policy eval: %v\n", err)
		return 2
	}
	set, err := loadSet(ctx, c.policyDir, policy.Options{Timeout: c.timeout})
	if err != nil {
		fmt.Fprintf(stderr, "runwarden-webhook policy eval: %v\n", err)
		return 3
	}
	if unknown := policy.UnknownEnforcedRules(cfg, set.Rules()); len(unknown) > 0 {
		fmt.Fprintf(stderr, "runwarden-webhook policy eval: warning: %s\n", policy.UnknownRulesMessage(unknown))
	}
	if set.CacheOff != nil {
		fmt.Fprintf(stderr, "runwarden-webhook policy eval: %s: %s\n", cacheOffMessage, set.CacheOff)
	}
	// The webhook's logs are the cluster's business; eval prints its own.
	ctx = logr.NewContext(ctx, logr.Discard())
	passes, err := admitAsTheAPIServer(ctx, c, cfg, set, req, look)
	if err != nil {
		fmt.Fprintf(stderr, "runwarden-webhook policy eval: the webhook could not decide: %v\n", err)
		return 3
	}
	return printEval(stdout, passes)
}

// evalPass is one webhook's answer.
type evalPass = audit.Pass

// admitAsTheAPIServer calls the mutating handler, then the validating one
// on the pod it admitted, as the API server does (and as policy audit
// does); it stops at a denial.
func admitAsTheAPIServer(ctx context.Context, c evalConfig, cfg map[string]any, set *policy.Set, req rwadmission.Request, look rwadmission.Lookups) ([]evalPass, error) {
	var resolver *rwadmission.Resolver
	if c.resolverImage != "" {
		resolver = &rwadmission.Resolver{Image: c.resolverImage, PullPolicy: corev1.PullPolicy(c.resolverPull)}
	}
	w := audit.NewWebhooks(rwadmission.Options{
		Policies: staticSet{set}, Config: cfg, Namespace: c.runnerNamespace,
		JobControllerUsers: c.jobUsers, Resolver: resolver,
	})
	return w.Admit(ctx, req, look)
}

// printEval prints the policies' decision, what
// was not checked, and the denial or the pod as admitted; it returns the
// exit status.
func printEval(stdout io.Writer, passes []evalPass) int {
	last := passes[len(passes)-1].Result
	// The decision that shaped the pod (the mutating webhook's), or the
	// one that denied it.
	decided := slices.IndexFunc(passes, func(p evalPass) bool { return p.Result.Evaluated })
	if last.Evaluated && last.Outcome == rwadmission.OutcomeDenied {
		decided = len(passes) - 1
	}
	if decided >= 0 {
		d := passes[decided].Result.Decision
		out, _ := yaml.Marshal(map[string]any{"decision": d})
		fmt.Fprintf(stdout, "%s", out)
		// Each violation with what the webhook does with it (the platform
		// configuration's enforcement).
		for _, v := range d.Violations() {
			fmt.Fprintf(stdout, "# action %s: %s\n", v.Action, v.Message)
		}
	}
	var notChecked, outcomes []string
	for _, p := range passes {
		for _, n := range p.Result.NotChecked {
			if !slices.Contains(notChecked, n) {
				notChecked = append(notChecked, n)
			}
		}
		outcome := p.Result.Outcome
		if p.Result.Reason != "" {
			outcome += " (" + p.Result.Reason + ")"
		}
		outcomes = append(outcomes, p.Webhook+" webhook: "+outcome)
	}
	for _, n := range notChecked {
		fmt.Fprintf(stdout, "# NOT CHECKED: %s\n", n)
	}
	if last.Outcome == rwadmission.OutcomeDenied {
		fmt.Fprintf(stdout, "# the pod would be DENIED by the %s webhook: %s\n", passes[len(passes)-1].Webhook, last.Denial)
		return 1
	}
	fmt.Fprintf(stdout, "# the pod would be admitted: %s\n", strings.Join(outcomes, "; "))
	out, _ := yaml.Marshal(map[string]any{"pod": last.Pod})
	fmt.Fprintf(stdout, "---\n%s", out)
	return 0
}

// readEvalFiles reads the request and the cluster objects eval was given.
func readEvalFiles(c evalConfig) (rwadmission.Request, *fileLookups, error) {
	req := rwadmission.Request{Operation: admissionv1.Create, SubResource: c.subResource, User: c.user, Pod: &corev1.Pod{}}
	if err := readYAML(c.podFile, req.Pod); err != nil {
		return req, nil, fmt.Errorf("reading the pod: %w", err)
	}
	if c.oldPodFile != "" {
		req.Operation, req.OldPod = admissionv1.Update, &corev1.Pod{}
		if err := readYAML(c.oldPodFile, req.OldPod); err != nil {
			return req, nil, fmt.Errorf("reading the pod before the update: %w", err)
		}
	}
	look := &fileLookups{}
	if c.nsFile != "" {
		look.ns = &corev1.Namespace{}
		if err := readYAML(c.nsFile, look.ns); err != nil {
			return req, nil, fmt.Errorf("reading the namespace: %w", err)
		}
	}
	// The request's namespace: the pod's, else the namespace given, else
	// default (as kubectl would send it).
	req.Namespace = req.Pod.Namespace
	if look.ns != nil {
		req.Namespace = cmp.Or(req.Namespace, look.ns.Name)
	}
	req.Namespace = cmp.Or(req.Namespace, "default")
	ns := req.Namespace
	if look.ns != nil && look.ns.Name != ns {
		return req, nil, fmt.Errorf("--namespace %s is namespace %q, and the pod is in %q: give the pod's namespace", c.nsFile, look.ns.Name, ns)
	}
	if c.saFile != "" {
		look.sa = &corev1.ServiceAccount{}
		if err := readYAML(c.saFile, look.sa); err != nil {
			return req, nil, fmt.Errorf("reading the service account: %w", err)
		}
		// As the webhook reads it: the pod's service account, or default.
		name := cmp.Or(req.Pod.Spec.ServiceAccountName, "default")
		if look.sa.Name != name || cmp.Or(look.sa.Namespace, ns) != ns {
			return req, nil, fmt.Errorf("--service-account %s is %s/%s, and the pod runs as %s/%s: give the pod's service account", c.saFile, look.sa.Namespace, look.sa.Name, ns, name)
		}
	}
	if c.jobFile != "" {
		look.job = &batchv1.Job{}
		if err := readYAML(c.jobFile, look.job); err != nil {
			return req, nil, fmt.Errorf("reading the Job: %w", err)
		}
	}
	return req, look, nil
}

// fileLookups are the cluster objects eval was given; an object not given
// is not checked (rwadmission.ErrNotChecked), never taken for missing.
type fileLookups struct {
	ns  *corev1.Namespace
	sa  *corev1.ServiceAccount
	job *batchv1.Job
}

var _ rwadmission.Lookups = (*fileLookups)(nil)

func (l *fileLookups) Namespace(_ context.Context, name string) (*corev1.Namespace, error) {
	switch {
	case l.ns == nil:
		return nil, fmt.Errorf("no --namespace given: %w", rwadmission.ErrNotChecked)
	case l.ns.Name != name:
		return nil, apierrors.NewNotFound(corev1.Resource("namespaces"), name)
	}
	return l.ns, nil
}

func (l *fileLookups) ServiceAccount(_ context.Context, namespace, name string) (*corev1.ServiceAccount, error) {
	switch {
	case l.sa == nil:
		return nil, fmt.Errorf("no --service-account given: %w", rwadmission.ErrNotChecked)
	case l.sa.Name != name || cmp.Or(l.sa.Namespace, namespace) != namespace:
		return nil, apierrors.NewNotFound(corev1.Resource("serviceaccounts"), name)
	}
	return l.sa, nil
}

// Job is the Job given, if the pod names it; a pod that names another Job
// names one that does not exist, as the webhook would find.
// ConfigMap is not read from a file: the role mapping ConfigMap is not
// checked.
func (l *fileLookups) ConfigMap(context.Context, string, string) (*corev1.ConfigMap, error) {
	return nil, rwadmission.ErrNotChecked
}

func (l *fileLookups) Job(_ context.Context, namespace, name string) (*batchv1.Job, error) {
	switch {
	case l.job == nil:
		return nil, fmt.Errorf("no --job given: %w", rwadmission.ErrNotChecked)
	case l.job.Name != name || cmp.Or(l.job.Namespace, namespace) != namespace:
		return nil, apierrors.NewNotFound(batchv1.Resource("jobs"), name)
	}
	return l.job, nil
}

// staticSet is a policy set that does not change.
type staticSet struct{ s *policy.Set }

func (p staticSet) Current() *policy.Set { return p.s }

// policyTest runs the policies' tests with coverage.
func policyTest(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("runwarden-webhook policy test", flag.ContinueOnError)
	fs.SetOutput(stderr)
	minCov := fs.Float64("min-coverage", 0, "fail below this coverage, in percent")
	timeout := fs.Duration("timeout", policy.DefaultTestTimeout, "deadline of each test, as the webhook's when it loads a set: the first test past it stops the rest")
	total := fs.Duration("total-timeout", policy.DefaultTestsTimeout, "deadline of all the tests together (both runs: the load's, then coverage's), as the webhook's --policy-tests-timeout")
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *timeout <= 0 || *total <= 0 {
		fmt.Fprintf(stderr, "runwarden-webhook policy test: --timeout %s, --total-timeout %s: each must be more than 0\n", *timeout, *total)
		return 2
	}
	opts := policy.Options{TestTimeout: *timeout, TestsTimeout: *total}
	var rep policy.TestReport
	var err error
	origin := "embedded policies"
	switch fs.NArg() {
	case 0:
		rep, err = policy.TestWithCoverage(ctx, policies.FS, origin, opts)
	case 1:
		origin = fs.Arg(0)
		rep, err = policy.TestWithCoverage(ctx, os.DirFS(origin), origin, opts)
	default:
		fmt.Fprintln(stderr, "runwarden-webhook policy test: at most one folder")
		return 2
	}
	if err != nil {
		fmt.Fprintf(stderr, "runwarden-webhook policy test: %s: %v\n", origin, err)
		return 1
	}
	fmt.Fprintf(stdout, "%s: %d tests passed, coverage %.1f%%\n", origin, rep.Tests, rep.Coverage)
	for _, u := range rep.Uncovered {
		fmt.Fprintf(stdout, "  not covered: %s\n", u)
	}
	if rep.CacheOff != nil {
		fmt.Fprintf(stdout, "%s: %s\n", cacheOffMessage, rep.CacheOff)
	}
	if rep.Coverage < *minCov {
		fmt.Fprintf(stderr, "runwarden-webhook policy test: coverage %.1f%% is below %.1f%%\n", rep.Coverage, *minCov)
		return 1
	}
	return 0
}
