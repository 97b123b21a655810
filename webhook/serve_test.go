package main

import (
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/prometheus/client_golang/prometheus"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"

	"github.com/runwarden/runwarden/webhook/metrics"
)

func TestParseServeRunnerNamespace(t *testing.T) {
	t.Parallel()
	c, err := parseServe([]string{"--cert-mode", "provided", "--runner-namespace", "team-a-runners"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.namespace != "team-a-runners" {
		t.Errorf("namespace %q, want team-a-runners", c.namespace)
	}
}

// TestCacheOptions checks that with a runner namespace the cache watches
// that Namespace by name (what RBAC can grant by resourceNames) and service
// accounts in it only, and without one, both cluster-wide.
func TestCacheOptions(t *testing.T) {
	t.Parallel()
	byKind := func(o cache.Options) (ns, sa cache.ByObject) {
		for obj, by := range o.ByObject {
			switch obj.(type) {
			case *corev1.Namespace:
				ns = by
			case *corev1.ServiceAccount:
				sa = by
			}
		}
		return ns, sa
	}
	ns, sa := byKind(cacheOptions("runners", nil))
	if ns.Field == nil || ns.Field.String() != "metadata.name=runners" {
		t.Errorf("namespace field selector %v, want metadata.name=runners", ns.Field)
	}
	if _, ok := sa.Namespaces["runners"]; !ok || len(sa.Namespaces) != 1 {
		t.Errorf("service account namespaces %v, want runners only", sa.Namespaces)
	}
	for _, by := range []cache.ByObject{ns, sa} {
		if by.UnsafeDisableDeepCopy == nil || !*by.UnsafeDisableDeepCopy {
			t.Error("the cache copies objects the handler only reads")
		}
	}
	ns, sa = byKind(cacheOptions("", nil))
	if ns.Field != nil || sa.Namespaces != nil {
		t.Errorf("without a runner namespace: field %v, namespaces %v; want cluster-wide", ns.Field, sa.Namespaces)
	}
	for obj, by := range cacheOptions("runners", nil).ByObject {
		if _, ok := obj.(*corev1.ConfigMap); ok {
			t.Errorf("a ConfigMap is cached without a role mapping ConfigMap named: %+v", by)
		}
	}
	if kinds := cachedKinds(nil); len(kinds) != 2 {
		t.Errorf("cached kinds %T, want the Namespace and ServiceAccount only", kinds)
	}
}

// TestCacheOptionsRoleMappingConfigMap checks that the role mapping
// ConfigMap the platform configuration names is the one ConfigMap the cache
// holds (so RBAC need grant that one only), and that its informer starts.
func TestCacheOptionsRoleMappingConfigMap(t *testing.T) {
	t.Parallel()
	platform := map[string]any{"workloadIdentity": map[string]any{"aws": map[string]any{
		"enabled": true, "roleMappingConfigMap": map[string]any{"namespace": "kube-system", "name": "pod-identity-webhook"},
	}}}
	var cm *cache.ByObject
	for obj, by := range cacheOptions("runners", platform).ByObject {
		if _, ok := obj.(*corev1.ConfigMap); ok {
			cm = &by
		}
	}
	if cm == nil {
		t.Fatal("no ConfigMap in the cache options")
	}
	if _, ok := cm.Namespaces["kube-system"]; !ok || len(cm.Namespaces) != 1 || cm.Field == nil || cm.Field.String() != "metadata.name=pod-identity-webhook" {
		t.Errorf("ConfigMap cache namespaces %v, field %v; want kube-system, metadata.name=pod-identity-webhook", cm.Namespaces, cm.Field)
	}
	if kinds := cachedKinds(platform); len(kinds) != 3 {
		t.Errorf("cached kinds %T, want the ConfigMap too", kinds)
	}
}

// TestFirstPolicyLoadIsNotAReload checks that the set loaded at start shows
// in policy_info, while policy_reloads_total counts only later reloads.
func TestFirstPolicyLoadIsNotAReload(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	store, err := loadPolicies(t.Context(), serveConfig{reloadInterval: time.Hour}, nil, metrics.New(reg), nil)
	if err != nil {
		t.Fatal(err)
	}
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]float64{}
	for _, f := range families {
		if !strings.HasPrefix(f.GetName(), "runwarden_webhook_policy_") {
			continue
		}
		for _, m := range f.GetMetric() {
			series := f.GetName()
			for _, l := range m.GetLabel() {
				series += "{" + l.GetName() + "=" + l.GetValue() + "}"
			}
			got[series] = m.GetCounter().GetValue() + m.GetGauge().GetValue()
		}
	}
	// The reload series exist from the start, at 0: the first load is not one.
	want := map[string]float64{
		"runwarden_webhook_policy_info{digest=" + store.Current().Digest + "}": 1,
		"runwarden_webhook_policy_reloads_total{result=failure}":               0,
		"runwarden_webhook_policy_reloads_total{result=success}":               0,
		"runwarden_webhook_policy_reload_timeouts_total":                       0,
		"runwarden_webhook_policy_decisions_total{source=cache}":               0,
		"runwarden_webhook_policy_decisions_total{source=evaluation}":          0,
	}
	if diff := cmp.Diff(want, got); diff != "" {
		t.Errorf("policy metrics after the first load (-want +got):\n%s", diff)
	}
}

// TestParseServePolicyReports checks the report flags: they need the
// runner namespace (the report's) and the pod's namespace (the Lease's).
func TestParseServePolicyReports(t *testing.T) {
	t.Parallel()
	base := []string{"--cert-mode", "provided"}
	tests := []struct {
		name    string
		args    []string
		wantErr string
	}{
		{name: "off", args: nil},
		{name: "on", args: []string{"--policy-reports", "--runner-namespace", "runners", "--pod-name", "w", "--pod-namespace", "runwarden"}},
		{name: "no runner namespace", args: []string{"--policy-reports", "--pod-name", "w", "--pod-namespace", "runwarden"}, wantErr: "--policy-reports needs --runner-namespace"},
		{name: "no pod namespace", args: []string{"--policy-reports", "--runner-namespace", "runners"}, wantErr: "--policy-reports needs --pod-namespace"},
		{name: "no interval", args: []string{"--policy-reports", "--runner-namespace", "runners", "--pod-name", "w", "--pod-namespace", "runwarden", "--policy-report-interval", "0s"}, wantErr: "--policy-report-interval 0s"},
		{name: "no results", args: []string{"--policy-reports", "--runner-namespace", "runners", "--pod-name", "w", "--pod-namespace", "runwarden", "--policy-report-max-results", "0"}, wantErr: "--policy-report-max-results"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c, err := parseServe(append(base, tt.args...), io.Discard)
			switch {
			case tt.wantErr == "" && err != nil:
				t.Fatalf("parseServe: %v", err)
			case tt.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tt.wantErr)):
				t.Fatalf("parseServe: %v, want an error containing %q", err, tt.wantErr)
			case tt.wantErr == "" && c.reports.enabled != slices.Contains(tt.args, "--policy-reports"):
				t.Errorf("reports enabled = %v", c.reports.enabled)
			}
		})
	}
}

// TestServeRefusesARoleMappingInTheRunnerNamespace: the role mapping
// ConfigMap chooses every runner's IAM role; in the runner namespace,
// whoever may write ConfigMaps there would, so the webhook does not start.
func TestServeRefusesARoleMappingInTheRunnerNamespace(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "platform.yaml")
	cfg := "workloadIdentity:\n  aws:\n    enabled: true\n    roleMappingConfigMap: {namespace: runners, name: roles}\n"
	if err := os.WriteFile(path, []byte(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	err := serveWith(t.Context(), serveConfig{configFile: path, namespace: "runners", kubeconfig: filepath.Join(t.TempDir(), "none")})
	if err == nil || !strings.Contains(err.Error(), "is in the runner namespace (--runner-namespace)") {
		t.Errorf("serving with the role mapping in the runner namespace: %v", err)
	}
}
