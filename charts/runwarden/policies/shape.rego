# Pod shape: what a runner pod may not be. Each denial names its rule, the
# container and the field; the `audit` mode turns denials into warnings.
package runwarden.admission

shape := object.get(cfg, "shape", {})

all_containers := array.concat(
	object.get(input.pod.spec, "initContainers", []),
	input.pod.spec.containers,
)

# Ephemeral containers (kubectl debug) are checked like the others where
# they can be: they have no resources.
ephemeral_containers := object.get(input.pod.spec, "ephemeralContainers", [])

checked_containers := array.concat(all_containers, ephemeral_containers)

violations contains violation("no-privileged", c.name, "securityContext.privileged", sprintf("container %q is privileged", [c.name])) if {
	some c in checked_containers
	c.securityContext.privileged == true
}

# Only an explicit true is denied. Unset, Kubernetes lets a container gain
# privileges too, but denying unset would refuse pods the chart and the e2e
# suite make (and any init container or sidecar a platform adds): the
# chart's pod template sets false for main, and runnerPodSecurity:
# restricted has the API server require false of every container.
violations contains violation("no-privilege-escalation", c.name, "securityContext.allowPrivilegeEscalation", sprintf("container %q allows privilege escalation", [c.name])) if {
	some c in checked_containers
	c.securityContext.allowPrivilegeEscalation == true
}

# One rule per field, read by name, so the webhook knows exactly which
# parts of the pod a decision depends on (see docs/policy.md, caching).
violations contains host_namespace("hostNetwork") if input.pod.spec.hostNetwork == true

violations contains host_namespace("hostPID") if input.pod.spec.hostPID == true

violations contains host_namespace("hostIPC") if input.pod.spec.hostIPC == true

host_namespace(f) := violation("no-host-namespaces", "", sprintf("spec.%s", [f]), sprintf("the pod uses the host's namespaces (%s)", [f]))

violations contains violation("no-host-path", "", sprintf("spec.volumes[%s].hostPath", [v.name]), sprintf("volume %q mounts a host path", [v.name])) if {
	some v in object.get(input.pod.spec, "volumes", [])
	v.hostPath
}

# Requests for cpu and memory and a memory limit, of every container, init
# containers included; no cpu limit (it only throttles a runner, and the
# chart sets none).
required_resources := [["requests", "cpu"], ["requests", "memory"], ["limits", "memory"]]

violations contains violation("resources-required", c.name, sprintf("resources.%s.%s", [kind, res]), sprintf("container %q has no %s %s", [c.name, res, kind])) if {
	object.get(shape, "requireResources", false) == true
	some c in all_containers
	some [kind, res] in required_resources
	not c.resources[kind][res]
}

violations contains violation("allowed-registries", c.name, "image", sprintf("container %q image %q is not from an allowed registry (%s)", [c.name, c.image, concat(", ", shape.allowedRegistries)])) if {
	count(object.get(shape, "allowedRegistries", [])) > 0
	some c in checked_containers
	not image_allowed(c.image)
}

image_allowed(image) if {
	some r in shape.allowedRegistries
	startswith(image, concat("", [trim_suffix(r, "/"), "/"]))
}

# runwarden's own image, which resolves the secret references in an init
# container (the webhook's --resolver-image, never the pod's choice).
image_allowed(image) if {
	object.get(input, "resolverImage", "") != ""
	image == input.resolverImage
}

repo_url := input.pod.metadata.annotations["runwarden.dev/repo-url"]

violations contains violation("git-url-allowed", "", "metadata.annotations[runwarden.dev/repo-url]", sprintf("the repository URL (annotation runwarden.dev/repo-url) matches no allowed pattern (%s)", [concat(", ", shape.gitURLAllowList)])) if {
	count(object.get(shape, "gitURLAllowList", [])) > 0
	repo_url
	not git_url_allowed
}

git_url_allowed if {
	some p in shape.gitURLAllowList
	regex.match(p, repo_url)
}

# Ephemeral containers added to a runner pod (kubectl debug): refused unless
# the platform allows them (ephemeralContainers.allow), and even then never
# with a Secret or projected volume mounted or env read from a Secret. An
# allowed debug container that targets "main" shares its process namespace
# and can still read its environment through /proc: allowing them is a
# trust decision (docs/policy.md).
# The path in one object.get: the decision cache then keys on those names
# alone, not on the whole pod before the update (docs/policy.md, caching).
old_ephemeral_names := {c.name | some c in object.get(input, ["oldPod", "spec", "ephemeralContainers"], [])}

new_ephemeral contains c if {
	some c in ephemeral_containers
	not c.name in old_ephemeral_names
}

ephemeral_allowed if object.get(cfg, ["ephemeralContainers", "allow"], false) == true

violations contains violation("no-ephemeral-containers", c.name, "spec.ephemeralContainers", sprintf("ephemeral container %q: debug containers on runner pods are off (platform configuration ephemeralContainers.allow)", [c.name])) if {
	is_runner
	not ephemeral_allowed
	some c in new_ephemeral
}

credential_volumes contains v.name if {
	some v in object.get(input.pod.spec, "volumes", [])
	v.secret
}

credential_volumes contains v.name if {
	some v in object.get(input.pod.spec, "volumes", [])
	v.projected
}

# The resolved secret references' in-memory volume (docs/secrets.md).
credential_volumes contains "runwarden-secrets"

violations contains violation("ephemeral-no-credentials", c.name, sprintf("env %s", [e.name]), sprintf("ephemeral container %q reads env %s from the resolved secret references", [c.name, e.name])) if {
	is_runner
	ephemeral_allowed
	some c in new_ephemeral
	some e in object.get(c, "env", [])
	e.valueFrom.fileKeyRef
}

violations contains violation("ephemeral-no-credentials", c.name, sprintf("volumeMounts[%s]", [m.name]), sprintf("ephemeral container %q mounts volume %q, which holds credentials", [c.name, m.name])) if {
	is_runner
	ephemeral_allowed
	some c in new_ephemeral
	some m in object.get(c, "volumeMounts", [])
	m.name in credential_volumes
}

violations contains violation("ephemeral-no-credentials", c.name, sprintf("env %s", [e.name]), sprintf("ephemeral container %q reads env %s from a Secret", [c.name, e.name])) if {
	is_runner
	ephemeral_allowed
	some c in new_ephemeral
	some e in object.get(c, "env", [])
	e.valueFrom.secretKeyRef
}

violations contains violation("ephemeral-no-credentials", c.name, "envFrom", sprintf("ephemeral container %q reads env from Secret %q", [c.name, f.secretRef.name])) if {
	is_runner
	ephemeral_allowed
	some c in new_ephemeral
	some f in object.get(c, "envFrom", [])
	f.secretRef
}
