package runwarden.admission_test

import data.runwarden.admission

# The EKS pod identity webhook's and Azure Workload Identity webhook's cases
# in their own form: a pod, its service account's annotations, the platform
# configuration; then what each container gets (variables and mounts), the
# pod's volumes and labels. The EKS cases are those of its
# containercredentials fixtures (its handler's testdata), with the platform's
# paths for its flags' test values; each is named after its fixture.

# identity_case evaluates a case: c.pod in namespace team-a, its service
# account (spec.serviceAccountName, else default) annotated c.sa, the
# platform configuration c.config, and the role mapping ConfigMap's entries
# c.roleMappings.
identity_case(c) := d if {
	inp := {
		"operation": "CREATE",
		"runner": true,
		"pod": c.pod,
		"namespace": {"name": "team-a", "labels": {}, "annotations": {}},
		"serviceAccount": {"name": object.get(c.pod.spec, "serviceAccountName", "default"), "annotations": object.get(c, "sa", {})},
		"config": c.config,
		"secretRefs": [],
		"awsRoleMappings": object.get(c, "roleMappings", {}),
	}
	d := admission.decision with input as inp
}

# outcome is what the pod gets, per container: the variables set and the
# mounts added, and the volumes and labels added.
outcome(c) := {
	"labels": d.mutations.labels,
	"volumes": d.mutations.volumes,
	"containers": {ctr.name: {
		"env": {e.env.name: e.env.value | some e in d.mutations.env; ctr.name in e.containers},
		"mounts": [m.volumeMount | some m in d.mutations.volumeMounts; ctr.name in m.containers],
	} |
		some ctr in array.concat(object.get(c.pod.spec, "initContainers", []), c.pod.spec.containers)
	},
} if {
	d := identity_case(c)
	d.deny == []
}

pod_with(containers, extra) := object.union(
	{"metadata": {"name": "balajilovesoreos", "labels": {}, "annotations": {}}, "spec": {
		"serviceAccountName": "default",
		"containers": containers,
	}},
	extra,
)

ctr(name) := {"name": name, "image": "registry.example.com/amazonlinux:1"}

# Pod Identity on, default for team-a/default associated, every container a
# target (as the EKS webhook mutates every container).
pod_identity(extra) := {"containers": ["*"], "workloadIdentity": {"aws": object.union(
	{"enabled": true, "podIdentity": {"associations": [{"namespace": "team-a", "serviceAccount": "default"}]}},
	extra,
)}}

pi_volume(seconds) := {"name": "eks-pod-identity-token", "projected": {"sources": [{"serviceAccountToken": {
	"audience": "pods.eks.amazonaws.com", "expirationSeconds": seconds, "path": "eks-pod-identity-token",
}}]}}

pi_mount := {"name": "eks-pod-identity-token", "mountPath": "/var/run/secrets/pods.eks.amazonaws.com/serviceaccount", "readOnly": true}

pi_env := {
	"AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://169.254.170.23/v1/credentials",
	"AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": "/var/run/secrets/pods.eks.amazonaws.com/serviceaccount/eks-pod-identity-token",
}

pi_label := {"eks.amazonaws.com/pod-identity": "enabled"}

test_eks_containercredentials_rawPodWithoutVolumes if {
	outcome({"pod": pod_with([ctr("balajilovesoreos")], {}), "config": pod_identity({})}) == {
		"labels": pi_label,
		"volumes": [pi_volume(86400)],
		"containers": {"balajilovesoreos": {"env": pi_env, "mounts": [pi_mount]}},
	}
}

test_eks_containercredentials_rawPodNeedsAll if {
	sa := {"eks.amazonaws.com/sts-regional-endpoints": "true", "eks.amazonaws.com/token-expiration": "10000"}
	outcome({"pod": pod_with([ctr("balajilovesoreos")], {}), "sa": sa, "config": pod_identity({"region": "cn-north-1"})}) == {
		"labels": pi_label,
		"volumes": [pi_volume(10000)],
		"containers": {"balajilovesoreos": {
			"env": object.union(pi_env, {
				"AWS_STS_REGIONAL_ENDPOINTS": "regional",
				"AWS_DEFAULT_REGION": "cn-north-1",
				"AWS_REGION": "cn-north-1",
			}),
			"mounts": [pi_mount],
		}},
	}
}

