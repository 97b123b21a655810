// Package admission is the runwarden webhook's admission handler: it builds
// the policy input for a runner pod, asks the current policy set for a
// decision, and answers with a denial or a JSON patch.
package admission

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	kjson "sigs.k8s.io/json"

	"github.com/runwarden/runwarden/webhook/policy"
)

// RunnerLabel marks runner pods; the mutating webhook configuration selects
// on it, and the handler checks that the pod earned it.
const RunnerLabel = "runwarden.dev/runner"

// DispatcherLabel is on every Job runwarden's dispatcher makes.
const DispatcherLabel = "runwarden.dev/dispatcher"

// TaskIDLabel is on a runner pod from its Job's template: with the pod's
// controller reference, it tells the dispatcher whose task the pod is.
const TaskIDLabel = "runwarden.dev/task-id"

// DefaultJobControllerUsers are the users the Job controller of
// kube-controller-manager creates pods as: its own service account with
// --use-service-account-credentials (the default of kubeadm and most
// distributions), else the controller manager's user.
var DefaultJobControllerUsers = []string{"system:serviceaccount:kube-system:job-controller", "system:kube-controller-manager"}

// Policies gives the policy set in force.
type Policies interface {
	Current() *policy.Set
}

// Recorder counts what the handler does; see the metrics package.
type Recorder interface {
	Admission(result string, d time.Duration)
	Denial(rule string)
}

// Options configure a Handler.
type Options struct {
	// Policies is the source of the policy set. Required.
	Policies Policies
	// Reader reads namespaces and service accounts (from a cache). Required.
	Reader client.Reader
	// Config is the platform configuration handed to the policies.
	// Default: empty.
	Config map[string]any
	// Mutate, when false, only validates: denials and warnings, no patch
	// (for a ValidatingWebhookConfiguration). Default: false.
	Mutate bool
	// Recorder counts admissions. Default: none.
	Recorder Recorder
	// Namespace, when set, is the one namespace whose runner pods this
	// handler admits; Reader holds nothing of other namespaces. A runner pod
	// elsewhere (a webhook configuration wider than the chart's) is refused.
	// Default: every namespace.
	Namespace string
	// Jobs reads the Job that owns a pod claiming the runner label, from the
	// API server (not a cache: the Job was made moments before its pod).
	// Default: none, and every such claim is refused.
	Jobs client.Reader
	// JobControllerUsers are the users the Job controller creates pods as;
	// only their pods may claim the runner label. Default:
	// DefaultJobControllerUsers.
	JobControllerUsers []string
	// Resolver, when set, resolves runner pods' secret references in an
	// init container (PlanSecrets); when nil they reach the runner as
	// written. Default: nil.
	Resolver *Resolver
}

// Handler answers admission requests for runner pods.
type Handler struct {
	opts Options
}

var _ admission.Handler = (*Handler)(nil)

// New returns a Handler.
func New(opts Options) *Handler {
	if opts.Config == nil {
		opts.Config = map[string]any{}
	}
	if len(opts.JobControllerUsers) == 0 {
		opts.JobControllerUsers = DefaultJobControllerUsers
	}
	if opts.Resolver != nil {
		r := *opts.Resolver
		if d, ok := opts.Config["secretDelivery"].(string); ok && d != "" {
			r.Delivery = d
		}
		opts.Resolver = &r
	}
	return &Handler{opts: opts}
}

// Handle implements admission.Handler.
func (h *Handler) Handle(ctx context.Context, req admission.Request) admission.Response {
	start := time.Now()
	resp, result := h.handle(ctx, req)
	if h.opts.Recorder != nil {
		h.opts.Recorder.Admission(result, time.Since(start))
	}
	return resp
}

