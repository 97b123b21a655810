package render

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/kustomize/api/types"
	"sigs.k8s.io/kustomize/kyaml/filesys"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/golden")

// overlays are the overlays every test builds: the shipped ones users start
// from, and one per Kustomize feature.
func overlays(t *testing.T) map[string]string {
	t.Helper()
	out := map[string]string{}
	for _, pattern := range []string{"../../kustomize/*/kustomization.yaml", "testdata/valid-*/kustomization.yaml"} {
		files, err := filepath.Glob(pattern)
		if err != nil {
			t.Fatal(err)
		}
		for _, f := range files {
			dir := filepath.Dir(f)
			out[filepath.Base(dir)] = dir
		}
	}
	if len(out) < 9 {
		t.Fatalf("found %d overlays, want the shipped ones and the testdata ones", len(out))
	}
	return out
}

func readInput(t *testing.T) []byte {
	t.Helper()
	b, err := os.ReadFile("testdata/input/chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// kustomizeCLI returns the pinned kustomize binary, the reference the
// output must equal, or skips the test saying how to build it.
func kustomizeCLI(t testing.TB) string {
	t.Helper()
	if p := os.Getenv("RUNWARDEN_KUSTOMIZE_CLI"); p != "" {
		return p
	}
	out, err := exec.Command("../../hack/tools.sh", "path", "kustomize").Output()
	if err == nil {
		p := filepath.Join(strings.TrimSpace(string(out)), "kustomize")
		if _, err := os.Stat(p); err == nil {
			return p
		}
	}
	t.Skip("skipped: the reference kustomize CLI is not built; run 'hack/tools.sh kustomize' (make unit does)")
	return ""
}

// cliBuild runs what users ran before: the overlay copied, Helm's output
// written to all.yaml beside it, and `kustomize build`.
func cliBuild(t testing.TB, cli, overlay string, input []byte) ([]byte, error) {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "overlay")
	if err := os.CopyFS(dir, os.DirFS(overlay)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "all.yaml"), input, 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(cli, "build", dir)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		return nil, errors.New(stderr.String())
	}
	return out, nil
}

func TestRenderMatchesKustomizeBuild(t *testing.T) {
	t.Parallel()
	cli := kustomizeCLI(t)
	input := readInput(t)
	for name, dir := range overlays(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			want, err := cliBuild(t, cli, dir, input)
			if err != nil {
				t.Fatalf("kustomize build: %v", err)
			}
			for _, shard := range []int{-1, 1, 3} {
				got, _, err := Render(t.Context(), Options{Overlay: dir, ShardSize: shard}, input)
				if err != nil {
					t.Fatalf("Render(shard size %d): %v", shard, err)
				}
				if diff := cmp.Diff(string(want), string(got)); diff != "" {
					t.Errorf("shard size %d: output differs from kustomize build (-cli +ours):\n%s", shard, diff)
				}
			}
		})
	}
}

func TestRenderGolden(t *testing.T) {
	t.Parallel()
	input := readInput(t)
	for name, dir := range overlays(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			got, _, err := Render(t.Context(), Options{Overlay: dir}, input)
			if err != nil {
				t.Fatalf("Render: %v", err)
			}
			golden := filepath.Join("testdata", "golden", name+".yaml")
			if *update {
				if err := os.MkdirAll(filepath.Dir(golden), 0o755); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(golden, got, 0o644); err != nil {
					t.Fatal(err)
				}
			}
			want, err := os.ReadFile(golden)
			if err != nil {
				t.Fatalf("%v (run go test -update to write it)", err)
			}
			if diff := cmp.Diff(string(want), string(got)); diff != "" {
				t.Errorf("output differs from %s (-want +got):\n%s", golden, diff)
			}
		})
	}
}

