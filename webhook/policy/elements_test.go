package policy

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
	"testing/fstest"

	"github.com/google/go-cmp/cmp"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/utils/ptr"

	"github.com/runwarden/runwarden/policies"
)

// TestElementReads checks the reads through the elements of an iterated
// list: by field where every use of the element names one, the elements
// whole (the list whole) otherwise.
func TestElementReads(t *testing.T) {
	t.Parallel()
	const decide = `decision := {"deny": [], "warnings": [w | some w in warning], "mutations": {}}
`
	const concat = `cs := array.concat(object.get(input.pod.spec, "initContainers", []), input.pod.spec.containers)
`
	tests := []struct {
		name, policy string
		modules      map[string]string
		want         []string
		counts       bool // want lists the lists' lengths read
	}{
		{
			// Whether the rule holds depends on how many containers there
			// are, and on nothing else of them.
			name:   "an element not used",
			policy: `warning contains "some" if { some c in input.pod.spec.containers; some e in c.env }`,
			want:   []string{"pod.spec.containers.#", "pod.spec.containers.*.env.#"},
			counts: true,
		},
		{
			name:   "fields by name",
			policy: `warning contains c.name if { some c in input.pod.spec.containers; c.image == "x"; object.get(c, ["securityContext", "privileged"], false) }`,
			want:   []string{"pod.spec.containers.*.image", "pod.spec.containers.*.name", "pod.spec.containers.*.securityContext.privileged"},
		},
		{
			name:   "a field iterated in turn",
			policy: `warning contains e.name if { some c in input.pod.spec.containers; some e in object.get(c, "env", []); startswith(e.name, "A") }`,
			want:   []string{"pod.spec.containers.*.env.*.name"},
		},
		{
			name:   "a field iterated by reference",
			policy: `warning contains m.name if { some c in input.pod.spec.containers; some m in c.volumeMounts }`,
			want:   []string{"pod.spec.containers.*.volumeMounts.*.name"},
		},
		{
			name:   "with its index",
			policy: `warning contains sprintf("%d %s", [i, c.name]) if { some i, c in input.pod.spec.containers }`,
			want:   []string{"pod.spec.containers.*.name"},
		},
		{
			name:   "a field read whole",
			policy: `warning contains json.marshal(c.env) if { some c in input.pod.spec.containers }`,
			want:   []string{"pod.spec.containers.*.env"},
		},
		{
			name:   "the element whole",
			policy: `warning contains json.marshal([c | some c in input.pod.spec.containers])`,
			want:   []string{"pod.spec.containers.*"},
		},
		{
			name: "a dynamic key",
			policy: `k := "image"
warning contains c[k] if { some c in input.pod.spec.containers }`,
			want: []string{"pod.spec.containers.*"},
		},
		{
			name: "passed to a function",
			policy: `f(x) := x.image
warning contains f(c) if { some c in input.pod.spec.containers }`,
			want: []string{"pod.spec.containers.*"},
		},
		{
			name:   "an element compared whole",
			policy: `warning contains "same" if { some c in input.pod.spec.containers; some d in input.pod.spec.initContainers; c == d }`,
			want:   []string{"pod.spec.containers.*", "pod.spec.initContainers.*"},
		},
		{
			name:   "a pattern instead of a variable",
			policy: `warning contains n if { some {"name": n} in input.pod.spec.containers }`,
			want:   []string{"pod.spec.containers"},
		},
		{
			name:   "every",
			policy: `warning contains "all" if { every c in input.pod.spec.containers { c.image != "" } }`,
			want:   []string{"pod.spec.containers"},
		},
		{
			name:   "membership",
			policy: `warning contains "in" if { {"name": "main"} in input.pod.spec.containers }`,
			want:   []string{"pod.spec.containers"},
		},
		{
			name:   "a list alias",
			policy: concat + `warning contains c.name if { some c in cs }`,
			want:   []string{"pod.spec.containers.*.name", "pod.spec.initContainers.*.name"},
		},
		{
			name: "an alias of a list alias",
			policy: concat + `all := array.concat(cs, object.get(input, ["pod", "spec", "ephemeralContainers"], []))
warning contains c.image if { some c in all }`,
			want: []string{"pod.spec.containers.*.image", "pod.spec.ephemeralContainers.*.image", "pod.spec.initContainers.*.image"},
		},
		{
			name:   "a list alias used whole",
			policy: concat + `warning contains sprintf("%d", [count(cs)])`,
			want:   []string{"pod.spec.containers", "pod.spec.initContainers"},
		},
		{
			name: "a list alias from another package",
			modules: map[string]string{
				"o.rego": "package runwarden.other\n\n" + concat,
				"p.rego": `warning contains c.name if { some c in data.runwarden.other.cs }`,
			},
			want: []string{"pod.spec.containers.*.name", "pod.spec.initContainers.*.name"},
		},
		{
			name: "a list alias defined twice is no alias",
			policy: concat + `cs := [] if false
warning contains c.name if { some c in cs }`,
			want: []string{"pod.spec.containers", "pod.spec.initContainers"},
		},
		{
			name: "the same name bound twice in a rule",
			policy: `warning contains x if {
	some c in input.pod.spec.containers
	x := [c.name | some c in input.pod.spec.initContainers][_]
}`,
			want: []string{"pod.spec.containers.*.name", "pod.spec.initContainers.*.name"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			modules := tt.modules
			if modules == nil {
				modules = map[string]string{"p.rego": tt.policy}
			}
			// Each iteration reads its list's length; the cases list
			// those reads only where they are all there is.
			got := readsOf(t, modules, decide, tt.counts)
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("reads (-want +got):\n%s", diff)
			}
		})
	}
}

