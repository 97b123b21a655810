package tests

import (
	"strings"
	"testing"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"

	"github.com/runwarden/runwarden/dispatcher/job"
)

// TestWritersPolicy: the writers policy names, as the API server checks
// them, the writers the chart's values give it: the dispatcher's service
// account, webhook.jobControllerUsers, Kueue's controller with
// queueing.kueue on, and writers.users, userPrefixes and groups, whose
// defaults cover kubeadm-made clusters (kind) and the local cluster (its
// kwok components act in system:masters); each policy is bound to the
// runner namespace by name. What the policies refuse is proved on the API
// server by TestWritersKubeSource and TestWritersOrchestratorSource (e2e).
func TestWritersPolicy(t *testing.T) {
	t.Parallel()
	h := helm(t, "helm3")
	const dispatcher = "system:serviceaccount:runwarden:rw-runwarden-dispatcher"
	tests := []struct {
		name string
		args []string
		// want are the strings each policy's validations hold.
		want map[string][]string
		// absent policies.
		absent []string
	}{
		{name: "defaults", want: map[string][]string{
			"jobs": {dispatcher, `"system:serviceaccount:kube-system:job-controller"`, `"system:kube-controller-manager"`, `"system:masters"`,
				"'runwarden.dev/dispatcher' in object.metadata.labels"},
			"pods": {"'runwarden.dev/runner' in object.metadata.labels", "'batch.kubernetes.io/controller-uid'", `"system:node:"`, `"system:kube-scheduler"`, `"system:serviceaccount:kube-system:job-controller"`, `"system:serviceaccount:kube-system:node-controller"`, `"system:masters"`},
			"events": {`"system:node:"`, `"system:kube-scheduler"`, `"system:serviceaccount:kube-system:job-controller"`, `"` + dispatcher + `"`,
				"startsWith('" + job.NamePrefix + "')", "'Job', 'Pod'", "object.regarding", "object.involvedObject", "!variables.aboutJob"},
			"records": {dispatcher, "startsWith('" + job.SecretPrefix + "')"},
			// What an update makes of an object counts, not only what it
			// was: a Job or a pod is labelled through its status too, and a
			// binding writes a pod's labels and annotations.
			"bindings": {`"system:masters"`, "'runwarden.dev/'", "k.startsWith('topology.kubernetes.io/')"},
			// The dispatcher's names for a task's Job and Secret, the runner
			// namespace's runwarden.dev/ annotations (through the Namespace
			// and its status) and the platform's objects there.
			"names":               {dispatcher, `"system:masters"`, "startsWith('" + job.NamePrefix + "')", "startsWith('" + job.SecretPrefix + "')"},
			"namespace":           {"object.metadata.name == 'runners'", "k.startsWith('runwarden.dev/')", `"system:masters"`},
			"platform-secrets":    {`"system:masters"`, "object.data"},
			"platform-configmaps": {`"system:masters"`, "object.binaryData"},
			// The runner service account as the chart renders it: no
			// identity annotation, no API token.
			"runner-account": {"object.metadata.name == 'runwarden-runner'", "variables.automount == 'false'", "k in {}"},
		}, absent: []string{"workloads"}},
		{name: "an IRSA role and the state backend", args: []string{"--set", "runner.serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::111122223333:role/runner",
			"--set", "runner.serviceAccount.stateBackendRole=true"}, want: map[string][]string{
			"runner-account": {`k in {"eks.amazonaws.com/role-arn":"arn:aws:iam::111122223333:role/runner"}`, "variables.automount == 'true'"},
		}},
		{name: "a service account of the platform's", args: []string{"--set", "runner.serviceAccount.create=false", "--set", "runner.serviceAccount.name=team-runner"}, want: map[string][]string{
			"runner-account": {"object.metadata.name == 'team-runner'", "variables.oldAnnotations[k] == variables.annotations[k]"},
		}},
		{name: "the platform's objects", args: []string{"--set", "runner.caBundle.configMap=runner-ca",
			"--set", "webhook.platform.credentialSets[0].name=git", "--set", "webhook.platform.credentialSets[0].secretName=git-creds",
			"--set", "webhook.platform.secretStores.vault.enabled=true", "--set", "webhook.platform.secretStores.vault.address=https://vault:8200",
			"--set", "webhook.platform.secretStores.vault.auth=token", "--set", "webhook.platform.secretStores.vault.secretName=vault-token",
			"--set", "writers.platformUsers={system:serviceaccount:external-secrets:external-secrets}"}, want: map[string][]string{
			"platform-secrets":    {"['git-creds','vault-token','']", `"system:serviceaccount:external-secrets:external-secrets"`},
			"platform-configmaps": {"['runner-ca','']", `"system:serviceaccount:external-secrets:external-secrets"`},
		}},
		{name: "kueue", args: []string{"--set", "queueing.kueue.enabled=true", "--set", "queueing.kueue.defaultQueue=q"}, want: map[string][]string{
			"jobs":      {`"system:serviceaccount:kueue-system:kueue-controller-manager"`},
			"events":    {`"system:serviceaccount:kueue-system:kueue-controller-manager"`},
			"workloads": {`"system:serviceaccount:kueue-system:kueue-controller-manager"`, `"` + dispatcher + `"`, "kueue.x-k8s.io/job-uid"},
		}},
		{name: "another Job controller and writers", args: []string{"--set", "webhook.jobControllerUsers={jc}", "--set", "writers.users={autoscaler}",
			"--set", "writers.userPrefixes={node:}", "--set", "writers.groups={admins}"}, want: map[string][]string{
			"jobs":   {`"jc"`, `"admins"`},
			"pods":   {`"jc"`, `"autoscaler"`, `"node:"`, `"admins"`},
			"events": {`"jc"`, `"autoscaler"`, `"node:"`},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			objs := render(t, h, append([]string{"--set", "runnerNamespace=runners"}, tt.args...)...)
			for kind, want := range tt.want {
				var p admissionregistrationv1.ValidatingAdmissionPolicy
				decode(t, objs, "ValidatingAdmissionPolicy/rw-runwarden-writers-"+kind, &p)
				var all strings.Builder
				for _, v := range p.Spec.MatchConditions {
					all.WriteString(v.Expression + "\n")
				}
				for _, v := range p.Spec.Variables {
					all.WriteString(v.Expression + "\n")
				}
				for _, v := range p.Spec.Validations {
					all.WriteString(v.Expression + "\n")
				}
				for _, w := range want {
					if !strings.Contains(all.String(), w) {
						t.Errorf("policy %s does not name %s:\n%s", kind, w, all.String())
					}
				}
				var b admissionregistrationv1.ValidatingAdmissionPolicyBinding
				decode(t, objs, "ValidatingAdmissionPolicyBinding/rw-runwarden-writers-"+kind, &b)
				sel := b.Spec.MatchResources.NamespaceSelector
				if b.Spec.PolicyName != p.Name || len(b.Spec.ValidationActions) != 1 || b.Spec.ValidationActions[0] != admissionregistrationv1.Deny ||
					sel == nil || len(sel.MatchLabels) != 0 || len(sel.MatchExpressions) != 1 || sel.MatchExpressions[0].Key != "kubernetes.io/metadata.name" ||
					len(sel.MatchExpressions[0].Values) != 1 || sel.MatchExpressions[0].Values[0] != "runners" {
					t.Errorf("binding %s: %+v, want Deny for %s in the runner namespace by its name", b.Name, b.Spec, p.Name)
				}
			}
			for _, kind := range tt.absent {
				if _, ok := objs["ValidatingAdmissionPolicy/rw-runwarden-writers-"+kind]; ok {
					t.Errorf("policy %s rendered, want none", kind)
				}
			}
		})
	}
}
