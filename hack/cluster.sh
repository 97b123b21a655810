#!/usr/bin/env bash
# Starts and stops the local Kubernetes cluster: etcd, kube-apiserver,
# kube-controller-manager, kube-scheduler and the kwok controller as host
# processes (kwokctl's binary runtime), with simulated nodes. Kueue, if
# wanted, is started beside it by hack/kueue.sh.
#
# Usage: hack/cluster.sh up|down|status|kubeconfig [--name NAME] [--no-real-node]
#
#   up          start the cluster, with a real node (hack/node.sh) unless
#               --no-real-node; reuses one of the same name made with the same
#               settings and tools (or with a real node, for --no-real-node),
#               and recreates one made otherwise
#   down        stop it (and Kueue, if started) and remove its state;
#               nothing is left running
#   status      say whether it runs and list its nodes
#   kubeconfig  print the path of its kubeconfig
#
# Environment:
#   RUNWARDEN_CLUSTER_NAME   cluster name (default: runwarden)
#   RUNWARDEN_REAL_NODE      "false" starts simulated nodes only (default: true)
#   RUNWARDEN_STATE_DIR      state folder (default: ${XDG_CACHE_HOME:-$HOME/.cache}/runwarden)
#                            the kubeconfig is $RUNWARDEN_STATE_DIR/clusters/NAME/kubeconfig
#   RUNWARDEN_TOOLS_DIR      pinned tools folder (see hack/tools.sh)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
state_dir=${RUNWARDEN_STATE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/runwarden}
name=${RUNWARDEN_CLUSTER_NAME:-runwarden}
real_node=${RUNWARDEN_REAL_NODE:-true}

cmd=${1:-}
shift || true
while [[ $# -gt 0 ]]; do
	case $1 in
	--name)
		name=${2:?--name needs a value}
		shift 2
		;;
	--name=*)
		name=${1#--name=}
		shift
		;;
	--no-real-node)
		real_node=false
		shift
		;;
	*)
		echo "hack/cluster.sh: unknown argument \"$1\"" >&2
		exit 2
		;;
	esac
done

if [[ ! $name =~ ^[a-z0-9]([a-z0-9-]*[a-z0-9])?$ ]]; then
	echo "hack/cluster.sh: cluster name \"$name\" must be lower-case letters, digits and dashes" >&2
	exit 2
fi