func (h *Handler) handle(ctx context.Context, req admission.Request) (admission.Response, string) {
	logger := log.FromContext(ctx).WithValues("namespace", req.Namespace, "operation", req.Operation)
	if !checked(req) {
		return admission.Allowed("runwarden checks the creation and update of pods, and ephemeral containers"), "skipped"
	}
	if h.opts.Mutate && req.Operation != admissionv1.Create {
		// Only a pod being created is shaped; changes are the validating
		// configuration's to check.
		return admission.Allowed("runwarden shapes pods at creation only"), "skipped"
	}
	pod, err := decodePod(req.Object.Raw)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the pod: %w", err)), "error"
	}
	var old *corev1.Pod
	if req.Operation == admissionv1.Update {
		if old, err = decodePod(req.OldObject.Raw); err != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the pod before the update: %w", err)), "error"
		}
	}
	if pod.Namespace == "" {
		pod.Namespace = req.Namespace
	}
	claimed := pod.Labels[RunnerLabel] == "true"
	if h.opts.Mutate && !claimed {
		return admission.Allowed("not a runner pod"), "skipped"
	}
	if h.opts.Namespace != "" && pod.Namespace != h.opts.Namespace {
		if !claimed {
			return admission.Allowed("not a runner pod, outside the runner namespace"), "skipped"
		}
		return admission.Denied(fmt.Sprintf("runwarden: this webhook admits runner pods in namespace %s only (its --runner-namespace), and this pod is in %s: its webhook configuration sends it more than it serves", h.opts.Namespace, pod.Namespace)), "denied"
	}
	runner := claimed
	switch {
	case old != nil && (old.Labels[RunnerLabel] == "true") != claimed:
		return admission.Denied(fmt.Sprintf("runwarden: the label %s cannot be added to or removed from a pod: a pod is a runner from its creation, or never", RunnerLabel)), "denied"
	case old != nil && claimed && identityChanged(old, pod) != "":
		return admission.Denied(fmt.Sprintf("runwarden: %s of a runner pod cannot be changed: with it the dispatcher tells whose task the pod is", identityChanged(old, pod))), "denied"
	case old != nil && claimed && recordChanged(old, pod) != "":
		return admission.Denied(fmt.Sprintf("runwarden: the annotation %s of a runner pod cannot be changed: it is the webhook's record of what it admitted, written at the pod's creation and read by the dispatcher into the task's record", recordChanged(old, pod))), "denied"
	case old == nil && claimed:
		why, err := h.earned(ctx, pod, req.UserInfo.Username)
		if err != nil {
			logger.Error(err, "reading the Job of a runner pod")
			return admission.Errored(http.StatusInternalServerError, err), "error"
		}
		if why != "" {
			return admission.Denied(fmt.Sprintf(`runwarden: this pod claims the label %s: "true", which only pods the Job controller makes for a Job of runwarden's dispatcher carry, but %s; remove the label, or submit the work as a task`, RunnerLabel, why)), "denied"
		}
	}
	set := h.opts.Policies.Current()
	in, err := BuildInput(ctx, h.opts.Reader, pod, string(req.Operation), req.UserInfo.Username, req.UserInfo.Groups, h.opts.Config)
	if err != nil {
		logger.Error(err, "building the policy input")
		return admission.Errored(http.StatusInternalServerError, err), "error"
	}
	in.Runner, in.OldPod, in.SubResource = runner, old, req.SubResource
	if h.opts.Resolver != nil {
		in.ResolverImage = h.opts.Resolver.Image
	}
	d, err := set.Eval(ctx, in)
	if err != nil {
		logger.Error(err, "evaluating the policies", "policies", set.Digest)
		return admission.Errored(http.StatusInternalServerError, err), "error"
	}
	if len(d.Deny) > 0 {
		msgs := make([]string, 0, len(d.Deny))
		for _, v := range d.Deny {
			msgs = append(msgs, v.Message)
			if h.opts.Recorder != nil {
				h.opts.Recorder.Denial(v.Rule)
			}
		}
		resp := admission.Denied("runwarden policy: " + strings.Join(msgs, "; "))
		resp.Warnings = d.Warnings
		rules := make([]string, 0, len(d.Deny))
		for _, v := range d.Deny {
			rules = append(rules, v.Rule)
		}
		logger.Info("pod denied", "pod", pod.GenerateName+pod.Name, "job", jobOf(pod), "policies", set.Digest, "rules", rules, "runner", runner)
		return resp, "denied"
	}
	if !h.opts.Mutate {
		resp := admission.Allowed("")
		resp.Warnings = d.Warnings
		return resp, "allowed"
	}
	before := pod.DeepCopy()
	if h.opts.Resolver != nil && runner && req.Operation == admissionv1.Create {
		// Before Apply: the policies give the store credentials to the
		// resolver's init container.
		if _, err := PlanSecrets(pod, *h.opts.Resolver); errors.Is(err, ErrResolverInTheWay) {
			return admission.Denied("runwarden: " + err.Error()), "denied"
		} else if err != nil {
			logger.Error(err, "planning the secret references")
			return admission.Errored(http.StatusInternalServerError, err), "error"
		}
	}
	if clashes := MountClashes(pod, d.Mutations); len(clashes) > 0 {
		// The API server would refuse the pod for it, with less to go on.
		return admission.Denied("runwarden policy: " + strings.Join(clashes, "; ")), "denied"
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
	if digest := SpecDigest(pod.Spec); runner && req.Operation == admissionv1.Create && pod.Annotations[AnnotationSpecDigest] != digest {
		if prev := pod.Annotations[AnnotationMutations]; prev != "" {
			mutations = union(strings.Split(prev, ", "), mutations)
		}
		record(pod, digest, set.Digest, mutations, d.Warnings)
		// One line per runner pod admitted: the record, as the pod keeps it.
		logger.Info("runner pod admitted", "pod", pod.GenerateName, "job", jobOf(pod), "policies", set.Digest,
			"spec", pod.Annotations[AnnotationSpecDigest], "mutations", mutations, "warnings", d.Warnings)
	}
	resp := admission.Patched("", Patch(before, pod)...)
	resp.Warnings = d.Warnings
	if len(resp.Patches) == 0 {
		return resp, "allowed"
	}
	return resp, "mutated"
}