# An association wins over the service account's role: no IRSA variables.
test_eks_containercredentials_rawPodWithRoleArn if {
	sa := {
		"eks.amazonaws.com/sts-regional-endpoints": "true",
		"eks.amazonaws.com/token-expiration": "10000",
		"eks.amazonaws.com/role-arn": "arn:aws-cn:iam::111122223333:role/s3-reader",
	}
	outcome({"pod": pod_with([ctr("balajilovesoreos")], {}), "sa": sa, "config": pod_identity({})}) == {
		"labels": pi_label,
		"volumes": [pi_volume(10000)],
		"containers": {"balajilovesoreos": {"env": object.union(pi_env, {"AWS_STS_REGIONAL_ENDPOINTS": "regional"}), "mounts": [pi_mount]}},
	}
}

test_eks_containercredentials_rawPodSkip if {
	pod := pod_with([ctr("sidecar"), ctr("balajilovesoreos")], {"metadata": {"name": "balajilovesoreos", "labels": {}, "annotations": {"eks.amazonaws.com/skip-containers": "sidecar"}}})
	outcome({"pod": pod, "config": pod_identity({})}) == {
		"labels": pi_label,
		"volumes": [pi_volume(86400)],
		"containers": {
			"sidecar": {"env": {}, "mounts": []},
			"balajilovesoreos": {"env": pi_env, "mounts": [pi_mount]},
		},
	}
}

# A volume of another name in the pod: the token's is added beside it.
test_eks_containercredentials_rawPodWithVolume if {
	pod := pod_with([ctr("balajilovesoreos")], {"spec": {"serviceAccountName": "default", "containers": [ctr("balajilovesoreos")], "volumes": [{"name": "tokenPath", "emptyDir": {}}]}})
	outcome({"pod": pod, "config": pod_identity({})}) == {
		"labels": pi_label,
		"volumes": [pi_volume(86400)],
		"containers": {"balajilovesoreos": {"env": pi_env, "mounts": [pi_mount]}},
	}
}

# The container already mounts a volume of the token's name (elsewhere), and
# the pod has that volume (the fixture's is a hostPath, which no-host-path
# refuses in a runner pod: an emptyDir here): both are kept, the variables
# still set.
test_eks_containercredentials_rawPodWithConflictingVolumeMount if {
	own := object.union(ctr("balajilovesoreos"), {"volumeMounts": [{"mountPath": "/some/other/path", "name": "eks-pod-identity-token", "readOnly": true}]})
	pod := pod_with([own], {"spec": {"serviceAccountName": "default", "containers": [own], "volumes": [{"name": "eks-pod-identity-token", "emptyDir": {}}]}})
	outcome({"pod": pod, "config": pod_identity({})}) == {
		"labels": pi_label,
		"volumes": [],
		"containers": {"balajilovesoreos": {"env": pi_env, "mounts": []}},
	}
}

# The EKS webhook's rawPodHasAll: a container that sets the role, the region
# and the STS variable itself is left alone, mount included; the volume is
# still added.
test_eks_rawPodHasAll if {
	own := object.union(ctr("balajilovesoreos"), {"env": [
		{"name": "AWS_REGION", "value": "cn-northwest-1"},
		{"name": "AWS_STS_REGIONAL_ENDPOINTS", "value": "regional"},
		{"name": "AWS_ROLE_ARN", "value": "arn:aws-cn:iam::111122223333:role/s3-reader"},
	]})
	cfg := {"containers": ["*"], "workloadIdentity": {"aws": {"enabled": true, "stsRegionalEndpoints": true, "region": "cn-north-1", "tokenExpiration": 3600}}}
	sa := {"eks.amazonaws.com/role-arn": "arn:aws-cn:iam::111122223333:role/s3-reader", "eks.amazonaws.com/audience": "sts.amazonaws.com"}
	outcome({"pod": pod_with([own], {}), "sa": sa, "config": cfg}) == {
		"labels": {},
		"volumes": [{"name": "aws-iam-token", "projected": {"sources": [{"serviceAccountToken": {"audience": "sts.amazonaws.com", "expirationSeconds": 3600, "path": "token"}}]}}],
		"containers": {"balajilovesoreos": {"env": {}, "mounts": []}},
	}
}

