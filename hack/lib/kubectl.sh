# shellcheck shell=bash
# kubectl on the local cluster whose kubeconfig the sourcing script holds in
# $kubeconfig, from the pinned Kubernetes in $kube_bin. Sourced, not run.

kubectl() { "$kube_bin/kubectl" --kubeconfig "$kubeconfig" "$@"; }

# api_ready reports whether the cluster's API server answers /readyz.
api_ready() {
	[[ -f $kubeconfig ]] && kubectl get --raw /readyz --request-timeout=5s >/dev/null 2>&1
}

# kubectl_again runs kubectl up to 4 times, 2s apart, while it fails: a
# request that timed out on a loaded API server (a teardown beside a whole
# e2e run) is tried again rather than failing the run. The last failure's
# output is printed and its status returned.
kubectl_again() {
	local try out
	for try in 1 2 3 4; do
		if out=$(kubectl "$@" 2>&1); then
			[[ -z $out ]] || printf '%s\n' "$out"
			return 0
		fi
		[[ $try == 4 ]] || sleep 2
	done
	printf '%s\n' "$out" >&2
	return 1
}
