package orchestrator

import (
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/runwarden/runwarden/dispatcher/api/v1alpha1"
	"github.com/runwarden/runwarden/dispatcher/job"
)

// jobTask is the task as the Job builder takes it: plain env values only
// (the protocol has no other kind), in namespace unless the task names one.
func jobTask(t Task, namespace string) job.Task {
	jt := job.Task{
		ID: t.ID, Namespace: t.Namespace, Image: t.Image, Command: t.Command, Args: t.Args,
		SecretEnv: t.SecretEnv, RepoURL: t.RepoURL, ActiveDeadlineSeconds: t.ActiveDeadlineSeconds,
		Resources: t.Resources, Queue: t.Queue, PriorityClass: t.PriorityClass,
	}
	for _, e := range t.Env {
		jt.Env = append(jt.Env, corev1.EnvVar{Name: e.Name, Value: e.Value})
	}
	if jt.Namespace == "" {
		jt.Namespace = namespace
	}
	return jt
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
