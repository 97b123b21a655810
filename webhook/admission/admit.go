package admission

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/go-logr/logr"
	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/log"

	"github.com/runwarden/runwarden/internal/contract"
	"github.com/runwarden/runwarden/webhook/policy"
)

// Request is what Admit decides on: the facts of one admission request.
type Request struct {
	// Operation is CREATE or UPDATE; anything else is skipped.
	Operation admissionv1.Operation
	// SubResource is "", "ephemeralcontainers" or "resize"; anything else
	// is skipped.
	SubResource string
	// Namespace is the request's namespace, the pod's when it names none.
	Namespace string
	// Pod is the pod as the request holds it. Admit fills in its
	// namespace and, when it shapes the pod (OutcomeMutated), shapes it in
	// place. Required.
	Pod *corev1.Pod
	// OldPod is the pod before an UPDATE; nil on CREATE.
	OldPod *corev1.Pod
	// User and Groups are who asked.
	User   string
	Groups []string
}

// Lookups are the cluster reads admission makes. An object that does not
// exist is an error for which apierrors.IsNotFound holds. A lookup that was
// not made (policy eval, not given the object) returns an error wrapping
// ErrNotChecked: Admit goes on without the object and names it in
// Result.NotChecked.
type Lookups interface {
	// Namespace reads a namespace.
	Namespace(ctx context.Context, name string) (*corev1.Namespace, error)
	// ServiceAccount reads a service account.
	ServiceAccount(ctx context.Context, namespace, name string) (*corev1.ServiceAccount, error)
	// Job reads the Job a runner pod names as its controller.
	Job(ctx context.Context, namespace, name string) (*batchv1.Job, error)
	// ConfigMap reads a ConfigMap: the role mapping ConfigMap the
	// platform configuration names (workloadIdentity.aws.roleMappingConfigMap).
	ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error)
}

// ErrNotChecked is a lookup that was not made; see Lookups.
var ErrNotChecked = errors.New("not checked")

// errNoJobReader is a cluster lookup of a Job by a handler without
// Options.Jobs: every claim of the runner label is refused.
var errNoJobReader = errors.New("this webhook cannot read Jobs to check its own")

// Outcomes of an admission, as Result.Outcome and the handler's metrics
// name them.
const (
	OutcomeSkipped = "skipped"
	OutcomeDenied  = "denied"
	OutcomeAllowed = "allowed"
	OutcomeMutated = "mutated"
)

// Result is what Admit decided.
type Result struct {
	// Outcome is OutcomeSkipped (not runwarden's to decide: allowed as it
	// is), OutcomeDenied, OutcomeAllowed or OutcomeMutated.
	Outcome string
	// Reason says why a request was skipped.
	Reason string
	// Denial is the whole message of a denial, as the requester sees it.
	Denial string
	// Rules are the policy rules that denied the pod, if the policies did.
	Rules []string
	// Warnings are the policies' warnings. Like Decision, they may be
	// shared with the decision cache (and with other pods' Results): read
	// them, never modify them in place.
	Warnings []string
	// Evaluated tells whether the policies were evaluated: Decision is
	// theirs.
	Evaluated bool
	// Decision is the policies' decision, when Evaluated; its slices and
	// maps may be the decision cache's (policy.Set.Eval).
	Decision policy.Decision
	// Runner tells whether the pod was admitted as an earned runner pod.
	Runner bool
	// Pod is the pod as admitted: Request.Pod, with the secret
	// references' plan, the mutations and the record when OutcomeMutated;
	// nil when OutcomeDenied.
	Pod *corev1.Pod
	// NotChecked names what Admit could not check because a lookup was
	// not made (ErrNotChecked), and how it went on; never set with
	// cluster lookups.
	NotChecked []string
}

// checkedOperation tells the requests runwarden decides on: a pod's
// creation, and every way to change its spec: its update, the ephemeral
// containers added to it (pods/ephemeralcontainers) and its resources
// changed in place (pods/resize, Kubernetes 1.33 and later). The others
// change no spec: the status (pods/status, the kubelet's) and the binding
// (pods/binding, the scheduler's).
func checkedOperation(op admissionv1.Operation, sub string) bool {
	switch op {
	case admissionv1.Create:
		return sub == ""
	case admissionv1.Update:
		return sub == "" || sub == "ephemeralcontainers" || sub == "resize"
	}
	return false
}

// skip says why a request is not the handler's to decide, or "": only
// those checkedOperation names are; the mutating handler shapes pods at
// creation only (changes are the validating configuration's to check).
func (h *Handler) skip(op admissionv1.Operation, sub string) string {
	switch {
	case !checkedOperation(op, sub):
		return "runwarden checks the creation and update of pods, ephemeral containers and resizes"
	case h.opts.Mutate && op != admissionv1.Create:
		return "runwarden shapes pods at creation only"
	}
	return ""
}

