package job

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/internal/contract"
)

// AnnotationTemplateDigest on a Job is the SHA-256 of the platform's pod
// template it was built from ("sha256:<hex>"), before the task was merged
// in.
const AnnotationTemplateDigest = "runwarden.dev/template-digest"

// templateDigest is the SHA-256 of a pod template's JSON encoding.
func templateDigest(t corev1.PodTemplateSpec) string {
	b, err := json.Marshal(t)
	if err != nil {
		return ""
	}
	sum := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(sum[:])
}

// ReadRecord reads the record of Job j from its newest pod of its own
// (IsPodOf; a cache of pods is enough: their metadata and status). A Job
// whose pod was never made has a record of its template alone.
//
// The record is the RunnerTask API's type: what a task ran is kept in one
// shape, the one the API versions. The orchestrator protocol converts it to
// its own wire type (orchestrator.Record), so neither API changes when the
// other does.
func ReadRecord(ctx context.Context, c client.Reader, j *batchv1.Job) (*v1alpha1.TaskRecord, error) {
	rec := &v1alpha1.TaskRecord{TemplateDigest: j.Annotations[AnnotationTemplateDigest]}
	// Only the Job's own pods (IsPodOf): the record annotations of a pod
	// planted with the Job's job-name label are the planter's words.
	pods, err := PodsOf(ctx, c, j, false)
	if err != nil {
		return rec, fmt.Errorf("reading the record of job %s: %w", j.Name, err)
	}
	var pod *corev1.Pod
	for i := range pods {
		if p := &pods[i]; pod == nil || pod.CreationTimestamp.Before(&p.CreationTimestamp) {
			pod = p
		}
	}
	if pod == nil {
		return rec, nil
	}
	rec.Pod, rec.Node = pod.Name, pod.Spec.NodeName
	rec.SpecDigest = pod.Annotations[contract.AnnotationSpecDigest]
	rec.ShortSpecDigest = Short(rec.SpecDigest)
	rec.PolicyDigest = pod.Annotations[contract.AnnotationPolicyDigest]
	if m := pod.Annotations[contract.AnnotationMutations]; m != "" {
		rec.Mutations = strings.Split(m, ", ")
	}
	if w := pod.Annotations[contract.AnnotationWarnings]; w != "" {
		rec.Warnings = strings.Split(w, "; ")
	}
	for _, s := range append(append([]corev1.ContainerStatus{}, pod.Status.InitContainerStatuses...), pod.Status.ContainerStatuses...) {
		rec.Images = append(rec.Images, v1alpha1.ImageRecord{Container: s.Name, Image: s.Image, ImageID: s.ImageID})
		if s.Name != RunnerContainer {
			continue
		}
		switch {
		case s.State.Terminated != nil:
			rec.StartedAt, rec.FinishedAt = timePtr(s.State.Terminated.StartedAt), timePtr(s.State.Terminated.FinishedAt)
		case s.State.Running != nil:
			rec.StartedAt = timePtr(s.State.Running.StartedAt)
		}
	}
	return rec, nil
}

// Short is the first 12 hexadecimal digits of a "sha256:" digest, for
// listings.
func Short(digest string) string {
	d := strings.TrimPrefix(digest, "sha256:")
	if len(d) > 12 {
		return d[:12]
	}
	return d
}

func timePtr(t metav1.Time) *metav1.Time {
	if t.IsZero() {
		return nil
	}
	return &t
}
