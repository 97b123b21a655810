package render

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

// configMaps returns n ConfigMaps named filler-0 to filler-(n-1), so that
// small inputs are split at small shard sizes.
func configMaps(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: filler-%d\ndata:\n  k: v\n", i)
	}
	return b.String()
}

// TestRenderEdgeCasesMatchKustomizeBuild runs inputs and overlays where
// splitting the build could go wrong through the kustomize CLI and Render,
// built once and split: the output, or the failure, must be the same.
func TestRenderEdgeCasesMatchKustomizeBuild(t *testing.T) {
	t.Parallel()
	cli := kustomizeCLI(t)
	tests := []struct {
		name, overlay, input string
		// split says whether Render must still split the input.
		split bool
	}{
		{
			name: "reference in an annotation Kustomize follows", overlay: "prefix", split: true,
			input: "apiVersion: v1\nkind: Secret\nmetadata:\n  name: basic-auth\n" + configMaps(4) +
				"---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: web\n  annotations:\n" +
				"    nginx.ingress.kubernetes.io/auth-secret: basic-auth\nspec:\n  defaultBackend:\n    service:\n      name: web\n      port:\n        number: 80\n",
		},
		{
			name: "names inside a List", overlay: "prefix",
			input: "apiVersion: v1\nkind: List\nitems:\n- apiVersion: v1\n  kind: ConfigMap\n  metadata:\n    name: settings\n" + configMaps(4) +
				"---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: app\nspec:\n  selector:\n    matchLabels: {app: a}\n  template:\n" +
				"    metadata:\n      labels: {app: a}\n    spec:\n      containers:\n      - name: c\n        image: x\n        envFrom:\n        - configMapRef:\n            name: settings\n",
		},
		{
			name: "two Namespaces renamed to one", overlay: "namespace",
			input: "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team1\n" + configMaps(4) +
				"---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: team2\n",
		},
		{
			name: "block scalar at the end of input without a newline", overlay: "prefix", split: true,
			input: configMaps(4) + "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: last\ndata:\n  k: |\n    x",
		},
		{
			name: "name reference configured in a base", overlay: "base-config",
			input: "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: wcfg\n" + configMaps(4) +
				"---\napiVersion: example.com/v1\nkind: Widget\nmetadata:\n  name: w\nspec:\n  selector:\n    configName: wcfg\n",
		},
		{
			name: "replicas of one Deployment", overlay: "replicas", split: true,
			input: configMaps(4) + "---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: app\nspec:\n  replicas: 1\n" +
				"  selector:\n    matchLabels: {app: a}\n  template:\n    metadata:\n      labels: {app: a}\n    spec:\n      containers:\n      - name: c\n        image: x\n",
		},
		{
			name: "reference written by a targeted patch", overlay: "patch-ref", split: true,
			input: "apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: runner\n" + configMaps(4) + deployment("web"),
		},
		{
			name: "reference written by commonAnnotations", overlay: "annotation-ref", split: true,
			input: "apiVersion: v1\nkind: Secret\nmetadata:\n  name: basic-auth\n" + configMaps(4) +
				"---\napiVersion: networking.k8s.io/v1\nkind: Ingress\nmetadata:\n  name: web\nspec:\n  defaultBackend:\n    service:\n      name: web\n      port:\n        number: 80\n",
		},
		{
			name: "reference to a name a patch gives", overlay: "rename",
			input: "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n" + configMaps(4) +
				"---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: x\n    envFrom:\n    - configMapRef:\n        name: b\n",
		},
		{
			name: "reference through a YAML alias", overlay: "prefix", split: true,
			input: "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: web-config\n" + configMaps(4) +
				"---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: web\n  labels: {config: &cfg web-config}\nspec:\n  containers:\n  - name: c\n    image: x\n    envFrom:\n    - configMapRef:\n        name: *cfg\n",
		},
		{
			name: "a Namespace with a namespace renamed onto another", overlay: "namespace",
			input: "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: monitoring\n  namespace: default\n" + configMaps(4) +
				"---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: logging\n",
		},
		{
			name: "empty documents", overlay: "prefix", split: true,
			input: configMaps(4) + "---\n{}\n---\nnull\n---\n[]\n---\n# only a comment\n~\n",
		},
		{
			name: "the deprecated bases field", overlay: "bases", split: true,
			input: configMaps(5),
		},
		{
			name: "replacement source named as the build names it", overlay: "replacements-prefix", split: true,
			input: "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\n" + configMaps(4) +
				"---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: source\nspec:\n  selector:\n    matchLabels: {app: a}\n  template:\n" +
				"    metadata:\n      labels: {app: a}\n    spec:\n      containers:\n      - name: c\n        image: x\n        envFrom:\n        - configMapRef:\n            name: settings\n",
		},
		{
			name: "replacement source selected by kind alone", overlay: "replacements-kind", split: true,
			input: configMaps(4) + "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: team\n",
		},
		{
			name: "two replacement sources where one is expected", overlay: "replacements-kind",
			input: "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: team\n" + configMaps(4) + "---\napiVersion: v1\nkind: Namespace\nmetadata:\n  name: other\n",
		},
		{
			name: "replacements kept in a file", overlay: "replacements-file", split: true,
			input: configMaps(4) + "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: settings\ndata:\n  k: from-settings\n",
		},
		{
			name: "vars", overlay: "vars",
			input: configMaps(5) + "---\napiVersion: v1\nkind: Pod\nmetadata:\n  name: web\nspec:\n  containers:\n  - name: c\n    image: x\n    args: [$(FIRST)]\n",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			dir := filepath.Join("testdata", "edge", tt.overlay)
			want, cliErr := cliBuild(t, cli, dir, []byte(tt.input))
			for _, shard := range []int{-1, 1, 3} {
				got, st, err := Render(t.Context(), Options{Overlay: dir, ShardSize: shard}, []byte(tt.input))
				switch {
				case cliErr != nil && err == nil:
					t.Errorf("shard size %d: Render succeeded where kustomize build failed with %v", shard, cliErr)
				case cliErr == nil && err != nil:
					t.Errorf("shard size %d: Render: %v", shard, err)
				case cliErr == nil:
					if diff := cmp.Diff(string(want), string(got)); diff != "" {
						t.Errorf("shard size %d: output differs from kustomize build (-cli +ours):\n%s", shard, diff)
					}
					if shard > 0 && tt.split && st.Shards < 2 {
						t.Errorf("shard size %d: built once (%q), want split", shard, st.Fallback+st.NotShardable)
					}
				}
			}
		})
	}
}