# The same for Pod Identity: a container with its own container credentials,
# region and STS variable is left alone.
test_eks_pod_identity_container_has_all if {
	own := object.union(ctr("main"), {"env": [
		{"name": "AWS_DEFAULT_REGION", "value": "eu-west-1"},
		{"name": "AWS_STS_REGIONAL_ENDPOINTS", "value": "legacy"},
		{"name": "AWS_CONTAINER_CREDENTIALS_FULL_URI", "value": "http://127.0.0.1/own"},
	]})
	o := outcome({"pod": pod_with([own, ctr("other")], {}), "config": pod_identity({"region": "eu-west-1", "stsRegionalEndpoints": true})})
	o.containers.main == {"env": {}, "mounts": []}
	o.containers.other.mounts == [pi_mount]
	o.containers.other.env.AWS_REGION == "eu-west-1"
}

test_eks_pod_identity_ipv6 if {
	o := outcome({"pod": pod_with([ctr("main")], {}), "config": pod_identity({"podIdentity": {"ipFamily": "IPv6", "associations": [{"namespace": "team-a", "serviceAccount": "default"}]}})})
	o.containers.main.env.AWS_CONTAINER_CREDENTIALS_FULL_URI == "http://[fd00:ec2::23]/v1/credentials"
}

# Only the associated service account, in its namespace.
test_eks_pod_identity_only_associated if {
	other := pod_identity({"podIdentity": {"associations": [
		{"namespace": "team-b", "serviceAccount": "default"},
		{"namespace": "team-a", "serviceAccount": "runner"},
	]}})
	outcome({"pod": pod_with([ctr("main")], {}), "config": other}) == {"labels": {}, "volumes": [], "containers": {"main": {"env": {}, "mounts": []}}}
	off := {"containers": ["*"], "workloadIdentity": {"aws": {"podIdentity": {"associations": [{"namespace": "team-a", "serviceAccount": "default"}]}}}}
	outcome({"pod": pod_with([ctr("main")], {}), "config": off}).volumes == []
}

# The role mapping ConfigMap (the EKS webhook's pod-identity-webhook
# ConfigMap): a service account without the annotation gets the entry's
# role, audience, STS and lifetime.
irsa_cfg := {"containers": ["*"], "workloadIdentity": {"aws": {"enabled": true}}}

test_eks_configmap_role_mapping if {
	mappings := {"team-a/default": {"roleARN": "arn:aws:iam::123456789012:role/mapped", "audience": "amazonaws.com", "useRegionalSTS": true, "tokenExpiration": 0}}
	outcome({"pod": pod_with([ctr("main")], {}), "config": irsa_cfg, "roleMappings": mappings}) == {
		"labels": {},
		"volumes": [{"name": "aws-iam-token", "projected": {"sources": [{"serviceAccountToken": {"audience": "amazonaws.com", "expirationSeconds": 86400, "path": "token"}}]}}],
		"containers": {"main": {
			"env": {
				"AWS_ROLE_ARN": "arn:aws:iam::123456789012:role/mapped",
				"AWS_WEB_IDENTITY_TOKEN_FILE": "/var/run/secrets/eks.amazonaws.com/serviceaccount/token",
				"AWS_STS_REGIONAL_ENDPOINTS": "regional",
			},
			"mounts": [{"name": "aws-iam-token", "mountPath": "/var/run/secrets/eks.amazonaws.com/serviceaccount", "readOnly": true}],
		}},
	}
}

test_eks_configmap_precedence if {
	pod := pod_with([ctr("main")], {"metadata": {"name": "p", "labels": {}, "annotations": {"eks.amazonaws.com/token-expiration": "1200"}}})
	wildcard := {"*/default": {"roleARN": "arn:aws:iam::1:role/any-namespace", "audience": "", "useRegionalSTS": false, "tokenExpiration": 3600}}
	w := identity_case({"pod": pod, "config": irsa_cfg, "roleMappings": wildcard})
	env_of(w, "AWS_ROLE_ARN")[0].env.value == "arn:aws:iam::1:role/any-namespace"

	# An empty audience stays empty (the API server's own), the pod's
	# lifetime wins over the entry's.
	aws_token(w) == {"audience": "", "expirationSeconds": 1200, "path": "token"}
	env_of(w, "AWS_STS_REGIONAL_ENDPOINTS") == []

	# The namespace's own entry wins over */name.
	both := object.union(wildcard, {"team-a/default": {"roleARN": "arn:aws:iam::1:role/own-namespace"}})
	env_of(identity_case({"pod": pod, "config": irsa_cfg, "roleMappings": both}), "AWS_ROLE_ARN")[0].env.value == "arn:aws:iam::1:role/own-namespace"

	# The service account's annotation wins over the ConfigMap, with its
	# own audience and lifetime.
	sa := {"eks.amazonaws.com/role-arn": "arn:aws:iam::1:role/annotated"}
	a := identity_case({"pod": pod_with([ctr("main")], {}), "sa": sa, "config": irsa_cfg, "roleMappings": both})
	env_of(a, "AWS_ROLE_ARN")[0].env.value == "arn:aws:iam::1:role/annotated"
	aws_token(a) == {"audience": "sts.amazonaws.com", "expirationSeconds": 86400, "path": "token"}

	# An entry without a role gives nothing.
	none := identity_case({"pod": pod, "config": irsa_cfg, "roleMappings": {"team-a/default": {"roleARN": ""}}})
	none.mutations.volumes == []
}

