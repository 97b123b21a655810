package policy

import (
	"bytes"
	"encoding/json"
	"errors"

	corev1 "k8s.io/api/core/v1"
)

// Decision is what the policies return for one pod: see docs/policy.md.
type Decision struct {
	// Deny lists the rules the pod breaks whose action is deny; any entry
	// refuses the pod.
	Deny []Violation `json:"deny"`
	// Warn lists the violations whose action is warn: the pod is admitted
	// and Warnings carry them to the user. Absent from a set written before
	// actions, as empty.
	Warn []Violation `json:"warn"`
	// Dryrun lists the violations whose action is dryrun: the pod is
	// admitted, the user sees nothing, the webhook counts and logs them.
	// Absent from a set written before actions, as empty.
	Dryrun []Violation `json:"dryrun"`
	// Warnings are shown to the user and do not refuse the pod.
	Warnings []string `json:"warnings"`
	// Mutations are applied to the pod by Go.
	Mutations Mutations `json:"mutations"`
}

// Violation is one broken rule.
type Violation struct {
	// Rule is the rule's stable name (docs/policy.md lists them).
	Rule      string `json:"rule"`
	Container string `json:"container"`
	Field     string `json:"field"`
	Message   string `json:"message"`
	// Action is what the platform configuration makes of the rule in the
	// pod's namespace: ActionDeny, ActionWarn or ActionDryrun.
	Action string `json:"action,omitempty"`
}

// The actions a violation may have (the platform configuration's
// enforcement).
const (
	ActionDeny   = "deny"
	ActionWarn   = "warn"
	ActionDryrun = "dryrun"
)

// Actions are the actions, in the order of their strength.
func Actions() []string { return []string{ActionDeny, ActionWarn, ActionDryrun} }

// Violations are the decision's violations of every action: deny, then
// warn, then dryrun, each with its action.
func (d Decision) Violations() []Violation {
	out := make([]Violation, 0, len(d.Deny)+len(d.Warn)+len(d.Dryrun))
	for _, l := range []struct {
		action string
		vs     []Violation
	}{{ActionDeny, d.Deny}, {ActionWarn, d.Warn}, {ActionDryrun, d.Dryrun}} {
		for _, v := range l.vs {
			// A set written before actions names none: its list says it.
			v.Action = l.action
			out = append(out, v)
		}
	}
	return out
}

// Mutations are the changes the policies ask for. Each is applied so that
// applying it again changes nothing.
type Mutations struct {
	Labels       map[string]string                `json:"labels"`
	Annotations  map[string]string                `json:"annotations"`
	NodeSelector map[string]string                `json:"nodeSelector"`
	Tolerations  []corev1.Toleration              `json:"tolerations"`
	NodeAffinity []corev1.NodeSelectorRequirement `json:"nodeAffinity"`
	Volumes      []corev1.Volume                  `json:"volumes"`
	Env          []ContainerEnv                   `json:"env"`
	EnvFrom      []ContainerEnvFrom               `json:"envFrom"`
	VolumeMounts []ContainerVolumeMount           `json:"volumeMounts"`
}

// ContainerEnv sets one variable in the named containers.
type ContainerEnv struct {
	Containers []string      `json:"containers"`
	Env        corev1.EnvVar `json:"env"`
}

// ContainerEnvFrom adds one envFrom source to the named containers.
type ContainerEnvFrom struct {
	Containers []string             `json:"containers"`
	EnvFrom    corev1.EnvFromSource `json:"envFrom"`
}

// ContainerVolumeMount mounts one volume in the named containers.
type ContainerVolumeMount struct {
	Containers  []string           `json:"containers"`
	VolumeMount corev1.VolumeMount `json:"volumeMount"`
}

// Input is the document the policies decide on.
type Input struct {
	Operation string `json:"operation"`
	// SubResource is "ephemeralcontainers" when containers are added to
	// a running pod (kubectl debug), else empty.
	SubResource string      `json:"subResource,omitempty"`
	Pod         *corev1.Pod `json:"pod"`
	// OldPod is the pod before an UPDATE.
	OldPod *corev1.Pod `json:"oldPod,omitempty"`
	// Runner tells whether the pod is an earned runner pod: made by the Job
	// controller for a Job of runwarden's dispatcher. Other pods of a
	// runner namespace reach the validating webhook only, for the shape
	// rules.
	Runner         bool           `json:"runner"`
	Namespace      NamespaceInfo  `json:"namespace"`
	ServiceAccount ObjectInfo     `json:"serviceAccount"`
	User           UserInfo       `json:"user"`
	Config         map[string]any `json:"config"`
	// ConfigJSON, when set, is Config's JSON encoding, made once by a
	// caller that decides on many inputs with one configuration (the
	// admission handler): Eval uses it instead of encoding Config again.
	// It must be a JSON value as json.Marshal writes it: it is put into
	// the input's encoding as it is.
	ConfigJSON json.RawMessage `json:"-"`
	SecretRefs []SecretRef     `json:"secretRefs"`
	// ResolverImage is the image of the init container that resolves the
	// secret references (the webhook's --resolver-image), else empty.
	ResolverImage string `json:"resolverImage,omitempty"`
	// AWSRoleMappings are the entries of the role mapping ConfigMap
	// (workloadIdentity.aws.roleMappingConfigMap) for the pod's service
	// account, by their keys: "<namespace>/<name>" and "*/<name>" when the
	// ConfigMap has them. Absent without that ConfigMap.
	AWSRoleMappings map[string]AWSRoleMapping `json:"awsRoleMappings,omitempty"`
}

// AWSRoleMapping is one entry of the role mapping ConfigMap, as the EKS pod
// identity webhook reads its pod-identity-webhook ConfigMap.
type AWSRoleMapping struct {
	RoleARN         string `json:"roleARN"`
	Audience        string `json:"audience"`
	UseRegionalSTS  bool   `json:"useRegionalSTS"`
	TokenExpiration int64  `json:"tokenExpiration"`
}

// NamespaceInfo is the pod's namespace as the policies see it.
type NamespaceInfo struct {
	Name        string            `json:"name"`
	Labels      map[string]string `json:"labels"`
	Annotations map[string]string `json:"annotations"`
}

// ObjectInfo is a named object's annotations.
type ObjectInfo struct {
	Name        string            `json:"name"`
	Annotations map[string]string `json:"annotations"`
}

// UserInfo is who asked for the pod.
type UserInfo struct {
	Username string   `json:"username"`
	Groups   []string `json:"groups"`
}

// SecretRef is one secret reference found in an env value.
type SecretRef struct {
	Container string `json:"container"`
	Env       string `json:"env"`
	// Store is ssm, gcp, azure or vault.
	Store string `json:"store"`
	// Name is the secret's name in its store: the secret id (ssm, gcp),
	// the secret name (azure) or the path (vault).
	Name string `json:"name"`
	// Vault is the Azure Key Vault name or the Vault namespace.
	Vault string `json:"vault,omitempty"`
	// Key is the Vault key, or the JSON key of an ssm value.
	Key string `json:"key,omitempty"`
	// Raw is the reference as written.
	Raw string `json:"raw"`
	// Error says what is wrong with a malformed reference; empty otherwise.
	Error string `json:"error"`
}

// encodeInput is the input's JSON encoding, with ConfigJSON in place of
// Config's when set.
func encodeInput(in *Input) ([]byte, error) {
	var buf bytes.Buffer
	if err := appendInput(&buf, in); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// appendInput writes the input's JSON encoding to buf, as json.Marshal
// writes it, followed by a newline. With ConfigJSON set, the rest of the
// input is encoded without its configuration and ConfigJSON (already
// compact, as json.Marshal wrote it) is put in as the last key, instead of
// being compacted again on every call: the same document, the key order
// aside, which neither the policies nor the decision cache's key (read by
// key, see projection) depend on.
func appendInput(buf *bytes.Buffer, in *Input) error {
	enc := json.NewEncoder(buf)
	if in.ConfigJSON == nil {
		return enc.Encode(in)
	}
	type plain Input
	start := buf.Len()
	if err := enc.Encode(struct {
		*plain
		Config json.RawMessage `json:"config,omitempty"` // shadows plain's, and is left out
	}{plain: (*plain)(in)}); err != nil {
		return err
	}
	// The encoding ends in "}\n" and has other keys (operation, pod, ...)
	// before it.
	end := buf.Len() - len("}\n")
	if end <= start+1 || buf.Bytes()[end] != '}' {
		return errors.New("encoding the input: not an object")
	}
	buf.Truncate(end)
	buf.WriteString(`,"config":`)
	buf.Write(in.ConfigJSON)
	buf.WriteString("}\n")
	return nil
}
