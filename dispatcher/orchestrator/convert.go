package orchestrator

import (
	"cmp"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/dispatcher/job"
)

// jobTask is the task as the Job builder takes it, in namespace unless
// the task names one, or why it can never run: another namespace, a
// variable that is not a value (plainEnv), or a quantity Kubernetes cannot
// read (kubeResources). It is where a task's wire types become the
// dispatcher's and Kubernetes'.
func jobTask(t Task, namespace string) (job.Task, error) {
	jt := job.Task{
		ID: t.ID, Namespace: cmp.Or(t.Namespace, namespace), Image: t.Image, Command: t.Command, Args: t.Args,
		SecretEnv: t.SecretEnv, RepoURL: t.RepoURL, ActiveDeadlineSeconds: t.ActiveDeadlineSeconds,
		Queue: t.Queue, PriorityClass: t.PriorityClass,
	}
	if jt.Namespace != namespace {
		return job.Task{}, fmt.Errorf("%w: namespace %q: this dispatcher runs tasks in %q only", job.ErrInvalidTask, jt.Namespace, namespace)
	}
	if err := plainEnv(t); err != nil {
		return job.Task{}, err
	}
	for _, e := range t.Env {
		jt.Env = append(jt.Env, corev1.EnvVar{Name: e.Name, Value: e.Value})
	}
	res, err := kubeResources(t.Resources)
	if err != nil {
		return job.Task{}, err
	}
	jt.Resources = res
	return jt, nil
}

// plainEnv refuses a task whose env sends a valueFrom: the protocol's
// variables carry values (a Secret's values go in secretEnv).
func plainEnv(t Task) error {
	for i, e := range t.Env {
		if len(e.ValueFrom) > 0 && string(e.ValueFrom) != "null" {
			return fmt.Errorf("%w: %w: env[%d] (%s): valueFrom is not part of the protocol; a task's variables carry values, and secret values go in secretEnv", job.ErrInvalidTask, job.ErrEnvSource, i, e.Name)
		}
	}
	return nil
}

// kubeResources are the task's resources as Kubernetes' type, or which
// quantity Kubernetes cannot read. Quantities are read as Kubernetes reads
// them in JSON: surrounding spaces trimmed.
func kubeResources(r *Resources) (*corev1.ResourceRequirements, error) {
	if r == nil {
		return nil, nil
	}
	limits, err := resourceList("limits", r.Limits)
	if err != nil {
		return nil, err
	}
	requests, err := resourceList("requests", r.Requests)
	if err != nil {
		return nil, err
	}
	k := &corev1.ResourceRequirements{Limits: limits, Requests: requests}
	for _, c := range r.Claims {
		k.Claims = append(k.Claims, corev1.ResourceClaim{Name: c.Name, Request: c.Request})
	}
	return k, nil
}

// resourceList is one of the task's resource lists, field, as Kubernetes'
// type. The first bad quantity in the order of the names is the one told.
func resourceList(field string, l map[string]Quantity) (corev1.ResourceList, error) {
	if l == nil {
		return nil, nil
	}
	k := make(corev1.ResourceList, len(l))
	for _, name := range slices.Sorted(maps.Keys(l)) {
		q, err := resource.ParseQuantity(strings.TrimSpace(string(l[name])))
		if err != nil {
			return nil, fmt.Errorf("%w: resources.%s[%s]: %q is not a quantity (%w); write one as Kubernetes does, such as 500m, 2 or 1Gi", job.ErrInvalidTask, field, name, l[name], err)
		}
		k[corev1.ResourceName(name)] = q
	}
	return k, nil
}

// wireRecord converts the dispatcher's task record (the RunnerTask API's
// TaskRecord) to the protocol's.
func wireRecord(r *v1alpha1.TaskRecord) *Record {
	if r == nil {
		return nil
	}
	w := &Record{
		SpecDigest: r.SpecDigest, PolicyDigest: r.PolicyDigest, TemplateDigest: r.TemplateDigest,
		Mutations: r.Mutations, Warnings: r.Warnings, Node: r.Node, Pod: r.Pod,
		StartedAt: wireTime(r.StartedAt), FinishedAt: wireTime(r.FinishedAt),
	}
	for _, i := range r.Images {
		w.Images = append(w.Images, ImageRecord{Container: i.Container, Image: i.Image, ImageID: i.ImageID})
	}
	return w
}

// wireTime is a Kubernetes time as the protocol sends it: UTC, whole
// seconds, as the API server keeps it.
func wireTime(t *metav1.Time) *time.Time {
	if t == nil {
		return nil
	}
	u := t.UTC().Truncate(time.Second)
	return &u
}
