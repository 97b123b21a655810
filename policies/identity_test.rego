package runwarden.admission_test

import data.runwarden.admission

# The cases of the EKS pod identity webhook's and Azure Workload Identity
# webhook's documented behaviour, one rule each.

with_identity(cfg, sa, pod_patch) := json.patch(input_with(cfg), array.concat(
	[{"op": "add", "path": "/serviceAccount/annotations", "value": sa}],
	pod_patch,
))

aws_on := {"workloadIdentity": {"aws": {"enabled": true}}}

role := {"eks.amazonaws.com/role-arn": "arn:aws:iam::111122223333:role/runner"}

decide(inp) := d if {
	d := admission.decision with input as inp
}

env_of(d, name) := [e | some e in d.mutations.env; e.env.name == name]

aws_token(d) := t if {
	some v in d.mutations.volumes
	v.name == "aws-iam-token"
	t := v.projected.sources[0].serviceAccountToken
}

# A bare role name (the EKS webhook's --compose-role-arn makes one into an
# ARN; nothing here does) is refused with the reason, from the annotation
# and from the role mapping ConfigMap alike; Pod Identity reads no role.
test_aws_role_must_be_an_arn if {
	bare := decide(with_identity(aws_on, {"eks.amazonaws.com/role-arn": "runner"}, []))
	[v.rule | some v in bare.deny] == ["aws-role-arn"]
	contains(bare.deny[0].message, `role "runner" is not an IAM role ARN`)
	gov := decide(with_identity(aws_on, {"eks.amazonaws.com/role-arn": "arn:aws-us-gov:iam::111122223333:role/path/runner"}, []))
	gov.deny == []
	mapped := json.patch(with_identity(aws_on, {}, []), [{"op": "add", "path": "/awsRoleMappings", "value": {"*/runner": {"roleARN": "mapped"}}}])
	[v.rule | some v in decide(mapped).deny] == ["aws-role-arn"]
	pi := {"workloadIdentity": {"aws": {"enabled": true, "podIdentity": {"associations": [{"namespace": "team-a", "serviceAccount": "runner"}]}}}}
	decide(with_identity(pi, {"eks.amazonaws.com/role-arn": "runner"}, [])).deny == []
}

test_aws_annotations_of_the_service_account if {
	sa := object.union(role, {
		"eks.amazonaws.com/audience": "sts.example.com",
		"eks.amazonaws.com/token-expiration": "7200",
		"eks.amazonaws.com/sts-regional-endpoints": "true",
	})
	d := admission.decision with input as with_identity({"workloadIdentity": {"aws": {"enabled": true, "region": "eu-west-1"}}}, sa, [])
	aws_token(d) == {"audience": "sts.example.com", "expirationSeconds": 7200, "path": "token"}
	env_of(d, "AWS_STS_REGIONAL_ENDPOINTS") == [{"containers": ["main"], "env": {"name": "AWS_STS_REGIONAL_ENDPOINTS", "value": "regional"}}]
	env_of(d, "AWS_REGION") == [{"containers": ["main"], "env": {"name": "AWS_REGION", "value": "eu-west-1"}}]
	env_of(d, "AWS_DEFAULT_REGION") == [{"containers": ["main"], "env": {"name": "AWS_DEFAULT_REGION", "value": "eu-west-1"}}]
}

test_aws_pod_token_expiration_wins_and_is_clamped if {
	sa := object.union(role, {"eks.amazonaws.com/token-expiration": "7200"})
	pod := [{"op": "add", "path": "/pod/metadata/annotations/eks.amazonaws.com~1token-expiration", "value": "5"}]
	aws_token(decide(with_identity(aws_on, sa, pod))).expirationSeconds == 600
	low := object.union(role, {"eks.amazonaws.com/token-expiration": "60"})
	aws_token(decide(with_identity(aws_on, low, []))).expirationSeconds == 600
	bad := object.union(role, {"eks.amazonaws.com/token-expiration": "a day"})
	aws_token(decide(with_identity(aws_on, bad, []))).expirationSeconds == 86400
}

