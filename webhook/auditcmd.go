package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strings"
	"testing/fstest"
	"time"

	"github.com/go-logr/logr"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/util/validation"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	"github.com/runwarden/runwarden/internal/kube"
	rwadmission "github.com/runwarden/runwarden/webhook/admission"
	"github.com/runwarden/runwarden/webhook/audit"
	"github.com/runwarden/runwarden/webhook/policy"
)

// Exit statuses of policy audit.
const (
	auditOK           = 0
	auditFailed       = 1
	auditBadArguments = 2
	auditNewDenials   = 3
)

// auditConfig is the parsed command line of `policy audit`.
type auditConfig struct {
	candidateDir, currentDir  string
	releaseNamespace, release string
	againstCluster            bool
	namespaces                []string
	podsDir                   string
	cfgFile                   string
	kubeconfig                string
	since                     time.Duration
	maxPods                   int
	output                    string
	allowNewDenials           bool
	jobUsers                  []string
	resolverImage             string
	timeout                   time.Duration
}

func parseAudit(args []string, stderr io.Writer) (auditConfig, error) {
	var c auditConfig
	var namespaces string
	jobUsers := strings.Join(rwadmission.DefaultJobControllerUsers, ",")
	fs := flag.NewFlagSet("runwarden-webhook policy audit", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, `Usage: runwarden-webhook policy audit --policies DIR (--against-cluster [--namespaces NS,...] | --pods DIR) [flags]

Tells what a policy change would do before it is in force: admits the recent
runner pods with the candidate set and with the current one, with the
webhook's own code (the mutating, then the validating handler), and prints,
per namespace, the pods the candidate would now deny, those it would mutate
differently (the patch operations only one set makes), those it treats
otherwise (warnings, denial messages), and how many are unchanged; then, per
rule, the pods it names anew or no more. Each pod is rebuilt as it was
submitted: from its Job's pod template while the Job is kept, else the
admitted pod, the webhook's record left out (docs/policy.md).

Read only. --against-cluster needs list on pods and jobs and get on
serviceaccounts in the runner namespaces, get on namespaces, and get on the
release's ConfigMaps (the current set, the platform configuration) unless
--current and --config are given; it checks them first and names those it
lacks.

Exit status: 0 the candidate denies nothing the current set admits (or
--allow-new-denials), 3 it does, 1 the audit failed (a set does not load,
a read is forbidden or fails), 2 bad arguments or files.

Flags:
`)
		fs.PrintDefaults()
	}
	fs.StringVar(&c.candidateDir, "policies", "", "the candidate policy folder (required)")
	fs.StringVar(&c.currentDir, "current", "", "the policy folder in force (default: with --against-cluster, the release's ConfigMap <release>-policies; with --pods, the shipped policies)")
	fs.BoolVar(&c.againstCluster, "against-cluster", false, "audit the runner pods of the cluster (the kubeconfig's)")
	fs.StringVar(&namespaces, "namespaces", "", "comma-separated runner namespaces to audit, with --against-cluster (default: every namespace)")
	fs.StringVar(&c.podsDir, "pods", "", "audit the Jobs and pods of the YAML or JSON files in this folder (kubectl get jobs,pods -o yaml) instead of a cluster")
	fs.StringVar(&c.release, "release", "runwarden", "the chart's full name (its ConfigMaps are <release>-policies and <release>-platform), with --against-cluster")
	fs.StringVar(&c.releaseNamespace, "release-namespace", "runwarden", "the namespace the chart is installed in, with --against-cluster")
	fs.StringVar(&c.cfgFile, "config", "", "platform configuration (YAML), as the webhook's --config (default: with --against-cluster, the release's ConfigMap <release>-platform; with --pods, none)")
	fs.StringVar(&c.kubeconfig, "kubeconfig", "", "kubeconfig (default: $KUBECONFIG when set, else in-cluster, else ~/.kube/config)")
	fs.DurationVar(&c.since, "since", 7*24*time.Hour, "audit the pods created in this last while (0: all)")
	fs.IntVar(&c.maxPods, "max-pods", 1000, "audit at most this many pods, the newest (0: all)")
	fs.StringVar(&c.output, "o", "text", "output: text or json")
	fs.BoolVar(&c.allowNewDenials, "allow-new-denials", false, "exit 0 even when the candidate denies pods the current set admits")
	fs.StringVar(&jobUsers, "job-controller-users", jobUsers, "comma-separated users the Job controller creates pods as, as the webhook's flag (pods are submitted as the first)")
	fs.StringVar(&c.resolverImage, "resolver-image", defaultResolverImage, "image of the init container that resolves secret references, as the webhook's flag; empty: none")
	fs.DurationVar(&c.timeout, "timeout", policy.DefaultTimeout, timeoutUsage)
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	switch {
	case c.candidateDir == "":
		return c, errors.New("--policies is required: the candidate policy folder")
	case c.againstCluster == (c.podsDir != ""):
		return c, errors.New("give one of --against-cluster and --pods DIR")
	case namespaces != "" && !c.againstCluster:
		return c, errors.New("--namespaces goes with --against-cluster")
	case c.output != "text" && c.output != "json":
		return c, fmt.Errorf("-o %q: use text or json", c.output)
	case c.maxPods < 0 || c.since < 0:
		return c, errors.New("--max-pods and --since must not be negative")
	}
	c.namespaces = splitList(namespaces)
	for _, ns := range c.namespaces {
		if errs := validation.IsDNS1123Label(ns); len(errs) > 0 {
			return c, fmt.Errorf("--namespaces %q: %s", ns, strings.Join(errs, "; "))
		}
	}
	c.jobUsers = splitList(jobUsers)
	return c, nil
}

