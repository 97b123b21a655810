package render

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"sigs.k8s.io/kustomize/api/provider"
	"sigs.k8s.io/kustomize/api/resource"
	"sigs.k8s.io/kustomize/kyaml/yaml"
)

// encodeCases are documents whose values take every path of viaJSON: the
// scalars YAML resolves to other types, numbers JSON writes in other forms,
// strings JSON or YAML change, tags, anchors and merge keys.
var encodeCases = map[string]string{
	"scalars": `apiVersion: v1
kind: ConfigMap
metadata:
  name: scalars
  annotations:
    quoted: "123"
    plain-looking: "true"
data:
  ints: [1, -0, +1, 017, 0o17, 0x1F, 1_000, 9223372036854775807, 9223372036854775808, 18446744073709551616]
  floats: [1.0, 1., 12e03, -1.5e-7, 0.000001, 1e21, 1e400, 123456789012345678901234567890.5]
  words: [~, null, Null, yes, no, on, off, y, n, True, FALSE]
  dates: [2001-12-14t21:59:43.10-05:00, 2002-12-14]
  strings: ["", " leading", "trailing ", "<&>", "é中文😀", "tab\there", "a: b", "- x", "# not a comment", "'single'", "\"double\""]
  literal: |
    line one
    line two with trailing space 
  kept: |+
    kept

  stripped: |-
    stripped
  folded: >
    folded
    text
  tagged: [!!str 123, !!str true, !!float 1, !!int 0x10]
  binary: !!binary aGVsbG8=
  empty: [{}, [], [[]], [null, {a: null}]]
`,
	"anchors": `apiVersion: v1
kind: ConfigMap
metadata:
  name: anchors
  labels: &labels
    app: x
data:
  base: &base {a: 1, b: two}
  merged:
    <<: *base
    c: 3
  copy: *labels
  "<<": literal merge-looking key
`,
	"not-a-number": `apiVersion: v1
kind: ConfigMap
metadata:
  name: not-a-number
data:
  floats: [.inf, -.Inf, .nan]
`,
	"changed-by-json": `apiVersion: v1
kind: ConfigMap
metadata:
  name: changed-by-json
data:
  next-line: "a\u0085b"
  line-separator: "a\u2028b"
  bom: "\ufeffx"
  bell: "a\ab"
  invalid-utf8: !!binary /w==
  "` + strings.Repeat("a", 990) + `": long key, written as is
  "` + strings.Repeat("&", 166) + `": long key once escaped, just short enough
  "` + strings.Repeat("&", 168) + `": long key once escaped, over the cutoff, read all the same
`,
	"refused-by-yaml": `apiVersion: v1
kind: ConfigMap
metadata:
  name: refused-by-yaml
data:
  delete: "a\x7fb"
  "` + strings.Repeat("&", 300) + `": too long a key once escaped
`,
	"deployment": `apiVersion: apps/v1
kind: Deployment
metadata:
  name: app
spec:
  replicas: 2
  template:
    spec:
      containers:
      - name: web
        image: nginx:1.25
        resources: {limits: {cpu: 500m, memory: 256Mi}, requests: {cpu: 0.5}}
        ports: [{containerPort: 8080, protocol: TCP}]
`,
}

