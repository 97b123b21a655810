// Package admission is the runwarden webhook's admission handler: it builds
// the policy input for a runner pod, asks the current policy set for a
// decision, and answers with a denial or a JSON patch. Admit is the
// decision itself, shared by the handler and `policy eval`.
package admission

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"time"

	admissionv1 "k8s.io/api/admission/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	kjson "sigs.k8s.io/json"

	"github.com/runwarden/runwarden/webhook/policy"
)

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
	// Violation counts one violation of a rule with its action (deny,
	// warn or dryrun).
	Violation(rule, action string)
	// Decision counts one decision of the policies by where it came from.
	Decision(source policy.Source)
}

// Options configure a Handler.
type Options struct {
	// Policies is the source of the policy set. Required.
	Policies Policies
	// Reader reads namespaces and service accounts (from a cache) for
	// Handle. Required for Handle; Admit reads through its Lookups.
	Reader client.Reader
	// Config is the platform configuration handed to the policies; it is
	// encoded once, in New, and must not change after. Default: empty.
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
	// API server (not a cache: the Job was made moments before its pod),
	// for Handle. Default: none, and every such claim is refused.
	Jobs client.Reader
	// Pods reads the pod of a CONNECT (kubectl exec, attach, port-forward),
	// whose request carries the options and not the pod, from the API
	// server. Default: none, and every such request in the namespace is an
	// error (refused with failurePolicy Fail).
	Pods client.Reader
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
	opts    Options
	lookups Lookups
	// configJSON is opts.Config's encoding (nil if it has none), handed
	// to every input so that it is not encoded on every admission.
	configJSON json.RawMessage
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
		r = r.withResources()
		opts.Resolver = &r
	}
	h := &Handler{opts: opts, lookups: ClusterLookups(opts.Reader, opts.Jobs)}
	if b, err := json.Marshal(opts.Config); err == nil {
		// Otherwise every evaluation reports the error when it encodes the
		// input.
		h.configJSON = b
	}
	return h
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
	if connecting(req) {
		logger := log.FromContext(ctx).WithValues("namespace", req.Namespace, "operation", req.Operation)
		return h.connect(log.IntoContext(ctx, logger), req)
	}
	if why := h.skip(req.Operation, req.SubResource); why != "" || req.Kind.Kind != "Pod" {
		return admission.Allowed(cmp.Or(why, "runwarden checks the creation and update of pods, ephemeral containers and resizes, and exec, attach and port-forward")), OutcomeSkipped
	}
	pod, err := podOf(req.Object)
	if err != nil {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the pod: %w", err)), "error"
	}
	var old *corev1.Pod
	if req.Operation == admissionv1.Update {
		if old, err = podOf(req.OldObject); err != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the pod before the update: %w", err)), "error"
		}
	}
	var before corev1.Pod
	res, err := h.admit(ctx, Request{
		Operation: req.Operation, SubResource: req.SubResource, Namespace: req.Namespace,
		Pod: pod, OldPod: old, User: req.UserInfo.Username, Groups: req.UserInfo.Groups,
	}, h.lookups, &before)
	if err != nil {
		return admission.Errored(http.StatusInternalServerError, err), "error"
	}
	h.violations(ctx, req, pod, res)
	var resp admission.Response
	switch res.Outcome {
	case OutcomeSkipped:
		return admission.Allowed(res.Reason), res.Outcome
	case OutcomeDenied:
		resp = admission.Denied(res.Denial)
	case OutcomeMutated:
		resp = admission.Patched("", Patch(&before, res.Pod)...)
		if len(resp.Patches) == 0 {
			res.Outcome = OutcomeAllowed
		}
	default:
		resp = admission.Allowed("")
	}
	resp.Warnings = res.Warnings
	return resp, res.Outcome
}

