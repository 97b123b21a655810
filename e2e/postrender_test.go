//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/e2e-framework/pkg/envconf"
	"sigs.k8s.io/e2e-framework/pkg/features"

	"github.com/runwarden/runwarden/e2e/harness"
)

// The label the kustomize/labels overlay adds to every object.
const (
	overlayLabel = "platform.example.com/team"
	overlayValue = "platform"
)

// helmRun runs one real helm binary with its own, empty configuration
// folders, against the suite's cluster.
type helmRun struct {
	bin     string
	plugins string // HELM_PLUGINS, for Helm v4's plugin
	home    string
	cfg     *envconf.Config
}

func newHelm(t *testing.T, cfg *envconf.Config, tool string) *helmRun {
	t.Helper()
	out, err := exec.Command(filepath.Join(suite.RepoRoot, "hack", "tools.sh"), "path", tool).Output()
	if err != nil {
		t.Fatalf("hack/tools.sh path %s: %v", tool, err)
	}
	bin := filepath.Join(strings.TrimSpace(string(out)), "helm")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%s is not built (make tools): %v", bin, err)
	}
	return &helmRun{bin: bin, home: t.TempDir(), cfg: cfg}
}

func (h *helmRun) run(ctx context.Context, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, h.bin, append(args, "--kubeconfig", h.cfg.KubeconfigFile())...)
	cmd.Env = append(os.Environ(),
		"HELM_CONFIG_HOME="+filepath.Join(h.home, "config"),
		"HELM_CACHE_HOME="+filepath.Join(h.home, "cache"),
		"HELM_DATA_HOME="+filepath.Join(h.home, "data"),
	)
	if h.plugins != "" {
		cmd.Env = append(cmd.Env, "HELM_PLUGINS="+h.plugins)
	}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	if err != nil {
		return stdout.String() + stderr.String(), fmt.Errorf("helm %s: %w\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return stdout.String(), nil
}

// buildPostrender builds runwarden-postrender and, for Helm v4, installs it
// as a plugin the way `make helm-plugin` does.
func buildPostrender(ctx context.Context, t *testing.T) (bin, plugins string) {
	t.Helper()
	dir := t.TempDir()
	bin = built.build(ctx, t, suite.RepoRoot, "./postrender", "CGO_ENABLED=0")
	plugins = filepath.Join(dir, "plugins")
	pdir := filepath.Join(plugins, "runwarden-postrender")
	if err := os.MkdirAll(filepath.Join(pdir, "bin"), 0o755); err != nil {
		t.Fatal(err)
	}
	manifest, err := os.ReadFile(filepath.Join(suite.RepoRoot, "postrender", "plugin", "plugin.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pdir, "plugin.yaml"), manifest, 0o644); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(bin)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(pdir, "bin", "runwarden-postrender"), b, 0o755); err != nil {
		t.Fatal(err)
	}
	return bin, plugins
}

// brokenOverlay is an overlay whose patch file is missing.
func brokenOverlay(t *testing.T) string {
	t.Helper()
	dir := t.TempDir()
	k := "resources: [all.yaml]\npatches:\n- path: missing-patch.yaml\n"
	if err := os.WriteFile(filepath.Join(dir, "kustomization.yaml"), []byte(k), 0o644); err != nil {
		t.Fatal(err)
	}
	return dir
}

func configMapLabel(ctx context.Context, t *testing.T, cfg *envconf.Config, ns, name string) (string, string) {
	t.Helper()
	var cm corev1.ConfigMap
	if err := cfg.Client().Resources(ns).Get(ctx, name, ns, &cm); err != nil {
		t.Fatalf("getting ConfigMap %s: %v", name, err)
	}
	return cm.Labels[overlayLabel], cm.Data["message"]
}

// TestHelmPostRenderer installs, upgrades and templates a chart with real
// Helm v3 and Helm v4 through runwarden-postrender and an overlay from
// kustomize/, and checks the objects in the API server carry the overlay's
// changes; a broken overlay fails the install with its cause shown.
func TestHelmPostRenderer(t *testing.T) {
	t.Parallel()
	chart := filepath.Join(suite.RepoRoot, "e2e", "testdata", "demo-chart")
	overlay := filepath.Join(suite.RepoRoot, "kustomize", "labels")
	for _, v := range []struct{ name, tool string }{{"helm v3", "helm3"}, {"helm v4", "helm4"}} {
		f := features.New("post-renderer with "+v.name).
			Assess("install, upgrade and template carry the overlay", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
				ns := harness.Namespace(ctx)
				bin, plugins := buildPostrender(ctx, t)
				h := newHelm(t, cfg, v.tool)
				pr := []string{"--post-renderer", bin, "--post-renderer-args", "--kustomize", "--post-renderer-args", overlay}
				if v.tool == "helm4" {
					h.plugins = plugins
					pr[1] = "runwarden-postrender"
				}
				if _, err := h.run(ctx, append([]string{"install", "demo", chart, "-n", ns}, pr...)...); err != nil {
					t.Fatal(err)
				}
				if label, msg := configMapLabel(ctx, t, cfg, ns, "demo-config"); label != overlayValue || msg != "hello" {
					t.Errorf("after install: label %q=%q, message %q; want %q and hello", overlayLabel, label, msg, overlayValue)
				}
				// Helm v4 sends hooks through the post-renderer; Helm v3 never does.
				wantHook := overlayValue
				if v.tool == "helm3" {
					wantHook = ""
				}
				if label, _ := configMapLabel(ctx, t, cfg, ns, "demo-hook"); label != wantHook {
					t.Errorf("post-install hook: label %q=%q, want %q", overlayLabel, label, wantHook)
				}
				if _, err := h.run(ctx, append([]string{"upgrade", "demo", chart, "-n", ns, "--set", "message=upgraded"}, pr...)...); err != nil {
					t.Fatal(err)
				}
				if label, msg := configMapLabel(ctx, t, cfg, ns, "demo-config"); label != overlayValue || msg != "upgraded" {
					t.Errorf("after upgrade: label %q, message %q; want %q and upgraded", label, msg, overlayValue)
				}
				out, err := h.run(ctx, append([]string{"template", "demo", chart, "-n", ns}, pr...)...)
				if err != nil {
					t.Fatal(err)
				}
				if !strings.Contains(out, overlayLabel+": "+overlayValue) || !strings.Contains(out, "name: demo-config") {
					t.Errorf("helm template output lacks the overlay's label:\n%s", out)
				}
				return ctx
			}).
			Assess("a broken overlay fails the install and says why", func(ctx context.Context, t *testing.T, cfg *envconf.Config) context.Context {
				ns := harness.Namespace(ctx)
				bin, plugins := buildPostrender(ctx, t)
				h := newHelm(t, cfg, v.tool)
				pr := []string{"--post-renderer", bin, "--post-renderer-args", "--kustomize", "--post-renderer-args", brokenOverlay(t)}
				if v.tool == "helm4" {
					h.plugins = plugins
					pr[1] = "runwarden-postrender"
				}
				out, err := h.run(ctx, append([]string{"install", "broken", chart, "-n", ns}, pr...)...)
				if err == nil {
					t.Fatalf("install with a broken overlay succeeded:\n%s", out)
				}
				t.Logf("%s says: %s", v.name, out)
				if !strings.Contains(out, "missing-patch.yaml") {
					t.Errorf("helm's output does not name the cause (missing-patch.yaml):\n%s", out)
				}
				var cms corev1.ConfigMapList
				if err := cfg.Client().Resources(ns).List(ctx, &cms); err != nil {
					t.Fatal(err)
				}
				for _, cm := range cms.Items {
					if strings.HasPrefix(cm.Name, "broken") {
						t.Errorf("the failed install left ConfigMap %s", cm.Name)
					}
				}
				return ctx
			}).Feature()
		testenv.Test(t, f)
	}
}