// jobOf is the name of a pod's controlling Job, if any.
func jobOf(pod *corev1.Pod) string {
	if ref := metav1.GetControllerOf(pod); ref != nil && ref.Kind == "Job" {
		return ref.Name
	}
	return ""
}

// checked tells whether the handler decides on a request: the creation or
// update of a pod, or containers added to one (pods/ephemeralcontainers).
// Status updates and other subresources are not its business.
func checked(req admission.Request) bool {
	if req.Kind.Kind != "Pod" {
		return false
	}
	switch req.Operation {
	case admissionv1.Create:
		return req.SubResource == ""
	case admissionv1.Update:
		return req.SubResource == "" || req.SubResource == "ephemeralcontainers"
	}
	return false
}

// earned says why a pod that claims the runner label may not have it, or
// "" when it may: the Job controller creates it, for the Job its controller
// reference names (UID included), and that Job was made by runwarden's
// dispatcher: it carries the dispatcher label and the runner label on its
// pod template. Only the dispatcher's service account may create such a Job
// (the chart's ValidatingAdmissionPolicy). An error is a failed read.
func (h *Handler) earned(ctx context.Context, pod *corev1.Pod, user string) (string, error) {
	if !slices.Contains(h.opts.JobControllerUsers, user) {
		return fmt.Sprintf("it is created by %s, not by the Job controller (%s)", user, strings.Join(h.opts.JobControllerUsers, ", ")), nil
	}
	ref := metav1.GetControllerOf(pod)
	if ref == nil || ref.Kind != "Job" || ref.APIVersion != "batch/v1" {
		return "it has no controller reference to a Job", nil
	}
	if h.opts.Jobs == nil {
		return "this webhook cannot read Jobs to check its own", nil
	}
	j := &batchv1.Job{}
	switch err := h.opts.Jobs.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: ref.Name}, j); {
	case apierrors.IsNotFound(err):
		return fmt.Sprintf("its Job %s does not exist", ref.Name), nil
	case err != nil:
		return "", fmt.Errorf("reading Job %s/%s: %w", pod.Namespace, ref.Name, err)
	}
	switch {
	case j.UID != ref.UID:
		return fmt.Sprintf("its controller reference names Job %s with UID %s, and that Job's UID is %s", ref.Name, ref.UID, j.UID), nil
	case j.Labels[DispatcherLabel] == "" || j.Spec.Template.Labels[RunnerLabel] != "true":
		return fmt.Sprintf("its Job %s was not made by runwarden's dispatcher (it lacks the label %s, or its pod template the label %s)", ref.Name, DispatcherLabel, RunnerLabel), nil
	}
	return "", nil
}