// TestShardedEqualsSingleBuild checks that splitting never changes the
// result, on a large input with references between documents, for overlays
// that rename, move to a namespace, generate, merge and patch.
func TestShardedEqualsSingleBuild(t *testing.T) {
	t.Parallel()
	input := genManifests(400)
	for _, dir := range []string{"testdata/bench-overlay", "testdata/valid-rename", "testdata/valid-components", "../../kustomize/restricted", "../../kustomize/labels"} {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			t.Parallel()
			once, st1, err := Render(t.Context(), Options{Overlay: dir, ShardSize: -1}, input)
			if err != nil {
				t.Fatalf("single build: %v", err)
			}
			sharded, st, err := Render(t.Context(), Options{Overlay: dir, ShardSize: 16}, input)
			if err != nil {
				t.Fatalf("sharded build: %v", err)
			}
			if st1.Shards != 1 {
				t.Errorf("shard size -1 built %d shards, want 1", st1.Shards)
			}
			if diff := cmp.Diff(string(once), string(sharded)); diff != "" {
				t.Errorf("sharded output differs from a single build (-once +sharded):\n%s", diff)
			}
			t.Logf("%s: %+v", dir, st)
		})
	}
}

func TestRenderSplitsOnlyWhenSafe(t *testing.T) {
	t.Parallel()
	input := genManifests(100)
	tests := []struct {
		name         string
		overlay      string
		wantShards   bool
		notShardable string
		fallback     string
	}{
		{name: "patches and labels split", overlay: "testdata/bench-overlay", wantShards: true},
		{name: "replacements split, their sources in every shard", overlay: "testdata/bench-replacements", wantShards: true},
		{name: "vars never split", overlay: "testdata/edge/vars", notShardable: "vars"},
		// valid-names merges into demo-config, which the input lacks: the
		// shards fail, and the single build reports the real error.
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, st, err := Render(t.Context(), Options{Overlay: tt.overlay, ShardSize: 10}, input)
			if err != nil && tt.overlay != "testdata/edge/vars" {
				t.Fatalf("Render: %v", err)
			}
			if got := st.Shards > 1; got != tt.wantShards {
				t.Errorf("split into %d shards, want split=%v", st.Shards, tt.wantShards)
			}
			if st.NotShardable != tt.notShardable {
				t.Errorf("NotShardable = %q, want %q", st.NotShardable, tt.notShardable)
			}
		})
	}
}

// TestBenchOverlaysMatchKustomizeBuild checks the benchmark's overlays on a
// large input against the kustomize CLI, built once and split, and that
// they are split: the replacements' sources go into every shard.
func TestBenchOverlaysMatchKustomizeBuild(t *testing.T) {
	t.Parallel()
	cli := kustomizeCLI(t)
	input := genManifests(400)
	for _, dir := range []string{"testdata/bench-overlay", "testdata/bench-replacements"} {
		t.Run(filepath.Base(dir), func(t *testing.T) {
			t.Parallel()
			want, err := cliBuild(t, cli, dir, input)
			if err != nil {
				t.Fatalf("kustomize build: %v", err)
			}
			for _, shard := range []int{-1, 16, 64} {
				got, st, err := Render(t.Context(), Options{Overlay: dir, ShardSize: shard}, input)
				if err != nil {
					t.Fatalf("Render(shard size %d): %v", shard, err)
				}
				if diff := cmp.Diff(string(want), string(got)); diff != "" {
					t.Errorf("shard size %d: output differs from kustomize build (-cli +ours):\n%s", shard, diff)
				}
				if shard > 0 && st.Shards < 2 {
					t.Errorf("shard size %d: built once (%q), want split", shard, st.Fallback+st.NotShardable)
				}
			}
		})
	}
}

// TestKustomizationFieldsClassified requires every field of the pinned
// library's types.Kustomization to be in exactly one of perDocumentFields
// and crossDocumentFields: a field a library upgrade adds must be
// classified before an overlay that sets it can be split.
func TestKustomizationFieldsClassified(t *testing.T) {
	t.Parallel()
	per, cross := perDocumentFields(), crossDocumentFields()
	fields := map[string]bool{}
	typ := reflect.TypeFor[types.Kustomization]()
	for i := range typ.NumField() {
		name := typ.Field(i).Name
		fields[name] = true
		_, isPer := per[name]
		_, isCross := cross[name]
		switch {
		case isPer && isCross:
			t.Errorf("Kustomization.%s is both per document and cross document", name)
		case !isPer && !isCross:
			t.Errorf("Kustomization.%s is not classified: add it to perDocumentFields or crossDocumentFields", name)
		}
	}
	for name := range per {
		if !fields[name] {
			t.Errorf("perDocumentFields lists %s, which types.Kustomization lacks", name)
		}
	}
	for name := range cross {
		if !fields[name] {
			t.Errorf("crossDocumentFields lists %s, which types.Kustomization lacks", name)
		}
	}
}