// TestResourceYAMLIsAsYAML checks that resourceYAML writes what the
// library's AsYAML writes, for every document of encodeCases and of the
// package's test inputs, and that it takes its own path (not AsYAML's) for
// every document JSON can encode.
func TestResourceYAMLIsAsYAML(t *testing.T) {
	inputs := map[string]string{}
	for name, text := range encodeCases {
		inputs[name] = text
	}
	files, err := filepath.Glob("testdata/*/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if more, _ := filepath.Glob("testdata/*/*/*.yaml"); len(more) > 0 {
		files = append(files, more...)
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		inputs[f] = string(b)
	}
	inputs["generated"] = string(genManifests(20))

	fast := 0
	for name, text := range inputs {
		res, err := resourcesOf(text)
		if err != nil {
			continue // not manifests (a kustomization, a JSON 6902 patch)
		}
		for _, r := range res {
			assertSameYAML(t, name, r)
			if ownPath(r) {
				fast++
			}
		}
	}
	if fast < 100 {
		t.Errorf("only %d resources took resourceYAML's own path: the test no longer covers it", fast)
	}
	for _, name := range []string{"scalars", "anchors", "deployment", "changed-by-json"} {
		res, err := resourcesOf(encodeCases[name])
		if err != nil {
			t.Fatal(err)
		}
		if !ownPath(res[0]) {
			t.Errorf("%s: resourceYAML fell back to AsYAML", name)
		}
	}
}

// TestViaJSONChangedByJSON checks the values JSON or the YAML v2 decoder
// change go through them, and those JSON refuses make resourceYAML return
// AsYAML's error.
func TestViaJSONChangedByJSON(t *testing.T) {
	res, err := resourcesOf(encodeCases["changed-by-json"])
	if err != nil {
		t.Fatal(err)
	}
	m, err := res[0].Map()
	if err != nil {
		t.Fatal(err)
	}
	data, ok := m["data"].(map[string]any)
	if !ok {
		t.Fatalf("data is %T", m["data"])
	}
	if len(data) != 8 {
		t.Fatalf("%d data entries, want 8", len(data))
	}
	for k, v := range data {
		if s, ok := v.(string); ok && plainJSONString(s) && plainJSONString(k) && !jsonKeyTooLong(k) && !strings.HasPrefix(s, "long key") {
			t.Errorf("%q: %q is taken as unchanged by JSON", k, s)
		}
	}
	assertSameYAML(t, "changed-by-json", res[0])

	// Values the YAML v2 decoder refuses once in JSON: AsYAML fails, and
	// resourceYAML with it (encodeCases["refused-by-yaml"] holds both).
	for _, doc := range []string{
		"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\ndata:\n  delete: \"a\\x7fb\"\n",
		"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\ndata:\n  \"" + strings.Repeat("&", 300) + "\": x\n",
	} {
		res, err := resourcesOf(doc)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := res[0].AsYAML(); err == nil {
			t.Errorf("AsYAML no longer refuses %q: add the case to encodeCases", doc)
		}
		if _, err := resourceYAML(res[0]); err == nil {
			t.Errorf("resourceYAML wrote %q, which AsYAML refuses", doc)
		}
	}

	res, err = resourcesOf(encodeCases["not-a-number"])
	if err != nil {
		t.Fatal(err)
	}
	if _, err := resourceYAML(res[0]); err == nil {
		t.Error("resourceYAML wrote a float that is not a number; AsYAML refuses it")
	}
	for _, v := range []any{map[any]any{1: "x"}, math.Inf(1), []any{math.NaN()}} {
		if _, ok := viaJSON(v, maxCopiedDepth); ok {
			t.Errorf("viaJSON accepted %#v, which JSON refuses", v)
		}
	}
}

// TestResourceYAMLDeepNesting checks resourceYAML against AsYAML on nesting
// around the YAML v2 decoder's limit of 10,000 levels, past which AsYAML
// fails.
func TestResourceYAMLDeepNesting(t *testing.T) {
	for _, n := range []int{50, 1500, 9990, 9999} {
		doc := "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: deep\ndata:\n  x: " +
			strings.Repeat("[", n) + "1" + strings.Repeat("]", n) + "\n"
		res, err := resourcesOf(doc)
		if err != nil {
			t.Fatalf("%d levels: %v", n, err)
		}
		_, asErr := res[0].AsYAML()
		if (asErr != nil) != (n == 9999) {
			t.Errorf("%d levels: AsYAML error %v; the decoder's limit moved, move the cases", n, asErr)
		}
		assertSameYAML(t, fmt.Sprintf("%d levels", n), res[0])
	}
}