// policyAudit compares what the candidate set and the current one do to
// the recent runner pods; see parseAudit's usage.
func policyAudit(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	c, err := parseAudit(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return auditOK
	}
	if err != nil {
		fmt.Fprintf(stderr, "runwarden-webhook policy audit: %v\n", err)
		return auditBadArguments
	}
	ctx = logr.NewContext(ctx, logr.Discard())
	cmp, code, err := runAudit(ctx, c)
	if err != nil {
		fmt.Fprintf(stderr, "runwarden-webhook policy audit: %v\n", err)
		return code
	}
	if c.output == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		if err := enc.Encode(cmp); err != nil {
			fmt.Fprintf(stderr, "runwarden-webhook policy audit: %v\n", err)
			return auditFailed
		}
	} else {
		printComparison(stdout, cmp)
	}
	if n := cmp.NewDenials(); n > 0 && !c.allowNewDenials {
		fmt.Fprintf(stderr, "runwarden-webhook policy audit: the candidate denies %d pod(s) the current set admits (--allow-new-denials to accept)\n", n)
		return auditNewDenials
	}
	return auditOK
}

// auditInputs are what an audit reads before it evaluates.
type auditInputs struct {
	current, candidate *policy.Set
	config             map[string]any
	subjects           []audit.Subject
	lookups            rwadmission.Lookups
}

// runAudit reads the sets and the pods and compares; on error it returns
// the exit status.
func runAudit(ctx context.Context, c auditConfig) (audit.Comparison, int, error) {
	in, code, err := readAuditInputs(ctx, c)
	if err != nil {
		return audit.Comparison{}, code, err
	}
	var resolver *rwadmission.Resolver
	if c.resolverImage != "" {
		resolver = &rwadmission.Resolver{Image: c.resolverImage}
	}
	eval := func(s *policy.Set) *audit.Evaluator {
		return audit.NewEvaluator(audit.Options{Set: s, Config: in.config, JobControllerUsers: c.jobUsers, Resolver: resolver, Lookups: in.lookups})
	}
	diffs, err := audit.CompareAll(ctx, eval(in.current), eval(in.candidate), in.subjects)
	if err != nil {
		return audit.Comparison{}, auditFailed, err
	}
	name := func(s *policy.Set) string { return fmt.Sprintf("%s (digest %s)", s.Origin, s.Digest) }
	return audit.NewComparison(name(in.current), name(in.candidate), diffs), auditOK, nil
}

