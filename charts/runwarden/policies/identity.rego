# Workload identity: the cloud credentials a runner gets from its service
# account instead of static keys, set exactly as each cloud's own webhook
# sets them, for clusters without that webhook. As those webhooks do, a
# container's own variables win (nothing is overwritten), an existing volume
# of the token's name is kept (AWS) or replaced (Azure), and the pod's
# skip-containers annotation is honoured. Unlike them, only the runner
# containers (config "containers") get the identity, not every container of
# the pod. docs/policy.md compares each case with the two webhooks.
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

# --- AWS, as the EKS pod identity webhook does it. ---
# Two ways, as that webhook has: EKS Pod Identity (container credentials)
# for a service account the platform associates with a role
# (podIdentity.associations, the webhook's watched configuration file), and
# IRSA (a web identity token and AWS_ROLE_ARN) for one whose role the
# service account's eks.amazonaws.com/role-arn names, else the role mapping
# ConfigMap (input.awsRoleMappings, the webhook's --watch-config-map). An
# association wins over a role.
aws_cfg := object.get(cfg, ["workloadIdentity", "aws"], {})

aws_pod_identity_cfg := object.get(aws_cfg, "podIdentity", {})

aws_pod_identity if {
	enabled(["workloadIdentity", "aws", "enabled"])
	some a in object.get(aws_pod_identity_cfg, "associations", [])
	a.namespace == input.namespace.name
	a.serviceAccount == input.serviceAccount.name
}

# The role mapping ConfigMap's entry for the service account: its own key
# (namespace/name), else the one for every namespace (*/name), as Go read
# them from the ConfigMap the platform names (roleMappingConfigMap).
aws_mapping := m if {
	m := input.awsRoleMappings[concat("/", [input.namespace.name, input.serviceAccount.name])]
} else := input.awsRoleMappings[concat("/", ["*", input.serviceAccount.name])]

# The service account's own annotation wins over the ConfigMap.
aws_sa_role := sa_annotations["eks.amazonaws.com/role-arn"] if sa_annotations["eks.amazonaws.com/role-arn"] != ""

# Pod Identity never reads the ConfigMap: its lifetime and regional STS
# are the service account's or the platform's, as the EKS webhook reads
# them for a service account it knows.
aws_role_from_mapping if {
	not aws_pod_identity
	not aws_sa_role
	object.get(aws_mapping, "roleARN", "") != ""
}

aws_role_arn := aws_sa_role

aws_role_arn := aws_mapping.roleARN if aws_role_from_mapping

aws_irsa if {
	enabled(["workloadIdentity", "aws", "enabled"])
	not aws_pod_identity
	aws_role_arn
}

# STS takes a role's whole ARN. The EKS webhook's --compose-role-arn, which
# makes a bare name into one, has no counterpart here: a role that is not an
# ARN would leave the runner without credentials, so the pod is refused
# with the reason rather than run.
violations contains violation("aws-role-arn", "", "metadata.annotations", sprintf(
	"role %q is not an IAM role ARN (arn:<partition>:iam::<account>:role/<name>): set eks.amazonaws.com/role-arn, or the role mapping ConfigMap's RoleARN, to the role's whole ARN",
	[aws_role_arn],
)) if {
	aws_irsa
	not regex.match(`^arn:[^:]+:iam::[^:]*:role/.+$`, aws_role_arn)
}

# aws_identity: the runner has an AWS identity, one way or the other (the
# secret stores leave the static keys out for it).
aws_identity if aws_pod_identity

aws_identity if aws_irsa

# The runner containers, and the resolver init container when it reads
# Parameter Store or Secrets Manager: with an identity on, the store is read
# with the same identity.
aws_targets contains n if some n in identity_targets

aws_targets contains "runwarden-secrets" if store_used("aws")

# eks.amazonaws.com/skip-containers: comma-separated container names.
aws_containers := aws_targets - {trim_space(n) | some n in split(object.get(pod_annotations_in, "eks.amazonaws.com/skip-containers", ""), ",")}