// FuzzResourceYAML checks resourceYAML against AsYAML on any document.
func FuzzResourceYAML(f *testing.F) {
	for _, text := range encodeCases {
		f.Add(text)
	}
	f.Add("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: x\ndata:\n  k: v\n")
	f.Fuzz(func(t *testing.T, text string) {
		if hasAliasCycle(text) {
			return // the library's reader recurses for ever on one; Render refuses it first
		}
		res, err := resourcesOf(text)
		if err != nil {
			return
		}
		for _, r := range res {
			assertSameYAML(t, "fuzz", r)
		}
	})
}

// hasAliasCycle reports whether a document of text holds an alias inside
// its own anchor, or text is not YAML.
func hasAliasCycle(text string) bool {
	dec := yaml.NewDecoder(strings.NewReader(text))
	for {
		var n yaml.Node
		switch err := dec.Decode(&n); {
		case errors.Is(err, io.EOF):
			return false
		case err != nil:
			return true
		case aliasCycle(&n) != nil:
			return true
		}
	}
}

func resourcesOf(text string) ([]*resource.Resource, error) {
	return provider.NewDefaultDepProvider().GetResourceFactory().SliceFromBytes([]byte(text))
}

func assertSameYAML(t *testing.T, name string, r *resource.Resource) {
	t.Helper()
	want, wantErr := r.AsYAML()
	got, gotErr := resourceYAML(r)
	switch {
	case (wantErr != nil) != (gotErr != nil):
		t.Errorf("%s: AsYAML error %v, resourceYAML error %v", name, wantErr, gotErr)
	case !bytes.Equal(got, want):
		t.Errorf("%s %s: resourceYAML differs from AsYAML\n got:\n%s\nwant:\n%s", name, r.CurId(), got, want)
	}
}

// ownPath reports whether resourceYAML writes r without calling AsYAML.
func ownPath(r *resource.Resource) bool {
	_, ok := ownYAML(r)
	return ok
}

// TestEncodeCasesMatchKustomizeBuild runs the documents of encodeCases
// through Render and through the kustomize CLI, with an overlay that
// touches every resource: the output must be the same, and the documents
// the CLI refuses must be refused.
func TestEncodeCasesMatchKustomizeBuild(t *testing.T) {
	t.Parallel()
	cli := kustomizeCLI(t)
	overlay := t.TempDir()
	kust := "resources:\n- all.yaml\nnamespace: encoded\ncommonAnnotations:\n  note: \"1.0\"\n"
	if err := os.WriteFile(filepath.Join(overlay, "kustomization.yaml"), []byte(kust), 0o644); err != nil {
		t.Fatal(err)
	}
	var good []string
	for name, text := range encodeCases {
		_, wantErr := cliBuild(t, cli, overlay, []byte(text))
		_, _, gotErr := Render(t.Context(), Options{Overlay: overlay}, []byte(text))
		if (wantErr != nil) != (gotErr != nil) {
			t.Errorf("%s: kustomize build error %v, Render error %v", name, wantErr, gotErr)
		}
		if wantErr == nil {
			good = append(good, text)
		} else {
			t.Logf("%s: refused by kustomize build: %v", name, wantErr)
		}
	}
	if len(good) < 4 {
		t.Fatalf("kustomize build took %d of the cases, want 4 at least", len(good))
	}
	input := []byte(strings.Join(good, "---\n"))
	want, err := cliBuild(t, cli, overlay, input)
	if err != nil {
		t.Fatalf("kustomize build: %v", err)
	}
	for _, shard := range []int{-1, 1} {
		got, _, err := Render(t.Context(), Options{Overlay: overlay, ShardSize: shard}, input)
		if err != nil {
			t.Fatalf("Render: %v", err)
		}
		if diff := cmp.Diff(string(want), string(got)); diff != "" {
			t.Errorf("shard size %d: output differs from kustomize build (-cli +ours):\n%s", shard, diff)
		}
	}
}