// Admit decides on a pod as the webhook does, with the cluster read through
// look: the runner label's earned check, the policies' decision and, for
// the mutating handler, the secret references' plan, the mutations and the
// record annotations. Handle answers with it (the JSON patch from the pod
// as the request held it to Result.Pod), and so does `runwarden-webhook
// policy eval`, with lookups from files. An error is a failure to decide
// (a read or an evaluation failed), never a denial.
func (h *Handler) Admit(ctx context.Context, req Request, look Lookups) (Result, error) {
	var before corev1.Pod
	return h.admit(ctx, req, look, &before)
}

// admit is Admit; when it shapes the pod, it first copies it into before,
// which it does not keep: the handler's copy, for the patch, stays on its
// stack. The decoded pod is shaped, not the copy: its lists keep the room
// the decoder gave them, which Apply's appends use.
func (h *Handler) admit(ctx context.Context, req Request, look Lookups, before *corev1.Pod) (Result, error) {
	logger := log.FromContext(ctx).WithValues("namespace", req.Namespace, "operation", req.Operation)
	if why := h.skip(req.Operation, req.SubResource); why != "" {
		return Result{Outcome: OutcomeSkipped, Reason: why, Pod: req.Pod}, nil
	}
	pod, old := req.Pod, req.OldPod
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	claimed := pod.Labels[contract.LabelRunner] == "true"
	if h.opts.Mutate && !claimed {
		return Result{Outcome: OutcomeSkipped, Reason: "not a runner pod", Pod: pod}, nil
	}
	if h.opts.Namespace != "" && pod.Namespace != h.opts.Namespace {
		if !claimed {
			return Result{Outcome: OutcomeSkipped, Reason: "not a runner pod, outside the runner namespace", Pod: pod}, nil
		}
		return denied(fmt.Sprintf("runwarden: this webhook admits runner pods in namespace %s only (its --runner-namespace), and this pod is in %s: its webhook configuration sends it more than it serves", h.opts.Namespace, pod.Namespace)), nil
	}
	res := Result{Runner: claimed, Pod: pod}
	// Decided here, before the policies: no enforcement mode relaxes it.
	jobController := slices.Contains(h.opts.JobControllerUsers, req.User)
	switch {
	case old != nil && (old.Labels[contract.LabelRunner] == "true") != claimed:
		return denied(fmt.Sprintf("runwarden: the label %s cannot be added to or removed from a pod: a pod is a runner from its creation, or never", contract.LabelRunner)), nil
	case frozen(req, claimed, jobController) != "":
		return denied(frozen(req, claimed, jobController)), nil
	case old != nil && jobController && controllersOnly(old, pod):
		res.Outcome, res.Reason = OutcomeAllowed, "the Job controller's own fields (finalizers, owner references)"
		return res, nil
	case old == nil && claimed:
		why, err := h.earned(ctx, look, pod, req.User, &res)
		if err != nil {
			logger.Error(err, "reading the Job of a runner pod")
			return Result{}, err
		}
		if why != "" {
			return denied(fmt.Sprintf(`runwarden: this pod claims the label %s: "true", which only pods the Job controller makes for a Job of runwarden's dispatcher carry, but %s; remove the label, or submit the work as a task`, contract.LabelRunner, why)), nil
		}
	}
	if why := platformSecrets(h.opts.Config, pod, res.Runner); why != "" { // boundary.go: before the policies, in every mode
		return denied(why), nil
	}
	set := h.opts.Policies.Current()
	in, notChecked, err := buildInput(ctx, look, pod, string(req.Operation), req.User, req.Groups, h.opts.Config)
	if err != nil {
		logger.Error(err, "building the policy input")
		return Result{}, err
	}
	res.NotChecked = append(res.NotChecked, notChecked...)
	in.Runner, in.OldPod, in.SubResource, in.ConfigJSON = res.Runner, old, req.SubResource, h.configJSON
	if h.opts.Resolver != nil {
		in.ResolverImage = h.opts.Resolver.Image
	}
	d, source, err := set.EvalWithSource(ctx, in)
	if err != nil {
		logger.Error(err, "evaluating the policies", "policies", set.Digest)
		return Result{}, err
	}
	if h.opts.Recorder != nil {
		h.opts.Recorder.Decision(source)
	}
	res.Evaluated, res.Decision, res.Warnings = true, d, d.Warnings
	if len(d.Deny) > 0 {
		msgs := make([]string, 0, len(d.Deny))
		res.Rules = make([]string, 0, len(d.Deny))
		for _, v := range d.Deny {
			msgs = append(msgs, v.Message)
			res.Rules = append(res.Rules, v.Rule)
		}
		res.Outcome, res.Denial, res.Pod = OutcomeDenied, "runwarden policy: "+strings.Join(msgs, "; "), nil
		logger.Info("pod denied", "pod", pod.GenerateName+pod.Name, "job", jobOf(pod), "policies", set.Digest, "rules", res.Rules, "runner", res.Runner)
		return res, nil
	}
	if !h.opts.Mutate {
		res.Outcome = OutcomeAllowed
		return res, nil
	}
	return h.shape(logger, req, res, set.Digest, before)
}