# The audience: Pod Identity's (pods.eks.amazonaws.com); for IRSA the
# ConfigMap's as written (empty: the API server's own audience), else the
# service account's annotation, else the platform's.
aws_audience := "pods.eks.amazonaws.com" if aws_pod_identity

else := object.get(aws_mapping, "audience", "") if aws_role_from_mapping

else := object.get(sa_annotations, "eks.amazonaws.com/audience", object.get(aws_cfg, "audience", "sts.amazonaws.com"))

# The token's lifetime: the pod's annotation, else the service account's (or
# for a ConfigMap role its entry's, 0 meaning the default), else the
# platform's (86400); an annotation below 600 s is raised to 600, and one
# that is not a number is ignored.
aws_default_expiration := object.get(aws_cfg, "tokenExpiration", 86400)

aws_sa_expiration := aws_default_expiration if {
	aws_role_from_mapping
	object.get(aws_mapping, "tokenExpiration", 0) == 0
} else := aws_mapping.tokenExpiration if {
	aws_role_from_mapping
} else := max([600, int_or(sa_annotations["eks.amazonaws.com/token-expiration"], 0)]) if {
	int_or(sa_annotations["eks.amazonaws.com/token-expiration"], null) != null
} else := aws_default_expiration

aws_expiration := max([600, int_or(pod_annotations_in["eks.amazonaws.com/token-expiration"], 0)]) if {
	int_or(pod_annotations_in["eks.amazonaws.com/token-expiration"], null) != null
} else := aws_sa_expiration

# Regional STS: the ConfigMap's entry for its role, else the service
# account's annotation, else the platform's.
aws_regional_sts := object.get(aws_mapping, "useRegionalSTS", false) if aws_role_from_mapping

else := bool_or(object.get(sa_annotations, "eks.amazonaws.com/sts-regional-endpoints", ""), object.get(aws_cfg, "stsRegionalEndpoints", false))

# Where the token goes, and the variables that name it.
aws_volume := "eks-pod-identity-token" if aws_pod_identity

else := "aws-iam-token"

aws_mount_path := "/var/run/secrets/pods.eks.amazonaws.com/serviceaccount" if aws_pod_identity

else := "/var/run/secrets/eks.amazonaws.com/serviceaccount"

aws_token_name := "eks-pod-identity-token" if aws_pod_identity

else := "token"

aws_token_file := concat("/", [aws_mount_path, aws_token_name])

# The Pod Identity agent's address on the node: its IPv6 one on an IPv6
# cluster (podIdentity.ipFamily: IPv6).
aws_full_uri := "http://[fd00:ec2::23]/v1/credentials" if object.get(aws_pod_identity_cfg, "ipFamily", "IPv4") == "IPv6"

else := "http://169.254.170.23/v1/credentials"

aws_token_vars := {"AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE"} if aws_pod_identity

else := {"AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE"}

aws_region_vars := {"AWS_REGION", "AWS_DEFAULT_REGION"}

aws_sts_vars := {"AWS_STS_REGIONAL_ENDPOINTS"}

# A container that sets one of the identity's pair, one of the region pair
# and the STS variable itself is left alone: no variable, no mount (the EKS
# webhook's "already has all").
aws_complete contains n if {
	some n in aws_containers
	defines(n, aws_token_vars)
	defines(n, aws_region_vars)
	defines(n, aws_sts_vars)
}

pod_labels contains ["eks.amazonaws.com/pod-identity", "enabled"] if aws_pod_identity

env contains identity_env(aws_containers, aws_token_vars, "AWS_CONTAINER_CREDENTIALS_FULL_URI", aws_full_uri) if aws_pod_identity

env contains identity_env(aws_containers, aws_token_vars, "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE", aws_token_file) if aws_pod_identity

env contains identity_env(aws_containers, aws_token_vars, "AWS_ROLE_ARN", aws_role_arn) if aws_irsa

env contains identity_env(aws_containers, aws_token_vars, "AWS_WEB_IDENTITY_TOKEN_FILE", aws_token_file) if aws_irsa

