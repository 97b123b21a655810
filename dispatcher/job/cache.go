package job

import (
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	toolscache "k8s.io/client-go/tools/cache"
)

// CacheTransform trims the Jobs and pods a dispatcher caches to what it
// reads: metadata (without managed fields), a Job's status and its spec
// without the pod template, a pod's status and node name. With 1,000 tasks
// in flight the cache holds 1,000 of each. Objects read from such a cache
// must never be written back whole (Update); the dispatcher only patches
// and deletes them.
func CacheTransform() toolscache.TransformFunc {
	return func(in any) (any, error) {
		switch o := in.(type) {
		case *batchv1.Job:
			o.ManagedFields = nil
			o.Spec.Template = corev1.PodTemplateSpec{}
		case *corev1.Pod:
			o.ManagedFields = nil
			o.Spec = corev1.PodSpec{NodeName: o.Spec.NodeName}
		}
		return in, nil
	}
}
