package admission

import (
	"context"
	"fmt"
	"net/http"
	"strings"

	admissionv1 "k8s.io/api/admission/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/log"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
	kjson "sigs.k8s.io/json"

	"github.com/runwarden/runwarden/internal/contract"
	"github.com/runwarden/runwarden/webhook/policy"
)

// RuleNoExec is the rule that refuses kubectl exec, attach and
// port-forward into runner pods unless the platform configuration allows
// them (exec.allow).
const RuleNoExec = "no-exec-into-runners"

// connectSubresources are the pod subresources a CONNECT reaches a running
// container by: a shell or a stream in it reads what main reads (its
// environment, the resolved secret values on the in-memory volume), and a
// forwarded port reaches what it serves.
var connectSubresources = map[string]string{"exec": "PodExecOptions", "attach": "PodAttachOptions", "portforward": "PodPortForwardOptions"}

// connectOptions is what the handler reads of a CONNECT's options
// (PodExecOptions, PodAttachOptions, PodPortForwardOptions), for its
// message.
type connectOptions struct {
	Kind      string  `json:"kind"`
	Container string  `json:"container"`
	Ports     []int32 `json:"ports"`
}

// connect decides a CONNECT on pods/exec, pods/attach or pods/portforward.
// The request carries the options, not the pod, so the pod is read from
// the API server to know whether it is a runner: runner pods are refused
// unless the platform allows it, other pods are not runwarden's business.
// A pod that cannot be read is an error (HTTP 500): with the chart's
// failurePolicy Fail the API server refuses the call.
func (h *Handler) connect(ctx context.Context, req admission.Request) (admission.Response, string) {
	if h.opts.Mutate {
		return admission.Allowed("runwarden shapes pods at creation only"), "skipped"
	}
	if h.opts.Namespace != "" && req.Namespace != h.opts.Namespace {
		return admission.Allowed("outside the runner namespace"), "skipped"
	}
	var opts connectOptions
	if len(req.Object.Raw) > 0 {
		if err := kjson.UnmarshalCaseSensitivePreserveInts(req.Object.Raw, &opts); err != nil {
			return admission.Errored(http.StatusBadRequest, fmt.Errorf("decoding the %s options of pod %s/%s: %w", req.SubResource, req.Namespace, req.Name, err)), "error"
		}
	}
	if want := connectSubresources[req.SubResource]; opts.Kind != "" && opts.Kind != want {
		return admission.Errored(http.StatusBadRequest, fmt.Errorf("the %s request for pod %s/%s carries %s options, want %s", req.SubResource, req.Namespace, req.Name, opts.Kind, want)), "error"
	}
	if h.opts.Pods == nil {
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("this webhook cannot read pods, so it cannot tell whether pod %s/%s is a runner; give it --runner-namespace's pods to read", req.Namespace, req.Name)), "error"
	}
	pod := &corev1.Pod{}
	switch err := h.opts.Pods.Get(ctx, client.ObjectKey{Namespace: req.Namespace, Name: req.Name}, pod); {
	case apierrors.IsNotFound(err):
		// The API server answers for a pod that does not exist.
		return admission.Allowed("no such pod"), "skipped"
	case err != nil:
		log.FromContext(ctx).Error(err, "reading the pod of a "+req.SubResource+" request", "pod", req.Name)
		return admission.Errored(http.StatusInternalServerError, fmt.Errorf("reading pod %s/%s to tell whether it is a runner: %w", req.Namespace, req.Name, err)), "error"
	}
	if pod.Labels[contract.LabelRunner] != "true" {
		return admission.Allowed("not a runner pod"), "skipped"
	}
	if execAllowed(h.opts.Config) {
		return admission.Allowed(""), "allowed"
	}
	if h.opts.Recorder != nil {
		// Not a policy rule: always denied, whatever the enforcement.
		h.opts.Recorder.Violation(RuleNoExec, policy.ActionDeny)
	}
	log.FromContext(ctx).Info("pod denied", "pod", req.Name, "job", jobOf(pod), "rules", []string{RuleNoExec}, "runner", true,
		"subresource", req.SubResource, "user", req.UserInfo.Username)
	return admission.Denied(fmt.Sprintf("runwarden policy: %s: %s runner pod %s%s is off (platform configuration exec.allow): it would read the task's environment and resolved secret values",
		RuleNoExec, connectVerb(req.SubResource), req.Name, connectTarget(opts))), "denied"
}

// connecting tells whether req is a CONNECT the handler decides.
func connecting(req admission.Request) bool {
	_, ok := connectSubresources[req.SubResource]
	return req.Operation == admissionv1.Connect && req.Resource.Group == "" && req.Resource.Resource == "pods" && ok
}

// execAllowed reads exec.allow of the platform configuration.
func execAllowed(cfg map[string]any) bool {
	e, _ := cfg["exec"].(map[string]any)
	allow, _ := e["allow"].(bool)
	return allow
}

// connectVerb names a subresource as kubectl's command does.
func connectVerb(sub string) string {
	switch sub {
	case "portforward":
		return "port-forward to"
	case "attach":
		return "attach to"
	}
	return "exec into"
}

// connectTarget says what in the pod a CONNECT reaches, for the message.
func connectTarget(o connectOptions) string {
	var parts []string
	if o.Container != "" {
		parts = append(parts, "container "+o.Container)
	}
	if len(o.Ports) > 0 {
		ports := make([]string, 0, len(o.Ports))
		for _, p := range o.Ports {
			ports = append(ports, fmt.Sprint(p))
		}
		parts = append(parts, "port "+strings.Join(ports, ", "))
	}
	if len(parts) == 0 {
		return ""
	}
	return " (" + strings.Join(parts, "; ") + ")"
}
