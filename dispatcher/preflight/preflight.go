// Package preflight proves, before the dispatcher takes any task, that a
// runner can run where its Jobs go: a throwaway Job shaped like a real
// runner must get its pod admitted (RBAC, Pod Security, admission webhooks,
// quota), Kueue must serve the queue tasks go to, and EnvFiles says whether
// resolved secret references can reach runner variables as env files. It
// is shared by every task source; it creates nothing that outlives it.
//
// TestRunner, what --test-runner (and so `helm test`) runs, makes its one
// runner Job here too, the same way as the preflight's throwaway Jobs.
package preflight

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/runwarden/runwarden/dispatcher/job"
)

// ErrFailed is wrapped by every preflight failure.
var ErrFailed = errors.New("preflight failed")

// Run waits this long at most, and looks at its Job this often, unless
// Options say otherwise.
const (
	runTimeout = 2 * time.Minute
	runPoll    = 500 * time.Millisecond
)

// tryFor is how long Run waits for one throwaway Job's pod, once the Job
// controller said it could not make it yet, before it tries a new Job.
const tryFor = 5 * time.Second

// Run creates a throwaway Job shaped like a real runner (the
// platform's template, a command that exits at once) and waits until its pod
// exists: that proves the dispatcher may create Jobs (RBAC) and that Pod
// Security, admission webhooks and quota admit a runner pod. It deletes the
// Job and returns nil, or an error naming the cause.
func Run(ctx context.Context, o Options) error {
	o.setDefaults(runTimeout, runPoll)
	ctx, cancel := withTimeout(ctx, o.Clock, o.Timeout)
	defer cancel()
	if q := o.Jobs.Queueing; q.Kueue {
		if err := checkQueue(ctx, o.Client, o.Namespace, q.DefaultQueue); err != nil {
			return err
		}
		// The throwaway Job proves admission of a runner pod, not Kueue's
		// quota: it does not queue.
		o.Jobs.Queueing = job.Queueing{}
	}
	var lastWarning string
	// A webhook that cannot be called yet (it may be starting beside the
	// dispatcher) is not a denial; the Job controller would retry it with
	// a growing backoff, so a new Job is tried instead.
	admitted, err := poll(ctx, o.Clock, o.Poll, func() (bool, error) {
		admitted, warning, err := tryOnce(ctx, o)
		if warning != "" {
			lastWarning = warning
		}
		return admitted, err
	})
	if err != nil || admitted {
		return err
	}
	cause := "no pod appeared"
	if lastWarning != "" {
		cause = "last warning: " + lastWarning
	}
	return fmt.Errorf("%w: no runner pod within %s in %s (%s)", ErrFailed, o.Timeout, o.Namespace, strings.TrimSpace(cause))
}

// tryOnce creates one throwaway Job and waits for its pod: until it is
// made, the Job controller refuses it for good (an error), or, past tryFor,
// says it could not make it yet (the transient warning it returns, for the
// caller to try a new Job).
func tryOnce(ctx context.Context, o Options) (bool, string, error) {
	t := job.Task{
		ID:        "preflight/" + o.Jobs.DispatcherID + "/" + suffix(),
		Namespace: o.Namespace,
		Command:   []string{"/bin/sh", "-c", "exit 0"},
	}
	opts := o.Jobs
	opts.EnvAllowList = nil
	j, _, err := job.Build(t, opts)
	if err != nil {
		return false, "", fmt.Errorf("%w: the pod template cannot make a Job: %w", ErrFailed, err)
	}
	j.Spec.TTLSecondsAfterFinished = ptr.To[int32](60)
	remove, err := o.create(ctx, j)
	if err != nil {
		return false, "", createRefused(o.Namespace, err)
	}
	defer remove()
	warning := ""
	look := func() (bool, error) {
		// Only the Job's own pod proves admission (job.IsPodOf), not one
		// planted with its job-name label.
		if pods, err := job.PodsOf(ctx, o.Client, j, false); err == nil && len(pods) > 0 {
			return true, nil
		}
		// About this Job (its kind and UID), not another object of its
		// name: events about other kinds are anyone's to write (the
		// writers policy).
		for _, e := range (job.Observer{Client: o.Client}).JobWarnings(ctx, j) {
			if e.Reason != "FailedCreate" {
				continue
			}
			if job.DeniedByAdmission(e.Message) {
				return false, fmt.Errorf("%w: a runner pod is not admitted in %s (Pod Security, an admission webhook or quota): %s", ErrFailed, o.Namespace, e.Message)
			}
			warning = e.Message
		}
		return false, nil
	}
	for {
		window, cancel := withTimeout(ctx, o.Clock, tryFor)
		admitted, err := poll(window, o.Clock, o.Poll, look)
		cancel()
		if err != nil || admitted {
			return admitted, "", err
		}
		// A Job the Job controller has not said a word about yet (a
		// loaded control plane) is watched on: a new one would only start
		// over behind it. One it could not make a pod for is left for a
		// new Job, which the Job controller's backoff does not hold.
		if warning != "" || ctx.Err() != nil {
			return false, warning, nil
		}
	}
}

