package audit

import (
	"cmp"
	"fmt"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"

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

// DefaultMaxResults bounds a report's results (ReportOptions.MaxResults).
const DefaultMaxResults = 1000

// maxMessage bounds a result's message, in bytes.
const maxMessage = 512

// redactMin is the shortest env value redacted from messages: shorter
// ones (a flag, a count) are not secrets and would garble the message.
const redactMin = 4

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
// warning is a warn of rule "warning". Messages never carry an env value
// of the pod (see Redact). A pod whose results would pass MaxResults is
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
		r.Metadata.Annotations["runwarden.dev/policy-digest"] = opts.Set.Digest
	}
	r.Metadata.Annotations["runwarden.dev/pods"] = fmt.Sprint(kept)
	r.Metadata.Annotations["runwarden.dev/pods-omitted"] = fmt.Sprint(len(pods) - kept)
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
	result := func(rule, res, msg string) ReportResult {
		return ReportResult{
			Source: ReportSource, Policy: ReportPolicy, Rule: rule, Result: res,
			Message: bounded(Redact(msg, p.Subject.Pod)), Timestamp: ts, Resources: []ReportRef{ref}, Properties: props,
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

// Redact replaces in msg every env value of pod's containers (plain
// values, redactMin bytes or longer) with "[redacted]": a rule's message
// may quote what it read, and a task author may have put a token in a
// plain value. Secret references are not values and are kept; the values
// they name never reach a pod's spec.
func Redact(msg string, pod *corev1.Pod) string {
	if pod == nil {
		return msg
	}
	var values []string
	for _, list := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			for _, e := range c.Env {
				if len(e.Value) >= redactMin && !isSecretRef(e.Value) {
					values = append(values, e.Value)
				}
			}
		}
	}
	// Longest first: a value that holds another is redacted whole.
	slices.SortFunc(values, func(a, b string) int { return cmp.Compare(len(b), len(a)) })
	for _, v := range values {
		msg = strings.ReplaceAll(msg, v, "[redacted]")
	}
	return msg
}

// isSecretRef tells whether an env value is a secret reference, as the
// webhook finds them.
func isSecretRef(v string) bool {
	refs := policy.ParseSecretRef("", "", v)
	return len(refs) > 0 && refs[0].Error == "" && refs[0].Raw == v
}

func bounded(s string) string {
	if len(s) <= maxMessage {
		return s
	}
	return strings.ToValidUTF8(s[:maxMessage-len("...")], "") + "..."
}