test_aws_regional_sts_reads_like_parse_bool if {
	off := object.union(role, {"eks.amazonaws.com/sts-regional-endpoints": "False"})
	env_of(decide(with_identity({"workloadIdentity": {"aws": {"enabled": true, "stsRegionalEndpoints": true}}}, off, [])), "AWS_STS_REGIONAL_ENDPOINTS") == []
	junk := object.union(role, {"eks.amazonaws.com/sts-regional-endpoints": "yes"})
	count(env_of(decide(with_identity({"workloadIdentity": {"aws": {"enabled": true, "stsRegionalEndpoints": true}}}, junk, [])), "AWS_STS_REGIONAL_ENDPOINTS")) == 1
}

test_aws_containers_own_env_wins if {
	pod := [{"op": "add", "path": "/pod/spec/containers/0/env", "value": [
		{"name": "AWS_ROLE_ARN", "value": "arn:aws:iam::1:role/own"},
		{"name": "AWS_DEFAULT_REGION", "value": "ap-south-1"},
	]}]
	d := admission.decision with input as with_identity({"workloadIdentity": {"aws": {"enabled": true, "region": "eu-west-1"}}}, role, pod)
	env_of(d, "AWS_ROLE_ARN")[0].containers == []
	env_of(d, "AWS_WEB_IDENTITY_TOKEN_FILE")[0].containers == []
	env_of(d, "AWS_REGION")[0].containers == []
}

test_aws_skip_containers if {
	pod := [
		{"op": "add", "path": "/pod/spec/containers/-", "value": {"name": "sidecar", "image": "registry.example.com/s:1"}},
		{"op": "add", "path": "/pod/spec/containers/-", "value": {"name": "helper", "image": "registry.example.com/h:1"}},
		{"op": "add", "path": "/pod/metadata/annotations/eks.amazonaws.com~1skip-containers", "value": "sidecar,helper"},
	]
	d := admission.decision with input as with_identity({"containers": ["*"], "workloadIdentity": {"aws": {"enabled": true}}}, role, pod)
	env_of(d, "AWS_ROLE_ARN")[0].containers == ["main"]
	some m in d.mutations.volumeMounts
	m.volumeMount.name == "aws-iam-token"
	m.containers == ["main"]
}

test_aws_existing_volume_is_kept if {
	pod := [{"op": "add", "path": "/pod/spec/volumes", "value": [{"name": "aws-iam-token", "emptyDir": {}}]}]
	d := admission.decision with input as with_identity(aws_on, role, pod)
	not aws_token(d)
	every v in d.mutations.volumes {
		v.name != "aws-iam-token"
	}
}

azure_on(extra) := {"workloadIdentity": {"azure": object.union({"enabled": true, "tenantId": "tid"}, extra)}}

client := {"azure.workload.identity/client-id": "cid"}

# The label Azure's webhook selects pods by, which the chart's runner pod
# template carries while Azure's inject mode is on.
azure_use := {"op": "add", "path": "/pod/metadata/labels/azure.workload.identity~1use", "value": "true"}

job_pod := [
	azure_use,
	{"op": "remove", "path": "/pod/metadata/name"},
	{"op": "add", "path": "/pod/metadata/generateName", "value": "rw-deploy-1a2b3c-x7k2p-"},
]

azure_volume(d) := v if {
	some v in d.mutations.volumes
	startswith(v.name, "azure-")
}

test_azure_current_layout if {
	d := admission.decision with input as with_identity(azure_on({}), client, job_pod)

	name := "azure-workload-identity-reserved-token"
	azure_volume(d) == {"name": name, "projected": {"sources": [{"serviceAccountToken": {
		"audience": "api://AzureADTokenExchange", "expirationSeconds": 3600, "path": "token/azure-identity-token",
	}}]}}
	{"containers": ["main"], "volumeMount": {"name": name, "mountPath": "/var/run/secrets/azure/wi", "readOnly": true}} in d.mutations.volumeMounts
	env_of(d, "AZURE_FEDERATED_TOKEN_FILE")[0].env.value == "/var/run/secrets/azure/wi/token/azure-identity-token"
}

