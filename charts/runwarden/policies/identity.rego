# Workload identity: the cloud credentials a runner gets from its service
# account instead of static keys.
package runwarden.admission

# AWS IRSA, for clusters without the EKS pod identity webhook: the same
# variables, token path, volume, audience and expiry that webhook injects.
aws_role_arn := sa_annotations["eks.amazonaws.com/role-arn"]

aws_identity if {
	enabled(["workloadIdentity", "aws", "enabled"])
	aws_role_arn != ""
}

env contains env_var("AWS_ROLE_ARN", aws_role_arn) if aws_identity

env contains env_var("AWS_WEB_IDENTITY_TOKEN_FILE", "/var/run/secrets/eks.amazonaws.com/serviceaccount/token") if aws_identity

volumes contains projected_token("aws-iam-token", "sts.amazonaws.com", 86400, "token") if aws_identity

volume_mounts contains mount("aws-iam-token", "/var/run/secrets/eks.amazonaws.com/serviceaccount") if aws_identity

# Azure Workload Identity. Mode "inject" (the default) does what Azure's
# webhook would. Mode "label" only labels the pod for Azure's webhook, which
# sees the label only if it runs after this one: the API server calls
# mutating webhooks in the order of their configurations' names, and never
# calls again one its object selector skipped.
azure_client_id := sa_annotations["azure.workload.identity/client-id"]

azure_identity if {
	enabled(["workloadIdentity", "azure", "enabled"])
	azure_client_id != ""
}

azure_mode := object.get(cfg, ["workloadIdentity", "azure", "mode"], "inject")

pod_labels contains ["azure.workload.identity/use", "true"] if {
	azure_identity
	azure_mode == "label"
}

azure_inject if {
	azure_identity
	azure_mode == "inject"
}

azure_tenant_id := object.get(sa_annotations, "azure.workload.identity/tenant-id", object.get(cfg, ["workloadIdentity", "azure", "tenantId"], ""))

env contains env_var("AZURE_CLIENT_ID", azure_client_id) if azure_inject

env contains env_var("AZURE_TENANT_ID", azure_tenant_id) if azure_inject

env contains env_var("AZURE_FEDERATED_TOKEN_FILE", "/var/run/secrets/azure/tokens/azure-identity-token") if azure_inject

env contains env_var("AZURE_AUTHORITY_HOST", object.get(cfg, ["workloadIdentity", "azure", "authorityHost"], "https://login.microsoftonline.com/")) if azure_inject

volumes contains projected_token("azure-identity-token", "api://AzureADTokenExchange", 3600, "azure-identity-token") if azure_inject

volume_mounts contains mount("azure-identity-token", "/var/run/secrets/azure/tokens") if azure_inject

# GKE Workload Identity: the pod must run where the metadata server is.
gcp_identity if {
	enabled(["workloadIdentity", "gcp", "enabled"])
	sa_annotations["iam.gke.io/gcp-service-account"] != ""
}

node_selector contains ["iam.gke.io/gke-metadata-server-enabled", "true"] if gcp_identity
