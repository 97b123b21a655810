//go:build e2e

package e2e

import (
	"context"

	coordinationv1 "k8s.io/api/coordination/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	apimachinerywait "k8s.io/apimachinery/pkg/util/wait"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
)

// rbacRole is the least a runner using OpenTofu's kubernetes backend needs:
// secrets (state) and leases (lock) in its own namespace, nothing else.
type rbacRole struct{ ns string }

func (r rbacRole) role() *rbacv1.Role {
	return &rbacv1.Role{
		ObjectMeta: metav1.ObjectMeta{Name: "tofu-state", Namespace: r.ns},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"secrets"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
			{APIGroups: []string{"coordination.k8s.io"}, Resources: []string{"leases"}, Verbs: []string{"get", "list", "watch", "create", "update", "patch", "delete"}},
		},
	}
}

func (r rbacRole) binding() *rbacv1.RoleBinding {
	return &rbacv1.RoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "tofu-state", Namespace: r.ns},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "Role", Name: "tofu-state"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Name: "runner", Namespace: r.ns}},
	}
}

func leaseExists(cfg *envconf.Config, ns, name string) apimachinerywait.ConditionWithContextFunc {
	return func(ctx context.Context) (bool, error) {
		var l coordinationv1.Lease
		if err := cfg.Client().Resources(ns).Get(ctx, name, ns, &l); err != nil {
			return false, nil
		}
		return true, nil
	}
}
