package job

import "testing"

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