# --- Azure ---
azure_cfg(extra) := {"containers": ["*"], "workloadIdentity": {"azure": object.union({"enabled": true, "tenantId": "tid"}, extra)}}

azure_pod(containers, volumes) := {"metadata": {"name": "p", "labels": {"azure.workload.identity/use": "true"}, "annotations": {}}, "spec": {
	"serviceAccountName": "sa",
	"containers": containers,
	"volumes": volumes,
}}

azure_token(path) := {"serviceAccountToken": {"audience": "api://AzureADTokenExchange", "expirationSeconds": 3600, "path": path}}

azure_mount := {"name": "azure-workload-identity-reserved-token", "mountPath": "/var/run/secrets/azure/wi", "readOnly": true}

# Azure's webhook mutates only pods labelled azure.workload.identity/use:
# "true", whatever their service account.
test_azure_only_labelled_pods if {
	unlabelled := json.patch(azure_pod([ctr("main")], []), [{"op": "replace", "path": "/metadata/labels", "value": {}}])
	outcome({"pod": unlabelled, "sa": {"azure.workload.identity/client-id": "cid"}, "config": azure_cfg({})}) == {"labels": {}, "volumes": [], "containers": {"main": {"env": {}, "mounts": []}}}
	other := json.patch(azure_pod([ctr("main")], []), [{"op": "replace", "path": "/metadata/labels", "value": {"azure.workload.identity/use": "True"}}])
	outcome({"pod": other, "sa": {"azure.workload.identity/client-id": "cid"}, "config": azure_cfg({})}).volumes == []
}

# A labelled pod whose service account names no client ID gets everything
# else, as from Azure's webhook.
test_azure_without_client_id if {
	outcome({"pod": azure_pod([ctr("main")], []), "sa": {}, "config": azure_cfg({})}) == {
		"labels": {},
		"volumes": [{"name": "azure-workload-identity-reserved-token", "projected": {"sources": [azure_token("token/azure-identity-token")]}}],
		"containers": {"main": {
			"env": {
				"AZURE_TENANT_ID": "tid",
				"AZURE_AUTHORITY_HOST": "https://login.microsoftonline.com/",
				"AZURE_FEDERATED_TOKEN_FILE": "/var/run/secrets/azure/wi/token/azure-identity-token",
			},
			"mounts": [azure_mount],
		}},
	}
}

# Azure's webhook replaces the reserved volume the pod has, whatever it holds
# (its "existing projected service account token volume overridden with
# desired audience"); runwarden also rewrites any other projected token at the
# token's path.
test_azure_existing_token_volume_replaced if {
	own := [
		{"name": "azure-workload-identity-reserved-token", "projected": {"sources": [{"serviceAccountToken": {"audience": "aud", "expirationSeconds": 3600, "path": "my-projected-volume"}}]}},
		{"name": "mine", "projected": {"sources": [
			{"configMap": {"name": "ca"}},
			{"serviceAccountToken": {"audience": "other", "path": "token/azure-identity-token"}},
		]}},
	]
	moved := object.union(ctr("main"), {"volumeMounts": [{"name": "azure-workload-identity-reserved-token", "mountPath": "/elsewhere"}]})
	outcome({"pod": azure_pod([moved], own), "sa": {"azure.workload.identity/client-id": "cid"}, "config": azure_cfg({})}) == {
		"labels": {},
		"volumes": [
			{"name": "azure-workload-identity-reserved-token", "projected": {"sources": [azure_token("token/azure-identity-token")]}},
			{"name": "mine", "projected": {"sources": [{"configMap": {"name": "ca"}}, azure_token("token/azure-identity-token")]}},
		],
		"containers": {"main": {
			"env": {
				"AZURE_CLIENT_ID": "cid",
				"AZURE_TENANT_ID": "tid",
				"AZURE_AUTHORITY_HOST": "https://login.microsoftonline.com/",
				"AZURE_FEDERATED_TOKEN_FILE": "/var/run/secrets/azure/wi/token/azure-identity-token",
			},
			"mounts": [azure_mount],
		}},
	}
}