// TestProjectionOfElements checks the key of a path through a list's
// elements: it changes with the list's length, order and the field read,
// and not with the elements' other fields.
func TestProjectionOfElements(t *testing.T) {
	t.Parallel()
	p := newProjection([][]string{{"l", elementKey, "n"}, {"l", elementKey, "e", elementKey, "k"}, {"o"}})
	key := func(doc string) [32]byte { return p.key([]byte(doc)) }
	base := key(`{"l":[{"n":"a","x":1,"e":[{"k":"K","v":"1"}]},{"n":"b"}],"o":1}`)
	same := []string{
		`{"l":[{"n":"a","x":2,"e":[{"k":"K","v":"2"}]},{"n":"b","x":3}],"o":1}`,
		`{"o":1,"l":[{"x":9,"n":"a","e":[{"v":"3","k":"K"}]},{"n":"b"}]}`,
	}
	for _, doc := range same {
		if key(doc) != base {
			t.Errorf("%s: fields not read changed the key", doc)
		}
	}
	differ := []string{
		`{"l":[{"n":"a","e":[{"k":"K"}]}],"o":1}`,                            // shorter
		`{"l":[{"n":"b"},{"n":"a","e":[{"k":"K"}]}],"o":1}`,                  // reordered
		`{"l":[{"n":"a","e":[{"k":"L"}]},{"n":"b"}],"o":1}`,                  // a nested field
		`{"l":[{"n":"a","e":[{"k":"K"},{"k":"K"}]},{"n":"b"}],"o":1}`,        // a nested length
		`{"l":[{"n":"a","e":[{"k":"K"}]},{"n":"b"},{}],"o":1}`,               // an element without the field
		`{"l":[{"n":"a","e":[{"k":"K"}]},{"n":null}],"o":1}`,                 // null against missing
		`{"l":{"0":{"n":"a","e":[{"k":"K"}]},"1":{"n":"b"}},"o":1}`,          // an object, not a list
		`{"l":[{"n":"a","e":{"k":"K"}},{"n":"b"}],"o":1}`,                    // a nested object
		`{"l":[{"n":"a","e":[{"k":"K"}]},{"n":"b"}],"o":2}`,                  // another path
		`{"l":[{"n":"a","e":[{"k":"K"}]},{"n":"b"}]}`,                        // a path missing
		`{"l":[{"n":"a","e":[{"k":"K"}]},{"n":"b\u00ff"}],"o":1}`,            // a value with a high byte
		`{"l":[{"n":"a","e":[{"k":"K"}]},"b"],"o":1}`,                        // an element not an object
		`{"l":[{"n":["a"],"e":[{"k":"K"}]},{"n":"b"}],"o":1}`,                // a field of another kind
		`{"l":[{"n":"a","e":[{"k":"K","v":"1"}]},{"n":"b"}],"o":1,"l2":[1]}`, // only this one is the same
	}
	for i, doc := range differ[:len(differ)-1] {
		if key(doc) == base {
			t.Errorf("case %d, %s: a field read did not change the key", i, doc)
		}
	}
	if key(differ[len(differ)-1]) != base {
		t.Error("a key the policies never read changed the key")
	}
	// Of duplicate keys, the last is what OPA decodes, and what is read.
	dup := newProjection([][]string{{"o", "k"}})
	if dup.key([]byte(`{"o":{"k":"1","k":"2"}}`)) == dup.key([]byte(`{"o":{"k":"1","k":"3"}}`)) {
		t.Error("the last of duplicate keys did not change the key")
	}
	count := newProjection([][]string{{"l", countKey}})
	if count.key([]byte(`{"l":[1,2]}`)) != count.key([]byte(`{"l":[3,{"x":4}]}`)) {
		t.Error("the elements changed the key of their number")
	}
	for _, doc := range []string{`{"l":[1]}`, `{"l":[]}`, `{}`, `{"l":{"a":1,"b":2}}`, `{"l":"12"}`} {
		if count.key([]byte(doc)) == count.key([]byte(`{"l":[1,2]}`)) {
			t.Errorf("%s: the key of the number of elements did not change", doc)
		}
	}
}

