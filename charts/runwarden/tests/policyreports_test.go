package tests

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	appsv1 "k8s.io/api/apps/v1"
	rbacv1 "k8s.io/api/rbac/v1"
)

// TestPolicyReportsChart checks what policyReports.enabled adds: the
// webhook's flags, its Role in the runner namespace (list pods and Jobs,
// write the one report runwarden), its Lease in the release namespace, the
// CRD (unless installCRD is off), and a ClusterRole aggregated into view,
// so a namespace's readers read its report; and that none of it is there
// while it is off.
func TestPolicyReportsChart(t *testing.T) {
	t.Parallel()
	h := helm(t, "helm3")
	off := render(t, h)
	for key := range off {
		if strings.Contains(key, "reports") || strings.Contains(key, "policyreports") {
			t.Errorf("rendered with policyReports off: %s", key)
		}
	}
	on := render(t, h, "--set", "policyReports.enabled=true", "--set", "policyReports.interval=1m", "--set", "policyReports.maxResults=200")
	var d appsv1.Deployment
	decode(t, on, "Deployment/rw-runwarden-webhook", &d)
	var flags []string
	for _, a := range d.Spec.Template.Spec.Containers[0].Args {
		if strings.HasPrefix(a, "--policy-report") {
			flags = append(flags, a)
		}
	}
	want := []string{"--policy-reports", "--policy-report-interval=1m", "--policy-report-since=24h", "--policy-report-max-results=200"}
	if diff := cmp.Diff(want, flags); diff != "" {
		t.Errorf("the webhook's report flags (-want +got):\n%s", diff)
	}
	var role rbacv1.Role
	decode(t, on, "Role/rw-runwarden-webhook-reports", &role)
	wantRules := []rbacv1.PolicyRule{
		{APIGroups: []string{""}, Resources: []string{"pods"}, Verbs: []string{"list"}},
		{APIGroups: []string{"batch"}, Resources: []string{"jobs"}, Verbs: []string{"list"}},
		{APIGroups: []string{"wgpolicyk8s.io"}, Resources: []string{"policyreports"}, ResourceNames: []string{"runwarden"}, Verbs: []string{"get", "patch"}},
		{APIGroups: []string{"wgpolicyk8s.io"}, Resources: []string{"policyreports"}, Verbs: []string{"create"}},
	}
	if role.Namespace != "runwarden-runners" {
		t.Errorf("the reports Role is in %q, want the runner namespace", role.Namespace)
	}
	if diff := cmp.Diff(wantRules, role.Rules); diff != "" {
		t.Errorf("the reports Role's rules (-want +got):\n%s", diff)
	}
	var lease rbacv1.Role
	decode(t, on, "Role/rw-runwarden-webhook-reports-lease", &lease)
	if lease.Namespace != "runwarden" || len(lease.Rules) != 2 || lease.Rules[0].ResourceNames[0] != "runwarden-webhook-policy-reports" {
		t.Errorf("the Lease Role: namespace %q, rules %+v; want the release namespace's Lease runwarden-webhook-policy-reports", lease.Namespace, lease.Rules)
	}
	var view rbacv1.ClusterRole
	decode(t, on, "ClusterRole/rw-runwarden-policyreports-view", &view)
	if view.Labels["rbac.authorization.k8s.io/aggregate-to-view"] != "true" {
		t.Errorf("the view ClusterRole's labels %v lack aggregate-to-view", view.Labels)
	}
	if diff := cmp.Diff([]rbacv1.PolicyRule{{APIGroups: []string{"wgpolicyk8s.io"}, Resources: []string{"policyreports"}, Verbs: []string{"get", "list", "watch"}}}, view.Rules); diff != "" {
		t.Errorf("the view ClusterRole's rules (-want +got):\n%s", diff)
	}
	if _, ok := on["CustomResourceDefinition/policyreports.wgpolicyk8s.io"]; !ok {
		t.Error("no PolicyReport CRD rendered with policyReports.enabled")
	}
	noCRD := render(t, h, "--set", "policyReports.enabled=true", "--set", "policyReports.installCRD=false")
	if _, ok := noCRD["CustomResourceDefinition/policyreports.wgpolicyk8s.io"]; ok {
		t.Error("the PolicyReport CRD is rendered with installCRD=false")
	}
}
