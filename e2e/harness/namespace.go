package harness

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"
)

// namespaceKey is the context key under which a feature's namespace is kept.
type namespaceKey struct{}

// LabelE2E marks namespaces the e2e suites create, so leftovers are easy to find.
const LabelE2E = "runwarden.dev/e2e"

var nonDNS = regexp.MustCompile(`[^a-z0-9-]+`)

// Namespace returns the fresh namespace created for the running feature.
func Namespace(ctx context.Context) string {
	ns, _ := ctx.Value(namespaceKey{}).(string)
	return ns
}

// WithNamespace returns ctx naming ns as the namespace Namespace returns,
// for code outside a feature (a benchmark) that made its own.
func WithNamespace(ctx context.Context, ns string) context.Context {
	return context.WithValue(ctx, namespaceKey{}, ns)
}

// namespaceName derives a valid, unique namespace name from a feature name.
func namespaceName(feature string) string {
	base := strings.Trim(nonDNS.ReplaceAllString(strings.ToLower(feature), "-"), "-")
	if len(base) > 40 {
		base = strings.TrimRight(base[:40], "-")
	}
	if base == "" {
		base = "feature"
	}
	b := make([]byte, 3)
	_, _ = rand.Read(b)
	return "e2e-" + base + "-" + hex.EncodeToString(b)
}

func createFeatureNamespace(ctx context.Context, cfg *envconf.Config, t *testing.T, f features.Feature) (context.Context, error) {
	name := namespaceName(f.Name())
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{
		Name:   name,
		Labels: map[string]string{LabelE2E: "true"},
	}}
	if err := cfg.Client().Resources().Create(ctx, ns); err != nil {
		return ctx, fmt.Errorf("creating namespace %s for feature %q: %w", name, f.Name(), err)
	}
	t.Logf("feature %q runs in namespace %s", f.Name(), name)
	return context.WithValue(ctx, namespaceKey{}, name), nil
}

func deleteFeatureNamespace(ctx context.Context, cfg *envconf.Config, t *testing.T, _ features.Feature) (context.Context, error) {
	name := Namespace(ctx)
	if name == "" {
		return ctx, nil
	}
	if t.Failed() {
		Dump(ctx, t, cfg, name)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := cfg.Client().Resources().Delete(ctx, ns); err != nil {
		return ctx, fmt.Errorf("deleting namespace %s: %w", name, err)
	}
	return ctx, nil
}

// LabelNamespace sets a label on the feature's namespace.
func LabelNamespace(ctx context.Context, cfg *envconf.Config, key, value string) error {
	r := cfg.Client().Resources()
	ns := &corev1.Namespace{}
	if err := r.Get(ctx, Namespace(ctx), "", ns); err != nil {
		return fmt.Errorf("reading namespace %s: %w", Namespace(ctx), err)
	}
	if ns.Labels == nil {
		ns.Labels = map[string]string{}
	}
	ns.Labels[key] = value
	if err := r.Update(ctx, ns); err != nil {
		return fmt.Errorf("labelling namespace %s: %w", ns.Name, err)
	}
	return nil
}
