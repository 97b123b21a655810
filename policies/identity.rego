# Workload identity: the cloud credentials a runner gets from its service
# account instead of static keys, set exactly as each cloud's own webhook
# sets them, for clusters without that webhook. As those webhooks do, a
# container's own variables win (nothing is overwritten), an existing volume
# of the same name is kept, and the pod's skip-containers annotation is
# honoured. Unlike them, only the runner containers (config "containers")
# get the identity, not every container of the pod.
package runwarden.admission

pod_annotations_in := object.get(input, ["pod", "metadata", "annotations"], {})

pod_containers := array.concat(
	object.get(input, ["pod", "spec", "initContainers"], []),
	object.get(input, ["pod", "spec", "containers"], []),
)

# identity_targets are the runner containers' names, "*" spelt out.
identity_targets contains c.name if {
	"*" in runner_containers
	some c in pod_containers
}

identity_targets contains name if {
	some name in runner_containers
	name != "*"
}

# defines(name, vars): the container of that name sets one of vars itself.
defines(name, vars) if {
	some c in pod_containers
	c.name == name
	some e in object.get(c, "env", [])
	e.name in vars
}

# mounts_volume(name, volume): the container of that name mounts it itself.
mounts_volume(name, volume) if {
	some c in pod_containers
	c.name == name
	some m in object.get(c, "volumeMounts", [])
	m.name == volume
}

has_volume(volume) if {
	some v in object.get(input, ["pod", "spec", "volumes"], [])
	v.name == volume
}

# int_or(s, default): s as an integer when it is one, as Go's
# strconv.ParseInt reads it, else default.
int_or(s, _) := to_number(s) if regex.match(`^[+-]?[0-9]+$`, s)

int_or(s, d) := d if not regex.match(`^[+-]?[0-9]+$`, s)

# bool_or(s, default): s as Go's strconv.ParseBool reads it, else default.
bool_or(s, _) if s in {"1", "t", "T", "TRUE", "true", "True"}

bool_or(s, _) := false if s in {"0", "f", "F", "FALSE", "false", "False"}

bool_or(s, d) := d if not s in {"1", "t", "T", "TRUE", "true", "True", "0", "f", "F", "FALSE", "false", "False"}

# identity_env sets a variable in each of containers that sets none of vars.
identity_env(containers, vars, name, value) := {"containers": sort([n | some n in containers; not defines(n, vars)]), "env": {"name": name, "value": value}}

# --- AWS IRSA, as the EKS pod identity webhook does it. ---
aws_role_arn := sa_annotations["eks.amazonaws.com/role-arn"]

aws_identity if {
	enabled(["workloadIdentity", "aws", "enabled"])
	aws_role_arn != ""
}

aws_cfg := object.get(cfg, ["workloadIdentity", "aws"], {})

# The runner containers, and the resolver init container when it reads
# Parameter Store or Secrets Manager: with IRSA on, the store is read with
# the same identity.
aws_targets contains n if some n in identity_targets

aws_targets contains "runwarden-secrets" if store_used("aws")

# eks.amazonaws.com/skip-containers: comma-separated container names.
aws_containers := aws_targets - {trim_space(n) | some n in split(object.get(pod_annotations_in, "eks.amazonaws.com/skip-containers", ""), ",")}

# The audience: the service account's annotation, else the platform's.
aws_audience := object.get(sa_annotations, "eks.amazonaws.com/audience", object.get(aws_cfg, "audience", "sts.amazonaws.com"))

# The token's lifetime: the pod's annotation, else the service account's,
# else the platform's (86400); an annotation below 600 s is raised to 600, and
# one that is not a number is ignored.
aws_default_expiration := object.get(aws_cfg, "tokenExpiration", 86400)

aws_sa_expiration := max([600, int_or(sa_annotations["eks.amazonaws.com/token-expiration"], 0)]) if {
	int_or(sa_annotations["eks.amazonaws.com/token-expiration"], null) != null
} else := aws_default_expiration

aws_expiration := max([600, int_or(pod_annotations_in["eks.amazonaws.com/token-expiration"], 0)]) if {
	int_or(pod_annotations_in["eks.amazonaws.com/token-expiration"], null) != null
} else := aws_sa_expiration

# Regional STS: the service account's annotation, else the platform's.
aws_regional_sts := bool_or(object.get(sa_annotations, "eks.amazonaws.com/sts-regional-endpoints", ""), object.get(aws_cfg, "stsRegionalEndpoints", false))

aws_token_vars := {"AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"}

aws_region_vars := {"AWS_REGION", "AWS_DEFAULT_REGION"}

env contains identity_env(aws_containers, aws_token_vars, "AWS_ROLE_ARN", aws_role_arn) if aws_identity

env contains identity_env(aws_containers, aws_token_vars, "AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/secrets/eks.amazonaws.com/serviceaccount/token") if aws_identity

env contains identity_env(aws_containers, {"AWS_STS_REGIONAL_ENDPOINTS"}, "AWS_STS_REGIONAL_ENDPOINTS", "regional") if {
	aws_identity
	aws_regional_sts
}

# The region pair goes to the resolver only as the store's region
# (secretstores.rego): that is where it reads the store, and one value per
# variable leaves nothing to the order the mutations are applied in.
aws_region_containers := aws_containers - {"runwarden-secrets"} if store_used("aws")

else := aws_containers

env contains identity_env(aws_region_containers, aws_region_vars, name, aws_cfg.region) if {
	aws_identity
	object.get(aws_cfg, "region", "") != ""
	some name in aws_region_vars
}

volumes contains projected_token("aws-iam-token", aws_audience, aws_expiration, "token") if {
	aws_identity
	not has_volume("aws-iam-token")
}

