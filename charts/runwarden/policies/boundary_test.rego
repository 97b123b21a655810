package runwarden.admission_test

import data.runwarden.admission

# The platform of the boundary's tests: a Vault store with Kubernetes auth,
# a credential set, IRSA and Azure on, and the runner service account and
# pod template Secrets the chart adds.
boundary_cfg := {
	"secretStores": {
		"vault": {"enabled": true, "address": "https://vault:8200", "auth": "kubernetes", "role": "runner", "secretName": "vault-token"},
		"aws": {"enabled": false, "secretName": "aws-creds"},
	},
	"credentialSets": [{"name": "git", "secretName": "git-creds", "mountPath": "/git"}],
	"workloadIdentity": {"aws": {"enabled": true}, "azure": {"enabled": true}},
	"runner": {"serviceAccount": "runwarden-runner", "secrets": ["template-pull", "template-ca"]},
}

# The ways a platform relaxes rules: none of them relaxes the boundary.
relaxing := [
	{},
	{"mode": "audit"},
	{"enforcement": {"default": "dryrun"}},
	{"enforcement": {"default": "warn"}},
]

# A pod without the runner label (runner false), as the validating webhook
# sees one, under cfg, changed by patch.
plain(cfg, patch) := json.patch(input_with(object.union(boundary_cfg, cfg)), array.concat(
	[
		{"op": "add", "path": "/runner", "value": false},
		{"op": "replace", "path": "/pod/metadata/labels", "value": {"app": "tool"}},
		{"op": "replace", "path": "/serviceAccount/name", "value": "default"},
	],
	patch,
))

test_plain_pod_without_platform_credentials_is_admitted if {
	d := admission.decision with input as plain({}, [
		{"op": "add", "path": "/pod/spec/containers/0/env", "value": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "own", "key": "t"}}}]},
		{"op": "add", "path": "/pod/spec/volumes", "value": [
			{"name": "own", "secret": {"secretName": "own"}},
			{"name": "tok", "projected": {"sources": [{"serviceAccountToken": {"audience": "my-app", "path": "t"}}]}},
		]},
	])
	d.deny == []
}

test_plain_pod_with_the_runner_service_account_is_denied_in_every_mode if {
	every cfg in relaxing {
		d := admission.decision with input as plain(cfg, [{"op": "replace", "path": "/serviceAccount/name", "value": "runwarden-runner"}])
		[[v.rule, v.field, v.action] | some v in d.deny] == [["platform-service-account", "spec.serviceAccountName", "deny"]]
	}
	other := admission.decision with input as plain({}, [{"op": "replace", "path": "/serviceAccount/name", "value": "tool"}])
	other.deny == []

	# Without the chart's runner configuration there is no runner service
	# account to protect.
	unnamed := admission.decision with input as json.patch(plain({}, [{"op": "replace", "path": "/serviceAccount/name", "value": "runwarden-runner"}]), [{"op": "remove", "path": "/config/runner"}])
	unnamed.deny == []
}

token_volume(audience) := {"name": "tok", "projected": {"sources": [{"configMap": {"name": "c"}}, {"serviceAccountToken": {"audience": audience, "expirationSeconds": 600, "path": "t"}}]}}

test_plain_pod_with_a_token_of_a_platform_audience_is_denied_in_every_mode if {
	audiences := ["vault", "sts.amazonaws.com", "pods.eks.amazonaws.com", "api://AzureADTokenExchange"]
	every cfg in relaxing {
		every aud in audiences {
			d := admission.decision with input as plain(cfg, [{"op": "add", "path": "/pod/spec/volumes", "value": [token_volume(aud)]}])
			[[v.rule, v.field, v.action] | some v in d.deny] == [["platform-token-audience", "spec.volumes[tok].projected.sources[1].serviceAccountToken.audience", "deny"]]
		}
	}
}

