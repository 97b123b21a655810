# Secret-store credentials: taken from Secrets the platform configuration
# names, always as secretKeyRef or Secret volumes, never as literal values.
# Where a cloud's workload identity applies, its static keys are left out.
#
# They go to the init container that resolves the runner's secret references
# (runwarden-secrets), never to the runner containers, and only for a store
# one of the pod's references reads: the task's code never holds them.
package runwarden.admission

stores := object.get(cfg, "secretStores", {})

store_on(name) if object.get(stores, [name, "enabled"], false) == true

# The store each reference form reads.
ref_stores := {"ssm": "aws", "gcp": "gcp", "azure": "azure", "vault": "vault"}

# store_used: the store is on and one of the pod's references reads it.
store_used(name) if {
	store_on(name)
	some ref in object.get(input, "secretRefs", [])
	ref.error == ""
	ref_stores[ref.store] == name
}

resolver_containers := ["runwarden-secrets"]

store_var(name, value) := {"containers": resolver_containers, "env": {"name": name, "value": value}}

store_secret(name, secret, key) := {"containers": resolver_containers, "env": {
	"name": name,
	"valueFrom": {"secretKeyRef": {"name": secret, "key": key}},
}}

store_mount(volume, path) := {"containers": resolver_containers, "volumeMount": {"name": volume, "mountPath": path, "readOnly": true}}

# A reference to a store the platform has not turned on cannot be resolved.
violations contains violation("secret-ref-store-disabled", ref.container, sprintf("env %s", [ref.env]), sprintf(
	"container %q env %s: %s reads store %q, which the platform configuration does not enable (secretStores.%s.enabled), so it cannot be resolved",
	[ref.container, ref.env, ref.raw, ref_stores[ref.store], ref_stores[ref.store]],
)) if {
	is_runner
	some ref in object.get(input, "secretRefs", [])
	ref.error == ""
	not store_on(ref_stores[ref.store])
}

# AWS Secrets Manager and SSM Parameter Store. The store's region: its own,
# else the workload identity's (workloadIdentity.aws.region), else us-east-1.
# The resolver gets this one alone (identity.rego leaves it out of the
# identity's region).
aws_region := object.get(stores, ["aws", "region"], "") if {
	object.get(stores, ["aws", "region"], "") != ""
} else := aws_cfg.region if {
	object.get(aws_cfg, "region", "") != ""
} else := "us-east-1"

env contains store_var(name, aws_region) if {
	store_used("aws")
	some name in ["AWS_REGION", "AWS_DEFAULT_REGION"]
}

env contains store_secret("AWS_ACCESS_KEY_ID", stores.aws.secretName, object.get(stores, ["aws", "accessKeyIdKey"], "aws_access_key_id")) if {
	store_used("aws")
	not aws_identity
}

env contains store_secret("AWS_SECRET_ACCESS_KEY", stores.aws.secretName, object.get(stores, ["aws", "secretAccessKeyKey"], "aws_secret_access_key")) if {
	store_used("aws")
	not aws_identity
}

# GCP Secret Manager: a service account key file from a Secret volume.
gcp_keys if {
	store_used("gcp")
	not gcp_identity
	object.get(stores, ["gcp", "secretName"], "") != ""
}

volumes contains {"name": "gcp-credentials", "secret": {"secretName": stores.gcp.secretName}} if gcp_keys

volume_mounts contains store_mount("gcp-credentials", "/var/run/secrets/runwarden/gcp") if gcp_keys

env contains store_var("GOOGLE_APPLICATION_CREDENTIALS", concat("/", ["/var/run/secrets/runwarden/gcp", object.get(stores, ["gcp", "key"], "credentials.json")])) if gcp_keys

env contains store_var("GOOGLE_CLOUD_PROJECT", stores.gcp.project) if {
	store_used("gcp")
	stores.gcp.project != ""
}

# Azure Key Vault: a service principal from a Secret.
azure_keys if {
	store_used("azure")
	not azure_identity
	object.get(stores, ["azure", "secretName"], "") != ""
}

env contains store_secret(name, stores.azure.secretName, key) if {
	azure_keys
	some [name, key] in [
		["AZURE_CLIENT_ID", "client_id"],
		["AZURE_CLIENT_SECRET", "client_secret"],
		["AZURE_TENANT_ID", "tenant_id"],
	]
}

# HashiCorp Vault: a token from a Secret, or Kubernetes auth with a
# projected service account token.
vault_auth := object.get(stores, ["vault", "auth"], "token")

env contains store_var("VAULT_ADDR", stores.vault.address) if store_used("vault")

env contains store_var("VAULT_NAMESPACE", stores.vault.namespace) if {
	store_used("vault")
	stores.vault.namespace != ""
}

# The mounts the resolver may read (secretrefs.rego): it checks each
# reference's mount, and the mount's type, against these before it reads.
env contains store_var("VAULT_KV_MOUNTS", concat(",", sort([m | some m in vault_kv_mounts; not m in vault_reserved_mounts]))) if store_used("vault")

env contains store_var("VAULT_ENGINE_MOUNTS", concat(",", sort([m | some m in vault_engine_mounts; not m in vault_reserved_mounts]))) if {
	store_used("vault")
	count(vault_engine_mounts - vault_reserved_mounts) > 0
}

env contains store_secret("VAULT_TOKEN", stores.vault.secretName, object.get(stores, ["vault", "tokenKey"], "token")) if {
	store_used("vault")
	vault_auth == "token"
}

vault_kubernetes if {
	store_used("vault")
	vault_auth == "kubernetes"
}

env contains store_var("VAULT_AUTH_ROLE", stores.vault.role) if vault_kubernetes

env contains store_var("VAULT_AUTH_MOUNT", object.get(stores, ["vault", "mount"], "kubernetes")) if vault_kubernetes

env contains store_var("VAULT_TOKEN_FILE", "/var/run/secrets/runwarden/vault/token") if vault_kubernetes

volumes contains projected_token("vault-token", object.get(stores, ["vault", "audience"], "vault"), 600, "token") if vault_kubernetes

volume_mounts contains store_mount("vault-token", "/var/run/secrets/runwarden/vault") if vault_kubernetes

# Other credential sets a runner needs (VCS credentials, tool API keys),
# each from a named Secret: variables from keys, or the Secret mounted.
credential_sets := object.get(cfg, "credentialSets", [])

env contains env_secret(v.name, set.secretName, v.key) if {
	some set in credential_sets
	some v in object.get(set, "env", [])
}

volumes contains {"name": concat("-", ["creds", set.name]), "secret": {"secretName": set.secretName}} if {
	some set in credential_sets
	set.mountPath != ""
}

volume_mounts contains mount(concat("-", ["creds", set.name]), set.mountPath) if {
	some set in credential_sets
	set.mountPath != ""
}

# A credential set with envFrom: true exposes every key of its Secret.
env_from contains {"containers": runner_containers, "envFrom": {"secretRef": {"name": set.secretName}}} if {
	some set in credential_sets
	set.envFrom == true
}