test_azure_v15_existing_token_volume_replaced if {
	own := [{"name": "azure-identity-token", "projected": {"sources": [{"serviceAccountToken": {"audience": "x", "path": "azure-identity-token"}}]}}]
	o := outcome({"pod": azure_pod([ctr("main")], own), "sa": {"azure.workload.identity/client-id": "cid"}, "config": azure_cfg({"layout": "v1.5"})})
	o.volumes == [{"name": "azure-identity-token", "projected": {"sources": [azure_token("azure-identity-token")]}}]
	o.containers.main.mounts == [{"name": "azure-identity-token", "mountPath": "/var/run/secrets/azure/tokens", "readOnly": true}]
}

# Mode label: the label, for Azure's webhook, on pods whose service account
# names a client ID only; nothing injected.
test_azure_label_mode_needs_client_id if {
	pod := json.patch(azure_pod([ctr("main")], []), [{"op": "replace", "path": "/metadata/labels", "value": {}}])
	outcome({"pod": pod, "sa": {"azure.workload.identity/client-id": "cid"}, "config": azure_cfg({"mode": "label"})}) == {"labels": {"azure.workload.identity/use": "true"}, "volumes": [], "containers": {"main": {"env": {}, "mounts": []}}}
	outcome({"pod": pod, "sa": {}, "config": azure_cfg({"mode": "label"})}).labels == {}
}

# Pod Identity with a role mapping entry for the service account too: the
# entry's lifetime, regional STS and role are not Pod Identity's.
test_eks_pod_identity_ignores_the_role_mapping if {
	mappings := {"*/default": {"roleARN": "arn:aws:iam::1:role/r", "audience": "x", "useRegionalSTS": true, "tokenExpiration": 3600}}
	o := outcome({"pod": pod_with([ctr("main")], {}), "config": pod_identity({}), "roleMappings": mappings})
	o.volumes == [pi_volume(86400)]
	o.containers.main.env == {
		"AWS_CONTAINER_CREDENTIALS_FULL_URI": "http://169.254.170.23/v1/credentials",
		"AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE": "/var/run/secrets/pods.eks.amazonaws.com/serviceaccount/eks-pod-identity-token",
	}
}

# A ConfigMap entry's own lifetime, when the pod names none.
test_eks_configmap_entry_lifetime if {
	mappings := {"*/default": {"roleARN": "arn:aws:iam::1:role/r", "audience": "sts.amazonaws.com", "tokenExpiration": 3600}}
	aws_token(identity_case({"pod": pod_with([ctr("main")], {}), "config": irsa_cfg, "roleMappings": mappings})).expirationSeconds == 3600
}

# The resolver reads Key Vault with the runner's identity only when there is
# one to sign in with (a client ID); without, it keeps the service principal
# and gets none of the identity's variables. In mode label, Azure's webhook
# gives the identity, so the service principal is left out too.
test_azure_resolver_identity_needs_client_id if {
	kv := {"store": "azure", "container": "main", "env": "DB", "name": "db", "vault": "kv1", "raw": "${azure:db@kv1}", "error": ""}
	cfg := object.union(azure_cfg({}), {"containers": ["main"], "secretStores": {"azure": {"enabled": true, "secretName": "sp"}}})
	inp := {
		"operation": "CREATE", "runner": true, "pod": azure_pod([ctr("main")], []),
		"namespace": {"name": "team-a", "labels": {}, "annotations": {}},
		"serviceAccount": {"name": "sa", "annotations": {}}, "config": cfg, "secretRefs": [kv],
	}
	d := admission.decision with input as inp
	resolver := {e.env.name | some e in d.mutations.env; "runwarden-secrets" in e.containers}
	"AZURE_CLIENT_SECRET" in resolver
	not "AZURE_FEDERATED_TOKEN_FILE" in resolver
	env_of(d, "AZURE_FEDERATED_TOKEN_FILE")[0].containers == ["main"]

	labelled := json.patch(inp, [
		{"op": "add", "path": "/config/workloadIdentity/azure/mode", "value": "label"},
		{"op": "replace", "path": "/serviceAccount/annotations", "value": {"azure.workload.identity/client-id": "cid"}},
	])
	l := admission.decision with input as labelled
	every e in l.mutations.env {
		not startswith(e.env.name, "AZURE_")
	}
}
