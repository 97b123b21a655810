package audit

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/runwarden/runwarden/internal/contract"
	"github.com/runwarden/runwarden/webhook/policy"
)

// The PolicyReport API (wgpolicyk8s.io/v1alpha2, the Kubernetes policy
// working group's): runwarden's own copy of the fields it writes, converted
// to an unstructured object at the edge.
const (
	ReportAPIVersion = "wgpolicyk8s.io/v1alpha2"
	ReportKind       = "PolicyReport"
	// ReportName is the one report runwarden writes in each runner
	// namespace.
	ReportName = "runwarden"
	// ReportPolicy is every result's policy.
	ReportPolicy = "runwarden"
	// ReportSource is every result's source.
	ReportSource = "runwarden-webhook"
)

// Results of a report.
const (
	ResultPass = "pass"
	ResultFail = "fail"
	ResultWarn = "warn"
	ResultSkip = "skip"
)

// What a report's annotations say besides the policy set's digest
// (contract.AnnotationPolicyDigest, as on each runner pod).
const (
	// AnnotationPods is how many pods the report's results are of.
	AnnotationPods = contract.Prefix + "pods"
	// AnnotationPodsOmitted is how many pods were left out past the
	// results' bound.
	AnnotationPodsOmitted = contract.Prefix + "pods-omitted"
)

// DefaultMaxResults bounds a report's results (ReportOptions.MaxResults).
const DefaultMaxResults = 1000

// maxMessage bounds a result's message, in bytes.
const maxMessage = 512

// Report is a PolicyReport.
type Report struct {
	APIVersion string         `json:"apiVersion"`
	Kind       string         `json:"kind"`
	Metadata   ReportMeta     `json:"metadata"`
	Scope      *ReportRef     `json:"scope,omitempty"`
	Summary    ReportSummary  `json:"summary"`
	Results    []ReportResult `json:"results,omitempty"`
}

// ReportMeta is a report's metadata.
type ReportMeta struct {
	Name        string            `json:"name"`
	Namespace   string            `json:"namespace"`
	Labels      map[string]string `json:"labels,omitempty"`
	Annotations map[string]string `json:"annotations,omitempty"`
}

// ReportRef is an object reference (corev1.ObjectReference's fields a
// report uses).
type ReportRef struct {
	APIVersion string `json:"apiVersion,omitempty"`
	Kind       string `json:"kind"`
	Namespace  string `json:"namespace,omitempty"`
	Name       string `json:"name"`
	UID        string `json:"uid,omitempty"`
}

// ReportSummary counts the results.
type ReportSummary struct {
	Pass  int `json:"pass"`
	Fail  int `json:"fail"`
	Warn  int `json:"warn"`
	Error int `json:"error"`
	Skip  int `json:"skip"`
}

// ReportResult is one rule's result for one pod.
type ReportResult struct {
	Source     string            `json:"source"`
	Policy     string            `json:"policy"`
	Rule       string            `json:"rule"`
	Result     string            `json:"result"`
	Message    string            `json:"message,omitempty"`
	Timestamp  ReportTimestamp   `json:"timestamp"`
	Resources  []ReportRef       `json:"resources"`
	Properties map[string]string `json:"properties,omitempty"`
}

// ReportTimestamp is a metav1.Timestamp.
type ReportTimestamp struct {
	Seconds int64 `json:"seconds"`
	Nanos   int32 `json:"nanos"`
}

// ReportOptions configure BuildReport.
type ReportOptions struct {
	// Set is the set in force: its digest is in the report's annotations.
	Set *policy.Set
	// Rules are the rules each pod gets a result for (Evaluator.Rules).
	Rules []string
	// MaxResults bounds the results: the oldest pods' are dropped, whole.
	// Default: DefaultMaxResults.
	MaxResults int
	// Now stamps the results.
	Now time.Time
	// Labels are the report's labels. Default: none.
	Labels map[string]string
}

// Evaluated is one subject with its outcome under the set in force.
type Evaluated struct {
	Subject Subject
	Outcome Outcome
}

