# The decision the runwarden webhook asks for on every runner pod.
#
# Go gathers the input (see docs/policy.md), these rules decide, and Go
# applies the decision: it denies the pod when `deny` is not empty, returns
# `warnings` to the user, counts every violation of `deny`, `warn` and
# `dryrun` by rule and action (and logs the dryrun ones), and turns
# `mutations` into a JSON patch.
package runwarden.admission

# decision is the one document the webhook reads.
decision := {
	"deny": denials,
	"warn": warned,
	"dryrun": dryruns,
	"warnings": warnings,
	"mutations": mutations,
}

# cfg is the platform configuration from the chart, with defaults.
cfg := object.get(input, "config", {})

audit if cfg.mode == "audit"

# is_runner: the pod is a runner pod the webhook found earned (made by the
# Job controller for a Job of runwarden's dispatcher). Other pods of a
# runner namespace get the shape rules only. An input without the field (an
# older caller) is a runner's.
is_runner if object.get(input, "runner", true) == true

# runner_containers are the containers mutations apply to by default.
runner_containers := object.get(cfg, "containers", ["main"])

violation_list := sort([v | some v in violations])

# Each violation with the action the platform chose for its rule in the
# pod's namespace (see action).
acted := [object.union(v, {"action": action(v.rule)}) | some v in violation_list]

denials := [v | some v in acted; v.action == "deny"]

warned := [v | some v in acted; v.action == "warn"]

dryruns := [v | some v in acted; v.action == "dryrun"]

warnings := sort(array.concat(
	[w | some w in warning],
	[sprintf("audit: would deny: %s", [v.message]) | some v in warned],
))

# enforcement is the platform's choice of action per rule: deny (the pod is
# refused), warn (admitted, the user warned) or dryrun (admitted silently,
# the webhook counts and logs it). Only the platform configuration sets it,
# never the namespace (its annotations are its tenants' to write).
enforcement := object.get(cfg, "enforcement", {})

# default_action is enforcement.default, else the mode's: audit warns,
# enforce denies.
default_action := enforcement.default if {
	enforcement.default
} else := "warn" if {
	audit
} else := "deny"

# action is the action for a rule in the pod's namespace: the namespace's
# own setting for it, else the rule's, else the default. Anything that is
# not an action (the chart's schema refuses it, the webhook refuses it at
# start) denies.
#
# The boundary rules always deny, whatever the enforcement or the mode:
# they bound what a pod may get of the platform's credentials and of the
# runners' (see boundary_rules), not a shape to roll out. A change to them
# is tried with `policy audit` instead.
action(rule) := "deny" if {
	boundary_rule(rule)
} else := checked_action(enforcement.namespaces[input.namespace.name][rule]) if {
	enforcement.namespaces[input.namespace.name][rule]
} else := checked_action(enforcement.rules[rule]) if {
	enforcement.rules[rule]
} else := checked_action(default_action)

# boundary_rule: a rule no enforcement can relax (see action). The
# webhook's enforcement check (policy.IsBoundaryRule) and the chart's
# schema (ruleActions) name the same rules; docs/policy.md says why each.
boundary_rule(rule) if startswith(rule, "secret-ref-")

boundary_rule(rule) if rule in boundary_rules

# boundary_rules, besides secret-ref-*: which secrets a task may read
# (secret-ref-*); a debug container, which reads main's environment and
# the resolved values as kubectl exec would (refused in Go in every mode);
# which images run beside the credentials (the registry allow-list); and
# which pods get the runner service account or a token the platform's
# credentials accept (boundary.rego). platform-secret, a boundary rule
# too, is decided in Go before the policies (webhook/admission/boundary.go).
boundary_rules := {
	"allowed-registries",
	"ephemeral-no-credentials",
	"identity-audience",
	"no-ephemeral-containers",
	"platform-service-account",
	"platform-token-audience",
}

checked_action(a) := a if a in {"deny", "warn", "dryrun"}

else := "deny"

mutations := {
	"labels": {k: v | some [k, v] in pod_labels},
	"annotations": {k: v | some [k, v] in pod_annotations},
	"nodeSelector": {k: v | some [k, v] in node_selector},
	"tolerations": sort([t | some t in tolerations]),
	"nodeAffinity": sort([e | some e in node_affinity]),
	"volumes": sort([v | some v in volumes]),
	"env": sort([e | some e in env]),
	"envFrom": sort([e | some e in env_from]),
	"volumeMounts": sort([m | some m in volume_mounts]),
}

# A violation names its rule, the container (empty for the pod) and the field.
violation(rule, container, field, message) := {
	"rule": rule,
	"container": container,
	"field": field,
	"message": sprintf("%s: %s", [rule, message]),
}

# env_var sets an environment variable in the runner containers.
env_var(name, value) := {"containers": runner_containers, "env": {"name": name, "value": value}}

# env_secret sets an environment variable from a key of a Secret.
env_secret(name, secret, key) := {"containers": runner_containers, "env": {
	"name": name,
	"valueFrom": {"secretKeyRef": {"name": secret, "key": key}},
}}

# mount mounts a volume in the runner containers, read-only.
mount(volume, path) := {"containers": runner_containers, "volumeMount": {"name": volume, "mountPath": path, "readOnly": true}}

# projected_token is a volume holding a service account token for an audience.
projected_token(volume, audience, seconds, path) := {"name": volume, "projected": {"sources": [{"serviceAccountToken": {
	"audience": audience,
	"expirationSeconds": seconds,
	"path": path,
}}]}}

sa_annotations := object.get(input, ["serviceAccount", "annotations"], {})

ns_annotations := object.get(input, ["namespace", "annotations"], {})

enabled(path) if object.get(cfg, path, false) == true