// TestCachedDecisionsEqualFreshOnesPerTask decides on runner pods that
// differ the way tasks' pods do (variables, arguments, images, sidecars,
// mounts, the variables that workload identity leaves alone), with
// platform configurations that turn the policies that read the containers
// on, and checks that each cached decision is the one a fresh evaluation
// makes. The values are drawn from small sets, so that the cache is hit
// by pods that differ in fields read and in fields not read.
func TestCachedDecisionsEqualFreshOnesPerTask(t *testing.T) {
	t.Parallel()
	s, err := Load(t.Context(), policies.FS, "embedded", Options{})
	if err != nil {
		t.Fatal(err)
	}
	configs := []map[string]any{
		{"workloadIdentity": map[string]any{"aws": map[string]any{"enabled": true}}},
		{
			"workloadIdentity": map[string]any{"aws": map[string]any{"enabled": true}, "azure": map[string]any{"enabled": true, "tenantId": "t"}},
			"shape":            map[string]any{"requireResources": true, "allowedRegistries": []any{"r"}},
			"containers":       []any{"main", "sidecar"},
		},
		{"containers": []any{"*"}, "ephemeralContainers": map[string]any{"allow": true}, "workloadIdentity": map[string]any{"aws": map[string]any{"enabled": true}}},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	pick := func(xs ...string) string { return xs[rng.IntN(len(xs))] }
	container := func(name string) corev1.Container {
		c := corev1.Container{Name: name, Image: pick("r/x:1", "r/x:2", "other/x:1")}
		for range rng.IntN(3) {
			e := corev1.EnvVar{Name: pick("DEPLOY_REF", "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AZURE_CLIENT_ID", "X"), Value: pick("1", "2", "3")}
			if rng.IntN(6) == 0 {
				e.Value, e.ValueFrom = "", &corev1.EnvVarSource{SecretKeyRef: &corev1.SecretKeySelector{LocalObjectReference: corev1.LocalObjectReference{Name: "s"}, Key: "k"}}
			}
			c.Env = append(c.Env, e)
		}
		if rng.IntN(2) == 0 {
			c.Args = []string{pick("deploy", "plan"), pick("a", "b")}
		}
		if rng.IntN(3) == 0 {
			c.VolumeMounts = []corev1.VolumeMount{{Name: pick("aws-iam-token", "azure-identity-token", "work"), MountPath: pick("/a", "/b")}}
		}
		if rng.IntN(3) == 0 {
			c.SecurityContext = &corev1.SecurityContext{Privileged: ptr.To(rng.IntN(2) == 0), AllowPrivilegeEscalation: ptr.To(rng.IntN(2) == 0)}
		}
		if rng.IntN(2) == 0 {
			q := resource.MustParse(pick("1", "2"))
			c.Resources = corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: q, corev1.ResourceMemory: q},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: q},
			}
		}
		return c
	}
	// Templates, as a platform has a few; each task's pod is one of them
	// with its own variables' values, arguments and labels, and now and
	// then one field the policies read changed as well.
	templates := make([]*Input, 8)
	for i := range templates {
		in := runnerInput()
		in.Runner = i != 0 // one template's pods are not runners: the shape rules only
		in.Config = configs[i%len(configs)]
		in.ServiceAccount.Annotations = map[string]string{
			"eks.amazonaws.com/role-arn":         "arn:aws:iam::1:role/r",
			"azure.workload.identity/client-id":  pick("", "c"),
			"eks.amazonaws.com/token-expiration": pick("3600", "86400"),
		}
		in.Pod.Labels["azure.workload.identity/use"] = pick("true", "false")
		in.Pod.Spec.Containers = []corev1.Container{container("main")}
		if rng.IntN(2) == 0 {
			in.Pod.Spec.Containers = append(in.Pod.Spec.Containers, container(pick("sidecar", "main2")))
		}
		if rng.IntN(3) == 0 {
			in.Pod.Spec.InitContainers = []corev1.Container{container(pick("init", "runwarden-secrets"))}
		}
		if i%4 == 3 { // two templates are updates adding a debug container
			in.Operation, in.SubResource = "UPDATE", "ephemeralcontainers"
			in.OldPod = in.Pod.DeepCopy()
			in.OldPod.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon{Name: "earlier", Image: "r/x:1"}}}
			in.Pod.Spec.EphemeralContainers = []corev1.EphemeralContainer{{EphemeralContainerCommon: corev1.EphemeralContainerCommon(container("debug"))}}
		}
		templates[i] = in
	}
	// flip turns a flag of the container's security context, leaving the
	// rest of it as it was.
	flip := func(c *corev1.Container, field func(*corev1.SecurityContext) **bool) {
		sc := &corev1.SecurityContext{}
		if c.SecurityContext != nil {
			sc = c.SecurityContext.DeepCopy()
		}
		f := field(sc)
		*f = ptr.To(*f == nil || !**f)
		c.SecurityContext = sc
	}
	// Changes to a field the policies read, one of which a pod may get.
	changes := []func(c *corev1.Container, in *Input){
		func(c *corev1.Container, _ *Input) { c.Image = "other/y:1" },
		func(c *corev1.Container, _ *Input) {
			c.Env = append(c.Env, corev1.EnvVar{Name: "AWS_ROLE_ARN", Value: "mine"})
		},
		func(c *corev1.Container, _ *Input) { c.Name = "renamed" },
		func(c *corev1.Container, _ *Input) {
			flip(c, func(sc *corev1.SecurityContext) **bool { return &sc.Privileged })
		},
		func(c *corev1.Container, _ *Input) {
			flip(c, func(sc *corev1.SecurityContext) **bool { return &sc.AllowPrivilegeEscalation })
		},
		func(c *corev1.Container, _ *Input) {
			c.VolumeMounts = append(c.VolumeMounts, corev1.VolumeMount{Name: "aws-iam-token", MountPath: "/x"})
		},
		func(c *corev1.Container, _ *Input) {
			if len(c.Resources.Requests) > 0 {
				c.Resources = corev1.ResourceRequirements{}
				return
			}
			q := resource.MustParse("1")
			c.Resources = corev1.ResourceRequirements{
				Requests: corev1.ResourceList{corev1.ResourceCPU: q, corev1.ResourceMemory: q},
				Limits:   corev1.ResourceList{corev1.ResourceMemory: q},
			}
		},
		func(_ *corev1.Container, in *Input) {
			in.Pod.Spec.Containers = append(in.Pod.Spec.Containers, container("extra"))
		},
		func(_ *corev1.Container, in *Input) {
			in.Pod.Spec.InitContainers = append(in.Pod.Spec.InitContainers, container("runwarden-secrets"))
		},
		// An update whose debug container was there before: not a new one.
		func(_ *corev1.Container, in *Input) {
			if in.OldPod != nil {
				in.OldPod.Spec.EphemeralContainers[0].Name = in.Pod.Spec.EphemeralContainers[0].Name
			}
		},
	}
	// A task's pod: the template with its own variables' values, arguments
	// and labels (never read), and change, if any, to one container.
	task := func(tmpl *Input, i int, change func(*corev1.Container, *Input), container int) *Input {
		in := *tmpl
		in.Pod = tmpl.Pod.DeepCopy()
		pods := []*corev1.Pod{in.Pod}
		if tmpl.OldPod != nil {
			in.OldPod = tmpl.OldPod.DeepCopy()
			pods = append(pods, in.OldPod)
		}
		for _, p := range pods {
			p.Labels["runwarden.dev/task-id"] = fmt.Sprint(i)
			for j := range p.Spec.Containers {
				c := &p.Spec.Containers[j]
				for k := range c.Env {
					if c.Env[k].ValueFrom == nil {
						c.Env[k].Value = fmt.Sprintf("task-%d", i)
					}
				}
				c.Args = []string{"deploy", fmt.Sprint(i)}
			}
		}
		if change != nil {
			change(&in.Pod.Spec.Containers[container%len(in.Pod.Spec.Containers)], &in)
		}
		return &in
	}
	hits := 0
	check := func(in *Input, what string) {
		t.Helper()
		_, seen := s.cache.get(s.proj.key(mustJSON(t, in)))
		if seen {
			hits++
		}
		if diff := cachedVsFresh(t, s, in); diff != "" {
			t.Fatalf("%s (cache hit: %v): the cached decision differs from a fresh one (-fresh +cached):\n%s", what, seen, diff)
		}
	}
	// Every change to every template's containers, right after a task of
	// the template filled the cache.
	n := 0
	for ti, tmpl := range templates {
		for ci, change := range changes {
			for k := range len(tmpl.Pod.Spec.Containers) {
				n++
				check(task(tmpl, n, nil, 0), fmt.Sprintf("template %d", ti))
				n++
				check(task(tmpl, n, change, k), fmt.Sprintf("template %d, change %d to container %d", ti, ci, k))
			}
		}
	}
	// And tasks drawn at random.
	for range 300 {
		n++
		var change func(*corev1.Container, *Input)
		if rng.IntN(3) == 0 {
			change = changes[rng.IntN(len(changes))]
		}
		check(task(templates[rng.IntN(len(templates))], n, change, rng.IntN(2)), fmt.Sprintf("task %d", n))
	}
	if hits < n/3 {
		t.Errorf("only %d of %d decisions came from the cache: the test compares too few", hits, n)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestCacheHoldsAgainstPolicyForms decides on two inputs, A then B, that
// differ where each policy reads in a way the syntax hides, and checks that
// B's decision is B's own: the cache is off for the set, or its key tells
// the two apart.
func TestCacheHoldsAgainstPolicyForms(t *testing.T) {
	t.Parallel()
	const decide = `decision := {"deny": [], "warnings": [x | some x in data.runwarden.w], "mutations": {}}
`
	labels := func(k, v string) func(*Input) { return func(in *Input) { in.Pod.Labels[k] = v } }
	tests := []struct {
		name    string
		modules map[string]string
		a, b    func(*Input)
	}{
		{
			name: "an input reference in a rule's head",
			modules: map[string]string{"p.rego": `package runwarden

by.node[input.pod.spec.nodeName] := true

w contains "evil" if by.node.evil
`},
			a: func(in *Input) { in.Pod.Spec.NodeName = "good" },
			b: func(in *Input) { in.Pod.Spec.NodeName = "evil" },
		},
		{
			name: "an element's field in a rule's head",
			modules: map[string]string{"p.rego": `package runwarden

imgs[c.name].img := c.image if { some c in input.pod.spec.containers }

w contains "evil" if imgs.evil.img == "r/x:1"
`},
			a: func(in *Input) {
				in.Pod.Spec.Containers = append(in.Pod.Spec.Containers, corev1.Container{Name: "side", Image: "r/x:1"})
			},
			b: func(in *Input) {
				in.Pod.Spec.Containers = append(in.Pod.Spec.Containers, corev1.Container{Name: "evil", Image: "r/x:1"})
			},
		},
		{
			name: "an alias in a rule's head",
			modules: map[string]string{"p.rego": `package runwarden

lbl := object.get(input, ["pod", "metadata", "labels"], {})

s.t[lbl.x] := 1

w contains "evil" if s.t.evil
`},
			a: labels("x", "good"),
			b: labels("x", "evil"),
		},
		{
			name: "an alias whose default is not empty",
			modules: map[string]string{"p.rego": `package runwarden

ann := object.get(input, ["pod", "metadata", "annotations"], {"runwarden.dev/allow": "true"})

w contains "not allowed" if not ann["runwarden.dev/allow"] == "true"
`},
			a: func(in *Input) { in.Pod.Annotations = nil },
			b: func(in *Input) { in.Pod.Annotations = map[string]string{"x": "y"} },
		},
		{
			name: "a key holding a NUL",
			modules: map[string]string{"p.rego": `package runwarden

v := input.config["a\u0000b"]

w contains "b" if input.config.a.b == "x"

w contains "v" if v == "zz"
`},
			a: func(in *Input) { in.Config = map[string]any{"a": map[string]any{"b": "y"}} },
			b: func(in *Input) { in.Config = map[string]any{"a": map[string]any{"b": "x"}} },
		},
		{
			name: "an alias reached from another package by a relative reference",
			modules: map[string]string{
				"a.rego": "package runwarden.admission\n\nann := object.get(input, [\"pod\", \"metadata\", \"labels\"], {})\n",
				"b.rego": "package runwarden\n\nadmission.helper := 1\n\nw contains \"evil\" if admission.ann.evil == \"true\"\n",
			},
			a: labels("evil", "false"),
			b: labels("evil", "true"),
		},
		{
			name: "a function of the policies' own named object.get",
			modules: map[string]string{"p.rego": `package runwarden

object.get(x, _, _) := x

lb := object.get(input, ["pod", "metadata", "labels"], {})

w contains "evil" if lb.pod.spec.hostNetwork
`},
			a: func(in *Input) { in.Pod.Spec.HostNetwork = false },
			b: func(in *Input) { in.Pod.Spec.HostNetwork = true },
		},
		{
			name: "a function of the policies' own named array.concat",
			modules: map[string]string{"p.rego": `package runwarden

array.concat(x, _) := [{"name": json.marshal(x)}]

cs := array.concat(input.pod.spec.containers, input.pod.spec.containers)

w contains "evil" if {
	some c in cs
	contains(c.name, "evil")
}
`},
			a: func(in *Input) { in.Pod.Spec.Containers[0].Image = "good" },
			b: func(in *Input) { in.Pod.Spec.Containers[0].Image = "evil" },
		},
		{
			name: "object.get imported from another package",
			modules: map[string]string{
				"lib.rego": "package runwarden.lib\n\nobject.get(x, _, _) := x\n",
				"p.rego": `package runwarden

import data.runwarden.lib.object

lb := object.get(input, ["pod", "metadata", "labels"], {})

w contains "evil" if lb.pod.spec.hostNetwork
`,
			},
			a: func(in *Input) { in.Pod.Spec.HostNetwork = false },
			b: func(in *Input) { in.Pod.Spec.HostNetwork = true },
		},
		{
			name: "object.get of an object that may be missing",
			modules: map[string]string{"p.rego": `package runwarden

w contains "root" if object.get(input.pod.spec.securityContext, "runAsUser", 0) == 0
`},
			a: func(in *Input) { in.Pod.Spec.SecurityContext = nil },
			b: func(in *Input) { in.Pod.Spec.SecurityContext = &corev1.PodSecurityContext{} },
		},
		{
			name: "object.get of a map that may be missing",
			modules: map[string]string{"p.rego": `package runwarden

w contains "d" if object.get(input.pod.metadata.annotations, "foo", "d") == "d"
`},
			a: func(in *Input) { in.Pod.Annotations = nil },
			b: func(in *Input) { in.Pod.Annotations = map[string]string{"x": "y"} },
		},
		{
			name: "an alias of an object that may be missing, read by key",
			modules: map[string]string{"p.rego": `package runwarden

sp := object.get(input.pod.spec.securityContext, "seccompProfile", {})

w contains "none" if object.get(sp, "type", "none") == "none"
`},
			a: func(in *Input) { in.Pod.Spec.SecurityContext = nil },
			b: func(in *Input) { in.Pod.Spec.SecurityContext = &corev1.PodSecurityContext{} },
		},
		{
			name: "object.get of an input field that may be missing",
			modules: map[string]string{"p.rego": `package runwarden

w contains "x" if object.get(input.awsRoleMappings, "a/b", null) == null
`},
			a: func(in *Input) { in.AWSRoleMappings = nil },
			b: func(in *Input) { in.AWSRoleMappings = map[string]AWSRoleMapping{"c/d": {}} },
		},
		{
			name: "every over object.get of an object that may be missing",
			modules: map[string]string{"p.rego": `package runwarden

w contains "x" if every s in object.get(input.pod.spec.securityContext, "sysctls", []) { s.name != "" }
`},
			a: func(in *Input) { in.Pod.Spec.SecurityContext = nil },
			b: func(in *Input) { in.Pod.Spec.SecurityContext = &corev1.PodSecurityContext{} },
		},
		{
			name: "elements of object.get of an object that may be missing",
			modules: map[string]string{"p.rego": `package runwarden

w contains "x" if {
	some s in object.get(input.pod.spec.securityContext, "sysctls", [{"name": "d"}])
	s.name == "d"
}
`},
			a: func(in *Input) { in.Pod.Spec.SecurityContext = nil },
			b: func(in *Input) { in.Pod.Spec.SecurityContext = &corev1.PodSecurityContext{} },
		},
		{
			name: "a built-in replaced with with",
			modules: map[string]string{"p.rego": `package runwarden

n := object.get(input.pod.spec, "nodeName", "")

myget(x, _, _) := x

w contains "evil" if {
	v := n with object.get as myget
	v.hostNetwork
}
`},
			a: func(in *Input) { in.Pod.Spec.HostNetwork = false },
			b: func(in *Input) { in.Pod.Spec.HostNetwork = true },
		},
	}
	// Keys spelled as the read paths' markers (elementKey, countKey,
	// existsKey), in every form a key reaches a path: a reference into the
	// input, an alias's key, object.get's key and path, an element's field.
	for _, m := range []string{existsKey, countKey, elementKey} {
		key := strconv.Quote(m)
		config := func(v string) func(*Input) {
			return func(in *Input) { in.Config = map[string]any{m: v, "rules": []any{map[string]any{m: v}}} }
		}
		for _, form := range []struct{ name, src string }{
			{"a reference", `w contains "evil" if input.config[` + key + `] == "evil"`},
			{"a label", `w contains "evil" if input.pod.metadata.labels[` + key + `] == "evil"`},
			{"an alias's key", "lb := object.get(input, [\"pod\", \"metadata\", \"labels\"], {})\n\nw contains \"evil\" if lb[" + key + `] == "evil"`},
			{"object.get's key", `w contains "evil" if object.get(input.config, ` + key + `, "") == "evil"`},
			{"object.get's path", `w contains "evil" if object.get(input, ["config", ` + key + `], "") == "evil"`},
			{"an element's field", "w contains \"evil\" if {\n\tsome r in input.config.rules\n\tr[" + key + `] == "evil"` + "\n}"},
			{"an element's field by object.get", "w contains \"evil\" if {\n\tsome r in input.config.rules\n\tobject.get(r, " + key + `, "") == "evil"` + "\n}"},
		} {
			tests = append(tests, struct {
				name    string
				modules map[string]string
				a, b    func(*Input)
			}{
				name:    fmt.Sprintf("the key %s in %s", key, form.name),
				modules: map[string]string{"p.rego": "package runwarden\n\n" + form.src + "\n"},
				a:       func(in *Input) { config("good")(in); labels(m, "good")(in) },
				b:       func(in *Input) { config("evil")(in); labels(m, "evil")(in) },
			})
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			fsys := fstest.MapFS{"decision.rego": {Data: []byte("package runwarden.admission\n\n" + decide)}}
			for name, src := range tt.modules {
				if name == "a.rego" {
					src = "package runwarden.admission\n\n" + strings.TrimPrefix(src, "package runwarden.admission\n\n")
					fsys["decision.rego"] = &fstest.MapFile{Data: []byte(src + "\n" + decide)}
					continue
				}
				fsys[name] = &fstest.MapFile{Data: []byte(src)}
			}
			s, err := Load(t.Context(), fsys, tt.name, Options{})
			if err != nil {
				t.Fatal(err)
			}
			a, b := runnerInput(), runnerInput()
			tt.a(a)
			tt.b(b)
			if _, err := s.Eval(t.Context(), a); err != nil {
				t.Fatal(err)
			}
			if diff := cachedVsFresh(t, s, b); diff != "" {
				t.Errorf("B's decision came from A's (cache on: %v, reads %v) (-fresh +cached):\n%s", s.Cached, s.reads, diff)
			}
		})
	}
}

