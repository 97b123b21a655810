package tests

import (
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/runwarden/runwarden/dispatcher/job"
)

// jobsPolicy is the rendered dispatcher Jobs policy's variables by name,
// and its validations' messages (messageExpression or message) in order.
func jobsPolicy(t *testing.T, args ...string) (map[string]string, []string) {
	t.Helper()
	objs := render(t, helm(t, "helm3"), args...)
	var p admissionregistrationv1.ValidatingAdmissionPolicy
	decode(t, objs, "ValidatingAdmissionPolicy/rw-runwarden-dispatcher-jobs", &p)
	vars := map[string]string{}
	for _, v := range p.Spec.Variables {
		vars[v.Name] = v.Expression
	}
	var messages []string
	for _, v := range p.Spec.Validations {
		m := v.Message
		if v.MessageExpression != "" {
			m = v.MessageExpression
		}
		messages = append(messages, m)
	}
	return vars, messages
}

// TestAdmissionPolicyBindsTasksSecrets: the Jobs policy binds a Job's own
// Secret to the prefix the dispatcher names tasks' Secrets with, and the
// Secrets policy makes the dispatcher's Secrets carry it, named after their
// owner. The policies' behaviour is proved on the API server by
// TestSecurityDispatcherBounds (e2e); this keeps the chart and the
// dispatcher's naming (job.SecretPrefix) in step.
func TestAdmissionPolicyBindsTasksSecrets(t *testing.T) {
	t.Parallel()
	vars, messages := jobsPolicy(t)
	if want := "'" + job.SecretPrefix + "' + object.metadata.name"; vars["ownSecret"] != want {
		t.Errorf("ownSecret = %q, want %q", vars["ownSecret"], want)
	}
	found := false
	for _, m := range messages {
		if m == "'runwarden: a Job of the dispatcher is named "+job.NamePrefix+"... (its names for tasks), not ' + object.metadata.name" {
			found = true
		}
	}
	if !found {
		t.Errorf("no validation names the dispatcher's Job name prefix %s: %q", job.NamePrefix, messages)
	}
	objs := render(t, helm(t, "helm3"))
	var p admissionregistrationv1.ValidatingAdmissionPolicy
	decode(t, objs, "ValidatingAdmissionPolicy/rw-runwarden-dispatcher-secrets", &p)
	var got []string
	for _, v := range p.Spec.Validations {
		got = append(got, v.Expression)
	}
	want := "object.metadata.name.startsWith('" + job.SecretPrefix + "')"
	if len(got) < 2 || got[1] != want {
		t.Errorf("the Secrets policy's second validation is %q, want %q", got, want)
	}
}

// TestAdmissionPolicyQueues: who else than the dispatcher may change a
// runner Job's spec (Kueue's controller, with kueue.enabled), and the
// LocalQueues and WorkloadPriorityClasses a namespace without its own lists
// allows (the chart's defaults).
func TestAdmissionPolicyQueues(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		want map[string]string
	}{
		{name: "defaults: no Kueue, no queue, no class", want: map[string]string{
			"specChanger":  `request.userInfo.username in [""]`,
			"defaultQueue": "[]", "defaultClass": "[]",
		}},
		{name: "kueue with its default service account", args: []string{"--set", "queueing.kueue.enabled=true", "--set", "queueing.kueue.defaultQueue=runners", "--set", "queueing.defaultPriorityClass=routine"},
			want: map[string]string{
				"specChanger":  `request.userInfo.username in ["system:serviceaccount:kueue-system:kueue-controller-manager",""]`,
				"defaultQueue": `["runners"]`, "defaultClass": `["routine"]`,
			}},
		{name: "kueue under other users", args: []string{"--set", "queueing.kueue.enabled=true", "--set", "queueing.kueue.defaultQueue=runners",
			"--set-json", `queueing.kueue.controllerUsers=["system:serviceaccount:kueue:kueue","kueue-operator"]`},
			want: map[string]string{
				"specChanger":  `request.userInfo.username in ["system:serviceaccount:kueue:kueue","kueue-operator",""]`,
				"defaultQueue": `["runners"]`, "defaultClass": "[]",
			}},
		{name: "kueue's users without kueue: none", args: []string{"--set-json", `queueing.kueue.controllerUsers=["kueue-operator"]`},
			want: map[string]string{"specChanger": `request.userInfo.username in [""]`, "defaultQueue": "[]", "defaultClass": "[]"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			vars, _ := jobsPolicy(t, tt.args...)
			got := map[string]string{
				"specChanger":  vars["specChanger"],
				"defaultQueue": elseBranch(vars["allowedQueues"]),
				"defaultClass": elseBranch(vars["allowedPriorityClasses"]),
			}
			if diff := cmp.Diff(tt.want, got); diff != "" {
				t.Errorf("policy variables (-want +got):\n%s", diff)
			}
		})
	}
}

// elseBranch is what follows the last ':' of a conditional expression.
func elseBranch(expr string) string {
	return strings.TrimSpace(expr[strings.LastIndex(expr, ":")+1:])
}
