package job

import (
	"context"
	"fmt"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runwarden/runwarden/internal/contract"
)

// IsPodOf tells whether pod p is one the Job controller made for Job j and
// that runwarden's webhook admitted as a runner pod: its controller
// reference names j (kind Job, batch/v1, j's UID), and it carries
// contract.LabelRunner and j's contract.TaskID.
//
// The label batch.kubernetes.io/job-name alone says nothing: whoever may
// create pods in the namespace may put it on a pod of their own, and such
// a pod must never decide a task's outcome, record or log. A controller
// reference can be written by anyone too, but its UID must be the Job's,
// and the runner label only the Job controller's pods of a dispatcher's
// Job earn (the webhook refuses it on any other pod, and its addition or
// removal on an update).
func IsPodOf(j *batchv1.Job, p *corev1.Pod) bool {
	if j == nil || p == nil || j.UID == "" || p.Namespace != j.Namespace {
		return false
	}
	ref := metav1.GetControllerOfNoCopy(p)
	if ref == nil || ref.Kind != "Job" || ref.APIVersion != batchv1.SchemeGroupVersion.String() || ref.UID != j.UID || ref.Name != j.Name {
		return false
	}
	task := j.Labels[contract.TaskID]
	return p.Labels[contract.LabelRunner] == "true" && task != "" && p.Labels[contract.TaskID] == task
}

// PodsOf lists the pods of Job j, those IsPodOf counts and no other. Read
// from a cache, the pods are shared with it (UnsafeDisableDeepCopy) when
// readOnly is true: the caller must not change them.
func PodsOf(ctx context.Context, c client.Reader, j *batchv1.Job, readOnly bool) ([]corev1.Pod, error) {
	opts := []client.ListOption{client.InNamespace(j.Namespace), client.MatchingLabels{batchv1.JobNameLabel: j.Name}}
	if readOnly {
		opts = append(opts, client.UnsafeDisableDeepCopy)
	}
	var list corev1.PodList
	if err := c.List(ctx, &list, opts...); err != nil {
		return nil, fmt.Errorf("listing the pods of job %s/%s: %w", j.Namespace, j.Name, err)
	}
	pods := list.Items[:0]
	for i := range list.Items {
		if IsPodOf(j, &list.Items[i]) {
			pods = append(pods, list.Items[i])
		}
	}
	return pods, nil
}