// TestShardableByFields: the fields a kustomization sets decide, and a field
// set that neither list names (as after a library upgrade) makes the
// overlay build once.
func TestShardableByFields(t *testing.T) {
	t.Parallel()
	withoutImages := perDocumentFields()
	delete(withoutImages, "Images")
	tests := []struct {
		name string
		k    types.Kustomization
		per  map[string]fieldCheck // default perDocumentFields
		want string
	}{
		{name: "resources and images", k: types.Kustomization{Resources: []string{"all.yaml"}, Images: []types.Image{{Name: "a"}}}},
		{name: "empty vars set nothing", k: types.Kustomization{Vars: []types.Var{}}}, //nolint:staticcheck // deprecated, yet kustomize build still honours it
		{name: "crds", k: types.Kustomization{Crds: []string{"crd.yaml"}}, want: "crds"},
		{name: "non-legacy sort", k: types.Kustomization{SortOptions: &types.SortOptions{Order: types.FIFOSortOrder}}, want: "sortOptions other than legacy"},
		{
			name: "a field neither list names", k: types.Kustomization{Images: []types.Image{{Name: "a"}}}, per: withoutImages,
			want: "the kustomization field Images, which this version does not know",
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			per := tt.per
			if per == nil {
				per = perDocumentFields()
			}
			var p splitPlan
			ok, why := shardableBy(per, crossDocumentFields(), filesys.MakeFsInMemory(), "/", &tt.k, 0, &p)
			if ok != (tt.want == "") || why != tt.want {
				t.Errorf("shardable = %v, %q; want %q", ok, why, tt.want)
			}
		})
	}
}

func TestRenderFallsBackToTheSingleBuildError(t *testing.T) {
	t.Parallel()
	// valid-names merges into ConfigMap demo-config, which this input lacks:
	// every shard fails, and the error is the one of a single build.
	_, st, err := Render(t.Context(), Options{Overlay: "testdata/valid-names", ShardSize: 10}, genManifests(100))
	if err == nil {
		t.Fatal("Render succeeded, want the merge error")
	}
	if st.Fallback == "" || !strings.Contains(err.Error(), "demo-config") {
		t.Errorf("fallback %q, error %v: want a fallback and an error naming demo-config", st.Fallback, err)
	}
}

func TestRenderHooks(t *testing.T) {
	t.Parallel()
	input := readInput(t)
	dir := "testdata/valid-labels-images"
	through, st, err := Render(t.Context(), Options{Overlay: dir, Hooks: HooksPassthrough}, input)
	if err != nil {
		t.Fatal(err)
	}
	if st.Hooks != 1 {
		t.Errorf("%d hooks passed through, want 1", st.Hooks)
	}
	hookDoc := "apiVersion: v1\nkind: Pod\nmetadata:\n  name: demo-test-connection\n  annotations:\n    helm.sh/hook: test\n"
	if !strings.Contains(string(through), hookDoc) {
		t.Errorf("passthrough output lacks the untouched hook:\n%s", through)
	}
	kustomized, _, err := Render(t.Context(), Options{Overlay: dir}, input)
	if err != nil {
		t.Fatal(err)
	}
	if strings.Contains(string(kustomized), hookDoc) || !strings.Contains(string(kustomized), "name: demo-test-connection") {
		t.Errorf("kustomize mode did not apply the overlay to the hook:\n%s", kustomized)
	}
}

func TestRenderKeepsHelmFilenameAnnotation(t *testing.T) {
	t.Parallel()
	input := []byte("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  annotations:\n    postrenderer.helm.sh/postrender-filename: demo/templates/a.yaml\n")
	out, _, err := Render(t.Context(), Options{Overlay: "../../kustomize/labels"}, input)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(out), "postrenderer.helm.sh/postrender-filename: demo/templates/a.yaml") {
		t.Errorf("the filename annotation was lost:\n%s", out)
	}
}

