package render

import (
	"os"
	"path/filepath"
	"testing"
)

// TestNeedsSchema checks which overlays have the OpenAPI schema decoded
// before their input is read: those with a strategic merge patch, an openapi
// or a crds field, in the kustomization, a component or a base, and those it
// cannot read.
func TestNeedsSchema(t *testing.T) {
	t.Parallel()
	smpBase := t.TempDir()
	write := func(dir, name, text string) {
		t.Helper()
		if err := os.MkdirAll(dir, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(filepath.Join(dir, name), []byte(text), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write(filepath.Join(smpBase, "base"), "kustomization.yaml", "patchesStrategicMerge:\n- |\n  apiVersion: v1\n  kind: ConfigMap\n  metadata: {name: a}\n")
	write(smpBase, "kustomization.yaml", "resources: [all.yaml, base]\n")
	smpComponent := t.TempDir()
	write(filepath.Join(smpComponent, "pool"), "kustomization.yaml", "apiVersion: kustomize.config.k8s.io/v1alpha1\nkind: Component\npatches:\n- path: p.yaml\n")
	write(filepath.Join(smpComponent, "pool"), "p.yaml", "apiVersion: apps/v1\nkind: Deployment\nmetadata: {name: a}\nspec: {replicas: 2}\n")
	write(smpComponent, "kustomization.yaml", "resources: [all.yaml]\ncomponents: [pool]\n")
	openAPI := t.TempDir()
	write(openAPI, "kustomization.yaml", "resources: [all.yaml]\nopenapi:\n  path: schema.json\n")
	missingPatch := t.TempDir()
	write(missingPatch, "kustomization.yaml", "resources: [all.yaml]\npatches:\n- path: nowhere.yaml\n")
	tests := []struct {
		name    string
		overlay string
		want    bool
	}{
		{name: "strategic merge patches, inline and in a file", overlay: "testdata/bench-overlay", want: true},
		{name: "a strategic merge patch in a component", overlay: smpComponent, want: true},
		{name: "patchesStrategicMerge in a base", overlay: smpBase, want: true},
		{name: "a schema of its own", overlay: openAPI, want: true},
		{name: "a patch it cannot read", overlay: missingPatch, want: true},
		{name: "no kustomization", overlay: "testdata/does-not-exist", want: true},
		{name: "labels and annotations", overlay: "../../kustomize/labels", want: false},
		{name: "images", overlay: "../../kustomize/internal-registry", want: false},
		{name: "a JSON 6902 patch", overlay: "testdata/edge/rename", want: false},
		{name: "JSON 6902 patches in a component", overlay: "testdata/valid-components", want: false},
		{name: "replacements", overlay: "testdata/edge/replacements-kind", want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir, err := filepath.Abs(tt.overlay)
			if err != nil {
				t.Fatal(err)
			}
			if got := needsSchema(newDisk(), dir, 0); got != tt.want {
				t.Errorf("needsSchema(%s) = %v, want %v", tt.overlay, got, tt.want)
			}
		})
	}
}
