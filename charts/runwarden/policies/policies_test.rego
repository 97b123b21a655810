package runwarden.admission_test

import data.runwarden.admission

base_pod := {
	"metadata": {"name": "", "labels": {"runwarden.dev/runner": "true"}, "annotations": {}},
	"spec": {"containers": [{
		"name": "main",
		"image": "registry.example.com/runner:1",
		"resources": {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"cpu": "1", "memory": "1Gi"}},
	}]},
}

input_with(cfg) := {
	"operation": "CREATE",
	"pod": base_pod,
	"namespace": {"name": "team-a", "labels": {}, "annotations": {}},
	"serviceAccount": {"name": "runner", "annotations": {}},
	"config": cfg,
	"secretRefs": [],
}

test_empty_config_changes_nothing if {
	d := admission.decision with input as input_with({})
	d.deny == []
	d.warnings == []
	d.mutations.env == []
	d.mutations.volumes == []
	d.mutations.labels == {}
}

test_irsa_injects_like_the_eks_webhook if {
	inp := json.patch(input_with({"workloadIdentity": {"aws": {"enabled": true}}}), [{"op": "add", "path": "/serviceAccount/annotations", "value": {"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/runner"}}])
	d := admission.decision with input as inp
	{"containers": ["main"], "env": {"name": "AWS_ROLE_ARN", "value": "arn:aws:iam::111122223333:role/runner"}} in d.mutations.env
	{"containers": ["main"], "env": {"name": "AWS_WEB_IDENTITY_TOKEN_FILE", "value": "/var/run/secrets/eks.amazonaws.com/serviceaccount/token"}} in d.mutations.env
	some v in d.mutations.volumes
	v.name == "aws-iam-token"
	v.projected.sources[0].serviceAccountToken == {"audience": "sts.amazonaws.com", "expirationSeconds": 86400, "path": "token"}
	{"containers": ["main"], "volumeMount": {"name": "aws-iam-token", "mountPath": "/var/run/secrets/eks.amazonaws.com/serviceaccount", "readOnly": true}} in d.mutations.volumeMounts
}

# A pod's valid references to the stores given (ssm, gcp, azure, vault).
# Each is allowed by the namespace's patterns, so that only the rules under
# test deny.
with_refs(cfg, forms) := json.patch(input_with(cfg), [
	{"op": "replace", "path": "/secretRefs", "value": [
	{"container": "main", "env": upper(f), "store": f, "name": ref_names[f], "vault": "scope", "raw": sprintf("${%s:x}", [f]), "error": ""} |
		some f in forms
	]},
	{"op": "add", "path": "/namespace/annotations", "value": {"runwarden.dev/secret-patterns": "**"}},
])

ref_names := {"ssm": "x", "gcp": "projects/p/secrets/x", "azure": "x", "vault": "secret/x"}