// createRefused names the cause of a failed Job creation: a 403 is RBAC,
// an exhausted quota, or an admission webhook or policy that refuses the
// Job itself; each needs a different fix.
func createRefused(namespace string, err error) error {
	switch {
	case job.IsPermanent(err):
		return fmt.Errorf("%w: the runner Job is not admitted in %s (an admission webhook or policy on Jobs): %w", ErrFailed, namespace, err)
	case apierrors.IsForbidden(err) && strings.Contains(err.Error(), "exceeded quota"):
		return fmt.Errorf("%w: the runner Job is over a ResourceQuota in %s: %w", ErrFailed, namespace, err)
	case apierrors.IsForbidden(err):
		return fmt.Errorf("%w: the dispatcher may not create Jobs in %s (RBAC): %w", ErrFailed, namespace, err)
	}
	return fmt.Errorf("%w: creating a Job in %s: %w", ErrFailed, namespace, err)
}

// ErrNoEnvFiles says the API server drops or refuses fileKeyRef, the way
// resolved secret references reach runner variables.
var ErrNoEnvFiles = errors.New("the cluster does not take env files (fileKeyRef)")

// EnvFiles checks, with a server-side dry run of a runner Job whose
// variable reads an env file, that the API server keeps valueFrom.fileKeyRef
// (Kubernetes EnvFiles: beta and on by default since 1.35). Without it,
// resolved secret references cannot reach runner variables: the platform
// configuration's secretDelivery: files delivers them as files instead.
// Nothing is stored.
func EnvFiles(ctx context.Context, o Options) error {
	opts := o.Jobs
	opts.EnvAllowList = nil
	j, _, err := job.Build(job.Task{ID: "preflight/" + o.Jobs.DispatcherID + "/envfiles", Namespace: o.Namespace, Command: []string{"true"}}, opts)
	if err != nil {
		return fmt.Errorf("%w: the pod template cannot make a Job: %w", ErrFailed, err)
	}
	j.Annotations[job.AnnotationPreflight] = "true"
	spec := &j.Spec.Template.Spec
	spec.Volumes = append(spec.Volumes, corev1.Volume{Name: "runwarden-envfiles-probe", VolumeSource: corev1.VolumeSource{EmptyDir: &corev1.EmptyDirVolumeSource{}}})
	main := &spec.Containers[0]
	for i := range spec.Containers {
		if spec.Containers[i].Name == job.RunnerContainer {
			main = &spec.Containers[i]
		}
	}
	main.Env = append(main.Env, corev1.EnvVar{Name: "RUNWARDEN_ENVFILES_PROBE", ValueFrom: &corev1.EnvVarSource{FileKeyRef: &corev1.FileKeySelector{
		VolumeName: "runwarden-envfiles-probe", Path: "probe.env", Key: "PROBE",
	}}})
	if err := o.Client.Create(ctx, j, client.DryRunAll); err != nil {
		if apierrors.IsInvalid(err) && strings.Contains(err.Error(), "valueFrom") {
			return fmt.Errorf("%w: %w", ErrNoEnvFiles, err)
		}
		return fmt.Errorf("%w: checking env files with a dry run in %s: %w", ErrFailed, o.Namespace, err)
	}
	for _, c := range j.Spec.Template.Spec.Containers {
		for _, e := range c.Env {
			if e.Name == "RUNWARDEN_ENVFILES_PROBE" && (e.ValueFrom == nil || e.ValueFrom.FileKeyRef == nil) {
				return fmt.Errorf("%w: the API server dropped it (the EnvFiles feature gate is off, or it is older than 1.34)", ErrNoEnvFiles)
			}
		}
	}
	return nil
}

// checkQueue checks that Kueue serves LocalQueues and, if the dispatcher
// has a default queue, that it exists in namespace.
func checkQueue(ctx context.Context, c client.Reader, namespace, queue string) error {
	gvk := job.WorkloadGVK.GroupVersion().WithKind("LocalQueue")
	if queue == "" {
		var list unstructured.UnstructuredList
		list.SetGroupVersionKind(gvk.GroupVersion().WithKind("LocalQueueList"))
		if err := c.List(ctx, &list, client.InNamespace(namespace), client.Limit(1)); err != nil {
			return fmt.Errorf("%w: --kueue, but LocalQueues cannot be read in %s (is Kueue installed, its CRDs at %s, and may the dispatcher list localqueues?): %w", ErrFailed, namespace, gvk.GroupVersion(), err)
		}
		return nil
	}
	lq := &unstructured.Unstructured{}
	lq.SetGroupVersionKind(gvk)
	err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: queue}, lq)
	switch {
	case err == nil:
		return nil
	case apierrors.IsNotFound(err) && !meta.IsNoMatchError(err):
		return fmt.Errorf("%w: --default-queue %s: no LocalQueue %s in %s; make it (a LocalQueue pointing at a ClusterQueue) or name another", ErrFailed, queue, queue, namespace)
	default:
		return fmt.Errorf("%w: --kueue, but LocalQueue %s cannot be read in %s (is Kueue installed, its CRDs at %s, and may the dispatcher get localqueues?): %w", ErrFailed, queue, namespace, gvk.GroupVersion(), err)
	}
}
