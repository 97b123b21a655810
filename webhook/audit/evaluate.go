package audit

import (
	"context"
	"fmt"
	"slices"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"

	"github.com/runwarden/runwarden/internal/contract"
	rwadmission "github.com/runwarden/runwarden/webhook/admission"
	"github.com/runwarden/runwarden/webhook/policy"
)

// Webhooks are the mutating and the validating handler of one policy set.
type Webhooks struct {
	mutating, validating *rwadmission.Handler
}

// NewWebhooks makes both handlers from opts (its Mutate is set for each).
func NewWebhooks(opts rwadmission.Options) Webhooks {
	m, v := opts, opts
	m.Mutate, v.Mutate = true, false
	return Webhooks{mutating: rwadmission.New(m), validating: rwadmission.New(v)}
}

// Pass is one webhook's answer.
type Pass struct {
	// Webhook is "mutating" or "validating".
	Webhook string
	// Result is its Admit's.
	Result rwadmission.Result
}

// Admit calls the mutating handler, then the validating one on the pod it
// admitted, as the API server does; it stops at a denial. req.Pod is
// shaped in place.
func (w Webhooks) Admit(ctx context.Context, req rwadmission.Request, look rwadmission.Lookups) ([]Pass, error) {
	var passes []Pass
	for _, p := range []struct {
		name string
		h    *rwadmission.Handler
	}{{"mutating", w.mutating}, {"validating", w.validating}} {
		res, err := p.h.Admit(ctx, req, look)
		if err != nil {
			return nil, err
		}
		passes = append(passes, Pass{Webhook: p.name, Result: res})
		if res.Outcome == rwadmission.OutcomeDenied {
			break
		}
		req.Pod = res.Pod
	}
	return passes, nil
}

// The lists of a decision an outcome compares, by rule: the denials, the
// warnings the user sees (a rule in warn among them), and the violations
// of the rules in dryrun, which only the webhook's metric and log show.
const (
	ListDeny     = "deny"
	ListWarnings = "warnings"
	ListDryrun   = "dryrun"
)

// Lists are the decision lists in the order they are shown.
var Lists = []string{ListDeny, ListWarnings, ListDryrun}

// RuleAdmission names the webhook's own checks, made before or after the
// policies (the runner label's earned check, a mount clash, the resolver's
// init container in the way): a denial that names no policy rule.
const RuleAdmission = "admission"

// RuleWarning names a warning that names no rule (the policies' warnings
// are text).
const RuleWarning = "warning"

// auditWarning starts a warning the policies give instead of a denial in
// audit mode (decision.rego): its rule follows.
const auditWarning = "audit: would deny: "

// Finding is one entry of a decision list.
type Finding struct {
	Rule      string `json:"rule"`
	Container string `json:"container,omitempty"`
	Field     string `json:"field,omitempty"`
	Message   string `json:"message"`
}

// Outcome is what one policy set did to one subject.
type Outcome struct {
	// Denied tells whether the pod would be refused.
	Denied bool `json:"denied"`
	// Denial is the message the requester would see.
	Denial string `json:"denial,omitempty"`
	// Evaluated tells whether the policies decided (a denial before them
	// did not ask them).
	Evaluated bool `json:"evaluated"`
	// Findings are the decision's lists (Lists), sorted.
	Findings map[string][]Finding `json:"findings"`
	// Patch turns the submitted pod into the admitted one (the webhook's
	// record annotations left out: they name the set); none when denied.
	Patch []jsonpatch.Operation `json:"patch,omitempty"`
	// NotChecked names what could not be read, and how the admission went
	// on without it.
	NotChecked []string `json:"notChecked,omitempty"`
}

// Options configure an Evaluator.
type Options struct {
	// Set is the policy set. Required.
	Set *policy.Set
	// Config is the platform configuration. Default: empty.
	Config map[string]any
	// JobControllerUsers are the users the Job controller creates pods
	// as; the subjects are submitted as the first. Default:
	// rwadmission.DefaultJobControllerUsers.
	JobControllerUsers []string
	// Resolver is the secret references' resolver, as the webhook's.
	// Default: none.
	Resolver *rwadmission.Resolver
	// Lookups read namespaces, service accounts and ConfigMaps (the
	// webhook's ClusterLookups over a client). Jobs are the subjects'
	// own. Default: none, every read not checked.
	Lookups rwadmission.Lookups
}

// Evaluator admits subjects with one policy set.
type Evaluator struct {
	opts     Options
	webhooks Webhooks
	rules    []string
}

// NewEvaluator returns an Evaluator.
func NewEvaluator(opts Options) *Evaluator {
	if len(opts.JobControllerUsers) == 0 {
		opts.JobControllerUsers = rwadmission.DefaultJobControllerUsers
	}
	return &Evaluator{
		opts: opts,
		webhooks: NewWebhooks(rwadmission.Options{
			Policies: staticSet{opts.Set}, Config: opts.Config,
			JobControllerUsers: opts.JobControllerUsers, Resolver: opts.Resolver,
		}),
		rules: opts.Set.Rules(),
	}
}

// Rules are the set's rules (policy.Set.Rules).
func (e *Evaluator) Rules() []string { return e.rules }