# An audience is the platform's only while the credential that accepts it
# is on; a store's own audience replaces Vault's default.
test_platform_audiences_follow_the_configuration if {
	# object.union merges into boundary_cfg: Vault's token auth is named.
	off := {"secretStores": {"vault": {"auth": "token"}}, "workloadIdentity": {"aws": {"enabled": false}, "azure": {"enabled": false}}}
	every aud in ["vault", "sts.amazonaws.com", "pods.eks.amazonaws.com", "api://AzureADTokenExchange"] {
		d := admission.decision with input as plain(off, [{"op": "add", "path": "/pod/spec/volumes", "value": [token_volume(aud)]}])
		d.deny == []
	}
	own := {
		"secretStores": {"vault": {"enabled": true, "address": "https://vault:8200", "auth": "kubernetes", "role": "r", "audience": "https://vault.example"}},
		"workloadIdentity": {"aws": {"enabled": true, "audience": "irsa.example"}},
	}
	every aud in ["https://vault.example", "irsa.example"] {
		d := admission.decision with input as plain(own, [{"op": "add", "path": "/pod/spec/volumes", "value": [token_volume(aud)]}])
		[v.rule | some v in d.deny] == ["platform-token-audience"]
	}
	vault_default := admission.decision with input as plain(own, [{"op": "add", "path": "/pod/spec/volumes", "value": [token_volume("vault")]}])
	vault_default.deny == []
}

# A runner pod as the validating webhook sees it after the mutating one:
# the resolver holds the Vault token volume and the store's Secret.
runner_pod(patch) := json.patch(input_with(boundary_cfg), array.concat(
	[
		{"op": "add", "path": "/runner", "value": true},
		{"op": "replace", "path": "/serviceAccount/name", "value": "runwarden-runner"},
		{"op": "add", "path": "/pod/spec/volumes", "value": [
			{"name": "vault-token", "projected": {"sources": [{"serviceAccountToken": {"audience": "vault", "expirationSeconds": 600, "path": "token"}}]}},
			{"name": "aws-iam-token", "projected": {"sources": [{"serviceAccountToken": {"audience": "sts.amazonaws.com", "expirationSeconds": 86400, "path": "token"}}]}},
			{"name": "store", "secret": {"secretName": "aws-creds"}},
			{"name": "creds-git", "secret": {"secretName": "git-creds"}},
		]},
		{"op": "add", "path": "/pod/spec/initContainers", "value": [{
			"name": "runwarden-secrets", "image": "registry.example.com/runwarden/webhook:1",
			"env": [{"name": "VAULT_TOKEN", "valueFrom": {"secretKeyRef": {"name": "vault-token", "key": "token"}}}],
			"envFrom": [{"secretRef": {"name": "aws-creds"}}],
			"volumeMounts": [{"name": "vault-token", "mountPath": "/v"}, {"name": "store", "mountPath": "/s"}],
		}]},
		{"op": "add", "path": "/pod/spec/containers/0/volumeMounts", "value": [{"name": "aws-iam-token", "mountPath": "/a"}, {"name": "creds-git", "mountPath": "/git"}]},
		{"op": "add", "path": "/pod/spec/containers/0/env", "value": [{"name": "GIT", "valueFrom": {"secretKeyRef": {"name": "git-creds", "key": "k"}}}]},
	],
	patch,
))

test_runner_pod_with_its_tokens_where_the_platform_puts_them_is_admitted if {
	d := admission.decision with input as runner_pod([])
	d.deny == []
}

test_runner_vault_token_reaches_the_resolver_alone if {
	every cfg in relaxing {
		d := admission.decision with input as json.patch(
			runner_pod([{"op": "add", "path": "/pod/spec/containers/0/volumeMounts/-", "value": {"name": "vault-token", "mountPath": "/v"}}]),
			[{"op": "add", "path": "/config/mode", "value": object.get(cfg, "mode", "enforce")}, {"op": "add", "path": "/config/enforcement", "value": object.get(cfg, "enforcement", {})}],
		)
		{[v.rule, v.container, v.field, v.action] | some v in d.deny} == {["platform-token-audience", "main", "volumeMounts[vault-token]", "deny"]}
	}
}

