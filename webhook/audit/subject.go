// Package audit tells what a policy set does to runner pods that were
// already admitted: it rebuilds each pod as it was submitted to admission,
// admits it with the webhook's own code (admission.Handler.Admit, the
// mutating then the validating handler, as the API server calls them),
// compares two sets' outcomes (`runwarden-webhook policy audit`) and builds
// the PolicyReports the webhook writes for the set in force.
package audit

import (
	"cmp"
	"maps"
	"slices"
	"time"

	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"

	"github.com/runwarden/runwarden/internal/contract"
)

// Where a subject's pod comes from.
const (
	// SourceJobTemplate is a pod rebuilt from its Job's template, as the
	// Job controller submits it: before any mutation.
	SourceJobTemplate = "job template"
	// SourceAdmittedPod is a runner pod whose Job is gone: the pod as
	// admitted, the webhook's record annotations left out. Its mutations
	// are already in it, so a mutation both sets make shows as none.
	SourceAdmittedPod = "admitted pod (its Job is gone)"
)

// Ref names a Kubernetes object a result is about.
type Ref struct {
	Kind      string    `json:"kind"`
	Namespace string    `json:"namespace"`
	Name      string    `json:"name"`
	UID       types.UID `json:"uid,omitempty"`
}

// String is kind/namespace/name, lower-case kind, as kubectl names it.
func (r Ref) String() string {
	kind := map[string]string{"Pod": "pod", "Job": "job"}[r.Kind]
	return cmp.Or(kind, r.Kind) + "/" + r.Name
}

// Subject is one runner pod to admit, as it was submitted to admission.
type Subject struct {
	// Ref is what results name: the newest pod of the Job, or the Job
	// when none of its pods is left, or the pod whose Job is gone.
	Ref Ref `json:"ref"`
	// Job names the Job the pod came from, when known.
	Job string `json:"job,omitempty"`
	// Source is SourceJobTemplate, SourceAdmittedPod, or the file the pod
	// was read from.
	Source string `json:"source"`
	// Created orders subjects: the newest are kept under a cap.
	Created time.Time `json:"created"`
	// Pod is the pod as submitted to admission.
	Pod *corev1.Pod `json:"-"`
	// JobObject is the pod's Job, for the runner label's earned check;
	// nil when it is gone (the check is then not made).
	JobObject *batchv1.Job `json:"-"`
}

// FromJob rebuilds the pod a runner Job's controller submits: the
// template's labels, annotations and spec, the Job as controller, named
// after the Job. pods are the Job's pods if any (any order): the subject
// names the newest, which is what a user sees.
func FromJob(job *batchv1.Job, pods []corev1.Pod) Subject {
	t := job.Spec.Template
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: job.Name + "-",
			Namespace:    job.Namespace,
			Labels:       maps.Clone(t.Labels),
			Annotations:  maps.Clone(t.Annotations),
			OwnerReferences: []metav1.OwnerReference{{
				APIVersion: "batch/v1", Kind: "Job", Name: job.Name, UID: job.UID,
				Controller: ptr.To(true), BlockOwnerDeletion: ptr.To(true),
			}},
		},
		Spec: *t.Spec.DeepCopy(),
	}
	s := Subject{
		Ref: Ref{Kind: "Job", Namespace: job.Namespace, Name: job.Name, UID: job.UID},
		Job: job.Name, Source: SourceJobTemplate, Created: job.CreationTimestamp.Time,
		Pod: pod, JobObject: job,
	}
	var newest *corev1.Pod
	for i := range pods {
		p := &pods[i]
		if ref := metav1.GetControllerOfNoCopy(p); ref == nil || ref.UID != job.UID {
			continue
		}
		if newest == nil || p.CreationTimestamp.After(newest.CreationTimestamp.Time) {
			newest = p
		}
	}
	if newest != nil {
		s.Ref = Ref{Kind: "Pod", Namespace: newest.Namespace, Name: newest.Name, UID: newest.UID}
		s.Created = newest.CreationTimestamp.Time
	}
	return s
}

// FromPod is a runner pod as admitted, for when its Job is gone: only what
// a request carries (name, labels, annotations, owners, spec), without the
// node the scheduler chose and without the webhook's record, which would
// otherwise read as the set's own mutation.
func FromPod(p *corev1.Pod, source string) Subject {
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			Name: p.Name, GenerateName: p.GenerateName, Namespace: p.Namespace,
			Labels: maps.Clone(p.Labels), Annotations: maps.Clone(p.Annotations),
			OwnerReferences: slices.Clone(p.OwnerReferences),
		},
		Spec: *p.Spec.DeepCopy(),
	}
	pod.Spec.NodeName = ""
	for _, a := range []string{contract.AnnotationSpecDigest, contract.AnnotationPolicyDigest, contract.AnnotationMutations, contract.AnnotationWarnings} {
		delete(pod.Annotations, a)
	}
	s := Subject{
		Ref:    Ref{Kind: "Pod", Namespace: p.Namespace, Name: p.Name, UID: p.UID},
		Source: source, Created: p.CreationTimestamp.Time, Pod: pod,
	}
	if ref := metav1.GetControllerOfNoCopy(p); ref != nil && ref.Kind == "Job" {
		s.Job = ref.Name
	}
	return s
}

// Subjects are the runner pods of jobs and pods: one per runner Job (its
// template: what its every pod was submitted as), and one per runner pod
// whose Job is not among jobs. Newest first; at most max (0: all), the
// oldest dropped.
func Subjects(jobs []batchv1.Job, pods []corev1.Pod, max int) []Subject {
	byJob := map[types.UID][]corev1.Pod{}
	for _, p := range pods {
		if ref := metav1.GetControllerOfNoCopy(&p); ref != nil {
			byJob[ref.UID] = append(byJob[ref.UID], p)
		}
	}
	var out []Subject
	seen := map[types.UID]bool{}
	for i := range jobs {
		j := &jobs[i]
		if j.Spec.Template.Labels[contract.LabelRunner] != "true" {
			continue
		}
		seen[j.UID] = true
		out = append(out, FromJob(j, byJob[j.UID]))
	}
	for i := range pods {
		p := &pods[i]
		if p.Labels[contract.LabelRunner] != "true" {
			continue
		}
		if ref := metav1.GetControllerOfNoCopy(p); ref != nil && seen[ref.UID] {
			continue
		}
		out = append(out, FromPod(p, SourceAdmittedPod))
	}
	slices.SortStableFunc(out, func(a, b Subject) int {
		if c := b.Created.Compare(a.Created); c != 0 {
			return c
		}
		return cmp.Compare(a.Ref.Namespace+"/"+a.Ref.Name, b.Ref.Namespace+"/"+b.Ref.Name)
	})
	if max > 0 && len(out) > max {
		out = out[:max]
	}
	return out
}
