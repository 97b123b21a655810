# shellcheck shell=bash
# kubectl on the local cluster whose kubeconfig the sourcing script holds in
# $kubeconfig, from the pinned Kubernetes in $kube_bin. Sourced, not run.

kubectl() { "$kube_bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

# api_ready reports whether the cluster's API server answers /readyz.
api_ready() {
	[[ -f $kubeconfig ]] && kubectl get --raw /readyz --request-timeout=5s >/dev/null 2>&1
}