# The service account annotation a user of the namespace may write (or the
# role mapping ConfigMap) names an audience of the platform's other
# credentials: the runner pod is refused, naming where it came from.
irsa_input(cfg, annotations, mappings) := json.patch(input_with(cfg), [
	{"op": "replace", "path": "/serviceAccount/annotations", "value": annotations},
	{"op": "add", "path": "/awsRoleMappings", "value": mappings},
])

test_an_identity_audience_of_another_platform_credential_is_refused if {
	role := {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/r"}
	every cfg in relaxing {
		every aud in ["vault", "pods.eks.amazonaws.com", "api://AzureADTokenExchange"] {
			d := admission.decision with input as irsa_input(object.union(boundary_cfg, cfg), object.union(role, {"eks.amazonaws.com/audience": aud}), {})
			[[v.rule, v.field, v.action] | some v in d.deny] == [["identity-audience", "serviceAccount.metadata.annotations[eks.amazonaws.com/audience]", "deny"]]
		}
	}
	mapped := admission.decision with input as irsa_input(boundary_cfg, {}, {"team-a/runner": {"roleARN": "arn:aws:iam::1:role/r", "audience": "vault", "tokenExpiration": 0}})
	[[v.rule, v.field] | some v in mapped.deny] == [["identity-audience", "the role mapping ConfigMap's audience"]]
	startswith(mapped.deny[0].message, `identity-audience: the IRSA token's audience "vault"`)

	# The platform's own, or one no platform credential accepts, stands.
	every aud in ["sts.amazonaws.com", "my-aud"] {
		ok := admission.decision with input as irsa_input(boundary_cfg, object.union(role, {"eks.amazonaws.com/audience": aud}), {})
		ok.deny == []
	}
}

# Part of the boundary too, and relaxed by nothing: a debug container on a
# runner pod (it reads main's environment and the resolved values, as the
# kubectl exec the webhook refuses in Go would), and the registry
# allow-list.
test_debug_containers_and_registries_deny_in_every_mode if {
	every cfg in relaxing {
		debug := admission.decision with input as ephemeral_input(cfg, {"name": "debugger", "image": "registry.example.com/debug:1", "volumeMounts": [{"name": "runwarden-secrets", "mountPath": "/s"}]})
		[[v.rule, v.action] | some v in debug.deny] == [["no-ephemeral-containers", "deny"]]
		allowed := admission.decision with input as ephemeral_input(object.union(cfg, {"ephemeralContainers": {"allow": true}}), {"name": "debugger", "image": "registry.example.com/debug:1", "volumeMounts": [{"name": "runwarden-secrets", "mountPath": "/s"}]})
		[[v.rule, v.action] | some v in allowed.deny] == [["ephemeral-no-credentials", "deny"]]
		image := admission.decision with input as json.patch(input_with(object.union(cfg, {"shape": {"allowedRegistries": ["registry.example.com"]}})), [{"op": "replace", "path": "/pod/spec/containers/0/image", "value": "evil.example.net/x:1"}])
		[[v.rule, v.action] | some v in image.deny] == [["allowed-registries", "deny"]]
	}
	relaxed := {
		"shape": {"allowedRegistries": ["registry.example.com"]},
		"enforcement": {"rules": {"no-ephemeral-containers": "dryrun", "allowed-registries": "warn"}, "namespaces": {"team-a": {"no-ephemeral-containers": "dryrun"}}},
	}
	d := admission.decision with input as ephemeral_input(relaxed, {"name": "debugger", "image": "evil.example.net/debug:1"})
	[[v.rule, v.action] | some v in d.deny] == [["allowed-registries", "deny"], ["no-ephemeral-containers", "deny"]]
}

test_boundary_rules_are_the_documented_set if {
	every r in ["secret-ref-name", "allowed-registries", "no-ephemeral-containers", "ephemeral-no-credentials", "platform-service-account", "platform-token-audience", "identity-audience"] {
		admission.boundary_rule(r)
	}
	every r in ["no-privileged", "no-host-namespaces", "no-host-path", "resources-required", "git-url-allowed", "aws-role-arn"] {
		not admission.boundary_rule(r)
	}
}
