package job

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/runwarden/runwarden/internal/contract"
)

func TestDeniedByAdmission(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		msg  string
		want bool
	}{
		{name: "webhook denial", msg: `FailedCreate: Error creating: admission webhook "pods.runwarden.dev" denied the request: runwarden policy: no-privileged: ...`, want: true},
		{name: "pod security", msg: `FailedCreate: Error creating: pods "x" is forbidden: violates PodSecurity "restricted:latest": ...`, want: true},
		{name: "quota", msg: `FailedCreate: Error creating: pods "x" is forbidden: exceeded quota: compute`, want: true},
		{name: "webhook unreachable", msg: `FailedCreate: Error creating: Internal error occurred: failed calling webhook "pods.runwarden.dev": failed to call webhook: ... connect: connection refused`, want: false},
		{name: "webhook timeout", msg: `FailedCreate: Error creating: Internal error occurred: failed calling webhook "pods.runwarden.dev": ... context deadline exceeded`, want: false},
		{name: "webhook that could not decide", msg: `Error creating: Internal error occurred: failed calling webhook "pods.runwarden.dev": failed to call webhook: an error on the server ("runwarden webhook could not decide, so it neither admits nor denies the pod (its creator tries again): evaluating data.runwarden.admission.decision: eval_conflict_error") has prevented the request from succeeding`, want: false},
		{name: "webhook that could not decide, quoting a refused read", msg: `Error creating: Internal error occurred: failed calling webhook "pods.runwarden.dev": failed to call webhook: an error on the server ("runwarden webhook could not decide, so it neither admits nor denies the pod (its creator tries again): reading namespace team-a: namespaces \"team-a\" is forbidden: User \"system:serviceaccount:runwarden:webhook\" cannot get resource") has prevented the request from succeeding`, want: false},
		{name: "webhook denial quoting a failed call", msg: `Error creating: admission webhook "pods.runwarden.dev" denied the request: runwarden policy: image: failed calling webhook "x"`, want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if got := DeniedByAdmission(tt.msg); got != tt.want {
				t.Errorf("DeniedByAdmission(%q) = %v, want %v", tt.msg, got, tt.want)
			}
		})
	}
}

// TestOutcomeReadsEachFailedCreate checks a Job whose pod the Job
// controller could not create: only a FailedCreate event that is a denial
// fails the task, read one event at a time.
func TestOutcomeReadsEachFailedCreate(t *testing.T) {
	t.Parallel()
	const (
		undecided = `Error creating: Internal error occurred: failed calling webhook "pods.runwarden.dev": failed to call webhook: an error on the server ("runwarden webhook could not decide, so it neither admits nor denies the pod (its creator tries again): reading namespace team-a: namespaces \"team-a\" is forbidden: User \"webhook\" cannot get resource \"namespaces\"") has prevented the request from succeeding`
		denied    = `Error creating: admission webhook "pods.runwarden.dev" denied the request: runwarden policy: no-privileged: container "main" is privileged`
	)
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	tests := []struct {
		name   string
		events []string
		want   Outcome
	}{
		{name: "no event", want: Outcome{}},
		{name: "webhook could not decide", events: []string{undecided}, want: Outcome{}},
		{name: "could not decide, then denied", events: []string{undecided, denied}, want: Outcome{Phase: PhaseFailed, Reason: ReasonAdmission, Stop: true,
			Message: "FailedCreate: " + undecided + "; FailedCreate: " + denied}},
		{name: "denied", events: []string{denied}, want: Outcome{Phase: PhaseFailed, Reason: ReasonAdmission, Stop: true, Message: "FailedCreate: " + denied}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			j := &batchv1.Job{ObjectMeta: metav1.ObjectMeta{Name: "rw-t-1", Namespace: "runners", CreationTimestamp: metav1.NewTime(created)}}
			b := fake.NewClientBuilder().WithIndex(&corev1.Event{}, "involvedObject.name", func(o client.Object) []string {
				return []string{o.(*corev1.Event).InvolvedObject.Name}
			})
			for i, m := range tt.events {
				b = b.WithObjects(&corev1.Event{
					ObjectMeta:     metav1.ObjectMeta{Name: fmt.Sprintf("e%d", i), Namespace: "runners"},
					InvolvedObject: corev1.ObjectReference{Kind: "Job", Name: j.Name, Namespace: "runners"},
					Type:           corev1.EventTypeWarning, Reason: "FailedCreate", Message: m,
				})
			}
			o := Observer{Client: b.Build(), Now: func() time.Time { return created.Add(time.Minute) }}
			got, err := o.Outcome(t.Context(), j)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("outcome (-want +got):\n%s", diff)
			}
		})
	}
}

