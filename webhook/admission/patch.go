package admission

import (
	"fmt"

	"gomodules.xyz/jsonpatch/v2"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/equality"
)

// Patch returns the JSON patch that turns before into after, for the fields
// Apply changes: labels, annotations, node selector, tolerations, affinity,
// volumes, and each container's env, envFrom and volume mounts. Each changed
// field is written whole with an "add", which sets an object member whether
// or not it exists. This is much cheaper than diffing the two documents,
// and FuzzDecisionToPatch checks it against them.
func Patch(before, after *corev1.Pod) []jsonpatch.Operation {
	var ops []jsonpatch.Operation
	add := func(path string, old, new any) {
		if !equality.Semantic.DeepEqual(old, new) {
			ops = append(ops, jsonpatch.Operation{Operation: "add", Path: path, Value: new})
		}
	}
	add("/metadata/labels", before.Labels, after.Labels)
	add("/metadata/annotations", before.Annotations, after.Annotations)
	add("/spec/nodeSelector", before.Spec.NodeSelector, after.Spec.NodeSelector)
	add("/spec/tolerations", before.Spec.Tolerations, after.Spec.Tolerations)
	add("/spec/affinity", before.Spec.Affinity, after.Spec.Affinity)
	add("/spec/volumes", before.Spec.Volumes, after.Spec.Volumes)
	for i := range after.Spec.Containers {
		b, a := &before.Spec.Containers[i], &after.Spec.Containers[i]
		add(fmt.Sprintf("/spec/containers/%d/env", i), b.Env, a.Env)
		add(fmt.Sprintf("/spec/containers/%d/envFrom", i), b.EnvFrom, a.EnvFrom)
		add(fmt.Sprintf("/spec/containers/%d/volumeMounts", i), b.VolumeMounts, a.VolumeMounts)
	}
	return ops
}