// identityChanged names what of a runner pod's identity an update changes,
// or is "": its task label, or its controller reference (given another
// owner, or one when it had none). The garbage collector and the Job
// controller may still remove the reference (orphaning, releasing).
func identityChanged(old, pod *corev1.Pod) string {
	if old.Labels[TaskIDLabel] != pod.Labels[TaskIDLabel] {
		return "the label " + TaskIDLabel
	}
	ref := metav1.GetControllerOfNoCopy(pod)
	if ref == nil {
		return ""
	}
	was := metav1.GetControllerOfNoCopy(old)
	if was == nil || was.UID != ref.UID || was.Kind != ref.Kind || was.APIVersion != ref.APIVersion || was.Name != ref.Name {
		return "the controller reference"
	}
	return ""
}

// decodePod decodes a pod of the request. The API server sends admission
// requests as JSON; the pod is decoded straight from it as the API
// machinery's JSON serializer decodes (case-sensitive, integers kept),
// without first sniffing the object's type: the request's kind says it.
func decodePod(raw []byte) (*corev1.Pod, error) {
	if len(raw) == 0 {
		return nil, errors.New("the request holds no object")
	}
	pod := &corev1.Pod{}
	if err := kjson.UnmarshalCaseSensitivePreserveInts(raw, pod); err != nil {
		return nil, err
	}
	return pod, nil
}

// BuildInput gathers the policy input for a pod: its namespace's labels and
// annotations and its service account's annotations (read through r), the
// user, the platform configuration and the secret references in its env.
// A namespace r cannot find is an error; a service account it cannot find
// has no annotations.
func BuildInput(ctx context.Context, r client.Reader, pod *corev1.Pod, op, user string, groups []string, cfg map[string]any) (*policy.Input, error) {
	in := &policy.Input{
		Operation:  op,
		Pod:        pod,
		Namespace:  policy.NamespaceInfo{Name: pod.Namespace, Labels: map[string]string{}, Annotations: map[string]string{}},
		User:       policy.UserInfo{Username: user, Groups: groups},
		Config:     cfg,
		SecretRefs: policy.PodSecretRefs(pod),
	}
	if in.SecretRefs == nil {
		in.SecretRefs = []policy.SecretRef{}
	}
	if r == nil {
		return in, nil
	}
	ns := &corev1.Namespace{}
	switch err := r.Get(ctx, client.ObjectKey{Name: pod.Namespace}, ns); {
	case apierrors.IsNotFound(err):
		// No pod is created in a namespace that does not exist: r is
		// behind. The namespace's limits (secret stores, patterns) are
		// unknown, so the pod is refused rather than given none.
		return nil, fmt.Errorf("namespace %s could not be read: the webhook's cache does not hold it yet, so its limits are unknown; retry: %w", pod.Namespace, err)
	case err != nil:
		return nil, fmt.Errorf("reading namespace %s: %w", pod.Namespace, err)
	}
	in.Namespace.Labels = orEmpty(ns.Labels)
	in.Namespace.Annotations = orEmpty(ns.Annotations)
	saName := pod.Spec.ServiceAccountName
	if saName == "" {
		saName = "default"
	}
	in.ServiceAccount = policy.ObjectInfo{Name: saName, Annotations: map[string]string{}}
	sa := &corev1.ServiceAccount{}
	err := r.Get(ctx, client.ObjectKey{Namespace: pod.Namespace, Name: saName}, sa)
	switch {
	case err == nil:
		in.ServiceAccount.Annotations = orEmpty(sa.Annotations)
	case apierrors.IsNotFound(err):
	default:
		return nil, fmt.Errorf("reading service account %s/%s: %w", pod.Namespace, saName, err)
	}
	return in, nil
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// CacheThenLive reads from cache, and asks live (the API server) for what
// the cache does not hold: a namespace or service account created moments
// before the pod may not have reached the cache yet, and reading it as
// missing would give the pod other credentials than its service account's.
func CacheThenLive(cache, live client.Reader) client.Reader {
	return cacheThenLive{cache: cache, live: live}
}

type cacheThenLive struct{ cache, live client.Reader }

func (r cacheThenLive) Get(ctx context.Context, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
	err := r.cache.Get(ctx, key, obj, opts...)
	if apierrors.IsNotFound(err) {
		return r.live.Get(ctx, key, obj, opts...)
	}
	return err
}

func (r cacheThenLive) List(ctx context.Context, list client.ObjectList, opts ...client.ListOption) error {
	return r.cache.List(ctx, list, opts...)
}