// A failed secret resolution is reported as SecretResolutionFailed with the
// init container's termination message; an init container that cannot
// start fails the task as its runner container would.
func TestOutcomeOfInitContainers(t *testing.T) {
	t.Parallel()
	const msg = "runwarden: resolving secret references: container main env TF_VAR_db: ${vault:secret/db.password@ns}: vault: reading secret/data/db: access denied"
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	failed := batchv1.JobCondition{Type: batchv1.JobFailed, Status: corev1.ConditionTrue, Reason: "BackoffLimitExceeded", Message: "Job has reached the specified backoff limit"}
	tests := []struct {
		name       string
		conditions []batchv1.JobCondition
		status     corev1.ContainerStatus
		want       Outcome
	}{
		{"resolution failed", []batchv1.JobCondition{failed}, corev1.ContainerStatus{Name: "runwarden-secrets", State: corev1.ContainerState{
			Terminated: &corev1.ContainerStateTerminated{ExitCode: 1, Message: msg + "\n"},
		}}, Outcome{Phase: PhaseFailed, Reason: ReasonSecretResolution, Message: failed.Message + " " + msg}},
		{"resolver image cannot be pulled", nil, corev1.ContainerStatus{Name: "runwarden-secrets", State: corev1.ContainerState{
			Waiting: &corev1.ContainerStateWaiting{Reason: "ImagePullBackOff", Message: "Back-off pulling image"},
		}}, Outcome{Phase: PhaseFailed, Reason: ReasonImagePullError, Message: "init container runwarden-secrets: Back-off pulling image", Stop: true}},
		{"runner image never pulled and absent", nil, corev1.ContainerStatus{Name: "runwarden-secrets", State: corev1.ContainerState{
			Waiting: &corev1.ContainerStateWaiting{Reason: "ErrImageNeverPull", Message: `Container image "localhost/absent:v1" is not present with pull policy of Never`},
		}}, Outcome{Phase: PhaseFailed, Reason: ReasonImagePullError, Message: `init container runwarden-secrets: Container image "localhost/absent:v1" is not present with pull policy of Never`, Stop: true}},
		{"resolver still running", nil, corev1.ContainerStatus{Name: "runwarden-secrets", State: corev1.ContainerState{
			Running: &corev1.ContainerStateRunning{},
		}}, Outcome{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			j := ownJob()
			j.CreationTimestamp, j.Status = metav1.NewTime(created), batchv1.JobStatus{Conditions: tt.conditions}
			pod := ownPod(j, "rw-t-1-abcde", created)
			pod.Status = corev1.PodStatus{Phase: corev1.PodPending, InitContainerStatuses: []corev1.ContainerStatus{tt.status}}
			c := fake.NewClientBuilder().WithObjects(pod).WithIndex(&corev1.Event{}, "involvedObject.name", func(o client.Object) []string {
				return []string{o.(*corev1.Event).InvolvedObject.Name}
			}).Build()
			got, err := Observer{Client: c, Now: func() time.Time { return created.Add(10 * time.Second) }}.Outcome(t.Context(), j)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("outcome (-want +got):\n%s", diff)
			}
		})
	}
}