// readAuditInputs loads both sets, the platform configuration and the
// pods, from the cluster or from files.
func readAuditInputs(ctx context.Context, c auditConfig) (auditInputs, int, error) {
	var in auditInputs
	opts := policy.Options{Timeout: c.timeout}
	var err error
	if in.candidate, err = policy.Load(ctx, os.DirFS(c.candidateDir), c.candidateDir, opts); err != nil {
		return in, auditFailed, fmt.Errorf("the candidate set: %w", err)
	}
	if c.cfgFile != "" || !c.againstCluster {
		if in.config, err = readPlatformConfig(c.cfgFile); err != nil {
			return in, auditBadArguments, err
		}
	}
	if !c.againstCluster {
		if in.current, err = loadSet(ctx, c.currentDir, opts); err != nil {
			return in, auditFailed, fmt.Errorf("the current set: %w", err)
		}
		rec, files, err := audit.ReadFiles(c.podsDir)
		if err != nil {
			return in, auditBadArguments, fmt.Errorf("reading --pods: %w", err)
		}
		in.subjects = audit.Subjects(rec.Jobs, rec.Pods, c.maxPods)
		for i, s := range in.subjects {
			in.subjects[i].Source = s.Source + ", " + files[s.Ref.Namespace+"/"+s.Ref.Kind+"/"+s.Ref.Name]
		}
		return in, auditOK, nil
	}
	return readFromCluster(ctx, c, in, opts)
}

// readFromCluster reads what --against-cluster audits: the current set
// and the platform configuration (from the release's ConfigMaps unless
// given), and the recent runner pods, after checking the caller may.
func readFromCluster(ctx context.Context, c auditConfig, in auditInputs, opts policy.Options) (auditInputs, int, error) {
	restCfg, err := kube.RestConfig(c.kubeconfig)
	if err != nil {
		return in, auditBadArguments, err
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return in, auditFailed, err
	}
	cl, err := client.New(restCfg, client.Options{Scheme: scheme})
	if err != nil {
		return in, auditFailed, fmt.Errorf("connecting to the cluster: %w", err)
	}
	if err := checkAuditAccess(ctx, cl, c); err != nil {
		return in, auditFailed, err
	}
	if in.current, err = currentSet(ctx, cl, c, opts); err != nil {
		return in, auditFailed, err
	}
	if in.config == nil {
		if in.config, err = releasePlatform(ctx, cl, c); err != nil {
			return in, auditFailed, err
		}
	}
	var since time.Time
	if c.since > 0 {
		since = time.Now().Add(-c.since)
	}
	var rec audit.Recorded
	for _, ns := range namespacesOrAll(c.namespaces) {
		r, err := audit.ListRunners(ctx, cl, ns, since)
		if err != nil {
			return in, auditFailed, err
		}
		rec.Jobs, rec.Pods = append(rec.Jobs, r.Jobs...), append(rec.Pods, r.Pods...)
	}
	in.subjects = audit.Subjects(rec.Jobs, rec.Pods, c.maxPods)
	in.lookups = rwadmission.ClusterLookups(forbiddenNamed{cl}, nil)
	return in, auditOK, nil
}

// namespacesOrAll is the namespaces, or every namespace ("").
func namespacesOrAll(namespaces []string) []string {
	if len(namespaces) == 0 {
		return []string{""}
	}
	return namespaces
}

// auditAccess is one permission --against-cluster needs.
type auditAccess struct {
	verb, group, resource, namespace, name string
}

