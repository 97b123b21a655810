package orchestrator_test

import (
	"context"
	"crypto/rand"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	crclient "sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/reconcile"

	"github.com/runwarden/runwarden/dispatcher/job"
	"github.com/runwarden/runwarden/dispatcher/orchestrator"
	"github.com/runwarden/runwarden/dispatcher/orchestrator/orchestratortest"
	"github.com/runwarden/runwarden/dispatcher/runner"
	"github.com/runwarden/runwarden/internal/resolve"
)

// withUIDs gives each object created a UID, as the API server does (the
// fake client does not): a Job's pods are told by its UID (job.IsPodOf).
func withUIDs() interceptor.Funcs {
	return interceptor.Funcs{Create: func(ctx context.Context, c crclient.WithWatch, o crclient.Object, opts ...crclient.CreateOption) error {
		if o.GetUID() == "" {
			o.SetUID(types.UID(rand.Text()))
		}
		return c.Create(ctx, o, opts...)
	}}
}

// A leased task whose pod's secret resolver fails (a reference the store
// denies) ends, at the orchestrator, with a Failed event of reason
// SecretResolutionFailed whose message names the variable and the
// reference, as the resolver's termination message does. The source polls
// the lease and creates the Job itself; the test plays the Job controller
// and the kubelet (the fake client runs neither) and the controller that
// calls Reconcile.
//
// It lives in package orchestrator_test because orchestratortest imports
// package orchestrator.
func TestSourceReportsSecretResolutionFailure(t *testing.T) {
	t.Parallel()
	const (
		ref = "${vault:secret/db.password@team-a}"
		// As resolvecmd writes it to the termination log.
		termination = "runwarden: resolving secret references: container main env TF_VAR_db_password: " + ref +
			": vault: reading secret/data/db: permission denied (after 1 tries)"
	)
	srv := orchestratortest.New(orchestratortest.Options{MaxWait: time.Second})
	srv.Start()
	t.Cleanup(srv.Close)
	c, err := orchestrator.NewClient(orchestrator.ClientOptions{URL: srv.URL(), DispatcherID: "d-1", Transport: srv.Client().Transport})
	if err != nil {
		t.Fatal(err)
	}
	srv.Add(orchestrator.Task{ID: "t-1", Image: "runner:1", Env: []orchestrator.EnvVar{{Name: "TF_VAR_db_password", Value: ref}}})

	kube := fake.NewClientBuilder().WithIndex(&corev1.Event{}, "involvedObject.name", func(o crclient.Object) []string {
		return []string{o.(*corev1.Event).InvolvedObject.Name}
	}).WithInterceptorFuncs(withUIDs()).Build()
	s := orchestrator.New(orchestrator.Options{
		Client: c, Kube: kube, Namespace: "runners", Options: runner.Options{MaxConcurrent: 1}, PollWait: time.Second,
		Jobs: job.Options{
			DispatcherID: "d-1", EnvAllowList: []string{"TF_VAR_*"},
			Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{{Name: job.RunnerContainer, Image: "runner:1"}}}},
		},
	})
	ctx, cancel := context.WithCancel(t.Context())
	stopped := make(chan error, 1)
	go func() { stopped <- s.Start(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-stopped; err != nil {
			t.Errorf("the source stopped with %v", err)
		}
	})

	// The source asks for the Job to be reconciled once it has made it
	// (Secret, Job, resumed).
	key := types.NamespacedName{Namespace: "runners", Name: job.Name("t-1")}
	select {
	case e := <-s.Enqueued():
		if got := crclient.ObjectKeyFromObject(e.Object); got != key {
			t.Fatalf("the source enqueued %s, want the task's Job %s", got, key)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("the source did not make the task's Job within 20 s")
	}
	var j batchv1.Job
	if err := kube.Get(t.Context(), key, &j); err != nil {
		t.Fatal(err)
	}
	if got := j.Spec.Template.Spec.Containers[0].Env; len(got) != 1 || got[0].Value != ref {
		t.Fatalf("the Job's runner env is %+v, want the reference as the task sent it (the webhook rewrites it)", got)
	}

	// The resolver init container exits 1 with its message; the pod fails,
	// and so does the Job. (The fake client keeps status apart, as the API
	// server does.)
	pod := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{Name: j.Name + "-abcde", Namespace: j.Namespace, Labels: map[string]string{"batch.kubernetes.io/job-name": j.Name},
			// As the Job controller makes the Job's pod (job.IsPodOf).
			OwnerReferences: []metav1.OwnerReference{{APIVersion: "batch/v1", Kind: "Job", Name: j.Name, UID: j.UID, Controller: ptr.To(true)}},
			// As runwarden's webhook records an admitted runner pod.
			Annotations: map[string]string{"runwarden.dev/spec-digest": "sha256:" + strings.Repeat("ab", 32), "runwarden.dev/policy-digest": "0123456789ab",
				"runwarden.dev/mutations": "env AWS_ROLE_ARN, secret references resolved in the pod"}},
		Spec: corev1.PodSpec{NodeName: "node-1"},
		Status: corev1.PodStatus{Phase: corev1.PodFailed, InitContainerStatuses: []corev1.ContainerStatus{{
			Image: "localhost/runwarden/webhook:1", ImageID: "localhost/runwarden/webhook@sha256:" + strings.Repeat("cd", 32),
			Name: resolve.InitContainer, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Reason: "Error", Message: termination + "\n"}},
		}}},
	}
	maps.Copy(pod.Labels, j.Spec.Template.Labels)
	status := pod.Status
	if err := kube.Create(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	pod.Status = status
	if err := kube.Status().Update(t.Context(), pod); err != nil {
		t.Fatal(err)
	}
	j.Status.Conditions = append(j.Status.Conditions, batchv1.JobCondition{
		Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: batchv1.JobReasonBackoffLimitExceeded, Message: "Job has reached the specified backoff limit",
	})
	if err := kube.Status().Update(t.Context(), &j); err != nil {
		t.Fatal(err)
	}

	// Reconcile as the Job's watch would: the Job is made, so this one
	// reconcile reports the outcome.
	if _, err := s.Reconcile(t.Context(), reconcile.Request{NamespacedName: key}); err != nil {
		t.Fatalf("reconcile: %v", err)
	}
	rec := srv.Task("t-1")
	if !rec.Done() {
		t.Fatalf("no final event at the orchestrator after the Job's reconcile: %+v", rec.Events)
	}
	final := rec.Final
	if final.Type != orchestrator.EventFailed || final.Reason != job.ReasonSecretResolution || final.JobName != j.Name {
		t.Errorf("final event %s, reason %q, job %q; want %s, %q, %q", final.Type, final.Reason, final.JobName, orchestrator.EventFailed, job.ReasonSecretResolution, j.Name)
	}
	for _, want := range []string{"TF_VAR_db_password", ref, "permission denied"} {
		if !strings.Contains(final.Message, want) {
			t.Errorf("final message %q does not name %q", final.Message, want)
		}
	}
	// The final event carries the task's record, from the pod.
	want := &orchestrator.Record{
		SpecDigest: "sha256:" + strings.Repeat("ab", 32), PolicyDigest: "0123456789ab", TemplateDigest: j.Annotations[job.AnnotationTemplateDigest],
		Mutations: []string{"env AWS_ROLE_ARN", "secret references resolved in the pod"},
		Images:    []orchestrator.ImageRecord{{Container: resolve.InitContainer, Image: "localhost/runwarden/webhook:1", ImageID: "localhost/runwarden/webhook@sha256:" + strings.Repeat("cd", 32)}},
		Node:      "node-1", Pod: pod.Name,
	}
	if diff := cmp.Diff(want, final.Record); diff != "" || want.TemplateDigest == "" {
		t.Errorf("the final event's record (-want +got):\n%s", diff)
	}
	if rec.FinalStored != 1 || rec.BadKeys != 0 {
		t.Errorf("%d final events stored, %d with a bad idempotency key; want 1 and 0", rec.FinalStored, rec.BadKeys)
	}
	if err := kube.Get(t.Context(), key, &j); err != nil || j.Annotations[orchestrator.AnnotationReported] != "true" {
		t.Errorf("the Job is not marked reported: %v, annotations %v", err, j.Annotations)
	}
}