// TestCacheIsOffForClockBuiltins: a certificate chain verified now may
// have expired by the next pod.
func TestCacheIsOffForClockBuiltins(t *testing.T) {
	t.Parallel()
	for _, call := range []string{
		`crypto.x509.parse_and_verify_certificates(input.config.chain)`,
		`crypto.x509.parse_and_verify_certificates_with_options(input.config.chain, {})`,
		// A function mocked with one, or with a built-in OPA marks
		// non-deterministic: no call of it shows in the syntax.
		`v1(input.config.chain) with data.runwarden.admission.v1 as crypto.x509.parse_and_verify_certificates`,
		`v2(input.config.token, {"secret": "s"}) with data.runwarden.admission.v2 as io.jwt.decode_verify`,
		`v1(input.config.token) with data.runwarden.admission.v1 as uuid.rfc4122`,
		`v2(input.config.n, 10) with data.runwarden.admission.v2 as rand.intn`,
	} {
		fsys := fstest.MapFS{"p.rego": {Data: []byte("package runwarden.admission\n\nv1(_) := 0\n\nv2(_, _) := 0\n\nchain := x if {\n\tx := " + call + "\n}\n\ndecision := {\"deny\": [], \"warnings\": [json.marshal(chain)], \"mutations\": {}}\n")}}
		s, err := Load(t.Context(), fsys, "clock", Options{})
		if err != nil {
			t.Fatal(err)
		}
		if s.Cached {
			t.Errorf("%s: the cache is on", call)
		}
	}
}