test_irsa_replaces_static_aws_keys if {
	cfg := {"workloadIdentity": {"aws": {"enabled": true}}, "secretStores": {"aws": {"enabled": true, "secretName": "aws-creds"}}}
	inp := json.patch(with_refs(cfg, ["ssm"]), [{"op": "add", "path": "/serviceAccount/annotations", "value": {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/r"}}])
	d := admission.decision with input as inp

	# The resolver reads the store with the runner's IRSA identity.
	{"containers": ["main", "runwarden-secrets"], "env": {"name": "AWS_ROLE_ARN", "value": "arn:aws:iam::1:role/r"}} in d.mutations.env
	some m in d.mutations.volumeMounts
	m.volumeMount.name == "aws-iam-token"
	m.containers == ["main", "runwarden-secrets"]
	names := {e.env.name | some e in d.mutations.env}
	"AWS_ROLE_ARN" in names
	"AWS_REGION" in names
	not "AWS_ACCESS_KEY_ID" in names
}

# irsa_regions(cfg): the region variables an IRSA pod with an ssm reference
# gets, as [container, name, value].
irsa_regions(cfg) := {[c, e.env.name, e.env.value] |
	irsa := {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/r"}
	d := admission.decision with input as json.patch(with_refs(cfg, ["ssm"]), [{"op": "add", "path": "/serviceAccount/annotations", "value": irsa}])
	some e in d.mutations.env
	e.env.name in {"AWS_REGION", "AWS_DEFAULT_REGION"}
	some c in e.containers
}

# With IRSA and the identity's region set, the resolver gets one region, the
# store's, the one it reads the store in; the runner keeps the identity's.
# (Both were set on the resolver, and which won depended on order.)
test_resolver_gets_one_aws_region_the_stores if {
	# The store's region as configured.
	irsa_regions({"workloadIdentity": {"aws": {"enabled": true, "region": "eu-west-1"}}, "secretStores": {"aws": {"enabled": true, "region": "us-west-2"}}}) == {
		["main", "AWS_REGION", "eu-west-1"], ["main", "AWS_DEFAULT_REGION", "eu-west-1"],
		["runwarden-secrets", "AWS_REGION", "us-west-2"], ["runwarden-secrets", "AWS_DEFAULT_REGION", "us-west-2"],
	}

	# The store's region left out: the identity's, not us-east-1.
	irsa_regions({"workloadIdentity": {"aws": {"enabled": true, "region": "eu-west-1"}}, "secretStores": {"aws": {"enabled": true}}}) == {
		["main", "AWS_REGION", "eu-west-1"], ["main", "AWS_DEFAULT_REGION", "eu-west-1"],
		["runwarden-secrets", "AWS_REGION", "eu-west-1"], ["runwarden-secrets", "AWS_DEFAULT_REGION", "eu-west-1"],
	}

	# Neither set: us-east-1 for the resolver, nothing for the runner.
	irsa_regions({"workloadIdentity": {"aws": {"enabled": true}}, "secretStores": {"aws": {"enabled": true}}}) == {
		["runwarden-secrets", "AWS_REGION", "us-east-1"], ["runwarden-secrets", "AWS_DEFAULT_REGION", "us-east-1"],
	}
}

test_aws_static_keys_from_secret_with_default_region if {
	d := admission.decision with input as with_refs({"secretStores": {"aws": {"enabled": true, "secretName": "aws-creds"}}}, ["ssm"])
	{"containers": ["runwarden-secrets"], "env": {"name": "AWS_ACCESS_KEY_ID", "valueFrom": {"secretKeyRef": {"name": "aws-creds", "key": "aws_access_key_id"}}}} in d.mutations.env
	{"containers": ["runwarden-secrets"], "env": {"name": "AWS_SECRET_ACCESS_KEY", "valueFrom": {"secretKeyRef": {"name": "aws-creds", "key": "aws_secret_access_key"}}}} in d.mutations.env
	{"containers": ["runwarden-secrets"], "env": {"name": "AWS_REGION", "value": "us-east-1"}} in d.mutations.env
}

# The store's credentials are for its references only: a pod without one
# gets none, and the runner containers never do.
test_store_credentials_only_for_references if {
	cfg := {"secretStores": {"aws": {"enabled": true, "secretName": "aws-creds"}, "vault": {"enabled": true, "address": "https://vault:8200", "secretName": "vault-token"}}}
	none := admission.decision with input as input_with(cfg)
	none.mutations.env == []
	vault := admission.decision with input as with_refs(cfg, ["vault"])
	{e.env.name | some e in vault.mutations.env} == {"VAULT_ADDR", "VAULT_KV_MOUNTS", "VAULT_TOKEN"}
	every e in vault.mutations.env {
		e.containers == ["runwarden-secrets"]
	}
}

test_reference_to_a_disabled_store_is_denied if {
	d := admission.decision with input as with_refs({"secretStores": {"aws": {"enabled": true, "secretName": "aws-creds"}}}, ["vault"])
	[v.rule | some v in d.deny] == ["secret-ref-store-disabled"]
	contains(d.deny[0].message, `${vault:x} reads store "vault", which the platform configuration does not enable (secretStores.vault.enabled)`)
}

test_azure_label_mode if {
	inp := json.patch(input_with({"workloadIdentity": {"azure": {"enabled": true, "mode": "label"}}}), [{"op": "add", "path": "/serviceAccount/annotations", "value": {"azure.workload.identity/client-id": "cid"}}])
	d := admission.decision with input as inp
	d.mutations.labels == {"azure.workload.identity/use": "true"}
	d.mutations.env == []
}

# Without a mode, a pod labelled for Azure (as the chart's runner pod
# template labels it) gets what Azure's webhook would inject: a label added
# here is seen by Azure's webhook only if it runs after this one.
test_azure_default_mode_injects if {
	inp := json.patch(input_with({"workloadIdentity": {"azure": {"enabled": true}}}), [{"op": "add", "path": "/serviceAccount/annotations", "value": {"azure.workload.identity/client-id": "cid"}}, {"op": "add", "path": "/pod/metadata/labels/azure.workload.identity~1use", "value": "true"}])
	d := admission.decision with input as inp
	not d.mutations.labels["azure.workload.identity/use"]
	"AZURE_CLIENT_ID" in {e.env.name | some e in d.mutations.env}
}

test_azure_inject_mode if {
	cfg := {"workloadIdentity": {"azure": {"enabled": true, "mode": "inject", "tenantId": "tid"}}, "secretStores": {"azure": {"enabled": true, "secretName": "sp"}}}
	inp := json.patch(input_with(cfg), [{"op": "add", "path": "/serviceAccount/annotations", "value": {"azure.workload.identity/client-id": "cid"}}, {"op": "add", "path": "/pod/metadata/labels/azure.workload.identity~1use", "value": "true"}])
	d := admission.decision with input as inp
	env := {e.env.name: object.get(e.env, "value", "") | some e in d.mutations.env}
	env == {
		"AZURE_CLIENT_ID": "cid",
		"AZURE_TENANT_ID": "tid",
		"AZURE_FEDERATED_TOKEN_FILE": "/var/run/secrets/azure/wi/token/azure-identity-token",
		"AZURE_AUTHORITY_HOST": "https://login.microsoftonline.com/",
	}
	some v in d.mutations.volumes
	v.projected.sources[0].serviceAccountToken.audience == "api://AzureADTokenExchange"
	v.projected.sources[0].serviceAccountToken.expirationSeconds == 3600
}

test_azure_service_principal_without_identity if {
	d := admission.decision with input as with_refs({"secretStores": {"azure": {"enabled": true, "secretName": "sp"}}}, ["azure"])
	{e.env.name | some e in d.mutations.env} == {"AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_TENANT_ID"}
}

test_gke_identity_selects_metadata_server_nodes if {
	cfg := {"workloadIdentity": {"gcp": {"enabled": true}}, "secretStores": {"gcp": {"enabled": true, "secretName": "gcp-key", "project": "p1"}}}
	inp := json.patch(with_refs(cfg, ["gcp"]), [{"op": "add", "path": "/serviceAccount/annotations", "value": {"iam.gke.io/gcp-service-account": "runner@p1.iam.gserviceaccount.com"}}])
	d := admission.decision with input as inp
	d.mutations.nodeSelector == {"iam.gke.io/gke-metadata-server-enabled": "true"}
	d.mutations.volumes == []
	{e.env.name | some e in d.mutations.env} == {"GOOGLE_CLOUD_PROJECT"}
}

# Where a cloud's workload identity applies, a Secret configured for its
# store is not used: the resolver reads the store with the identity the
# runner container holds too (docs/secrets.md, "Threat model's part"). Only
# static credentials, and Vault's token of audience vault, stay the
# resolver's alone.
test_workload_identity_reads_the_store_as_the_runner if {
	cfg := {
		"workloadIdentity": {"aws": {"enabled": true}, "azure": {"enabled": true, "tenantId": "tid"}},
		"secretStores": {
			"aws": {"enabled": true, "secretName": "aws-creds"}, "azure": {"enabled": true, "secretName": "sp"},
			"vault": {"enabled": true, "address": "https://vault:8200", "auth": "kubernetes", "role": "runner"},
		},
	}
	sa := {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/r", "azure.workload.identity/client-id": "cid"}
	d := admission.decision with input as json.patch(with_refs(cfg, ["ssm", "azure", "vault"]), [{"op": "add", "path": "/serviceAccount/annotations", "value": sa}, {"op": "add", "path": "/pod/metadata/labels/azure.workload.identity~1use", "value": "true"}])
	d.deny == []
	shared := {"AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE", "AZURE_CLIENT_ID", "AZURE_TENANT_ID", "AZURE_FEDERATED_TOKEN_FILE", "AZURE_AUTHORITY_HOST"}
	{[e.env.name, e.containers] | some e in d.mutations.env} == {[n, ["main", "runwarden-secrets"]] | some n in shared} | {
	[n, ["runwarden-secrets"]] |
		some n in {"AWS_REGION", "AWS_DEFAULT_REGION", "VAULT_ADDR", "VAULT_KV_MOUNTS", "VAULT_AUTH_ROLE", "VAULT_AUTH_MOUNT", "VAULT_TOKEN_FILE"}
	}
	{[m.volumeMount.name, m.containers] | some m in d.mutations.volumeMounts} == {
		["aws-iam-token", ["main", "runwarden-secrets"]],
		["azure-workload-identity-reserved-token", ["main", "runwarden-secrets"]],
		["vault-token", ["runwarden-secrets"]],
	}
}

test_gcp_key_file if {
	d := admission.decision with input as with_refs({"secretStores": {"gcp": {"enabled": true, "secretName": "gcp-key"}}}, ["gcp"])
	d.mutations.volumes == [{"name": "gcp-credentials", "secret": {"secretName": "gcp-key"}}]
	{"containers": ["runwarden-secrets"], "env": {"name": "GOOGLE_APPLICATION_CREDENTIALS", "value": "/var/run/secrets/runwarden/gcp/credentials.json"}} in d.mutations.env
}

test_vault_token_and_kubernetes_auth if {
	t := admission.decision with input as with_refs({"secretStores": {"vault": {"enabled": true, "address": "https://vault:8200", "secretName": "vault-token", "namespace": "ns1"}}}, ["vault"])
	{e.env.name | some e in t.mutations.env} == {"VAULT_ADDR", "VAULT_KV_MOUNTS", "VAULT_NAMESPACE", "VAULT_TOKEN"}
	k := admission.decision with input as with_refs({"secretStores": {"vault": {"enabled": true, "address": "https://vault:8200", "auth": "kubernetes", "role": "runner"}}}, ["vault"])
	{e.env.name | some e in k.mutations.env} == {"VAULT_ADDR", "VAULT_KV_MOUNTS", "VAULT_AUTH_ROLE", "VAULT_AUTH_MOUNT", "VAULT_TOKEN_FILE"}
	k.mutations.volumes[0].projected.sources[0].serviceAccountToken.audience == "vault"
}

test_credential_sets if {
	cfg := {"credentialSets": [
		{"name": "github", "secretName": "gh-app", "env": [{"name": "GITHUB_APP_ID", "key": "app_id"}], "mountPath": "/var/run/secrets/github"},
		{"name": "infracost", "secretName": "infracost", "envFrom": true},
	]}
	d := admission.decision with input as input_with(cfg)
	{"containers": ["main"], "env": {"name": "GITHUB_APP_ID", "valueFrom": {"secretKeyRef": {"name": "gh-app", "key": "app_id"}}}} in d.mutations.env
	d.mutations.volumes == [{"name": "creds-github", "secret": {"secretName": "gh-app"}}]
	d.mutations.envFrom == [{"containers": ["main"], "envFrom": {"secretRef": {"name": "infracost"}}}]
}

test_no_literal_secret_values if {
	cfg := {"secretStores": {
		"aws": {"enabled": true, "secretName": "a"}, "azure": {"enabled": true, "secretName": "b"},
		"vault": {"enabled": true, "address": "x", "secretName": "c"},
	}}
	d := admission.decision with input as with_refs(cfg, ["ssm", "azure", "vault"])
	count(d.mutations.env) == 10
	every e in d.mutations.env {
		secret_ref_or_public(e.env)
	}
}

secret_ref_or_public(env) if env.valueFrom.secretKeyRef

secret_ref_or_public(env) if env.name in {"AWS_REGION", "AWS_DEFAULT_REGION", "VAULT_ADDR", "VAULT_KV_MOUNTS"}

test_scheduling_from_config_and_namespace if {
	cfg := {"scheduling": {
		"nodeSelector": {"runwarden.dev/pool": "runner"},
		"tolerations": [{"key": "runwarden.dev/pool", "operator": "Equal", "value": "runner", "effect": "NoSchedule"}],
		"requiredNodeAffinity": [{"key": "kubernetes.io/arch", "operator": "In", "values": ["amd64"]}],
		"doNotEvict": true,
	}}
	d := admission.decision with input as input_with(cfg)
	d.mutations.nodeSelector == {"runwarden.dev/pool": "runner"}
	count(d.mutations.tolerations) == 1
	count(d.mutations.nodeAffinity) == 1
	d.mutations.annotations == {"cluster-autoscaler.kubernetes.io/safe-to-evict": "false", "karpenter.sh/do-not-disrupt": "true"}

	inp := json.patch(input_with(cfg), [{"op": "add", "path": "/namespace/annotations", "value": {
		"runwarden.dev/node-selector": "pool=team-a, zone=eu",
		"runwarden.dev/tolerations": `[{"key":"team-a","operator":"Exists","effect":"NoSchedule"}]`,
	}}])
	n := admission.decision with input as inp
	n.mutations.nodeSelector == {"pool": "team-a", "zone": "eu"}
	n.warnings == []
	count(n.mutations.tolerations) == 2
}

test_bad_tolerations_annotation_warns if {
	inp := json.patch(input_with({}), [{"op": "add", "path": "/namespace/annotations", "value": {"runwarden.dev/tolerations": `{"not": "a list"}`}}])
	d := admission.decision with input as inp
	count(d.warnings) == 1
	d.mutations.tolerations == []
}

# A node selector annotation that does not read as key=value pairs with
# distinct keys, each a label key and a label value the API server accepts,
# is a warning, and the configured pool stays.
test_every_bad_node_selector_annotation_keeps_the_configured_pool if {
	cfg := {"scheduling": {"nodeSelector": {"runwarden.dev/pool": "runner"}}}
	long := concat("", ["a" | some _ in numbers.range(1, 64)])
	every bad in [
		"pool: team-a", "pool=a,pool=b", "=x", "a=b=c", " , ",
		"pool=team a", "team pool=a", "pool=-a", "pool=a_", sprintf("pool=%s", [long]), sprintf("%s=a", [long]),
		"Example.com/pool=a", "/pool=a", "a/b/c=x", "example.com/=a",
	] {
		inp := json.patch(input_with(cfg), [{"op": "add", "path": "/namespace/annotations", "value": {"runwarden.dev/node-selector": bad}}])
		d := admission.decision with input as inp
		d.mutations.nodeSelector == {"runwarden.dev/pool": "runner"}
		count(d.warnings) == 1
	}
}

# Label keys with a prefix, and empty values, are node selector pairs too.
test_node_selector_annotation_with_prefixed_keys_and_empty_values if {
	inp := json.patch(input_with({}), [{"op": "add", "path": "/namespace/annotations", "value": {"runwarden.dev/node-selector": "example.com/pool=team-a.x_1, gpu="}}])
	d := admission.decision with input as inp
	d.mutations.nodeSelector == {"example.com/pool": "team-a.x_1", "gpu": ""}
	d.warnings == []
}

# Items of the tolerations annotation that are not tolerations are left out
# with a warning; the others are kept.
test_tolerations_annotation_items_that_are_not_tolerations if {
	inp := json.patch(input_with({}), [{"op": "add", "path": "/namespace/annotations", "value": {"runwarden.dev/tolerations": `["team-a", {"key": 1}, {"key": "team-a", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30}]`}}])
	d := admission.decision with input as inp
	[t.key | some t in d.mutations.tolerations] == ["team-a"]
	count(d.warnings) == 2
}

tolerations_annotation(items) := json.patch(input_with({}), [{"op": "add", "path": "/namespace/annotations", "value": {"runwarden.dev/tolerations": json.marshal(items)}}])

# What the API server accepts in a pod is kept: an empty key with Exists
# tolerates every taint, an empty operator means Equal, an empty effect
# every effect, and tolerationSeconds goes with NoExecute (negative means 0).
test_tolerations_annotation_keeps_what_kubernetes_accepts if {
	good := [
		{"operator": "Exists"},
		{"key": "example.com/team", "value": "team-a"},
		{"key": "team", "operator": "Equal", "value": "", "effect": "PreferNoSchedule"},
		{"key": "team", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": -1},
		{"key": "team", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 9223372036854775807},
	]
	d := admission.decision with input as tolerations_annotation(good)
	d.warnings == []
	count(d.mutations.tolerations) == count(good)
}

# Each item the API server would refuse in a pod (Kubernetes'
# ValidateTolerations), or Go could not decode, is left out with a warning
# saying why, and the platform's own tolerations stay.
test_tolerations_annotation_leaves_out_each_kind_of_invalid_item if {
	cfg := {"scheduling": {"tolerations": [{"key": "runwarden.dev/pool", "operator": "Equal", "value": "runner", "effect": "NoSchedule"}]}}
	cases := [
		[{"key": "team", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 1.5}, "tolerationSeconds is not a whole number of seconds"],
		[{"key": "team", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 30.0}, "tolerationSeconds is not a whole number of seconds"],
		[{"key": "team", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": 9223372036854775808}, "tolerationSeconds is not a whole number of seconds"],
		[{"key": "team", "operator": "Exists", "effect": "NoExecute", "tolerationSeconds": "30"}, "tolerationSeconds is not a whole number of seconds"],
		[{"key": "team", "operator": "Exists", "tolerationSeconds": 30}, "tolerationSeconds needs effect NoExecute"],
		[{"key": "team", "operator": "Exists", "effect": "NoSchedule", "tolerationSeconds": 30}, "tolerationSeconds needs effect NoExecute"],
		[{"key": "team", "operator": "In", "value": "a"}, `operator "In" is not Equal or Exists`],
		[{"key": "team", "operator": "exists"}, `operator "exists" is not Equal or Exists`],
		[{"key": "team", "operator": "Exists", "effect": "NoExec"}, `effect "NoExec" is not NoSchedule, PreferNoSchedule or NoExecute`],
		[{"value": "a"}, "an empty key needs operator Exists"],
		[{"key": "", "operator": "Equal", "value": "a"}, "an empty key needs operator Exists"],
		[{"key": "team", "operator": "Exists", "value": "a"}, "operator Exists takes no value"],
		[{"key": "team", "operator": "Equal", "value": "team a"}, `value "team a" is not a label value`],
		[{"key": "team", "value": concat("", ["a" | some _ in numbers.range(1, 64)])}, "is not a label value"],
		[{"key": "team a", "operator": "Exists"}, `key "team a" is not a label key`],
		[{"key": "Example.com/team", "operator": "Exists"}, `key "Example.com/team" is not a label key`],
		[{"key": "a/b/c", "operator": "Exists"}, `key "a/b/c" is not a label key`],
		[{"key": "team", "operator": "Exists", "effects": "NoSchedule"}, `no field "effects"`],
		[{"key": "team", "operator": null}, "operator is not a string"],
		[["team"], "not an object"],
	]
	every c in cases {
		d := admission.decision with input as json.patch(tolerations_annotation([c[0]]), [{"op": "add", "path": "/config", "value": cfg}])
		d.mutations.tolerations == cfg.scheduling.tolerations
		count(d.warnings) == 1
		contains(d.warnings[0], "runwarden.dev/tolerations")
		contains(d.warnings[0], c[1])
		endswith(d.warnings[0], "; left out")
	}
}

ref(store, name, err) := {"container": "main", "env": "DB_PASSWORD", "store": store, "name": name, "raw": "x", "error": err}

# Every store on, so that references are checked for their stores and names.
all_stores := {"secretStores": {
	"aws": {"enabled": true, "secretName": "a"}, "gcp": {"enabled": true, "secretName": "g"},
	"azure": {"enabled": true, "secretName": "z"}, "vault": {"enabled": true, "address": "x", "secretName": "v"},
}}

# A reference with its scope: the Vault namespace or the Azure key vault.
sref(store, name, scope) := {"container": "main", "env": "DB_PASSWORD", "store": store, "name": name, "vault": scope, "raw": sprintf("${%s:%s}", [store, name]), "error": ""}

with_patterns(inp, patterns) := json.patch(inp, [{"op": "add", "path": "/namespace/annotations", "value": {"runwarden.dev/secret-patterns": patterns}}])

test_secret_refs_denied_by_default if {
	inp := json.patch(input_with(all_stores), [{"op": "replace", "path": "/secretRefs", "value": [ref("ssm", "prod/db", "")]}])
	d := admission.decision with input as inp
	[v.rule | some v in d.deny] == ["secret-ref-name"]
	contains(d.deny[0].message, "none: the namespace names no secret patterns")
}

test_secret_ref_store_and_name_per_namespace if {
	inp := json.patch(input_with(all_stores), [
		{"op": "replace", "path": "/secretRefs", "value": [ref("gcp", "x", ""), sref("vault", "secret/team-b/db", "team-a"), sref("vault", "secret/team-a/db", "team-a")]},
		{"op": "add", "path": "/namespace/annotations", "value": {"runwarden.dev/secret-stores": "vault, ssm", "runwarden.dev/secret-patterns": "vault:team-a:secret/team-a/*"}},
	])
	d := admission.decision with input as inp
	[[v.rule, v.message] | some v in d.deny] == [
		["secret-ref-name", "secret-ref-name: container \"main\" env DB_PASSWORD: namespace team-a may not read ${vault:secret/team-b/db} (vault:team-a:secret/team-b/db; allowed: vault:team-a:secret/team-a/*)"],
		["secret-ref-store", "secret-ref-store: container \"main\" env DB_PASSWORD: namespace team-a may not read from store \"gcp\" (allowed: ssm, vault)"],
	]
}

test_secret_ref_config_defaults if {
	cfg := object.union(all_stores, {"secretRefs": {"allowedStores": ["ssm"], "allowedPatterns": ["ssm:shared/**"]}})
	inp := json.patch(input_with(cfg), [{"op": "replace", "path": "/secretRefs", "value": [ref("ssm", "shared/a/b", ""), ref("ssm", "other", ""), sref("vault", "secret/shared/x", "ns")]}])
	d := admission.decision with input as inp
	[v.rule | some v in d.deny] == ["secret-ref-name", "secret-ref-store"]
}

# A pattern bounds the whole address of a secret: the store, its scope
# (Vault namespace, key vault, GCP project, an ARN's account and region)
# and the name; the same name in another scope is not allowed.
test_secret_pattern_bounds_the_whole_address if {
	cfg := object.union(all_stores, {"secretStores": {"gcp": {"project": "p-a"}}})
	patterns := "vault:team-a:secret/team-a/**, azure:team-a-kv:team-a-*, gcp:p-a:team-a-*, ssm:/team-a/**, ssm:arn:aws:secretsmanager:us-east-1:111:secret:team-a-*"
	allowed := [
		sref("vault", "secret/team-a/db", "team-a"),
		sref("azure", "team-a-db", "team-a-kv"),
		ref("gcp", "team-a-db", ""),
		ref("gcp", "projects/p-a/secrets/team-a-db/versions/2", ""),
		ref("ssm", "/team-a/db", ""),
		ref("ssm", "arn:aws:secretsmanager:us-east-1:111:secret:team-a-db", ""),
	]
	ok := admission.decision with input as with_patterns(json.patch(input_with(cfg), [{"op": "replace", "path": "/secretRefs", "value": allowed}]), patterns)
	ok.deny == []
	denied := [
		sref("vault", "secret/team-a/db", "team-b"),
		sref("azure", "team-a-db", "team-b-kv"),
		ref("gcp", "projects/p-b/secrets/team-a-db", ""),
		ref("ssm", "/team-b/db", ""),
		ref("ssm", "arn:aws:secretsmanager:us-east-1:222:secret:team-a-db", ""),
		ref("ssm", "arn:aws:secretsmanager:eu-west-1:111:secret:team-a-db", ""),
	]
	d := admission.decision with input as with_patterns(json.patch(input_with(cfg), [{"op": "replace", "path": "/secretRefs", "value": denied}]), patterns)
	count(d.deny) == count(denied)
	{v.rule | some v in d.deny} == {"secret-ref-name"}
}

test_unscoped_pattern_says_how_to_write_it if {
	inp := with_patterns(json.patch(input_with(all_stores), [{"op": "replace", "path": "/secretRefs", "value": [sref("vault", "secret/team-a/db", "team-a")]}]), "team-a/*")
	d := admission.decision with input as inp
	{v.rule | some v in d.deny} == {"secret-ref-name", "secret-ref-pattern"}
	some v in d.deny
	v.rule == "secret-ref-pattern"
	contains(v.message, "write it as vault:<namespace>:<path>")
}

test_gcp_reference_without_a_project_is_denied if {
	inp := with_patterns(json.patch(input_with(all_stores), [{"op": "replace", "path": "/secretRefs", "value": [ref("gcp", "db", "")]}]), "**")
	d := admission.decision with input as inp
	[v.rule | some v in d.deny] == ["secret-ref-gcp-project"]
}

# Vault's own paths are never read, whatever the patterns allow: the
# resolver's token (auth/token/lookup-self), an identity token minted for it,
# its cubbyhole, sys/.
test_vault_reference_to_vaults_own_paths_is_denied if {
	cfg := object.union(all_stores, {"secretStores": {"vault": {"kvMounts": ["secret", "auth", "sys"]}}})
	refs := [
		sref("vault", "auth/token/lookup-self", "team-a"),
		sref("vault", "identity/oidc/token/role", "team-a"),
		sref("vault", "cubbyhole/x", "team-a"),
		sref("vault", "sys/config/state/sanitized", "team-a"),
	]
	d := admission.decision with input as with_patterns(json.patch(input_with(cfg), [{"op": "replace", "path": "/secretRefs", "value": refs}]), "**")
	count(d.deny) == 4
	every v in d.deny {
		v.rule == "secret-ref-vault-mount"
		contains(v.message, "not a stored secret")
		contains(v.message, "(secret/)")
	}
}

test_vault_reference_outside_the_named_mounts_is_denied if {
	cfg := object.union(all_stores, {"secretStores": {"vault": {"kvMounts": ["secret", "kv1/"], "engineMounts": ["database"]}}})
	refs := [sref("vault", "secret/a", "n"), sref("vault", "kv1/a", "n"), sref("vault", "database/creds/ro", "n"), sref("vault", "transit/keys/k", "n"), sref("vault", "secretx/a", "n")]
	d := admission.decision with input as with_patterns(json.patch(input_with(cfg), [{"op": "replace", "path": "/secretRefs", "value": refs}]), "**")
	[v.message | some v in d.deny] == [
		"secret-ref-vault-mount: container \"main\" env DB_PASSWORD: ${vault:secretx/a} is under no Vault mount the platform names (database/, kv1/, secret/; secretStores.vault.kvMounts or engineMounts)",
		"secret-ref-vault-mount: container \"main\" env DB_PASSWORD: ${vault:transit/keys/k} is under no Vault mount the platform names (database/, kv1/, secret/; secretStores.vault.kvMounts or engineMounts)",
	]
	count(d.deny) == 2

	# The resolver gets the same mounts, and checks them again before it reads.
	{"containers": ["runwarden-secrets"], "env": {"name": "VAULT_KV_MOUNTS", "value": "kv1,secret"}} in d.mutations.env
	{"containers": ["runwarden-secrets"], "env": {"name": "VAULT_ENGINE_MOUNTS", "value": "database"}} in d.mutations.env
}

test_shape_denials_name_rule_container_and_field if {
	cfg := {"shape": {"requireResources": true, "allowedRegistries": ["registry.example.com"], "gitURLAllowList": ["^https://git\\.example\\.com/"]}}
	bad := json.patch(input_with(cfg), [
		{"op": "add", "path": "/pod/spec/hostNetwork", "value": true},
		{"op": "add", "path": "/pod/spec/volumes", "value": [{"name": "root", "hostPath": {"path": "/"}}]},
		{"op": "add", "path": "/pod/spec/initContainers", "value": [{"name": "setup", "image": "docker.io/evil:1", "securityContext": {"privileged": true, "allowPrivilegeEscalation": true}}]},
		{"op": "replace", "path": "/pod/spec/containers/0/resources", "value": {}},
		{"op": "add", "path": "/pod/metadata/annotations/runwarden.dev~1repo-url", "value": "https://github.com/x/y"},
	])
	d := admission.decision with input as bad
	rules := {v.rule | some v in d.deny}
	rules == {"no-host-namespaces", "no-host-path", "no-privileged", "no-privilege-escalation", "allowed-registries", "resources-required", "git-url-allowed"}
	some v in d.deny
	v.rule == "no-privileged"
	v.container == "setup"
	v.field == "securityContext.privileged"
}

test_shape_allows_a_good_pod if {
	cfg := {"shape": {"requireResources": true, "allowedRegistries": ["registry.example.com/"], "gitURLAllowList": ["^https://git\\.example\\.com/"]}}
	good := json.patch(input_with(cfg), [{"op": "add", "path": "/pod/metadata/annotations/runwarden.dev~1repo-url", "value": "https://git.example.com/team/infra.git"}])
	d := admission.decision with input as good
	d.deny == []
}

# no-privilege-escalation denies an explicit true only: unset is allowed
# (see shape.rego), and so is false.
test_privilege_escalation_is_denied_only_when_set_true if {
	unset := admission.decision with input as input_with({})
	unset.deny == []
	f := json.patch(input_with({}), [{"op": "add", "path": "/pod/spec/containers/0/securityContext", "value": {"allowPrivilegeEscalation": false}}])
	off := admission.decision with input as f
	off.deny == []
	on := admission.decision with input as json.patch(f, [{"op": "replace", "path": "/pod/spec/containers/0/securityContext/allowPrivilegeEscalation", "value": true}])
	[v.rule | some v in on.deny] == ["no-privilege-escalation"]
}

# The chart's runner resources (requests, a memory limit, no cpu limit)
# meet requireResources; a missing memory limit does not.
test_shape_requires_requests_and_a_memory_limit if {
	cfg := {"shape": {"requireResources": true}}
	chart := json.patch(input_with(cfg), [{"op": "replace", "path": "/pod/spec/containers/0/resources", "value": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "1Gi"}}}])
	ok := admission.decision with input as chart
	ok.deny == []
	no_limit := json.patch(chart, [{"op": "remove", "path": "/pod/spec/containers/0/resources/limits"}])
	d := admission.decision with input as no_limit
	[v.field | some v in d.deny] == ["resources.limits.memory"]
}

# requireResources holds for init containers as for containers.
test_shape_requires_resources_of_init_containers if {
	cfg := {"shape": {"requireResources": true}}
	inp := json.patch(input_with(cfg), [{"op": "add", "path": "/pod/spec/initContainers", "value": [{"name": "clone", "image": "registry.example.com/git:1", "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}}}]}])
	d := admission.decision with input as inp
	[[v.rule, v.container, v.field] | some v in d.deny] == [["resources-required", "clone", "resources.limits.memory"]]
}

test_audit_mode_turns_denials_into_warnings if {
	inp := json.patch(input_with({"mode": "audit"}), [{"op": "add", "path": "/pod/spec/hostPID", "value": true}])
	d := admission.decision with input as inp
	d.deny == []
	d.warnings == ["audit: would deny: no-host-namespaces: the pod uses the host's namespaces (hostPID)"]
}

test_custom_runner_containers if {
	d := admission.decision with input as input_with({"containers": ["main", "sidecar"], "credentialSets": [{"name": "gh", "secretName": "gh", "env": [{"name": "GH_TOKEN", "key": "token"}]}]})
	count(d.mutations.env) == 1
	every e in d.mutations.env {
		e.containers == ["main", "sidecar"]
	}
}

# A pod of a runner namespace that is not an earned runner gets the shape
# rules, not the secret-reference rules (it gets no credentials).
test_non_runner_pods_get_shape_rules_only if {
	inp := json.patch(input_with({}), [
		{"op": "add", "path": "/runner", "value": false},
		{"op": "add", "path": "/pod/spec/containers/0/securityContext", "value": {"privileged": true}},
		{"op": "add", "path": "/secretRefs", "value": [{"container": "main", "env": "X", "store": "vault", "error": "malformed secret reference ${vault:x}"}]},
	])
	d := admission.decision with input as inp
	rules := {v.rule | some v in d.deny}
	rules == {"no-privileged"}
}

ephemeral_input(cfg, container) := json.patch(input_with(cfg), [
	{"op": "add", "path": "/operation", "value": "UPDATE"},
	{"op": "add", "path": "/runner", "value": true},
	{"op": "add", "path": "/subResource", "value": "ephemeralcontainers"},
	{"op": "add", "path": "/oldPod", "value": json.patch(base_pod, [{"op": "add", "path": "/spec/ephemeralContainers", "value": [{"name": "old", "image": "registry.example.com/debug:1"}]}])},
	{"op": "add", "path": "/pod/spec/volumes", "value": [{"name": "vault-token", "secret": {"secretName": "vault-token"}}, {"name": "work", "emptyDir": {}}]},
	{"op": "add", "path": "/pod/spec/ephemeralContainers", "value": [{"name": "old", "image": "registry.example.com/debug:1"}, container]},
])

test_ephemeral_containers_refused_by_default if {
	d := admission.decision with input as ephemeral_input({}, {"name": "debugger", "image": "registry.example.com/debug:1"})
	[v.rule | some v in d.deny] == ["no-ephemeral-containers"]
	contains(d.deny[0].message, `ephemeral container "debugger"`)
}

test_ephemeral_containers_allowed_without_credentials if {
	cfg := {"ephemeralContainers": {"allow": true}}
	ok := admission.decision with input as ephemeral_input(cfg, {"name": "debugger", "image": "registry.example.com/debug:1", "volumeMounts": [{"name": "work", "mountPath": "/w"}]})
	ok.deny == []
	mounted := admission.decision with input as ephemeral_input(cfg, {"name": "debugger", "image": "registry.example.com/debug:1", "volumeMounts": [{"name": "vault-token", "mountPath": "/t"}]})
	[v.message | some v in mounted.deny] == [`ephemeral-no-credentials: ephemeral container "debugger" mounts volume "vault-token", which holds credentials`]
	env := admission.decision with input as ephemeral_input(cfg, {"name": "debugger", "image": "registry.example.com/debug:1", "env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "vault-token", "key": "token"}}}], "envFrom": [{"secretRef": {"name": "aws-creds"}}]})
	count(env.deny) == 2
	values := admission.decision with input as ephemeral_input(cfg, {"name": "debugger", "image": "registry.example.com/debug:1", "volumeMounts": [{"name": "runwarden-secrets", "mountPath": "/s"}], "env": [{"name": "V", "valueFrom": {"fileKeyRef": {"volumeName": "runwarden-secrets", "path": "secrets.env", "key": "RW_0"}}}]})
	{v.message | some v in values.deny} == {
		`ephemeral-no-credentials: ephemeral container "debugger" mounts volume "runwarden-secrets", which holds credentials`,
		`ephemeral-no-credentials: ephemeral container "debugger" reads env V from the resolved secret references`,
	}
	privileged := admission.decision with input as ephemeral_input(cfg, {"name": "debugger", "image": "registry.example.com/debug:1", "securityContext": {"privileged": true}})
	[v.rule | some v in privileged.deny] == ["no-privileged"]
}

test_image_change_on_update_is_checked if {
	inp := json.patch(input_with({"shape": {"allowedRegistries": ["registry.example.com"]}}), [
		{"op": "add", "path": "/operation", "value": "UPDATE"},
		{"op": "add", "path": "/oldPod", "value": base_pod},
		{"op": "add", "path": "/pod/spec/containers/0/image", "value": "evil.example.net/runner:1"},
	])
	d := admission.decision with input as inp
	[v.rule | some v in d.deny] == ["allowed-registries"]
}

# The resolver's image is runwarden's, named by the webhook, not the pod: it
# passes the registry allow-list; the same image named by the pod alone does not.
test_resolver_image_is_allowed if {
	cfg := {"shape": {"allowedRegistries": ["registry.example.com"]}}
	pod := [{"op": "add", "path": "/pod/spec/initContainers", "value": [{"name": "runwarden-secrets", "image": "localhost/runwarden/webhook:1"}]}]
	with_image := json.patch(input_with(cfg), array.concat(pod, [{"op": "add", "path": "/resolverImage", "value": "localhost/runwarden/webhook:1"}]))
	allowed := admission.decision with input as with_image
	allowed.deny == []
	without := admission.decision with input as json.patch(input_with(cfg), pod)
	[v.rule | some v in without.deny] == ["allowed-registries"]
}

# A cloud store without a Secret (its credentials come from workload
# identity, or are missing) gets no key variables or volumes, never a mount of
# a volume that is not there.
test_cloud_store_without_a_secret if {
	cfg := {"secretStores": {"aws": {"enabled": true}, "gcp": {"enabled": true, "project": "p1"}, "azure": {"enabled": true}}}
	d := admission.decision with input as with_refs(cfg, ["ssm", "gcp", "azure"])
	d.deny == []
	d.mutations.volumes == []
	d.mutations.volumeMounts == []
	{e.env.name | some e in d.mutations.env} == {"AWS_REGION", "AWS_DEFAULT_REGION", "GOOGLE_CLOUD_PROJECT"}
}