// violations counts the policies' violations of a request by rule and
// action, and logs the dryrun ones (the user is told nothing of them), once
// per request the API server makes: the validating handler counts those on
// the pod as it will be stored, and the mutating handler only those of a
// pod it denies, since the API server then calls no validating webhook.
func (h *Handler) violations(ctx context.Context, req admission.Request, pod *corev1.Pod, res Result) {
	if !res.Evaluated || (h.opts.Mutate && res.Outcome != OutcomeDenied) {
		return
	}
	logger := log.FromContext(ctx)
	for _, v := range res.Decision.Violations() {
		if h.opts.Recorder != nil {
			h.opts.Recorder.Violation(v.Rule, v.Action)
		}
		if v.Action == policy.ActionDryrun {
			// The message names fields, containers and secret references,
			// never a secret's value: the webhook never holds one.
			logger.Info("policy violation in dryrun, pod admitted", "rule", v.Rule, "namespace", req.Namespace,
				"pod", cmp.Or(pod.Name, pod.GenerateName), "job", jobOf(pod), "operation", req.Operation,
				"container", v.Container, "field", v.Field, "message", v.Message)
		}
	}
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
// annotations and its service account's annotations (read through look),
// the user, the platform configuration and the secret references in its
// env, and the role mapping ConfigMap's entries for the service account when
// the configuration names one (see roleMappings). A namespace look cannot
// find is an error, and so is a service account of a pod being created; for
// an update, a service account it cannot find has no annotations. What look did not check (ErrNotChecked)
// is left empty and named in the returned notes.
func BuildInput(ctx context.Context, look Lookups, pod *corev1.Pod, op, user string, groups []string, cfg map[string]any) (*policy.Input, []string, error) {
	return buildInput(ctx, look, pod, op, user, groups, cfg)
}

func buildInput(ctx context.Context, look Lookups, pod *corev1.Pod, op, user string, groups []string, cfg map[string]any) (*policy.Input, []string, error) {
	in := &policy.Input{
		Operation:  op,
		Pod:        pod,
		Namespace:  policy.NamespaceInfo{Name: pod.Namespace},
		User:       policy.UserInfo{Username: user, Groups: groups},
		Config:     cfg,
		SecretRefs: policy.PodSecretRefs(pod),
	}
	if in.SecretRefs == nil {
		in.SecretRefs = []policy.SecretRef{}
	}
	var notChecked []string
	switch ns, err := look.Namespace(ctx, pod.Namespace); {
	case err == nil:
		in.Namespace.Labels, in.Namespace.Annotations = ns.Labels, ns.Annotations
	case errors.Is(err, ErrNotChecked):
		notChecked = append(notChecked, fmt.Sprintf("namespace %s: %v; the policies see it without labels or annotations", pod.Namespace, err))
	case apierrors.IsNotFound(err):
		// No pod is created in a namespace that does not exist: look is
		// behind. The namespace's limits (secret stores, patterns) are
		// unknown, so the pod is refused rather than given none.
		return nil, nil, fmt.Errorf("namespace %s could not be read: the webhook's cache does not hold it yet, so its limits are unknown; retry: %w", pod.Namespace, err)
	default:
		return nil, nil, fmt.Errorf("reading namespace %s: %w", pod.Namespace, err)
	}
	saName := pod.Spec.ServiceAccountName
	if saName == "" {
		saName = "default"
	}
	in.ServiceAccount = policy.ObjectInfo{Name: saName}
	sa, err := look.ServiceAccount(ctx, pod.Namespace, saName)
	switch {
	case err == nil:
		in.ServiceAccount.Annotations = sa.Annotations
	case errors.Is(err, ErrNotChecked):
		notChecked = append(notChecked, fmt.Sprintf("service account %s/%s: %v; the policies see it without annotations", pod.Namespace, saName, err))
	case apierrors.IsNotFound(err) && op == string(admissionv1.Create):
		// The identity a pod gets comes from its service account: without
		// it, the pod would start with none, or another. Refused with an
		// error, as Azure's webhook refuses it; the Job controller retries.
		return nil, nil, fmt.Errorf("service account %s/%s could not be read, so the pod's workload identity is unknown; create it, or name an existing one in serviceAccountName: %w", pod.Namespace, saName, err)
	case apierrors.IsNotFound(err):
		// An update of a pod whose service account has gone since (the Job
		// controller removing its finalizer) is checked without it.
	default:
		return nil, nil, fmt.Errorf("reading service account %s/%s: %w", pod.Namespace, saName, err)
	}
	mappings, note, err := roleMappings(ctx, look, cfg, pod.Namespace, saName)
	if err != nil {
		return nil, nil, err
	}
	in.AWSRoleMappings = mappings
	if note != "" {
		notChecked = append(notChecked, note)
	}
	// The objects' maps are handed to the policies as they are (not
	// copied); an empty map only where there is none.
	in.Namespace.Labels, in.Namespace.Annotations = orEmpty(in.Namespace.Labels), orEmpty(in.Namespace.Annotations)
	in.ServiceAccount.Annotations = orEmpty(in.ServiceAccount.Annotations)
	return in, notChecked, nil
}

func orEmpty(m map[string]string) map[string]string {
	if m == nil {
		return map[string]string{}
	}
	return m
}

// ClusterLookups reads namespaces and service accounts through reader (the
// webhook's cache, CacheThenLive) and Jobs through jobs (the API server);
// with jobs nil, no Job can be read, and every claim of the runner label
// is refused.
func ClusterLookups(reader, jobs client.Reader) Lookups {
	return clusterLookups{reader: reader, jobs: jobs}
}

type clusterLookups struct{ reader, jobs client.Reader }

func (l clusterLookups) Namespace(ctx context.Context, name string) (*corev1.Namespace, error) {
	ns := &corev1.Namespace{}
	if err := l.reader.Get(ctx, client.ObjectKey{Name: name}, ns); err != nil {
		return nil, err
	}
	return ns, nil
}

func (l clusterLookups) ServiceAccount(ctx context.Context, namespace, name string) (*corev1.ServiceAccount, error) {
	sa := &corev1.ServiceAccount{}
	if err := l.reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, sa); err != nil {
		return nil, err
	}
	return sa, nil
}

func (l clusterLookups) ConfigMap(ctx context.Context, namespace, name string) (*corev1.ConfigMap, error) {
	cm := &corev1.ConfigMap{}
	if err := l.reader.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, cm); err != nil {
		return nil, err
	}
	return cm, nil
}

func (l clusterLookups) Job(ctx context.Context, namespace, name string) (*batchv1.Job, error) {
	if l.jobs == nil {
		return nil, errNoJobReader
	}
	j := &batchv1.Job{}
	if err := l.jobs.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, j); err != nil {
		return nil, err
	}
	return j, nil
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