volume_mounts contains {"containers": sort([n | some n in aws_containers; not mounts_volume(n, "aws-iam-token")]), "volumeMount": {
	"name": "aws-iam-token",
	"mountPath": "/var/run/secrets/eks.amazonaws.com/serviceaccount",
	"readOnly": true,
}} if aws_identity

# --- Azure Workload Identity, as Azure's webhook does it. ---
# Mode "inject" (the default) does what Azure's webhook would. Mode "label"
# only labels the pod for Azure's webhook, which sees the label only if it
# runs after this one: the API server calls mutating webhooks in the order of
# their configurations' names, and never calls again one its object selector
# skipped.
azure_client_id := sa_annotations["azure.workload.identity/client-id"]

azure_identity if {
	enabled(["workloadIdentity", "azure", "enabled"])
	azure_client_id != ""
}

azure_cfg := object.get(cfg, ["workloadIdentity", "azure"], {})

azure_mode := object.get(azure_cfg, "mode", "inject")

pod_labels contains ["azure.workload.identity/use", "true"] if {
	azure_identity
	azure_mode == "label"
}

azure_inject if {
	azure_identity
	azure_mode == "inject"
}

# The runner containers, and the resolver init container when it reads Key
# Vault: the store is read with the same identity.
azure_targets contains n if some n in identity_targets

azure_targets contains "runwarden-secrets" if store_used("azure")

# azure.workload.identity/skip-containers: semicolon-separated names.
azure_containers := azure_targets - {trim_space(n) | some n in split(object.get(pod_annotations_in, "azure.workload.identity/skip-containers", ""), ";")}

# The tenant: the service account's annotation (even empty), else the
# platform's. A variable with no value is not set.
azure_tenant_id := object.get(sa_annotations, "azure.workload.identity/tenant-id", object.get(azure_cfg, "tenantId", ""))

# The token's lifetime: the pod's annotation, else the service account's,
# else 3600. Azure's webhook refuses the pod when it is not a number from 3600
# to 86400; so does this policy.
azure_expiration_raw := pod_annotations_in["azure.workload.identity/service-account-token-expiration"] if {
	pod_annotations_in["azure.workload.identity/service-account-token-expiration"] != ""
} else := sa_annotations["azure.workload.identity/service-account-token-expiration"] if {
	sa_annotations["azure.workload.identity/service-account-token-expiration"] != ""
} else := "3600"

azure_expiration := int_or(azure_expiration_raw, 0)

violations contains violation("azure-token-expiration", "", "metadata.annotations", sprintf(
	"token expiration %s not valid: azure.workload.identity/service-account-token-expiration must be a number of seconds from 3600 to 86400",
	[azure_expiration_raw],
)) if {
	azure_inject
	not azure_expiration_valid
}

azure_expiration_valid if {
	azure_expiration >= 3600
	azure_expiration <= 86400
}

# The layout: "v1.6" (Azure's current webhook: a volume named from a hash of
# the pod's name, mounted at /var/run/secrets/azure/wi) or "v1.5" (volume
# azure-identity-token at /var/run/secrets/azure/tokens).
azure_layout := object.get(azure_cfg, "layout", "v1.6")

# v1.6 names its volume from a hash of the pod's name; runwarden names it
# azure-workload-identity-reserved-token, the same for every pod, so that
# pods of one template share a cached decision (what the workload sees, the
# mount and the file, is v1.6's).
azure_volume := "azure-identity-token" if azure_layout == "v1.5"

else := "azure-workload-identity-reserved-token"

azure_mount_path := "/var/run/secrets/azure/tokens" if azure_layout == "v1.5"

else := "/var/run/secrets/azure/wi"

azure_token_path := "azure-identity-token" if azure_layout == "v1.5"

else := "token/azure-identity-token"

azure_env := {
	"AZURE_CLIENT_ID": azure_client_id,
	"AZURE_TENANT_ID": azure_tenant_id,
	"AZURE_FEDERATED_TOKEN_FILE": concat("/", [azure_mount_path, azure_token_path]),
	"AZURE_AUTHORITY_HOST": object.get(azure_cfg, "authorityHost", "https://login.microsoftonline.com/"),
}

env contains identity_env(azure_containers, {name}, name, value) if {
	azure_inject
	some name, value in azure_env
	value != ""
}

# v1.5 keeps a token volume already there (any projected token at its path);
# v1.6 sets its reserved volume.
azure_keeps_volume if {
	azure_layout == "v1.5"
	some v in object.get(input, ["pod", "spec", "volumes"], [])
	some s in object.get(v, ["projected", "sources"], [])
	s.serviceAccountToken.path == "azure-identity-token"
}

volumes contains projected_token(azure_volume, "api://AzureADTokenExchange", azure_expiration, azure_token_path) if {
	azure_inject
	azure_expiration_valid
	not azure_keeps_volume
}

volume_mounts contains {"containers": sort([n | some n in azure_containers; not mounts_volume(n, azure_volume)]), "volumeMount": {
	"name": azure_volume,
	"mountPath": azure_mount_path,
	"readOnly": true,
}} if azure_inject

# --- GKE Workload Identity. ---
# GKE injects nothing into pods: the node's metadata server answers for the
# service account named by iam.gke.io/gcp-service-account. The pod must run
# where that server is, which Google's documentation asks of a node selector.
gcp_identity if {
	enabled(["workloadIdentity", "gcp", "enabled"])
	sa_annotations["iam.gke.io/gcp-service-account"] != ""
}

node_selector contains ["iam.gke.io/gke-metadata-server-enabled", "true"] if gcp_identity
