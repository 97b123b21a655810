package main

import (
	"io"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/controller-runtime/pkg/cache"
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
	ns, sa := byKind(cacheOptions("runners"))
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
	ns, sa = byKind(cacheOptions(""))
	if ns.Field != nil || sa.Namespaces != nil {
		t.Errorf("without a runner namespace: field %v, namespaces %v; want cluster-wide", ns.Field, sa.Namespaces)
	}
}