env contains identity_env(aws_containers, aws_sts_vars, "AWS_STS_REGIONAL_ENDPOINTS", "regional") if {
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

# A volume of the same name already in the pod is kept, whatever it holds.
volumes contains projected_token(aws_volume, aws_audience, aws_expiration, aws_token_name) if {
	aws_identity
	not has_volume(aws_volume)
}

# A container that already mounts a volume of that name keeps its own mount,
# wherever it is.
volume_mounts contains {"containers": sort([n | some n in (aws_containers - aws_complete); not mounts_volume(n, aws_volume)]), "volumeMount": {
	"name": aws_volume,
	"mountPath": aws_mount_path,
	"readOnly": true,
}} if aws_identity

# --- Azure Workload Identity, as Azure's webhook does it. ---
# Mode "inject" (the default) does what Azure's webhook would, for the pods it
# would: those labelled azure.workload.identity/use: "true" (the chart's
# runner pod template carries the label while this mode is on, so the
# platform, not the task, opts runner pods in). A labelled pod whose service
# account names no client ID gets the rest (tenant, authority host, token), as
# from Azure's webhook. Mode "label" only labels the pod for Azure's webhook,
# when its service account names a client ID; that webhook sees the label only
# if it runs after this one: the API server calls mutating webhooks in the
# order of their configurations' names, and never calls again one its object
# selector skipped.
azure_client_id := object.get(sa_annotations, "azure.workload.identity/client-id", "")

azure_cfg := object.get(cfg, ["workloadIdentity", "azure"], {})

azure_mode := object.get(azure_cfg, "mode", "inject")

azure_labelled if object.get(input, ["pod", "metadata", "labels", "azure.workload.identity/use"], "") == "true"

pod_labels contains ["azure.workload.identity/use", "true"] if {
	enabled(["workloadIdentity", "azure", "enabled"])
	azure_mode == "label"
	azure_client_id != ""
}

azure_inject if {
	enabled(["workloadIdentity", "azure", "enabled"])
	azure_mode == "inject"
	azure_labelled
}

# azure_identity: the runner gets an Azure identity it can sign in with (a
# client ID), from this policy or from Azure's webhook (the secret stores
# leave the service principal out for it).
azure_identity if {
	azure_inject
	azure_client_id != ""
}

azure_identity if {
	enabled(["workloadIdentity", "azure", "enabled"])
	azure_mode == "label"
	azure_client_id != ""
}

# The runner containers, and the resolver init container when it reads Key
# Vault: the store is read with the same identity.
azure_targets contains n if some n in identity_targets

azure_targets contains "runwarden-secrets" if {
	store_used("azure")
	azure_identity
}

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

# A volume of the reserved name already in the pod is replaced with the token
# (Azure's webhook replaces it whatever it held), and so is the token of any
# other projected volume at the token's path, with the audience and lifetime
# wanted (its other sources kept): no token for another audience sits where
# the SDK looks for Azure's.
volumes contains projected_token(azure_volume, "api://AzureADTokenExchange", azure_expiration, azure_token_path) if {
	azure_inject
	azure_expiration_valid
}

volumes contains json.patch(v, [{"op": "replace", "path": sprintf("/projected/sources/%d/serviceAccountToken", [i]), "value": {
	"audience": "api://AzureADTokenExchange",
	"expirationSeconds": azure_expiration,
	"path": azure_token_path,
}}]) if {
	azure_inject
	azure_expiration_valid
	some v in object.get(input, ["pod", "spec", "volumes"], [])
	v.name != azure_volume
	some i, src in object.get(v, ["projected", "sources"], [])
	src.serviceAccountToken.path == azure_token_path
}

# Every target container mounts the token at Azure's path, one that mounted
# the reserved volume elsewhere too (Azure's webhook moves that mount; a
# mutation only adds, so the container keeps its own as well).
volume_mounts contains {"containers": sort([n | some n in azure_containers]), "volumeMount": {
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
