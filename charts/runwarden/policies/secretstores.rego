# Secret-store credentials: taken from Secrets the platform configuration
# names, always as secretKeyRef or Secret volumes, never as literal values.
# Where a cloud's workload identity applies, its static keys are left out.
package runwarden.admission

stores := object.get(cfg, "secretStores", {})

store_on(name) if object.get(stores, [name, "enabled"], false) == true

# AWS Secrets Manager and SSM Parameter Store.
aws_region := object.get(stores, ["aws", "region"], "us-east-1")

# The store's region, unless the container sets one itself or workload
# identity sets the platform's.
env contains identity_env(identity_targets, aws_region_vars, name, aws_region) if {
	store_on("aws")
	not aws_identity_region
	some name in aws_region_vars
}

aws_identity_region if {
	aws_identity
	object.get(aws_cfg, "region", "") != ""
}

env contains env_secret("AWS_ACCESS_KEY_ID", stores.aws.secretName, object.get(stores, ["aws", "accessKeyIdKey"], "aws_access_key_id")) if {
	store_on("aws")
	not aws_identity
}

env contains env_secret("AWS_SECRET_ACCESS_KEY", stores.aws.secretName, object.get(stores, ["aws", "secretAccessKeyKey"], "aws_secret_access_key")) if {
	store_on("aws")
	not aws_identity
}

# GCP Secret Manager: a service account key file from a Secret volume.
gcp_keys if {
	store_on("gcp")
	not gcp_identity
}

volumes contains {"name": "gcp-credentials", "secret": {"secretName": stores.gcp.secretName}} if gcp_keys

volume_mounts contains mount("gcp-credentials", "/var/run/secrets/runwarden/gcp") if gcp_keys

env contains env_var("GOOGLE_APPLICATION_CREDENTIALS", concat("/", ["/var/run/secrets/runwarden/gcp", object.get(stores, ["gcp", "key"], "credentials.json")])) if gcp_keys

env contains env_var("GOOGLE_CLOUD_PROJECT", stores.gcp.project) if {
	store_on("gcp")
	stores.gcp.project != ""
}

# Azure Key Vault: a service principal from a Secret.
azure_keys if {
	store_on("azure")
	not azure_identity
}

env contains env_secret(name, stores.azure.secretName, key) if {
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

env contains env_var("VAULT_ADDR", stores.vault.address) if store_on("vault")

env contains env_var("VAULT_NAMESPACE", stores.vault.namespace) if {
	store_on("vault")
	stores.vault.namespace != ""
}

env contains env_secret("VAULT_TOKEN", stores.vault.secretName, object.get(stores, ["vault", "tokenKey"], "token")) if {
	store_on("vault")
	vault_auth == "token"
}

vault_kubernetes if {
	store_on("vault")
	vault_auth == "kubernetes"
}

env contains env_var("VAULT_AUTH_ROLE", stores.vault.role) if vault_kubernetes

env contains env_var("VAULT_AUTH_MOUNT", object.get(stores, ["vault", "mount"], "kubernetes")) if vault_kubernetes

env contains env_var("VAULT_TOKEN_FILE", "/var/run/secrets/runwarden/vault/token") if vault_kubernetes

volumes contains projected_token("vault-token", object.get(stores, ["vault", "audience"], "vault"), 600, "token") if vault_kubernetes

volume_mounts contains mount("vault-token", "/var/run/secrets/runwarden/vault") if vault_kubernetes

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