// checkAuditAccess asks the API server (SelfSubjectAccessReview) whether
// the caller may make every read the audit makes, and names those it may
// not, with the namespace.
func checkAuditAccess(ctx context.Context, cl client.Client, c auditConfig) error {
	var need []auditAccess
	for _, ns := range namespacesOrAll(c.namespaces) {
		need = append(need,
			auditAccess{"list", "", "pods", ns, ""}, auditAccess{"list", "batch", "jobs", ns, ""},
			auditAccess{"get", "", "serviceaccounts", ns, ""})
	}
	need = append(need, auditAccess{"get", "", "namespaces", "", ""})
	if c.currentDir == "" {
		need = append(need, auditAccess{"get", "", "configmaps", c.releaseNamespace, c.release + "-policies"})
	}
	if c.cfgFile == "" {
		need = append(need, auditAccess{"get", "", "configmaps", c.releaseNamespace, c.release + "-platform"})
	}
	var missing []string
	for _, a := range need {
		review := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
			ResourceAttributes: &authorizationv1.ResourceAttributes{Verb: a.verb, Group: a.group, Resource: a.resource, Namespace: a.namespace, Name: a.name},
		}}
		if err := cl.Create(ctx, review); err != nil {
			return fmt.Errorf("asking the API server what this user may read (SelfSubjectAccessReview): %w", err)
		}
		if review.Status.Allowed {
			continue
		}
		res := a.resource
		if a.group != "" {
			res += "." + a.group
		}
		if a.name != "" {
			res += " " + a.name
		}
		where := " in namespace " + a.namespace
		switch {
		case a.resource == "namespaces":
			where = ""
		case a.namespace == "":
			where = " in every namespace (or give --namespaces)"
		}
		missing = append(missing, fmt.Sprintf("%s %s%s", a.verb, res, where))
	}
	if len(missing) > 0 {
		return fmt.Errorf("%w: this user may not %s; policy audit reads only, and needs each (docs/policy.md)", audit.ErrForbidden, strings.Join(missing, "; "))
	}
	return nil
}

// currentSet is --current, or the policies of the release's ConfigMap.
func currentSet(ctx context.Context, cl client.Reader, c auditConfig, opts policy.Options) (*policy.Set, error) {
	if c.currentDir != "" {
		set, err := policy.Load(ctx, os.DirFS(c.currentDir), c.currentDir, opts)
		if err != nil {
			return nil, fmt.Errorf("the current set: %w", err)
		}
		return set, nil
	}
	cm, err := releaseConfigMap(ctx, cl, c, "-policies")
	if err != nil {
		return nil, err
	}
	fsys := fstest.MapFS{}
	for name, src := range cm.Data {
		fsys[name] = &fstest.MapFile{Data: []byte(src)}
	}
	origin := "configmap " + cm.Namespace + "/" + cm.Name
	set, err := policy.Load(ctx, fsys, origin, opts)
	if err != nil {
		return nil, fmt.Errorf("the current set: %w", err)
	}
	return set, nil
}

// releasePlatform is the platform configuration of the release's
// ConfigMap.
func releasePlatform(ctx context.Context, cl client.Reader, c auditConfig) (map[string]any, error) {
	cm, err := releaseConfigMap(ctx, cl, c, "-platform")
	if err != nil {
		return nil, err
	}
	cfg := map[string]any{}
	if err := yaml.Unmarshal([]byte(cm.Data["platform.yaml"]), &cfg); err != nil {
		return nil, fmt.Errorf("platform configuration in configmap %s/%s: %w", cm.Namespace, cm.Name, err)
	}
	return cfg, nil
}

func releaseConfigMap(ctx context.Context, cl client.Reader, c auditConfig, suffix string) (*corev1.ConfigMap, error) {
	cm := &corev1.ConfigMap{}
	err := cl.Get(ctx, client.ObjectKey{Namespace: c.releaseNamespace, Name: c.release + suffix}, cm)
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("configmap %s/%s%s not found: give --release and --release-namespace of the chart's release, or --current and --config", c.releaseNamespace, c.release, suffix)
	case err != nil:
		return nil, fmt.Errorf("reading configmap %s/%s%s: %w", c.releaseNamespace, c.release, suffix, err)
	}
	return cm, nil
}