// TestOutcomeSuccessNeedsTheRunnersExit: a Job's Complete condition is
// believed only with a pod of its own whose runner container exited 0. A
// pod planted with the Job's selector label and adopted by the Job
// controller (its controller reference is the Job's, but it has no runner
// label: the webhook keeps that to the Job controller's pods) completes the
// Job when it exits 0; the task is not reported Succeeded for it.
func TestOutcomeSuccessNeedsTheRunnersExit(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	complete := batchv1.JobCondition{Type: batchv1.JobComplete, Status: corev1.ConditionTrue, Reason: "CompletionsReached", Message: "Reached expected number of succeeded pods"}
	terminated := func(code int32) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: RunnerContainer, State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: code}}}
	}
	running := corev1.ContainerStatus{Name: RunnerContainer, State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
	type pod struct {
		planted bool
		phase   corev1.PodPhase
		status  corev1.ContainerStatus
	}
	tests := []struct {
		name string
		pods []pod
		want Outcome
	}{
		{name: "the runner exited 0", pods: []pod{{phase: corev1.PodSucceeded, status: terminated(0)}},
			want: Outcome{Phase: PhaseSucceeded, Reason: ReasonCompleted, Message: complete.Message, ExitCode: ptr.To[int32](0), Running: true}},
		{name: "an adopted planted pod exited 0, the runner was killed", pods: []pod{
			{planted: true, phase: corev1.PodSucceeded, status: terminated(0)}, {phase: corev1.PodFailed, status: terminated(137)}},
			want: Outcome{Phase: PhaseFailed, Reason: ReasonRunnerNotSucceeded, ExitCode: ptr.To[int32](137), Running: true,
				Message: "the Job reports success, but no pod of its own has its runner container terminated with exit code 0 (the runner exited 137): " + complete.Message}},
		{name: "an adopted planted pod exited 0, the runner pod deleted", pods: []pod{{planted: true, phase: corev1.PodSucceeded, status: terminated(0)}},
			want: Outcome{Phase: PhaseFailed, Reason: ReasonRunnerNotSucceeded,
				Message: "the Job reports success, but no pod of its own has its runner container terminated with exit code 0 (it has no pod of its own left: a pod it adopted through its selector ended it, or its pod was deleted): " + complete.Message}},
		{name: "an adopted planted pod exited 0, the runner still stopping", pods: []pod{
			{planted: true, phase: corev1.PodSucceeded, status: terminated(0)}, {phase: corev1.PodRunning, status: running}},
			want: Outcome{Running: true}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			j := ownJob()
			j.CreationTimestamp = metav1.NewTime(created)
			j.Status.Conditions = []batchv1.JobCondition{complete}
			b := fake.NewClientBuilder().WithIndex(&corev1.Event{}, "involvedObject.name", func(o client.Object) []string {
				return []string{o.(*corev1.Event).InvolvedObject.Name}
			})
			for i, p := range tt.pods {
				own := ownPod(j, fmt.Sprintf("rw-t-1-%d", i), created)
				if p.planted {
					// Adopted through batch.kubernetes.io/controller-uid: the
					// Job controller made itself its controller.
					delete(own.Labels, contract.LabelRunner)
				}
				own.Status = corev1.PodStatus{Phase: p.phase, ContainerStatuses: []corev1.ContainerStatus{p.status}}
				b = b.WithObjects(own)
			}
			got, err := Observer{Client: b.Build(), Now: func() time.Time { return created.Add(time.Minute) }}.Outcome(t.Context(), j)
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("outcome (-want +got):\n%s", diff)
			}
		})
	}
}

// TestOutcomeIgnoresEventsOfAnotherUID: a FailedCreate event about an
// earlier Job of the same name (another UID) does not fail this one.
func TestOutcomeIgnoresEventsOfAnotherUID(t *testing.T) {
	t.Parallel()
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	j := ownJob()
	j.CreationTimestamp = metav1.NewTime(created)
	c := fake.NewClientBuilder().WithIndex(&corev1.Event{}, "involvedObject.name", func(o client.Object) []string {
		return []string{o.(*corev1.Event).InvolvedObject.Name}
	}).WithObjects(&corev1.Event{
		ObjectMeta:     metav1.ObjectMeta{Name: "e", Namespace: j.Namespace},
		InvolvedObject: corev1.ObjectReference{Kind: "Job", Name: j.Name, Namespace: j.Namespace, UID: "an-earlier-job"},
		Type:           corev1.EventTypeWarning, Reason: "FailedCreate", Message: `Error creating: admission webhook "pods.runwarden.dev" denied the request: no`,
	}).Build()
	got, err := Observer{Client: c, Now: func() time.Time { return created.Add(time.Minute) }}.Outcome(t.Context(), j)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(Outcome{}, got); diff != "" {
		t.Errorf("outcome (-want +got):\n%s", diff)
	}
}

// TestIsNamedFor: a Job is taken for the task its annotation names only
// when its name and task label are that task's.
func TestIsNamedFor(t *testing.T) {
	t.Parallel()
	j, _, err := Build(Task{ID: "t-1", Namespace: "runners", Image: "runner:1"}, Options{DispatcherID: "d"})
	if err != nil {
		t.Fatal(err)
	}
	if !IsNamedFor(j, "t-1") {
		t.Errorf("the Job Build made for t-1 is not named for it: %s %v", j.Name, j.Labels)
	}
	if IsNamedFor(j, "t-2") || IsNamedFor(j, "") {
		t.Errorf("t-1's Job %s taken for t-2's or no task's", j.Name)
	}
}
