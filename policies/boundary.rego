# The credentials boundary: which pods get the platform's credentials.
#
# Only runner pods (the webhook found the runner label earned: the Job
# controller made the pod for a Job of runwarden's dispatcher) run as the
# runner service account or get a service account token of an audience the
# platform's credentials accept; within a runner pod, the Vault role's token
# reaches the resolver init container alone; and no service account
# annotation turns a runner's identity token into another credential's.
# Every rule here is a boundary rule (decision.rego): no enforcement or mode
# relaxes it. The platform's Secrets are kept to runner pods (and a store's
# to the resolver) in Go, before the policies (platform-secret,
# webhook/admission/boundary.go): a container's Secret references change
# from task to task, and the decision cache keys on what the policies read.
#
# The runner service account comes from the platform configuration's
# `runner`, which the chart writes from the rendered runner pod template
# (its schema keeps webhook.platform from setting it).
package runwarden.admission

runner_cfg := object.get(cfg, "runner", {})

# The runner service account, as the chart renders it; none without the chart.
runner_service_account := object.get(runner_cfg, "serviceAccount", "")

# The audiences the platform's credentials accept a token of: the Vault
# role's (Kubernetes auth), IRSA's and Pod Identity's, Azure's. A store or
# identity that is off accepts none.
vault_kubernetes_audience := object.get(stores, ["vault", "audience"], "vault") if {
	store_on("vault")
	vault_auth == "kubernetes"
}

aws_platform_audience := object.get(aws_cfg, "audience", "sts.amazonaws.com")

identity_audiences contains aws_platform_audience if enabled(["workloadIdentity", "aws", "enabled"])

identity_audiences contains "pods.eks.amazonaws.com" if enabled(["workloadIdentity", "aws", "enabled"])

identity_audiences contains "api://AzureADTokenExchange" if enabled(["workloadIdentity", "azure", "enabled"])

platform_audiences contains a if some a in identity_audiences

platform_audiences contains vault_kubernetes_audience

# Audiences only the resolver may hold a token of: the Vault role's, unless
# a runner identity shares it.
resolver_audiences := {vault_kubernetes_audience} - identity_audiences

pod_volumes := object.get(input.pod.spec, "volumes", [])

# volume_audiences: [volume, source index, audience] of each service
# account token a volume holds.
volume_audiences contains [v.name, i, s.serviceAccountToken.audience] if {
	some v in pod_volumes
	some i, s in v.projected.sources
	s.serviceAccountToken.audience
}

# mounted_by contains [container, volume] for each mount of each container.
mounted_by contains [c.name, m.name] if {
	some c in object.get(input.pod.spec, "initContainers", [])
	some m in object.get(c, "volumeMounts", [])
}

mounted_by contains [c.name, m.name] if {
	some c in input.pod.spec.containers
	some m in object.get(c, "volumeMounts", [])
}

mounted_by contains [c.name, m.name] if {
	some c in object.get(input.pod.spec, "ephemeralContainers", [])
	some m in object.get(c, "volumeMounts", [])
}

# --- Pods that are not runners get none of the platform's identities. ---

# input.serviceAccount.name is the pod's spec.serviceAccountName, "default"
# when it names none (the webhook's input).
violations contains violation("platform-service-account", "", "spec.serviceAccountName", sprintf("spec.serviceAccountName: the pod runs as service account %q, the runners': only runner pods may", [runner_service_account])) if {
	not is_runner
	runner_service_account != ""
	input.serviceAccount.name == runner_service_account
}

violations contains violation("platform-token-audience", "", sprintf("spec.volumes[%s].projected.sources[%d].serviceAccountToken.audience", [v, i]), sprintf("spec.volumes[%s].projected.sources[%d].serviceAccountToken.audience: volume %q holds a service account token for audience %q, which the platform's credentials accept: only runner pods get one", [v, i, v, aud])) if {
	not is_runner
	some [v, i, aud] in volume_audiences
	aud in platform_audiences
}

# --- Within a runner pod, the Vault role's token reaches the resolver alone. ---

violations contains violation("platform-token-audience", c, sprintf("volumeMounts[%s]", [v]), sprintf("container %q mounts volume %q, a service account token for audience %q, which only the resolver init container (%s) gets", [c, v, aud, resolver_containers[0]])) if {
	is_runner
	some [v, _, aud] in volume_audiences
	aud in resolver_audiences
	some [c, mounted] in mounted_by
	mounted == v
	not c in resolver_containers
}

# --- An audience read from a service account annotation or the role
# mapping ConfigMap is never another of the platform's. ---
# Whoever may annotate the runner service account would otherwise give
# every runner a token the resolver's Vault role (or Azure, or Pod
# Identity) accepts. Refused rather than ignored: the runner would start
# with a token its role does not expect, and the refusal names the cause.
violations contains violation("identity-audience", "", aws_audience_field, sprintf("the IRSA token's audience %q (%s) is one the platform's other credentials accept: it may only be the platform's own (%s) or one they do not", [aws_audience, aws_audience_field, aws_platform_audience])) if {
	aws_irsa
	aws_audience != aws_platform_audience
	aws_audience in platform_audiences
}

aws_audience_field := "the role mapping ConfigMap's audience" if aws_role_from_mapping

else := "serviceAccount.metadata.annotations[eks.amazonaws.com/audience]"
