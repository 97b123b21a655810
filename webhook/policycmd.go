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

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/policies"
	rwadmission "github.com/runwarden/runwarden/webhook/admission"
	"github.com/runwarden/runwarden/webhook/policy"
)

// timeoutUsage is the help of the policy commands' --timeout flag.
const timeoutUsage = "deadline of each policy evaluation (each test, each decision), as the webhook's --policy-timeout"

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

// policyEval prints the decision the policies make for a pod, and the pod
// after the mutations. It exits 1 when the pod would be denied, 2 for bad
// arguments or files, 3 when the policies cannot decide (they do not load,
// or their evaluation fails): a check that expects a denial must not pass
// on broken policies.
func policyEval(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("runwarden-webhook policy eval", flag.ContinueOnError)
	fs.SetOutput(stderr)
	podFile := fs.String("pod", "", "pod manifest (YAML) to evaluate (required)")
	nsFile := fs.String("namespace", "", "namespace manifest: its labels and annotations")
	saFile := fs.String("service-account", "", "service account manifest: its annotations")
	cfgFile := fs.String("config", "", "platform configuration (YAML)")
	dir := fs.String("policies", "", "policy folder (default: the shipped policies)")
	// Runner pods are created by the Job controller, not the dispatcher.
	user := fs.String("user", rwadmission.DefaultJobControllerUsers[0], "requesting user policies see as input.user.username (runner pods are created by the Job controller; a pod labelled runwarden.dev/runner that another user creates is refused, as the webhook refuses it)")
	jobUsers := fs.String("job-controller-users", strings.Join(rwadmission.DefaultJobControllerUsers, ","), "comma-separated users the Job controller creates pods as, as the webhook's flag")
	timeout := fs.Duration("timeout", policy.DefaultTimeout, timeoutUsage)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	if *podFile == "" {
		fmt.Fprintln(stderr, "runwarden-webhook policy eval: --pod is required")
		return 2
	}
	pod := &corev1.Pod{}
	if err := readYAML(*podFile, pod); err != nil {
		fmt.Fprintf(stderr, "runwarden-webhook policy eval: reading the pod: %v\n", err)
		return 2
	}
	ns := &corev1.Namespace{}
	if *nsFile != "" {
		if err := readYAML(*nsFile, ns); err != nil {
			fmt.Fprintf(stderr, "runwarden-webhook policy eval: reading the namespace: %v\n", err)
			return 2
		}
	}
	if pod.Namespace == "" {
		pod.Namespace = cmp.Or(ns.Name, "default")
	}
	cfg, err := readPlatformConfig(*cfgFile)
	if err != nil {
		fmt.Fprintf(stderr, "runwarden-webhook policy eval: %v\n", err)
		return 2
	}
	// The webhook also checks the pod's Job, which needs a cluster: here
	// only who creates it is checked, and a pod labelled a runner is
	// evaluated as an earned one, else as another pod of a runner namespace.
	runner := pod.Labels[rwadmission.RunnerLabel] == "true"
	if runner && !slices.Contains(strings.Split(*jobUsers, ","), *user) {
		fmt.Fprintf(stdout, "# the pod would be DENIED: it claims the label %s: \"true\", and %s is not the Job controller (%s)\n", rwadmission.RunnerLabel, *user, *jobUsers)
		return 1
	}
	in, err := rwadmission.BuildInput(ctx, nil, pod, "CREATE", *user, nil, cfg)
	if err != nil {
		fmt.Fprintf(stderr, "runwarden-webhook policy eval: %v\n", err)
		return 3
	}
	in.Runner = runner
	in.Namespace = policy.NamespaceInfo{Name: pod.Namespace, Labels: orEmpty(ns.Labels), Annotations: orEmpty(ns.Annotations)}
	// As the webhook reads it: the pod's service account, or default.
	in.ServiceAccount = policy.ObjectInfo{Name: cmp.Or(pod.Spec.ServiceAccountName, "default"), Annotations: map[string]string{}}
	if *saFile != "" {
		sa := &corev1.ServiceAccount{}
		if err := readYAML(*saFile, sa); err != nil {
			fmt.Fprintf(stderr, "runwarden-webhook policy eval: reading the service account: %v\n", err)
			return 2
		}
		in.ServiceAccount = policy.ObjectInfo{Name: sa.Name, Annotations: orEmpty(sa.Annotations)}
	}
	set, err := loadSet(ctx, *dir, policy.Options{Timeout: *timeout})
	if err != nil {
		fmt.Fprintf(stderr, "runwarden-webhook policy eval: %v\n", err)
		return 3
	}
	d, err := set.Eval(ctx, in)
	if err != nil {
		fmt.Fprintf(stderr, "runwarden-webhook policy eval: %v\n", err)
		return 3
	}
	out, _ := yaml.Marshal(map[string]any{"decision": d})
	fmt.Fprintf(stdout, "%s", out)
	if len(d.Deny) > 0 {
		fmt.Fprintln(stdout, "# the pod would be DENIED")
		return 1
	}
	// The webhook denies a pod whose own volumes clash with the mutations.
	if clashes := rwadmission.MountClashes(pod, d.Mutations); len(clashes) > 0 {
		fmt.Fprintf(stdout, "# the pod would be DENIED: %s\n", strings.Join(clashes, "; "))
		return 1
	}
	if !runner {
		// Another pod of a runner namespace: checked, never shaped.
		fmt.Fprintln(stdout, "# not a runner pod: allowed, unchanged")
		return 0
	}
	rwadmission.Apply(pod, d.Mutations)
	out, _ = yaml.Marshal(map[string]any{"pod": pod})
	fmt.Fprintf(stdout, "---\n%s", out)
	return 0
}

// policyTest runs the policies' tests with coverage.
func policyTest(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("runwarden-webhook policy test", flag.ContinueOnError)
	fs.SetOutput(stderr)
	minCov := fs.Float64("min-coverage", 0, "fail below this coverage, in percent")
	timeout := fs.Duration("timeout", policy.DefaultTimeout, timeoutUsage)
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0
		}
		return 2
	}
	opts := policy.Options{Timeout: *timeout}
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
	if rep.Coverage < *minCov {
		fmt.Fprintf(stderr, "runwarden-webhook policy test: coverage %.1f%% is below %.1f%%\n", rep.Coverage, *minCov)
		return 1
	}
	return 0
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}