// shape applies an allowed decision to the pod in place (the mutating
// handler), after copying it into before: the secret references' plan, the
// mutations, the record.
func (h *Handler) shape(logger logr.Logger, req Request, res Result, policyDigest string, before *corev1.Pod) (Result, error) {
	pod, d := req.Pod, res.Decision
	pod.DeepCopyInto(before)
	if h.opts.Resolver != nil && res.Runner && req.Operation == admissionv1.Create {
		// Before Apply: the policies give the store credentials to the
		// resolver's init container.
		if _, err := PlanSecrets(pod, *h.opts.Resolver); errors.Is(err, ErrResolverInTheWay) {
			return withDenial(res, "runwarden: "+err.Error()), nil
		} else if err != nil {
			logger.Error(err, "planning the secret references")
			return Result{}, err
		}
	}
	if clashes := MountClashes(pod, d.Mutations); len(clashes) > 0 {
		// The API server would refuse the pod for it, with less to go on.
		return withDenial(res, "runwarden policy: "+strings.Join(clashes, "; ")), nil
	}
	Apply(pod, d.Mutations)
	mutations := MutationNames(d.Mutations)
	if len(pod.Spec.InitContainers) != len(before.Spec.InitContainers) {
		mutations = append(mutations, "secret references resolved in the pod")
	}
	// The record is written when the spec differs from the one recorded:
	// always on the first pass; on a second (reinvocation) only if another
	// webhook changed the spec since. Called again, the record keeps what
	// the first pass changed.
	if res.Runner && req.Operation == admissionv1.Create {
		if digest := specDigest(&pod.Spec); pod.Annotations[contract.AnnotationSpecDigest] != digest {
			if prev := pod.Annotations[contract.AnnotationMutations]; prev != "" {
				mutations = union(strings.Split(prev, ", "), mutations)
			}
			record(pod, digest, policyDigest, mutations, d.Warnings)
			// One line per runner pod admitted: the record, as the pod keeps it.
			logger.Info("runner pod admitted", "pod", pod.GenerateName, "job", jobOf(pod), "policies", policyDigest,
				"spec", pod.Annotations[contract.AnnotationSpecDigest], "mutations", mutations, "warnings", d.Warnings)
		}
	}
	res.Outcome, res.Pod = OutcomeMutated, pod
	return res, nil
}

// denied is a denial before the policies.
func denied(msg string) Result {
	return Result{Outcome: OutcomeDenied, Denial: msg}
}

// withDenial turns an allowed decision into a denial after the policies,
// keeping their decision and warnings.
func withDenial(res Result, msg string) Result {
	res.Outcome, res.Denial, res.Pod = OutcomeDenied, msg, nil
	return res
}

// jobOf is the name of a pod's controlling Job, if any.
func jobOf(pod *corev1.Pod) string {
	if ref := metav1.GetControllerOf(pod); ref != nil && ref.Kind == "Job" {
		return ref.Name
	}
	return ""
}

// earned says why a pod that claims the runner label may not have it, or
// "" when it may: the Job controller creates it, for the Job its controller
// reference names (UID included), and that Job was made by runwarden's
// dispatcher: it carries the dispatcher label and the runner label on its
// pod template. Only the dispatcher's service account may create such a Job
// (the chart's ValidatingAdmissionPolicy). A Job that was not looked up
// (ErrNotChecked) is taken as earned and noted in res. An error is a
// failed read.
func (h *Handler) earned(ctx context.Context, look Lookups, pod *corev1.Pod, user string, res *Result) (string, error) {
	if !slices.Contains(h.opts.JobControllerUsers, user) {
		return fmt.Sprintf("it is created by %s, not by the Job controller (%s)", user, strings.Join(h.opts.JobControllerUsers, ", ")), nil
	}
	ref := metav1.GetControllerOfNoCopy(pod)
	if ref == nil || ref.Kind != "Job" || ref.APIVersion != "batch/v1" {
		return "it has no controller reference to a Job", nil
	}
	j, err := look.Job(ctx, pod.Namespace, ref.Name)
	switch {
	case err == nil:
	case errors.Is(err, ErrNotChecked):
		res.NotChecked = append(res.NotChecked, fmt.Sprintf("whether the pod's Job %s (UID %s) exists and was made by runwarden's dispatcher: %v; the runner label is taken as earned", ref.Name, ref.UID, err))
		return "", nil
	case errors.Is(err, errNoJobReader):
		return err.Error(), nil
	case apierrors.IsNotFound(err):
		return fmt.Sprintf("its Job %s does not exist", ref.Name), nil
	default:
		return "", fmt.Errorf("reading Job %s/%s: %w", pod.Namespace, ref.Name, err)
	}
	switch {
	case j.UID != ref.UID:
		return fmt.Sprintf("its controller reference names Job %s with UID %s, and that Job's UID is %s", ref.Name, ref.UID, j.UID), nil
	case j.Labels[contract.LabelDispatcher] == "" || j.Spec.Template.Labels[contract.LabelRunner] != "true":
		return fmt.Sprintf("its Job %s was not made by runwarden's dispatcher (it lacks the label %s, or its pod template the label %s)", ref.Name, contract.LabelDispatcher, contract.LabelRunner), nil
	}
	return "", nil
}