test_azure_v15_layout if {
	d := admission.decision with input as with_identity(azure_on({"layout": "v1.5"}), client, [azure_use])
	azure_volume(d).name == "azure-identity-token"
	azure_volume(d).projected.sources[0].serviceAccountToken.path == "azure-identity-token"
	{"containers": ["main"], "volumeMount": {"name": "azure-identity-token", "mountPath": "/var/run/secrets/azure/tokens", "readOnly": true}} in d.mutations.volumeMounts
	env_of(d, "AZURE_FEDERATED_TOKEN_FILE")[0].env.value == "/var/run/secrets/azure/tokens/azure-identity-token"
}

test_azure_token_expiration if {
	sa := object.union(client, {"azure.workload.identity/service-account-token-expiration": "7200"})
	azure_volume(decide(with_identity(azure_on({}), sa, [azure_use]))).projected.sources[0].serviceAccountToken.expirationSeconds == 7200
	pod := [azure_use, {"op": "add", "path": "/pod/metadata/annotations/azure.workload.identity~1service-account-token-expiration", "value": "86400"}]
	azure_volume(decide(with_identity(azure_on({}), sa, pod))).projected.sources[0].serviceAccountToken.expirationSeconds == 86400
	every bad in ["600", "86401", "an hour"] {
		p := [azure_use, {"op": "add", "path": "/pod/metadata/annotations/azure.workload.identity~1service-account-token-expiration", "value": bad}]
		d := admission.decision with input as with_identity(azure_on({}), client, p)
		d.deny[0].rule == "azure-token-expiration"
		contains(d.deny[0].message, sprintf("token expiration %s not valid", [bad]))
		not azure_volume(d)
	}
}

test_azure_tenant_and_skip_and_own_env if {
	pod := [
		azure_use,
		{"op": "add", "path": "/pod/spec/containers/0/env", "value": [{"name": "AZURE_CLIENT_ID", "value": "own"}]},
		{"op": "add", "path": "/pod/spec/containers/-", "value": {"name": "sidecar", "image": "registry.example.com/s:1"}},
		{"op": "add", "path": "/pod/metadata/annotations/azure.workload.identity~1skip-containers", "value": "sidecar; helper"},
	]
	cfg := {"containers": ["*"], "workloadIdentity": {"azure": {"enabled": true}}}
	d := admission.decision with input as with_identity(cfg, client, pod)
	env_of(d, "AZURE_CLIENT_ID")[0].containers == []
	env_of(d, "AZURE_AUTHORITY_HOST")[0].containers == ["main"]

	# No tenant known: the variable is not set, never set empty.
	env_of(d, "AZURE_TENANT_ID") == []
	sa := object.union(client, {"azure.workload.identity/tenant-id": "sa-tenant"})
	env_of(decide(with_identity(azure_on({}), sa, [azure_use])), "AZURE_TENANT_ID")[0].env.value == "sa-tenant"
}

# The resolver reads Key Vault with the runner's Azure identity.
test_azure_identity_reaches_the_resolver if {
	cfg := {"workloadIdentity": {"azure": {"enabled": true, "tenantId": "tid"}}, "secretStores": {"azure": {"enabled": true, "secretName": "sp"}}}
	inp := json.patch(with_identity(cfg, client, [azure_use]), [{"op": "replace", "path": "/secretRefs", "value": [
		{"container": "main", "env": "DB", "store": "azure", "name": "db", "vault": "kv1", "raw": "${azure:db@kv1}", "error": ""},
	]}])
	d := decide(inp)
	env_of(d, "AZURE_CLIENT_ID")[0].containers == ["main", "runwarden-secrets"]
	not "AZURE_CLIENT_SECRET" in {e.env.name | some e in d.mutations.env}
}
