package admission

import (
	"sort"
	"strconv"
	"strings"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

// Patch returns the JSON patch that turns before into after, for the fields
// Apply and PlanSecrets change: labels, annotations, node selector,
// tolerations, the required node affinity, volumes, init containers added
// first, and each container's env, envFrom and volume mounts.
//
// The pod is decoded into the webhook's own API types, which drop fields
// they do not know (a volume source or an env field newer than the
// webhook). So the patch touches only what Apply changed, never a whole
// list or object the pod already had: new map keys and new list items are
// added, and a changed list item is replaced by itself alone. Apply never
// removes or reorders items (PlanSecrets only puts init containers first),
// which is what makes this exact;
// FuzzDecisionToPatch checks it against the two documents.
func Patch(before, after *corev1.Pod) []jsonpatch.Operation {
	// Room for what a runner pod's shaping usually takes, grown past it.
	p := patcher{ops: make([]jsonpatch.Operation, 0, 16)}
	p.maps("/metadata/labels", before.Labels, after.Labels)
	p.maps("/metadata/annotations", before.Annotations, after.Annotations)
	p.maps("/spec/nodeSelector", before.Spec.NodeSelector, after.Spec.NodeSelector)
	lists(&p, "/spec/tolerations", before.Spec.Tolerations, after.Spec.Tolerations)
	p.affinity(before.Spec.Affinity, after.Spec.Affinity)
	lists(&p, "/spec/volumes", before.Spec.Volumes, after.Spec.Volumes)
	containers(&p, "/spec/initContainers", before.Spec.InitContainers, after.Spec.InitContainers)
	containers(&p, "/spec/containers", before.Spec.Containers, after.Spec.Containers)
	return p.ops
}

// containers patches each container's env, envFrom and volume mounts.
// after may start with containers before lacks (PlanSecrets puts the
// resolver first): they are added whole, ahead of the others.
func containers(p *patcher, path string, before, after []corev1.Container) {
	n := len(after) - len(before)
	if n > 0 && before == nil {
		p.add(path, after)
		return
	}
	for i := range n {
		p.add(index(path, i), &after[i])
	}
	for i := range before {
		b, a := &before[i], &after[i+n]
		item := index(path, i+n)
		lists(p, item+"/env", b.Env, a.Env)
		lists(p, item+"/envFrom", b.EnvFrom, a.EnvFrom)
		lists(p, item+"/volumeMounts", b.VolumeMounts, a.VolumeMounts)
	}
}

// index is the JSON pointer to item i of the list at path.
func index(path string, i int) string {
	return path + "/" + strconv.Itoa(i)
}

// patcher gathers the operations. A value is the pod's own (a pointer into
// after, for a list item): the patch is encoded before anything changes
// the pod again.
type patcher struct{ ops []jsonpatch.Operation }

func (p *patcher) add(path string, v any) {
	p.ops = append(p.ops, jsonpatch.Operation{Operation: "add", Path: path, Value: v})
}

// maps adds the keys whose values differ; a map the pod did not have (or
// had as null) is added whole.
func (p *patcher) maps(path string, before, after map[string]string) {
	if equality.Semantic.DeepEqual(before, after) {
		return
	}
	if before == nil {
		p.add(path, after)
		return
	}
	keys := make([]string, 0, len(after))
	for k, v := range after {
		if old, ok := before[k]; !ok || old != v {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		p.add(path+"/"+escape(k), after[k])
	}
}

// lists replaces the items that differ and appends the new ones; a list the
// pod did not have (or had as null) is added whole.
func lists[T any](p *patcher, path string, before, after []T) {
	if before == nil {
		if len(after) > 0 {
			p.add(path, after)
		}
		return
	}
	var end string
	for i := range after {
		switch {
		case i >= len(before):
			if end == "" {
				end = path + "/-"
			}
			p.add(end, &after[i])
		case !semanticEqual(&before[i], &after[i]):
			p.ops = append(p.ops, jsonpatch.Operation{Operation: "replace", Path: index(path, i), Value: &after[i]})
		}
	}
}

// semanticEqual is equality.Semantic.DeepEqual, without its reflection
// for the variables that hold a value only (most of them).
func semanticEqual[T any](a, b *T) bool {
	if a, ok := any(a).(*corev1.EnvVar); ok {
		b := any(b).(*corev1.EnvVar)
		switch {
		case a.Name != b.Name || a.Value != b.Value || (a.ValueFrom == nil) != (b.ValueFrom == nil):
			return false
		case a.ValueFrom == nil:
			return true
		}
	}
	return equality.Semantic.DeepEqual(*a, *b)
}

// affinity patches the required node affinity, the one part Apply changes,
// from the deepest level the pod already had.
func (p *patcher) affinity(before, after *corev1.Affinity) {
	const base = "/spec/affinity"
	switch {
	case equality.Semantic.DeepEqual(before, after):
		return
	case before == nil:
		p.add(base, after)
		return
	case before.NodeAffinity == nil:
		p.add(base+"/nodeAffinity", after.NodeAffinity)
		return
	}
	b, a := before.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution, after.NodeAffinity.RequiredDuringSchedulingIgnoredDuringExecution
	path := base + "/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution"
	switch {
	case b == nil:
		p.add(path, a)
		return
	case b.NodeSelectorTerms == nil:
		p.add(path+"/nodeSelectorTerms", a.NodeSelectorTerms)
		return
	}
	for i := range a.NodeSelectorTerms {
		if i >= len(b.NodeSelectorTerms) {
			p.add(path+"/nodeSelectorTerms/-", a.NodeSelectorTerms[i])
			continue
		}
		lists(p, index(path+"/nodeSelectorTerms", i)+"/matchExpressions",
			b.NodeSelectorTerms[i].MatchExpressions, a.NodeSelectorTerms[i].MatchExpressions)
	}
}

// escape makes a map key a JSON pointer token (RFC 6901).
func escape(k string) string {
	return strings.ReplaceAll(strings.ReplaceAll(k, "~", "~0"), "/", "~1")
}