// BuildReport is the PolicyReport of namespace ns for pods (newest first;
// each must be of ns): per pod, one result per rule, fail for the rules
// that deny it, warn for those that warn about it (audit mode), pass for
// the others; a denial by the webhook's own checks is a fail of rule
// "admission" and a skip of every rule, which were not asked; each other
// warning is a warn of rule "warning". Messages never carry a value of
// the pod (see Redact). A pod whose results would pass MaxResults is
// left out, with every older one; the annotation
// runwarden.dev/pods-omitted counts them.
func BuildReport(ns string, pods []Evaluated, opts ReportOptions) Report {
	opts.MaxResults = cmp.Or(opts.MaxResults, DefaultMaxResults)
	r := Report{
		APIVersion: ReportAPIVersion, Kind: ReportKind,
		Metadata: ReportMeta{Name: ReportName, Namespace: ns, Labels: opts.Labels, Annotations: map[string]string{}},
		Scope:    &ReportRef{APIVersion: "v1", Kind: "Namespace", Name: ns},
	}
	ts := ReportTimestamp{Seconds: opts.Now.Unix(), Nanos: int32(opts.Now.Nanosecond())}
	kept := 0
	for _, p := range pods {
		results := podResults(p, opts.Rules, ts)
		if len(r.Results)+len(results) > opts.MaxResults {
			break
		}
		r.Results = append(r.Results, results...)
		kept++
	}
	for _, res := range r.Results {
		switch res.Result {
		case ResultPass:
			r.Summary.Pass++
		case ResultFail:
			r.Summary.Fail++
		case ResultWarn:
			r.Summary.Warn++
		case ResultSkip:
			r.Summary.Skip++
		}
	}
	if opts.Set != nil {
		r.Metadata.Annotations[contract.AnnotationPolicyDigest] = opts.Set.Digest
	}
	r.Metadata.Annotations[AnnotationPods] = fmt.Sprint(kept)
	r.Metadata.Annotations[AnnotationPodsOmitted] = fmt.Sprint(len(pods) - kept)
	return r
}

// podResults are one pod's results, by rule.
func podResults(p Evaluated, rules []string, ts ReportTimestamp) []ReportResult {
	ref := ReportRef{APIVersion: "v1", Kind: p.Subject.Ref.Kind, Namespace: p.Subject.Ref.Namespace, Name: p.Subject.Ref.Name, UID: string(p.Subject.Ref.UID)}
	if ref.Kind == "Job" {
		ref.APIVersion = "batch/v1"
	}
	props := map[string]string{"source": p.Subject.Source}
	if p.Subject.Job != "" {
		props["job"] = p.Subject.Job
	}
	red := policy.NewRedactor(p.Subject.Pod)
	result := func(rule, res, msg string) ReportResult {
		return ReportResult{
			Source: ReportSource, Policy: ReportPolicy, Rule: red.Redact(rule), Result: res,
			Message: bounded(red.Redact(msg)), Timestamp: ts, Resources: []ReportRef{ref}, Properties: props,
		}
	}
	o := p.Outcome
	byRule := map[string][]string{}
	list := map[string]string{}
	// A rule in dryrun fails as one in deny does: the pod broke it, and
	// the report is where a platform reads what enforcing it would refuse.
	for _, l := range []string{ListWarnings, ListDryrun, ListDeny} {
		for _, f := range o.Findings[l] {
			byRule[f.Rule] = append(byRule[f.Rule], f.Message)
			list[f.Rule] = l
		}
	}
	var out []ReportResult
	if o.Denied && !o.Evaluated {
		out = append(out, result(RuleAdmission, ResultFail, o.Denial))
		for _, rule := range rules {
			out = append(out, result(rule, ResultSkip, "not evaluated: the webhook denied the pod before its policies"))
		}
		return out
	}
	all := slices.Clone(rules)
	for rule := range byRule {
		if !slices.Contains(all, rule) {
			all = append(all, rule)
		}
	}
	slices.Sort(all)
	for _, rule := range all {
		msgs, found := byRule[rule]
		switch {
		case !found:
			out = append(out, result(rule, ResultPass, ""))
		case list[rule] == ListDeny || list[rule] == ListDryrun:
			out = append(out, result(rule, ResultFail, strings.Join(msgs, "; ")))
		default:
			out = append(out, result(rule, ResultWarn, strings.Join(msgs, "; ")))
		}
	}
	return out
}

// Redact replaces in msg every value pod carries, in each encoding a
// policy can write it in, and every URL's userinfo, with "[redacted]"
// (policy.Redactor says which values and encodings). A policy's messages
// have been through it already (policy.Set.Eval); the webhook's own
// denials go through it here, so that nothing a report holds was a value
// of the pod: it holds the rule, the container and the field path instead.
func Redact(msg string, pod *corev1.Pod) string {
	return policy.NewRedactor(pod).Redact(msg)
}

func bounded(s string) string {
	if len(s) <= maxMessage {
		return s
	}
	return strings.ToValidUTF8(s[:maxMessage-len("...")], "") + "..."
}