// TestManagedByLabelMatchesKustomizeBuild checks the version Kustomize
// stamps into app.kubernetes.io/managed-by, with the built binary: test
// binaries carry no dependency versions for the library to find.
func TestManagedByLabelMatchesKustomizeBuild(t *testing.T) {
	t.Parallel()
	dir, err := filepath.Abs(filepath.Join("testdata", "edge", "managed-by"))
	if err != nil {
		t.Fatal(err)
	}
	input := []byte(configMaps(5))
	want, err := cliBuild(t, kustomizeCLI(t), dir, input)
	if err != nil {
		t.Fatalf("kustomize build: %v", err)
	}
	cmd := exec.Command(buildPostrender(t), "--kustomize", dir)
	cmd.Stdin = bytes.NewReader(input)
	got, err := cmd.Output()
	if err != nil {
		t.Fatalf("runwarden-postrender: %v", err)
	}
	if !bytes.Contains(want, []byte("managed-by: kustomize-v")) {
		t.Fatalf("kustomize build set no versioned managed-by label:\n%s", want)
	}
	if diff := cmp.Diff(string(want), string(got)); diff != "" {
		t.Errorf("output differs from kustomize build (-cli +ours):\n%s", diff)
	}
}

// TestSkippedKeysAreNotNameReferences checks that no field the grouping
// ignores appears in a path of Kustomize's default name references, read
// from the pinned library's source.
func TestSkippedKeysAreNotNameReferences(t *testing.T) {
	t.Parallel()
	out, err := exec.Command("go", "list", "-m", "-f", "{{.Dir}}", "sigs.k8s.io/kustomize/api").Output()
	if err != nil {
		t.Fatalf("go list: %v", err)
	}
	src, err := os.ReadFile(filepath.Join(string(bytes.TrimSpace(out)), "internal", "konfig", "builtinpluginconsts", "namereference.go"))
	if err != nil {
		t.Fatal(err)
	}
	paths := regexp.MustCompile(`(?m)^[\s-]*path:\s*(\S+)`).FindAllSubmatch(src, -1)
	if len(paths) < 50 {
		t.Fatalf("found %d name reference paths, want Kustomize's default list", len(paths))
	}
	for _, p := range paths {
		for _, seg := range strings.Split(string(p[1]), "/") {
			if skippedKeys[strings.TrimSuffix(seg, "[]")] {
				t.Errorf("Kustomize follows names at %s, but the grouping skips %q", p[1], seg)
			}
		}
	}
}

// deployment returns a Deployment named name, for inputs.
func deployment(name string) string {
	return "---\napiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: " + name + "\nspec:\n  selector:\n    matchLabels: {app: a}\n" +
		"  template:\n    metadata:\n      labels: {app: a}\n    spec:\n      containers:\n      - name: c\n        image: x\n"
}

// An overlay reached through a symbolic link gets Helm's manifests, not a
// file of the same name left in the folder the link points to (the shell
// script's all.yaml).
func TestOverlayThroughSymlink(t *testing.T) {
	t.Parallel()
	root := t.TempDir()
	real := filepath.Join(root, "real")
	if err := os.Mkdir(real, 0o755); err != nil {
		t.Fatal(err)
	}
	for name, content := range map[string]string{
		"kustomization.yaml": "resources:\n- all.yaml\nnamePrefix: p-\n",
		"all.yaml":           "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: stale\n",
	} {
		if err := os.WriteFile(filepath.Join(real, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	link := filepath.Join(root, "link")
	if err := os.Symlink("real", link); err != nil {
		t.Fatal(err)
	}
	out, _, err := Render(t.Context(), Options{Overlay: link}, []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: p-a\n"; string(out) != want {
		t.Errorf("got\n%s\nwant\n%s", out, want)
	}
}
