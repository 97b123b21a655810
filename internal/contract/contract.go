// Package contract holds the names the dispatcher and the webhook agree on:
// the labels that make a pod a runner's and tie it to its task and
// dispatcher, and the annotations in which the webhook records on a runner
// pod what it admitted, which the dispatcher copies into the task's record.
// Each is defined here once; both programs import it.
package contract

import "strings"

// Prefix begins every label and annotation runwarden writes.
const Prefix = "runwarden.dev/"

// TaskID names a runner Job's and its pod's task. As an annotation it is
// the task ID as the source gave it; as a label, the same ID, or its hash
// when the ID is not a valid label value (taskLabel in dispatcher/job). One key, one
// concept: the label selects, the annotation tells the whole ID.
const TaskID = "runwarden.dev/task-id"

// Labels on runner Jobs and their pods.
const (
	// LabelRunner marks runner pods: the webhook selects on it, and checks
	// that a pod earned it (made by the Job controller for a Job of the
	// dispatcher).
	LabelRunner = "runwarden.dev/runner"
	// LabelDispatcher names the dispatcher that made the Job.
	LabelDispatcher = "runwarden.dev/dispatcher"
)

// What the webhook records on each runner pod it admits: names and
// digests, never a value.
const (
	// AnnotationSpecDigest is the SHA-256 of the pod's spec as admitted
	// (after the template, the task, the overlays and the policies),
	// "sha256:<hex>".
	AnnotationSpecDigest = "runwarden.dev/spec-digest"
	// AnnotationPolicyDigest identifies the policy set that decided.
	AnnotationPolicyDigest = "runwarden.dev/policy-digest"
	// AnnotationMutations names what the policies changed, e.g.
	// "env AWS_ROLE_ARN, toleration runwarden.dev/pool, volume aws-iam-token".
	AnnotationMutations = "runwarden.dev/mutations"
	// AnnotationWarnings are the policies' warnings, joined by "; ".
	AnnotationWarnings = "runwarden.dev/warnings"
)

// SecretRefStores are the stores a secret reference in a runner pod's env
// names: "${<store>:" begins a reference ("${vault:secret/db.password@team-a}"),
// which the webhook reads and runwarden's resolver resolves in the pod.
var SecretRefStores = []string{"ssm", "gcp", "azure", "vault"}

// HasSecretRef tells whether value holds the start of a secret reference
// (well formed or not: the webhook refuses a malformed one).
func HasSecretRef(value string) bool {
	for _, s := range SecretRefStores {
		if strings.Contains(value, "${"+s+":") {
			return true
		}
	}
	return false
}
