package job

import (
	"fmt"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
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