// aliasBomb is a ConfigMap of levels lists of nine aliases of the list
// before: 9^levels strings once expanded, from a few hundred bytes.
func aliasBomb(levels int) string {
	var b strings.Builder
	b.WriteString("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: bomb\ndata:\n  l0: &l0 [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n")
	for i := 1; i < levels; i++ {
		prev := fmt.Sprintf("*l%d", i-1)
		fmt.Fprintf(&b, "  l%d: &l%d [%s]\n", i, i, strings.Repeat(prev+", ", 8)+prev)
	}
	return b.String()
}

// TestRenderAllowsModestAliasing: aliases that expand a document within the
// bounds (a small document, or a few copies in a large one) render as
// Kustomize renders them.
func TestRenderAllowsModestAliasing(t *testing.T) {
	t.Parallel()
	out, _, err := Render(t.Context(), Options{Overlay: "../../kustomize/labels"}, []byte(aliasBomb(3)))
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Count(string(out), "lol"); got != 9+81+729 {
		t.Errorf("%d expanded strings, want %d:\n%s", got, 9+81+729, out)
	}
}

func TestRenderErrors(t *testing.T) {
	t.Parallel()
	notListed := t.TempDir()
	if err := os.WriteFile(filepath.Join(notListed, "kustomization.yaml"), []byte("resources: []\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	badKust := t.TempDir()
	if err := os.WriteFile(filepath.Join(badKust, "kustomization.yaml"), []byte("resources: [all.yaml]\npatches: {not: a list}\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	missingPatch := t.TempDir()
	if err := os.WriteFile(filepath.Join(missingPatch, "kustomization.yaml"), []byte("resources: [all.yaml]\npatches:\n- path: nowhere.yaml\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	cycle := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n  labels: &l\n    y: *l\n"
	cycleFile := t.TempDir()
	if err := os.WriteFile(filepath.Join(cycleFile, "kustomization.yaml"), []byte("resources: [all.yaml]\npatches:\n- path: p.yaml\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(cycleFile, "p.yaml"), []byte(cycle), 0o600); err != nil {
		t.Fatal(err)
	}
	cycleInline := t.TempDir()
	inline := "resources: [all.yaml]\npatches:\n- patch: |-\n" + indent(cycle, "    ")
	if err := os.WriteFile(filepath.Join(cycleInline, "kustomization.yaml"), []byte(inline), 0o600); err != nil {
		t.Fatal(err)
	}
	cycleKust := t.TempDir()
	if err := os.WriteFile(filepath.Join(cycleKust, "kustomization.yaml"), []byte("resources: [all.yaml]\ncommonAnnotations: &l\n  y: *l\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	bomb := aliasBomb(9)
	bombFile := t.TempDir()
	if err := os.WriteFile(filepath.Join(bombFile, "kustomization.yaml"), []byte("resources: [all.yaml]\npatches:\n- path: p.yaml\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(bombFile, "p.yaml"), []byte(bomb), 0o600); err != nil {
		t.Fatal(err)
	}
	good := "../../kustomize/labels"
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n"
	tests := []struct {
		name    string
		overlay string
		input   string
		is      error
		want    []string // substrings of the message
	}{
		{name: "empty input", overlay: good, input: "", is: ErrEmptyInput},
		{name: "only comments", overlay: good, input: "---\n# Source: x\n---\n", is: ErrEmptyInput},
		{
			name: "invalid YAML names document and line", overlay: good,
			input: cm + "---\n# Source: demo/templates/bad.yaml\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: b\n   bad: indent\n",
			want:  []string{"document 2", "input line 6", "demo/templates/bad.yaml"},
		},
		{
			name: "an alias inside its own anchor", overlay: good,
			input: cm + "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: b\n  labels: &l\n    x: *l\n",
			want:  []string{"document 2", "alias *l on input line 11 is inside the anchor"},
		},
		{
			name: "an alias bomb in the input", overlay: good, input: cm + "---\n# Source: demo/templates/bomb.yaml\n" + bomb, is: ErrExcessiveAliasing,
			want: []string{"document 2", "demo/templates/bomb.yaml", "excessive aliasing: its aliases expand 38 nodes into more than 4000000"},
		},
		{
			name: "a long value aliased many times", overlay: good, is: ErrExcessiveAliasing, want: []string{"document 1", "copy more than 16777216 bytes"},
			input: "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: long\ndata:\n  a: &a " + strings.Repeat("x", 1<<20) + "\n  b: [" + strings.Repeat("*a, ", 20) + "*a]\n",
		},
		{name: "an alias bomb in an overlay patch", overlay: bombFile, input: cm, is: ErrExcessiveAliasing, want: []string{filepath.Join(bombFile, "p.yaml"), "excessive aliasing"}},
		{name: "a list is not a manifest", overlay: good, input: "- a\n- b\n", want: []string{"document 1", "must be a mapping"}},
		{name: "no kind", overlay: good, input: "apiVersion: v1\nmetadata: {name: a}\n", want: []string{"document 1", "no kind"}},
		{name: "missing overlay", overlay: "testdata/does-not-exist", input: cm, is: ErrOverlayMissing},
		{name: "overlay is a file", overlay: good + "/kustomization.yaml", input: cm, is: ErrOverlayIsFile, want: []string{good + "/kustomization.yaml is a file"}},
		{name: "no kustomization", overlay: "testdata", input: cm, is: ErrNoKustomization},
		{name: "manifests not listed", overlay: notListed, input: cm, is: ErrNotListed, want: []string{"kustomization.yaml", "all.yaml"}},
		{name: "invalid kustomization names the file", overlay: badKust, input: cm, want: []string{filepath.Join(badKust, "kustomization.yaml")}},
		{name: "missing patch file", overlay: missingPatch, input: cm, want: []string{"nowhere.yaml"}},
		{name: "alias cycle in a patch file", overlay: cycleFile, input: cm, want: []string{filepath.Join(cycleFile, "p.yaml"), "alias *l on line 6"}},
		{name: "alias cycle in an inline patch", overlay: cycleInline, input: cm, want: []string{filepath.Join(cycleInline, "kustomization.yaml"), "line 6 of an inline patch"}},
		{name: "alias cycle in the kustomization", overlay: cycleKust, input: cm, want: []string{filepath.Join(cycleKust, "kustomization.yaml"), "contains itself"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			out, _, err := Render(t.Context(), Options{Overlay: tt.overlay}, []byte(tt.input))
			if err == nil {
				t.Fatalf("Render succeeded with %d bytes, want an error", len(out))
			}
			if tt.is != nil && !errors.Is(err, tt.is) {
				t.Errorf("error %v, want errors.Is %v", err, tt.is)
			}
			for _, w := range tt.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q does not mention %q", err, w)
				}
			}
		})
	}
}

// TestRenderNamesAHookThatIsATemplate checks that a duplicate resource is a
// HookConflictError when one copy is a Helm hook, by Kustomize's identity
// (an unset namespace is "default"), and only then.
func TestRenderNamesAHookThatIsATemplate(t *testing.T) {
	t.Parallel()
	cm := func(ns string, hook bool) string {
		s := "---\napiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n"
		if ns != "" {
			s += "  namespace: " + ns + "\n"
		}
		if hook {
			s += "  annotations:\n    helm.sh/hook: pre-install\n"
		}
		return s
	}
	tests := []struct {
		name     string
		input    string
		resource string // of the HookConflictError; empty: another error
	}{
		{name: "same namespace", input: cm("team", false) + cm("team", true), resource: "ConfigMap team/a"},
		{name: "unset namespace is default", input: cm("", true) + cm("default", false), resource: "ConfigMap a"},
		{name: "two templates", input: cm("team", false) + cm("team", false) + cm("other", true)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, _, err := Render(t.Context(), Options{Overlay: "../../kustomize/labels"}, []byte(tt.input))
			if err == nil {
				t.Fatal("Render succeeded, want an already registered id")
			}
			var conflict *HookConflictError
			got := ""
			if errors.As(err, &conflict) {
				got = conflict.Resource
			}
			if got != tt.resource {
				t.Errorf("hook conflict on %q, want %q: %v", got, tt.resource, err)
			}
			if !strings.Contains(err.Error(), "already registered id") {
				t.Errorf("error %v lacks Kustomize's own message", err)
			}
		})
	}
}

// indent prefixes every line of text.
func indent(text, prefix string) string {
	lines := strings.SplitAfter(strings.TrimSuffix(text, "\n"), "\n")
	return prefix + strings.Join(lines, prefix) + "\n"
}

func TestSplitDocuments(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		in    string
		lines []int
		err   string
	}{
		{name: "leading separator", in: "---\na: 1\n---\nb: 2\n", lines: []int{2, 4}},
		{name: "no separator", in: "a: 1\n", lines: []int{1}},
		{name: "comment after separator", in: "a: 1\n--- # next\nb: 2\n", lines: []int{1, 3}},
		{name: "block scalar with dashes inside", in: "a: |\n  ---\n  x\n---\nb: 2\n", lines: []int{1, 5}},
		{name: "empty and comment-only documents dropped", in: "---\n---\n# c\n---\na: 1\n", lines: []int{5}},
		{name: "no trailing newline", in: "a: 1\n---\nb: 2", lines: []int{1, 3}},
		{name: "content on the first line's separator", in: "--- {a: 1}\n---\nb: 2\n", lines: []int{1, 3}},
		{name: "content after a separator", in: "a: 1\n--- {b: 2}\nc: 3\n", err: "document 2 (input line 2): invalid document separator: --- {b: 2}"},
		{name: "four dashes", in: "a: 1\n----\n", err: "document 2 (input line 2): invalid document separator: ----"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			docs, err := splitDocuments([]byte(tt.in))
			if tt.err != "" || err != nil {
				if err == nil || err.Error() != tt.err {
					t.Fatalf("error %v, want %q", err, tt.err)
				}
				return
			}
			var lines []int
			for _, d := range docs {
				lines = append(lines, d.line)
			}
			if diff := cmp.Diff(tt.lines, lines); diff != "" {
				t.Errorf("document start lines (-want +got):\n%s", diff)
			}
		})
	}
}

func FuzzSplitDocuments(f *testing.F) {
	f.Add([]byte("a: 1\n---\nb: 2\n"))
	f.Add([]byte("---\n--- #x\n\n"))
	f.Fuzz(func(t *testing.T, in []byte) {
		docs, err := splitDocuments(in)
		if err != nil {
			return
		}
		// Every document's text is a part of the input, in order.
		rest := in
		for _, d := range docs {
			i := bytes.Index(rest, d.raw)
			if i < 0 {
				t.Fatalf("document %d is not in the input in order", d.index)
			}
			rest = rest[i+len(d.raw):]
			if !hasContent(d.raw) {
				t.Fatalf("document %d has no content", d.index)
			}
		}
	})
}

// FuzzRender runs the post-renderer's whole pipeline on arbitrary input:
// it never panics, never takes all memory (aliases are bounded), and either
// fails or writes manifests that parse again.
func FuzzRender(f *testing.F) {
	cm := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n"
	for _, s := range []string{
		cm, cm + "---\n" + strings.Replace(cm, "name: a", "name: b", 1), aliasBomb(9), aliasBomb(4),
		"apiVersion: v1\nkind: List\nitems:\n- " + strings.ReplaceAll(cm, "\n", "\n  "),
		cm + "  labels: &l\n    x: *l\n", "- a\n", "",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		out, _, err := Render(t.Context(), Options{Overlay: "../../kustomize/labels"}, in)
		if err != nil {
			return
		}
		if _, err := splitDocuments(out); err != nil {
			t.Fatalf("output does not split into documents: %v\n%s", err, out)
		}
		for _, d := range mustSplit(t, out) {
			if _, err := yaml.Parse(string(d.raw)); err != nil {
				t.Fatalf("output document %d does not parse: %v", d.index, err)
			}
		}
	})
}

func mustSplit(t *testing.T, b []byte) []doc {
	t.Helper()
	docs, err := splitDocuments(b)
	if err != nil {
		t.Fatal(err)
	}
	return docs
}
