package admission

import (
	"fmt"
	"iter"
	"slices"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"

	"github.com/runwarden/runwarden/webhook/policy"
)

// Apply changes pod as the mutations say. Every change is an "ensure": a
// value already there is left alone, so applying the same mutations to the
// result changes nothing (reinvocation is safe). Variables, mounts and
// volumes are matched by name, and a policy's value replaces a different
// one the pod had: the pod gets exactly what the policy decided.
func Apply(pod *corev1.Pod, m policy.Mutations) {
	pod.Labels = setAll(pod.Labels, m.Labels)
	pod.Annotations = setAll(pod.Annotations, m.Annotations)
	pod.Spec.NodeSelector = setAll(pod.Spec.NodeSelector, m.NodeSelector)
	for _, t := range m.Tolerations {
		if !slices.ContainsFunc(pod.Spec.Tolerations, func(o corev1.Toleration) bool { return equality.Semantic.DeepEqual(o, t) }) {
			pod.Spec.Tolerations = append(pod.Spec.Tolerations, t)
		}
	}
	if len(m.NodeAffinity) > 0 {
		requireNodeAffinity(&pod.Spec, m.NodeAffinity)
	}
	for _, v := range m.Volumes {
		pod.Spec.Volumes = upsert(pod.Spec.Volumes, v, func(a, b *corev1.Volume) bool { return a.Name == b.Name })
	}
	// Init containers too: "*" means every container, and a policy may name
	// an init container (a git clone that needs the VCS credentials).
	for i := range pod.Spec.InitContainers {
		applyContainer(&pod.Spec.InitContainers[i], m)
	}
	for i := range pod.Spec.Containers {
		applyContainer(&pod.Spec.Containers[i], m)
	}
}

func applyContainer(c *corev1.Container, m policy.Mutations) {
	for _, e := range m.Env {
		if slices.Contains(e.Containers, c.Name) || slices.Contains(e.Containers, "*") {
			c.Env = upsert(c.Env, e.Env, func(a, b *corev1.EnvVar) bool { return a.Name == b.Name })
		}
	}
	for _, e := range m.EnvFrom {
		if (slices.Contains(e.Containers, c.Name) || slices.Contains(e.Containers, "*")) &&
			!slices.ContainsFunc(c.EnvFrom, func(o corev1.EnvFromSource) bool { return equality.Semantic.DeepEqual(o, e.EnvFrom) }) {
			c.EnvFrom = append(c.EnvFrom, e.EnvFrom)
		}
	}
	for _, vm := range m.VolumeMounts {
		if slices.Contains(vm.Containers, c.Name) || slices.Contains(vm.Containers, "*") {
			c.VolumeMounts = upsert(c.VolumeMounts, vm.VolumeMount, func(a, b *corev1.VolumeMount) bool { return a.Name == b.Name && a.MountPath == b.MountPath })
		}
	}
}

// MountClashes returns, for each container, the volume mounts of the
// mutations whose path the container already uses for another volume: the
// pod would be invalid with both (mount paths are unique per container).
func MountClashes(pod *corev1.Pod, m policy.Mutations) []string {
	var out []string
	for c := range allContainers(pod) {
		for _, vm := range m.VolumeMounts {
			if !slices.Contains(vm.Containers, c.Name) && !slices.Contains(vm.Containers, "*") {
				continue
			}
			for _, own := range c.VolumeMounts {
				if own.MountPath == vm.VolumeMount.MountPath && own.Name != vm.VolumeMount.Name {
					out = append(out, fmt.Sprintf("container %s already mounts volume %s at %s, where the platform mounts %s",
						c.Name, own.Name, own.MountPath, vm.VolumeMount.Name))
				}
			}
		}
	}
	return out
}

// allContainers yields the pod's init containers, then its containers.
func allContainers(pod *corev1.Pod) iter.Seq[*corev1.Container] {
	return func(yield func(*corev1.Container) bool) {
		for _, cs := range [][]corev1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
			for i := range cs {
				if !yield(&cs[i]) {
					return
				}
			}
		}
	}
}

func setAll(dst, src map[string]string) map[string]string {
	if len(src) == 0 {
		return dst
	}
	if dst == nil {
		dst = map[string]string{}
	}
	for k, v := range src {
		dst[k] = v
	}
	return dst
}

// upsert puts v into list: in place of the item that is the same one
// (same says, by key), or at the end.
func upsert[T any](list []T, v T, same func(a, b *T) bool) []T {
	for i := range list {
		if same(&list[i], &v) {
			if !semanticEqual(&list[i], &v) {
				list[i] = v
			}
			return list
		}
	}
	return append(list, v)
}

// requireNodeAffinity adds the expressions to every required node selector
// term (a pod without one gets one term holding them).
func requireNodeAffinity(spec *corev1.PodSpec, exprs []corev1.NodeSelectorRequirement) {
	if spec.Affinity == nil {
		spec.Affinity = &corev1.Affinity{}
	}
	if spec.Affinity.NodeAffinity == nil {
		spec.Affinity.NodeAffinity = &corev1.NodeAffinity{}
	}
	na := spec.Affinity.NodeAffinity
	if na.RequiredDuringSchedulingIgnoredDuringExecution == nil {
		na.RequiredDuringSchedulingIgnoredDuringExecution = &corev1.NodeSelector{}
	}
	ns := na.RequiredDuringSchedulingIgnoredDuringExecution
	if len(ns.NodeSelectorTerms) == 0 {
		ns.NodeSelectorTerms = []corev1.NodeSelectorTerm{{}}
	}
	for i := range ns.NodeSelectorTerms {
		t := &ns.NodeSelectorTerms[i]
		for _, e := range exprs {
			if !slices.ContainsFunc(t.MatchExpressions, func(o corev1.NodeSelectorRequirement) bool { return equality.Semantic.DeepEqual(o, e) }) {
				t.MatchExpressions = append(t.MatchExpressions, e)
			}
		}
	}
}