// forbiddenNamed names the permission a forbidden read lacks.
type forbiddenNamed struct{ r client.Reader }

func (f forbiddenNamed) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	err := f.r.Get(ctx, key, obj, opts...)
	if apierrors.IsForbidden(err) {
		return fmt.Errorf("%w: grant get on %T %s (%w)", audit.ErrForbidden, obj, key, err)
	}
	return err
}

func (f forbiddenNamed) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return f.r.List(ctx, list, opts...)
}

// printComparison prints the comparison for a reader: per namespace, the
// pods by change; then per rule.
func printComparison(w io.Writer, c audit.Comparison) {
	fmt.Fprintf(w, "current:   %s\ncandidate: %s\n", c.CurrentSet, c.CandidateSet)
	if len(c.Diffs) == 0 {
		fmt.Fprintln(w, "no runner pod to audit")
		return
	}
	ns := ""
	var unchanged int
	flush := func() {
		if unchanged > 0 {
			fmt.Fprintf(w, "  unchanged: %d pod(s)\n", unchanged)
		}
		unchanged = 0
	}
	for _, d := range c.Diffs {
		if d.Subject.Ref.Namespace != ns {
			flush()
			ns = d.Subject.Ref.Namespace
			fmt.Fprintf(w, "\nnamespace %s:\n", ns)
		}
		if d.Change == audit.Unchanged {
			unchanged++
			continue
		}
		fmt.Fprintf(w, "  %s: %s (%s)\n", strings.ToUpper(string(d.Change)), d.Subject.Ref, d.Subject.Source)
		for _, l := range audit.Lists {
			for _, f := range d.Added[l] {
				fmt.Fprintf(w, "    + %s %s: %s\n", l, f.Rule, f.Message)
			}
			for _, f := range d.Removed[l] {
				fmt.Fprintf(w, "    - %s %s: %s\n", l, f.Rule, f.Message)
			}
		}
		if d.Change == audit.DeniedDifferently && len(d.Added[audit.ListDeny])+len(d.Removed[audit.ListDeny]) == 0 {
			fmt.Fprintf(w, "    - %s\n    + %s\n", d.Current.Denial, d.Candidate.Denial)
		}
		if d.Change != audit.NewlyDenied && !d.Candidate.Denied {
			for _, op := range d.PatchAdded {
				fmt.Fprintf(w, "    + patch %s\n", audit.FormatOp(op))
			}
			for _, op := range d.PatchRemoved {
				fmt.Fprintf(w, "    - patch %s\n", audit.FormatOp(op))
			}
		}
	}
	flush()
	if len(c.Rules) > 0 {
		fmt.Fprintln(w, "\nby rule:")
	}
	for _, r := range c.Rules {
		verb := map[string][2]string{audit.ListDeny: {"now denies", "no longer denies"}, audit.ListWarnings: {"now warns about", "no longer warns about"}}[r.List]
		if verb[0] == "" {
			verb = [2]string{"now lists in " + r.List, "no longer lists in " + r.List}
		}
		for i, refs := range [][]audit.Ref{r.Added, r.Removed} {
			if len(refs) > 0 {
				fmt.Fprintf(w, "  %s %s %d pod(s): %s\n", r.Rule, verb[i], len(refs), refNames(refs))
			}
		}
	}
	var notChecked []string
	for _, d := range c.Diffs {
		for _, n := range append(d.Current.NotChecked, d.Candidate.NotChecked...) {
			if !slices.Contains(notChecked, n) {
				notChecked = append(notChecked, n)
			}
		}
	}
	for _, n := range notChecked {
		fmt.Fprintf(w, "# NOT CHECKED: %s\n", n)
	}
	fmt.Fprintf(w, "\n%d pod(s) audited, %d newly denied\n", len(c.Diffs), c.NewDenials())
}

func refNames(refs []audit.Ref) string {
	names := make([]string, len(refs))
	for i, r := range refs {
		names[i] = r.Namespace + "/" + r.String()
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}