kube_bin=$("$root/hack/tools.sh" path kubernetes)
etcd_bin=$("$root/hack/tools.sh" path etcd)
kwok_bin=$("$root/hack/tools.sh" path kwok)
kube_version=$(basename "$kube_bin")
kube_version=${kube_version#kubernetes-}

cluster_dir=$state_dir/clusters/$name
kubeconfig=$cluster_dir/kubeconfig
export KWOK_WORKDIR=$state_dir/kwok

kwokctl() { "$kwok_bin/kwokctl" "$@"; }
# shellcheck source=hack/lib/kubectl.sh
source "$root/hack/lib/kubectl.sh"

require_binaries() {
	local missing=()
	for b in "$kube_bin/kube-apiserver" "$kube_bin/kube-controller-manager" "$kube_bin/kube-scheduler" \
		"$kube_bin/kubectl" "$etcd_bin/etcd" "$kwok_bin/kwok" "$kwok_bin/kwokctl"; do
		[[ -x $b ]] || missing+=("$b")
	done
	if [[ ${#missing[@]} -gt 0 ]]; then
		echo "hack/cluster.sh: missing binaries: ${missing[*]}" >&2
		echo "hack/cluster.sh: run 'make tools' to build them" >&2
		exit 1
	fi
}

exists() {
	kwokctl get clusters 2>/dev/null | grep -qx "$name"
}

# wait_nodes_ready waits until every simulated node reports Ready.
wait_nodes_ready() {
	kubectl wait --for=condition=Ready node -l type=kwok --timeout=60s >/dev/null
}

# kwokctl_config prints the kwokctl configuration of the cluster, for a real
# node beside the simulated ones if $1 is true. Its first line names the
# tools' versions: a cluster is reused only if made from the same.
kwokctl_config() {
	local with_real_node=$1 pki=$KWOK_WORKDIR/clusters/$name/pki
	echo "# made from kubernetes $kube_version, $(basename "$etcd_bin"), $(basename "$kwok_bin")"
	cat <<-EOF
	apiVersion: config.kwok.x-k8s.io/v1alpha1
	kind: KwokctlConfiguration
	options:
	  runtime: binary
	  # Every component listens on loopback only (kwokctl's default is every
	  # address, etcd included, which has no TLS or login); the API server
	  # of a cluster with a real node also listens on the node's bridge, below.
	  bindAddress: 127.0.0.1
	  # The kubernetes Service's ClusterIP and the real node's bridge gateway,
	  # so pods on the real node can verify the API server's certificate.
	  kubeApiserverCertSANs: ["10.0.0.1", "10.88.0.1"]
	componentsPatches:
	# The kwok controller drives only the simulated nodes (annotated
	# kwok.x-k8s.io/node=fake), never the real kubelet's node beside them.
	# The Job controller creates pods and writes Job status through the
	# controller manager's client: its default 20 requests/s and 5 Job
	# workers, not the API server, would bound every Job-heavy test.
	# Each controller acts as its own service account, as kubeadm and most
	# distributions run them: the Job controller creates pods as
	# system:serviceaccount:kube-system:job-controller, the user the
	# webhook requires of a runner pod's creator.
	# One controller manager and one scheduler, with no peer to hand over
	# to: without leader election, an API call stalled past the lease's
	# renew deadline (a slow disk under etcd) is retried instead of ending
	# the process, which nothing here restarts (every Job then stays
	# without pods for the rest of the run).
	- name: kube-controller-manager
	  extraArgs:
	  - key: leader-elect
	    value: "false"
	    override: true
	  - key: use-service-account-credentials
	    value: "true"
	  - key: kube-api-qps
	    value: "300"
	  - key: kube-api-burst
	    value: "600"
	  - key: concurrent-job-syncs
	    value: "20"
	- name: kube-scheduler
	  extraArgs:
	  - key: leader-elect
	    value: "false"
	    override: true
	- name: kwok-controller
	  extraArgs:
	  - key: manage-all-nodes
	    value: "false"
	    override: true
	  - key: manage-nodes-with-annotation-selector
	    value: kwok.x-k8s.io/node=fake
	EOF
	if [[ $with_real_node == true ]]; then
		cat <<-EOF
		# The API server advertises the real node's bridge gateway, so the
		# kubernetes Service leads pods there, and presents a client
		# certificate to the kubelet (kubectl logs and exec).
		- name: kube-apiserver
		  extraArgs:
		  - key: advertise-address
		    value: "10.88.0.1"
		  # Pods reach it at the bridge gateway, the host at 127.0.0.1: one
		  # --bind-address is both only as every address. Beyond its health
		  # and version, it answers only requests with a client certificate
		  # or token.
		  - key: bind-address
		    value: "0.0.0.0"
		    override: true
		  - key: kubelet-client-certificate
		    value: $pki/admin.crt
		  - key: kubelet-client-key
		    value: $pki/admin.key
		  # Reach kubelets by address, never by a host name lookup.
		  - key: kubelet-preferred-address-types
		    value: InternalIP
		EOF
	fi
}

# made_alike reports whether the existing cluster was made with the
# configuration this run would give it. One made with a real node also serves
# a run without: it only adds settings for the real node.
made_alike() {
	local have=$cluster_dir/kwokctl.yaml
	[[ -f $have ]] || return 1
	cmp -s "$have" <(kwokctl_config "$real_node") && return 0
	[[ $real_node != true ]] && cmp -s "$have" <(kwokctl_config true)
}

# remove_cluster stops and deletes the cluster and its real node, to make it anew.
remove_cluster() {
	local out
	"$root/hack/kueue.sh" down --name "$name"
	"$root/hack/node.sh" down --name "$name"
	out=$(kwokctl delete cluster --kubeconfig "$state_dir/kwok/kwokctl-kubeconfig" --name "$name" 2>&1) || echo "$out" >&2
	wait_gone
}

up() {
	require_binaries
	local start=$SECONDS
	if exists && ! made_alike; then
		if [[ -f $cluster_dir/kwokctl.yaml ]]; then
			echo "cluster $name: exists but was made with other settings or tools; recreating it. Its configuration then (<) and now (>):" >&2
			diff "$cluster_dir/kwokctl.yaml" <(kwokctl_config "$real_node") | grep '^[<>]' | head -n 20 >&2 || true
		else
			echo "cluster $name: exists but its configuration ($cluster_dir/kwokctl.yaml) is gone; recreating it" >&2
		fi
		remove_cluster
		if exists; then
			echo "hack/cluster.sh: cluster $name could not be deleted (above); run 'hack/cluster.sh down --name $name' and try again" >&2
			exit 1
		fi
	fi
	if exists; then
		if ! api_ready; then
			echo "cluster $name: exists but does not answer; starting its components" >&2
			kwokctl start cluster --name "$name" --wait 1m >&2 || true
		fi
		if api_ready; then
			kubectl apply -f "$root/hack/cluster/nodes.yaml" >/dev/null
			wait_nodes_ready
			if [[ $real_node == true ]]; then
				"$root/hack/node.sh" up --name "$name"
			fi
			echo "cluster $name: already running (kubeconfig $kubeconfig)" >&2
			return 0
		fi
		echo "cluster $name: cannot be revived; recreating it" >&2
		remove_cluster
	fi

	mkdir -p "$cluster_dir"
	kwokctl_config "$real_node" >"$cluster_dir/kwokctl.yaml"
	local log=$cluster_dir/create.log
	# --kubeconfig "" keeps kwokctl away from the user's ~/.kube/config.
	if ! KWOK_KUBE_VERSION=$kube_version KWOK_KUBECTL_BINARY=$kube_bin/kubectl \
		kwokctl create cluster --name "$name" --config "$cluster_dir/kwokctl.yaml" \
		--runtime binary --kubeconfig "" \
		--kube-apiserver-binary "$kube_bin/kube-apiserver" \
		--kube-controller-manager-binary "$kube_bin/kube-controller-manager" \
		--kube-scheduler-binary "$kube_bin/kube-scheduler" \
		--etcd-binary "$etcd_bin/etcd" \
		--kwok-controller-binary "$kwok_bin/kwok" \
		--wait 2m >"$log" 2>&1; then
		echo "hack/cluster.sh: creating cluster $name failed; kwokctl said:" >&2
		tail -n 20 "$log" >&2
		if grep -qi 'address already in use\|bind:' "$log"; then
			echo "hack/cluster.sh: a port the cluster needs is taken; see 'ss -ltnp' and stop what holds it" >&2
		fi
		kwokctl delete cluster --kubeconfig "$state_dir/kwok/kwokctl-kubeconfig" --name "$name" >/dev/null 2>&1 || true
		exit 1
	fi
	kwokctl get kubeconfig --name "$name" >"$kubeconfig.tmp"
	mv "$kubeconfig.tmp" "$kubeconfig"
	kubectl apply -f "$root/hack/cluster/nodes.yaml" >/dev/null
	wait_nodes_ready
	echo "cluster $name: control plane and simulated nodes ready in $((SECONDS - start))s" >&2
	if [[ $real_node == true ]]; then
		"$root/hack/node.sh" up --name "$name"
	fi
	echo "cluster $name: ready in $((SECONDS - start))s (kubeconfig $kubeconfig)" >&2
}

down() {
	# Kueue (hack/kueue.sh), if started, runs beside the cluster: it goes first.
	"$root/hack/kueue.sh" down --name "$name"
	"$root/hack/node.sh" down --name "$name"
	if [[ ! -x $kwok_bin/kwokctl ]]; then
		# Without kwokctl (the tools folder was removed), stop whatever of the
		# cluster still runs by the path of its binaries.
		pkill -TERM -f "$KWOK_WORKDIR/clusters/$name/bin/" || true
		wait_gone
		rm -rf "$cluster_dir" "$KWOK_WORKDIR/clusters/$name"
		echo "cluster $name: stopped and removed (kwokctl is not built)" >&2
		return 0
	fi
	if exists; then
		local deleted=true
		kwokctl delete cluster --kubeconfig "$cluster_dir/kwokctl-kubeconfig" --name "$name" >"$state_dir/kwok/delete-$name.log" 2>&1 ||
			{ cat "$state_dir/kwok/delete-$name.log" >&2; deleted=false; }
		rm -f "$state_dir/kwok/delete-$name.log"
		wait_gone
		if [[ $deleted == false ]]; then
			echo "cluster $name: kwokctl delete failed (above); its processes are stopped, its state is left in $KWOK_WORKDIR/clusters/$name" >&2
			return 1
		fi
		echo "cluster $name: stopped and removed" >&2
	else
		echo "cluster $name: not running" >&2
	fi
	rm -rf "$cluster_dir"
}

# wait_gone waits until no process of the cluster is left (kwokctl signals
# them and returns at once), and kills any that outlive a grace period.
wait_gone() {
	local pattern="$KWOK_WORKDIR/clusters/$name/bin/"
	for _ in $(seq 1 100); do
		pgrep -f "$pattern" >/dev/null || return 0
		sleep 0.1
	done
	echo "cluster $name: killing processes that did not stop: $(pgrep -f "$pattern" | tr '\n' ' ')" >&2
	pkill -KILL -f "$pattern" || true
}

status() {
	if exists && api_ready; then
		echo "cluster $name: running (kubeconfig $kubeconfig)"
		kubectl get nodes -o wide
	else
		echo "cluster $name: not running"
		return 1
	fi
}

case $cmd in
up) up ;;
down) down ;;
status) status ;;
kubeconfig) echo "$kubeconfig" ;;
*)
	sed -n '2,23p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac
