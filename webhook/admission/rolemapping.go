package admission

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runwarden/runwarden/webhook/policy"
)

// RoleMappingKey is the key of the role mapping ConfigMap that holds the
// mappings, as in the EKS pod identity webhook's pod-identity-webhook
// ConfigMap.
const RoleMappingKey = "config"

// RoleMappingConfigMap names the role mapping ConfigMap of a platform
// configuration (workloadIdentity.aws.roleMappingConfigMap, with
// workloadIdentity.aws.enabled), or nothing: ok is false when the
// configuration names none.
func RoleMappingConfigMap(cfg map[string]any) (ref client.ObjectKey, ok bool) {
	aws, _ := dig(cfg, "workloadIdentity", "aws").(map[string]any)
	if on, _ := aws["enabled"].(bool); !on {
		return client.ObjectKey{}, false
	}
	cm, _ := aws["roleMappingConfigMap"].(map[string]any)
	ns, _ := cm["namespace"].(string)
	name, _ := cm["name"].(string)
	if ns == "" || name == "" {
		return client.ObjectKey{}, false
	}
	return client.ObjectKey{Namespace: ns, Name: name}, true
}

func dig(m map[string]any, keys ...string) any {
	var v any = m
	for _, k := range keys {
		mm, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = mm[k]
	}
	return v
}

// ParseRoleMappings reads the mappings of a role mapping ConfigMap's
// "config" value: a JSON object from "<namespace>/<service account>" (the
// namespace "*" for every namespace) to {"RoleARN", "Audience",
// "UseRegionalSTS", "TokenExpiration"}, field names in any case, as the EKS
// pod identity webhook reads it. An empty value holds no mappings.
func ParseRoleMappings(config string) (map[string]policy.AWSRoleMapping, error) {
	out := map[string]policy.AWSRoleMapping{}
	if strings.TrimSpace(config) == "" {
		return out, nil
	}
	if err := json.Unmarshal([]byte(config), &out); err != nil {
		return nil, fmt.Errorf(`want a JSON object from "<namespace>/<service account>" to {"RoleARN": ..., "Audience": ..., "UseRegionalSTS": ..., "TokenExpiration": ...}: %w`, err)
	}
	for key := range out {
		if ns, name, ok := strings.Cut(key, "/"); !ok || ns == "" || name == "" || strings.Contains(name, "/") {
			return nil, fmt.Errorf(`key %q is not "<namespace>/<service account>" (or "*/<service account>")`, key)
		}
	}
	return out, nil
}

// roleMappings returns the entries of the role mapping ConfigMap cfg names
// that apply to service account sa of namespace ns: its own key and the one
// for every namespace, those the ConfigMap has. With no ConfigMap named it
// returns nil; one that does not exist holds no mappings. A ConfigMap that
// cannot be read or parsed is an error: the pod's role would be unknown.
// One look did not check is a note, and no mapping.
func roleMappings(ctx context.Context, look Lookups, cfg map[string]any, ns, sa string) (map[string]policy.AWSRoleMapping, string, error) {
	ref, ok := RoleMappingConfigMap(cfg)
	if !ok {
		return nil, "", nil
	}
	out := map[string]policy.AWSRoleMapping{}
	cm, err := look.ConfigMap(ctx, ref.Namespace, ref.Name)
	switch {
	case errors.Is(err, ErrNotChecked):
		return out, fmt.Sprintf("role mapping ConfigMap %s: %v; the policies see no mapping for the service account", ref, err), nil
	case apierrors.IsNotFound(err):
		return out, "", nil
	case err != nil:
		return nil, "", fmt.Errorf("reading the role mapping ConfigMap %s (workloadIdentity.aws.roleMappingConfigMap): %w", ref, err)
	}
	all, err := ParseRoleMappings(cm.Data[RoleMappingKey])
	if err != nil {
		return nil, "", fmt.Errorf("the role mapping ConfigMap %s, key %s, cannot be read, so the roles of its service accounts are unknown; fix it: %w", ref, RoleMappingKey, err)
	}
	for _, key := range []string{ns + "/" + sa, "*/" + sa} {
		if m, ok := all[key]; ok {
			out[key] = m
		}
	}
	return out, "", nil
}