// Evaluate admits s's pod (a copy) as the Job controller's request to
// create it. An error is a failure to decide (a read or an evaluation
// failed), never a denial.
func (e *Evaluator) Evaluate(ctx context.Context, s Subject) (Outcome, error) {
	submitted := s.Pod.DeepCopy()
	req := rwadmission.Request{
		Operation: admissionv1.Create, Namespace: s.Pod.Namespace,
		Pod: s.Pod.DeepCopy(), User: e.opts.JobControllerUsers[0],
	}
	passes, err := e.webhooks.Admit(ctx, req, lookups{cluster: e.opts.Lookups, job: s.JobObject})
	if err != nil {
		return Outcome{}, fmt.Errorf("admitting %s in %s: %w", s.Ref, s.Ref.Namespace, err)
	}
	return e.outcome(submitted, passes), nil
}

func (e *Evaluator) outcome(submitted *corev1.Pod, passes []Pass) Outcome {
	last := passes[len(passes)-1].Result
	o := Outcome{Findings: map[string][]Finding{}}
	var warnings []string
	for _, p := range passes {
		o.Evaluated = o.Evaluated || p.Result.Evaluated
		for _, n := range p.Result.NotChecked {
			if !slices.Contains(o.NotChecked, n) {
				o.NotChecked = append(o.NotChecked, n)
			}
		}
		for _, w := range p.Result.Warnings {
			if !slices.Contains(warnings, w) {
				warnings = append(warnings, w)
			}
		}
	}
	for _, w := range warnings {
		o.Findings[ListWarnings] = append(o.Findings[ListWarnings], warningFinding(w, e.rules))
	}
	for _, p := range passes {
		for _, v := range p.Result.Decision.Dryrun {
			f := Finding{Rule: v.Rule, Container: v.Container, Field: v.Field, Message: v.Message}
			if !slices.Contains(o.Findings[ListDryrun], f) {
				o.Findings[ListDryrun] = append(o.Findings[ListDryrun], f)
			}
		}
	}
	if last.Outcome == rwadmission.OutcomeDenied {
		o.Denied, o.Denial = true, last.Denial
		for _, v := range last.Decision.Deny {
			o.Findings[ListDeny] = append(o.Findings[ListDeny], Finding{Rule: v.Rule, Container: v.Container, Field: v.Field, Message: v.Message})
		}
		if len(last.Decision.Deny) == 0 {
			o.Findings[ListDeny] = []Finding{{Rule: RuleAdmission, Message: last.Denial}}
		}
	} else {
		admitted := last.Pod.DeepCopy()
		for _, a := range []string{contract.AnnotationSpecDigest, contract.AnnotationPolicyDigest, contract.AnnotationMutations, contract.AnnotationWarnings} {
			delete(admitted.Annotations, a)
		}
		o.Patch = rwadmission.Patch(submitted, admitted)
	}
	for _, l := range Lists {
		slices.SortFunc(o.Findings[l], compareFindings)
	}
	return o
}

// warningFinding is a warning as a finding: in audit mode, the denial it
// stands for, with its rule; else a warning that names none.
func warningFinding(w string, rules []string) Finding {
	if rest, ok := strings.CutPrefix(w, auditWarning); ok {
		if rule, _, ok := strings.Cut(rest, ": "); ok && slices.Contains(rules, rule) {
			return Finding{Rule: rule, Message: w}
		}
	}
	return Finding{Rule: RuleWarning, Message: w}
}

func compareFindings(a, b Finding) int {
	return strings.Compare(a.Rule+"\x00"+a.Container+"\x00"+a.Field+"\x00"+a.Message, b.Rule+"\x00"+b.Container+"\x00"+b.Field+"\x00"+b.Message)
}

// staticSet is a policy set that does not change.
type staticSet struct{ s *policy.Set }

func (p staticSet) Current() *policy.Set { return p.s }

// lookups read the cluster through cluster (none: not checked), and the
// subject's own Job: a Job that is gone is not checked (its pod was
// admitted; whether it earned the runner label then is not the set's
// question).
type lookups struct {
	cluster rwadmission.Lookups
	job     *batchv1.Job
}

var _ rwadmission.Lookups = lookups{}

var errNoLookups = fmt.Errorf("no cluster to read: %w", rwadmission.ErrNotChecked)

func (l lookups) Namespace(ctx context.Context, name string) (*corev1.Namespace, error) {
	if l.cluster == nil {
		return nil, errNoLookups
	}
	return l.cluster.Namespace(ctx, name)
}

func (l lookups) ServiceAccount(ctx context.Context, namespace, name string) (*corev1.ServiceAccount, error) {
	if l.cluster == nil {
		return nil, errNoLookups
	}
	return l.cluster.ServiceAccount(ctx, namespace, name)
}

func (l lookups) ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error) {
	if l.cluster == nil {
		return nil, errNoLookups
	}
	return l.cluster.ConfigMap(ctx, namespace, name)
}

func (l lookups) Job(_ context.Context, namespace, name string) (*batchv1.Job, error) {
	if l.job == nil || l.job.Name != name || l.job.Namespace != namespace {
		return nil, fmt.Errorf("the pod's Job was not recorded (it is gone): %w", rwadmission.ErrNotChecked)
	}
	return l.job, nil
}
