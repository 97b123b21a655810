package policy

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"

	"github.com/runwarden/runwarden/policies"
)

func TestInputReadsOfTheShippedPolicies(t *testing.T) {
	t.Parallel()
	s, err := Load(t.Context(), policies.FS, "embedded", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Cached {
		t.Fatal("the shipped policies should be cacheable")
	}
	var got []string
	for _, p := range s.reads {
		got = append(got, strings.Join(p, "."))
	}
	slices.Sort(got)
	for _, want := range []string{
		"config", "secretRefs.*",
		"serviceAccount.annotations.eks.amazonaws.com/role-arn", "namespace.annotations.runwarden.dev/secret-stores",
		"pod.metadata.annotations.eks.amazonaws.com/skip-containers",
		// The containers by field (elements.go): their variables' names,
		// not their values.
		"pod.spec.containers.*.name", "pod.spec.containers.*.image", "pod.spec.containers.*.env.*.name",
		"pod.spec.initContainers.*.name",
		// Of the pod before an update, the ephemeral containers' names.
		"oldPod.spec.ephemeralContainers.*.name",
	} {
		if !slices.Contains(got, want) {
			t.Errorf("reads %v lack %s", got, want)
		}
	}
	// What differs from one task's runner pod to the next is never read.
	for _, p := range got {
		if p == "oldPod" || p == "oldPod.spec" {
			t.Errorf("reads %v include %s: every update of a runner pod would be a full evaluation", got, p)
		}
		for _, list := range []string{"pod.spec.containers", "pod.spec.initContainers"} {
			if p == list || p == list+".*" || p == list+".*.env" || p == list+".*.env.*" || strings.HasPrefix(p, list+".*.env.*.value") ||
				strings.HasPrefix(p, list+".*.args") || strings.HasPrefix(p, list+".*.command") {
				t.Errorf("reads %v include %s: a task's variables or arguments would be in the cache key", got, p)
			}
		}
	}
	// One label is read by its key, the one Azure's webhook selects pods by
	// (identity.rego): the cache keys on its value alone, not on the task's
	// labels.
	const azureUse = "pod.metadata.labels.azure.workload.identity/use"
	if !slices.Contains(got, azureUse) {
		t.Errorf("reads %v lack %s", got, azureUse)
	}
	for _, p := range got {
		if p == azureUse {
			continue
		}
		// The annotations are read by key: a pod's own (the task's id)
		// are not in the cache key.
		if strings.HasPrefix(p, "pod.metadata.labels") || strings.HasPrefix(p, "pod.metadata.name") || p == "pod" || p == "pod.metadata" ||
			p == "pod.metadata.annotations" || p == "serviceAccount.annotations" || p == "namespace.annotations" {
			t.Errorf("reads %v include %s, which the shipped policies never read", got, p)
		}
	}
}

func TestCacheIsOffWhenReadsAreUnbounded(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, policy string
		cached       bool
	}{
		{name: "bounded", policy: `decision := {"deny": [], "warnings": [input.pod.spec.nodeName], "mutations": {}}`, cached: true},
		{name: "dynamic key below a constant prefix", policy: `f := "nodeName"
decision := {"deny": [], "warnings": [input.pod.spec[f]], "mutations": {}}`, cached: true},
		{name: "whole input", policy: `decision := {"deny": [], "warnings": [json.marshal(input)], "mutations": {}}`},
		{name: "time", policy: `decision := {"deny": [], "warnings": [sprintf("%d", [time.now_ns()])], "mutations": {}}`},
		{name: "time, statement form", policy: `decision := {"deny": [], "warnings": [sprintf("%d", [t])], "mutations": {}} if {
	time.now_ns(t)
}`},
		// http.send, which this case used, is refused at load now (capabilities.go).
		{name: "rand.intn, statement form in a comprehension", policy: `decision := {"deny": [], "warnings": [sprintf("%d", [r]) | rand.intn("x", 10, r)], "mutations": {}}`},
		{name: "dynamic object.get key", policy: `k := "pod"
decision := {"deny": [], "warnings": [json.marshal(object.get(input, k, {}))], "mutations": {}}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fsys := fstest.MapFS{"p.rego": {Data: []byte("package runwarden.admission\n\n" + tt.policy + "\n")}}
			s, err := Load(t.Context(), fsys, tt.name, Options{})
			if err != nil {
				t.Fatal(err)
			}
			if s.Cached != tt.cached {
				t.Errorf("Cached = %v, want %v (reads %v)", s.Cached, tt.cached, s.reads)
			}
		})
	}
}

// TestCachedDecisionsEqualFreshOnes checks, on inputs that differ in places
// the policies read and in places they do not, that the cached decision is
// always the one a fresh evaluation makes.
func TestCachedDecisionsEqualFreshOnes(t *testing.T) {
	t.Parallel()
	s, err := Load(t.Context(), policies.FS, "embedded", Options{})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 60 {
		in := runnerInput()
		in.Pod.Labels["runwarden.dev/task-id"] = fmt.Sprint(i)                         // never read
		in.Pod.GenerateName = fmt.Sprintf("task-%d-", i)                               // never read
		in.Pod.Annotations = map[string]string{"runwarden.dev/task-id": fmt.Sprint(i)} // never read
		if i%6 == 0 {
			in.Pod.Annotations["eks.amazonaws.com/skip-containers"] = "main" // read
		}
		if i%3 == 0 {
			in.Pod.Spec.Containers[0].Image = fmt.Sprintf("r/x:%d", i%2) // read
		}
		if i%4 == 0 {
			in.ServiceAccount.Annotations = map[string]string{} // read
		}
		if i%5 == 0 {
			in.Config = map[string]any{"mode": "audit", "shape": map[string]any{"allowedRegistries": []any{"other"}}}
		}
		if diff := cachedVsFresh(t, s, in); diff != "" {
			t.Fatalf("input %d: cached decision differs from a fresh one (-fresh +cached):\n%s", i, diff)
		}
	}
}

// cachedVsFresh decides on in through the cache and afresh, and returns
// how the two decisions differ (-fresh +cached), "" when they do not.
func cachedVsFresh(t *testing.T, s *Set, in *Input) string {
	t.Helper()
	cached, err := s.Eval(t.Context(), in)
	if err != nil {
		t.Fatal(err)
	}
	fresh, err := s.EvalUncached(t.Context(), in)
	if err != nil {
		t.Fatal(err)
	}
	return cmp.Diff(fresh, cached)
}

func TestProjectionKeySeesWhatThePoliciesRead(t *testing.T) {
	t.Parallel()
	s, err := Load(t.Context(), policies.FS, "embedded", Options{})
	if err != nil {
		t.Fatal(err)
	}
	keyOf := func(mut func(*Input)) [32]byte {
		in := runnerInput()
		mut(in)
		b, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		return s.proj.key(b)
	}
	base := keyOf(func(*Input) {})
	if keyOf(func(in *Input) { in.Pod.Labels["runwarden.dev/task-id"] = "7" }) != base {
		t.Error("a label the policies never read changed the key")
	}
	for name, mut := range map[string]func(*Input){
		"repo-url annotation (a key with dots)": func(in *Input) {
			in.Pod.Annotations = map[string]string{"runwarden.dev/repo-url": "https://x"}
		},
		"hostPID": func(in *Input) { in.Pod.Spec.HostPID = true },
		"image":   func(in *Input) { in.Pod.Spec.Containers[0].Image = "other" },
		"config":  func(in *Input) { in.Config = map[string]any{"mode": "audit"} },
		"sa role": func(in *Input) {
			in.ServiceAccount.Annotations["eks.amazonaws.com/role-arn"] = "arn:aws:iam::1:role/other"
		},
		"skip-containers annotation": func(in *Input) {
			in.Pod.Annotations = map[string]string{"eks.amazonaws.com/skip-containers": "main"}
		},
		"a variable's name": func(in *Input) {
			in.Pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "AWS_ROLE_ARN", Value: "1"}}
		},
		"a second container": func(in *Input) {
			in.Pod.Spec.Containers = append(in.Pod.Spec.Containers, corev1.Container{Name: "sidecar", Image: "r/x:1"})
		},
	} {
		if keyOf(mut) == base {
			t.Errorf("%s: a field the policies read did not change the key", name)
		}
	}
	for name, mut := range map[string]func(*Input){
		"task-id annotation": func(in *Input) { in.Pod.Annotations = map[string]string{"runwarden.dev/task-id": "7"} },
		"sa annotation":      func(in *Input) { in.ServiceAccount.Annotations["x"] = "y" },
		"ns annotation":      func(in *Input) { in.Namespace.Annotations["x"] = "y" },
		// What differs from one task's pod to the next.
		"arguments": func(in *Input) { in.Pod.Spec.Containers[0].Args = []string{"deploy", "7"} },
		"command":   func(in *Input) { in.Pod.Spec.Containers[0].Command = []string{"/bin/run"} },
	} {
		if keyOf(mut) != base {
			t.Errorf("%s: a field the policies never read changed the key", name)
		}
	}
	deployRef := func(v string) func(*Input) {
		return func(in *Input) { in.Pod.Spec.Containers[0].Env = []corev1.EnvVar{{Name: "DEPLOY_REF", Value: v}} }
	}
	if keyOf(deployRef("1")) != keyOf(deployRef("7")) {
		t.Error("a variable's value, which the policies never read, changed the key")
	}
}

// TestInputAliases checks the reads through a rule that names a part of
// the input (`a := object.get(input, [...], {})`): by key where every use
// has a constant key, the whole part otherwise.
func TestInputAliases(t *testing.T) {
	t.Parallel()
	const alias = `ann := object.get(input, ["pod", "metadata", "annotations"], {})
`
	tests := []struct {
		name    string
		modules map[string]string
		want    []string
	}{
		{
			name:    "constant keys",
			modules: map[string]string{"p.rego": alias + `decision := {"deny": [], "warnings": [ann["a.b/c"], object.get(ann, "d", ""), object.get(ann, ["e"], "")], "mutations": {}}`},
			want:    []string{"pod.metadata.annotations.a.b/c", "pod.metadata.annotations.d", "pod.metadata.annotations.e"},
		},
		{
			name:    "used whole",
			modules: map[string]string{"p.rego": alias + `decision := {"deny": [], "warnings": [json.marshal(ann)], "mutations": {}}`},
			want:    []string{"pod.metadata.annotations"},
		},
		{
			name: "dynamic key",
			modules: map[string]string{"p.rego": alias + `k := "a"
decision := {"deny": [], "warnings": [ann[k]], "mutations": {}}`},
			want: []string{"pod.metadata.annotations"},
		},
		{
			// Every element whole: the projection takes an object whole
			// there.
			name:    "iterated",
			modules: map[string]string{"p.rego": alias + `decision := {"deny": [], "warnings": [v | some v in ann], "mutations": {}}`},
			want:    []string{"pod.metadata.annotations.#", "pod.metadata.annotations.*"},
		},
		{
			name: "defined twice is no alias",
			modules: map[string]string{"p.rego": `ann := object.get(input, ["pod", "metadata", "annotations"], {}) if input.runner
else := {}
decision := {"deny": [], "warnings": [ann["a"]], "mutations": {}}`},
			want: []string{"pod.metadata.annotations", "runner"},
		},
		{
			name: "by key from another package",
			modules: map[string]string{
				"p.rego": `decision := {"deny": [], "warnings": [data.runwarden.other.ann["a"]], "mutations": {}}`,
				"o.rego": "package runwarden.other\n\n" + alias,
			},
			want: []string{"pod.metadata.annotations.a"},
		},
		{
			name: "its package whole",
			modules: map[string]string{
				"p.rego": `decision := {"deny": [], "warnings": [json.marshal(data.runwarden.other)], "mutations": {}}`,
				"o.rego": "package runwarden.other\n\n" + alias,
			},
			want: []string{"pod.metadata.annotations"},
		},
		{
			name: "a local of the same name in another package is not the alias",
			modules: map[string]string{
				"p.rego": `decision := {"deny": [], "warnings": [ann | ann := "x"], "mutations": {}}`,
				"o.rego": "package runwarden.other\n\n" + alias,
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := readsOf(t, tt.modules, "", true)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("reads (-want +got):\n%s", diff)
			}
		})
	}
}

// readsOf loads the modules (those without a package clause get package
// runwarden.admission and head before them) and returns the input paths
// they read, sorted, the lists' lengths (countKey) and the objects' presence
// (existsKey) among them if counts.
// The cache must be on.
func readsOf(t *testing.T, modules map[string]string, head string, counts bool) []string {
	t.Helper()
	fsys := fstest.MapFS{}
	for name, src := range modules {
		if !strings.HasPrefix(src, "package ") {
			src = "package runwarden.admission\n\n" + head + src
		}
		fsys[name] = &fstest.MapFile{Data: []byte(src + "\n")}
	}
	s, err := Load(t.Context(), fsys, t.Name(), Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Cached {
		t.Fatalf("the cache is off (reads %v)", s.reads)
	}
	var got []string
	for _, p := range s.reads {
		if (p[len(p)-1] == countKey || p[len(p)-1] == existsKey) && !counts {
			continue
		}
		got = append(got, strings.Join(p, "."))
	}
	slices.Sort(got)
	return got
}

// TestCacheReadsKeysAsOPADecodesThem: the key finds an object's fields by
// the names OPA decodes (encoding/json), for input bytes encoding/json
// would not write itself (a raw value in the configuration, a managed
// field's raw JSON): an invalid UTF-8 byte and a lone surrogate escape
// are U+FFFD to OPA.
func TestCacheReadsKeysAsOPADecodesThem(t *testing.T) {
	t.Parallel()
	fsys := fstest.MapFS{"p.rego": {Data: []byte(`package runwarden.admission

default v := "undefined"

v := json.marshal(input.config.o["\ufffdA"])

default w := "undefined"

w := json.marshal(input.config.p["\ufffd"])

decision := {"deny": [], "warnings": [v, w], "mutations": {}}
`)}}
	s, err := Load(t.Context(), fsys, "keys", Options{})
	if err != nil {
		t.Fatal(err)
	}
	if !s.Cached {
		t.Fatal("the cache is off")
	}
	for _, tt := range []struct{ name, a, b string }{
		{"a lone surrogate escape", `{"o": {}}`, `{"o": {"\ud800\u0041": "evil"}}`},
		{"an invalid UTF-8 byte", `{"p": {}}`, "{\"p\": {\"\xff\": \"evil\"}}"},
		{"an invalid UTF-8 byte beside U+FFFD", `{"p": {"\ufffd": "good"}}`, "{\"p\": {\"\\ufffd\": \"good\", \"\xff\": \"evil\"}}"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			config := func(raw string) *Input {
				in := runnerInput()
				var top map[string]json.RawMessage
				if err := json.Unmarshal([]byte(raw), &top); err != nil {
					t.Fatal(err)
				}
				in.Config = map[string]any{}
				for k, v := range top {
					in.Config[k] = v
				}
				return in
			}
			s, err := Load(t.Context(), fsys, "keys", Options{})
			if err != nil {
				t.Fatal(err)
			}
			if _, err := s.Eval(t.Context(), config(tt.a)); err != nil {
				t.Fatal(err)
			}
			if diff := cachedVsFresh(t, s, config(tt.b)); diff != "" {
				t.Errorf("B's decision came from A's (-fresh +cached):\n%s", diff)
			}
		})
	}
}
