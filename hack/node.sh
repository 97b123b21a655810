#!/usr/bin/env bash
# Starts and stops the local cluster's real node: containerd (with runc and
# the CNI bridge plugin), a kubelet, kube-proxy and CoreDNS, all as host
# processes with their own config, state folders and socket, so they touch
# nothing else on the machine. hack/cluster.sh calls it; it needs root.
#
# Usage: hack/node.sh up|down|status|socket [--name CLUSTER]
#
# The node is named rw-real-0, registered with the taint
# runwarden.dev/real-node=true:NoSchedule so only pods that ask land there.
# Pods get addresses on the bridge rwbr0 (10.88.0.0/16, no masquerade, no
# route outward): they reach the host, the API server and each other, and
# nothing beyond the machine. Only one cluster on a machine can have the
# real node at a time.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
state_dir=${RUNWARDEN_STATE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/runwarden}
name=${RUNWARDEN_CLUSTER_NAME:-runwarden}

cmd=${1:-}
shift || true
while [[ $# -gt 0 ]]; do
	case $1 in
	--name) name=${2:?--name needs a value}; shift 2 ;;
	--name=*) name=${1#--name=}; shift ;;
	*) echo "hack/node.sh: unknown argument \"$1\"" >&2; exit 2 ;;
	esac
done

# Fixed names and addresses of the real node; see docs/development.md.
NODE_NAME=rw-real-0
BRIDGE=rwbr0
POD_SUBNET=10.88.0.0/16
GATEWAY=10.88.0.1
SERVICE_SUBNET=10.0.0.0/24
CLUSTER_DOMAIN=cluster.local
NODE_TAINT_KEY=runwarden.dev/real-node

cluster_dir=$state_dir/clusters/$name
node_dir=$cluster_dir/node
kubeconfig=$cluster_dir/kubeconfig
owner_file=$state_dir/real-node.owner
run_marker=$state_dir/real-node.run-containerd
# Host folders the kubelet and the CNI plugins write to whatever they are
# configured with (device plugin socket, /var/log/containers links, CNI
# result cache): those that did not exist before the real node first came up
# are removed when it goes.
host_paths=(/var/lib/kubelet /var/log/containers /var/lib/cni)
created_file=$state_dir/real-node.created
# Kernel settings the kubelet sets at start (protectKernelDefaults is off):
# saved when the real node first comes up, put back when it goes.
kernel_keys=(vm/overcommit_memory vm/panic_on_oom kernel/panic kernel/panic_on_oops kernel/keys/root_maxkeys kernel/keys/root_maxbytes)
sysctl_file=$state_dir/real-node.sysctl
kube_bin=$("$root/hack/tools.sh" path kubernetes)
coredns_bin=$("$root/hack/tools.sh" path coredns)
sock=$node_dir/containerd/containerd.sock

# Two clusters coming up at once would both take the real node: one `up` at
# a time. flock -o: the node's programs started below do not inherit the lock.
if [[ $cmd == up && ${RUNWARDEN_NODE_UP_LOCKED:-} != "$name" ]]; then
	mkdir -p "$state_dir"
	exec env RUNWARDEN_NODE_UP_LOCKED="$name" flock -o "$state_dir/real-node.lock" "$0" up --name "$name"
fi

# shellcheck source=hack/lib/kubectl.sh
source "$root/hack/lib/kubectl.sh"
ctr() { command ctr --address "$sock" --namespace k8s.io --connect-timeout 2s --timeout 60s "$@"; }
log() { echo "node $NODE_NAME ($name): $*" >&2; }

require_root() {
	if [[ $(id -u) -ne 0 ]]; then
		echo "hack/node.sh: the real node needs root (containerd, mounts, network namespaces)." >&2
		echo "hack/node.sh: run as root, or start the cluster without it: RUNWARDEN_REAL_NODE=false make cluster-up" >&2
		exit 1
	fi
}

# shellcheck source=hack/lib/pidfile.sh
source "$root/hack/lib/pidfile.sh"

# pid_alive reports whether the process recorded in pid file $1 (of the
# node folder $2, default this cluster's) still runs.
pid_alive() { pidfile_alive "${2:-$node_dir}/run/$1.pid"; }

# start runs a component in the background with its log and pid file.
start() {
	local component=$1
	shift
	if pid_alive "$component"; then
		return 0
	fi
	setsid "$@" >"$node_dir/logs/$component.log" 2>&1 </dev/null &
	pidfile_record "$node_dir/run/$component.pid" $!
}

# stop signals a component and waits for it to exit (10 s, then SIGKILL).
stop() { pidfile_stop "$node_dir/run/$1.pid" || true; }

wait_for() {
	local what=$1 tries=$2
	shift 2
	for _ in $(seq 1 "$tries"); do
		"$@" >/dev/null 2>&1 && return 0
		sleep 0.2
	done
	log "timed out waiting for $what"
	return 1
}

ensure_bridge() {
	if ! ip link show "$BRIDGE" >/dev/null 2>&1; then
		ip link add "$BRIDGE" type bridge
	fi
	if ! ip -4 addr show dev "$BRIDGE" | grep -q "inet $GATEWAY/"; then
		ip addr add "$GATEWAY/${POD_SUBNET#*/}" dev "$BRIDGE"
	fi
	ip link set "$BRIDGE" up
	# The Service range goes to the bridge too. kube-proxy rewrites Service
	# addresses to pod addresses; should it not (yet) have a rule, traffic to
	# a Service address stays on the machine instead of following the default
	# route outward.
	ip route replace "$SERVICE_SUBNET" dev "$BRIDGE"
}

# put writes stdin to a file only when its content differs: kube-proxy exits
# when its configuration file changes, and a running node must survive a
# second `up`.
put() {
	local tmp
	tmp=$(mktemp "$1.XXXXXX")
	cat >"$tmp"
	if [[ -f $1 ]] && cmp -s "$tmp" "$1"; then
		rm -f "$tmp"
	else
		mv "$tmp" "$1"
	fi
}

write_configs() {
	mkdir -p "$node_dir"/{containerd/root,containerd/state,containerd/opt,cni/conf,cni/ipam,kubelet,pod-logs,logs,run,coredns}

	put "$node_dir/containerd/config.toml" <<-EOF
	version = 2
	root = "$node_dir/containerd/root"
	state = "$node_dir/containerd/state"
	disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.overlayfs"]
	[grpc]
	  address = "$sock"
	[plugins."io.containerd.internal.v1.opt"]
	  path = "$node_dir/containerd/opt"
	[plugins."io.containerd.grpc.v1.cri"]
	  sandbox_image = "$(image_ref pause)"
	  restrict_oom_score_adj = true
	  netns_mounts_under_state_dir = true
	  disable_tcp_service = true
	  stream_server_address = "127.0.0.1"
	  stream_server_port = "0"
	  enable_selinux = false
	  [plugins."io.containerd.grpc.v1.cri".containerd]
	    snapshotter = "native"
	    default_runtime_name = "runc"
	    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
	      runtime_type = "io.containerd.runc.v2"
	      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
	        SystemdCgroup = false
	        Root = "$node_dir/runc"
	  [plugins."io.containerd.grpc.v1.cri".cni]
	    bin_dir = "/usr/lib/cni"
	    conf_dir = "$node_dir/cni/conf"
	  [plugins."io.containerd.grpc.v1.cri".registry]
	    config_path = "$node_dir/containerd/certs.d"
	EOF

	# The local registry (hack/registry.sh): pulled over HTTPS, its
	# certificate checked against the local CA.
	local registry
	registry=$("$root/hack/registry.sh" address)
	mkdir -p "$node_dir/containerd/certs.d/$registry"
	put "$node_dir/containerd/certs.d/$registry/hosts.toml" <<-EOF
	server = "https://$registry"
	[host."https://$registry"]
	  capabilities = ["pull", "resolve"]
	  ca = "$("$root/hack/registry.sh" ca)"
	EOF

	# bridge + host-local only: no masquerade and no portmap, so no NAT rule
	# is added, and no default route: pods route only to the bridge and to
	# the Service range (10.0.0.0/24, through kube-proxy), so their traffic
	# never leaves the machine.
	put "$node_dir/cni/conf/10-runwarden.conflist" <<-EOF
	{
	  "cniVersion": "1.0.0",
	  "name": "runwarden",
	  "plugins": [
	    {
	      "type": "bridge",
	      "bridge": "$BRIDGE",
	      "isGateway": true,
	      "ipMasq": false,
	      "hairpinMode": true,
	      "ipam": {
	        "type": "host-local",
	        "dataDir": "$node_dir/cni/ipam",
	        "ranges": [[{"subnet": "$POD_SUBNET", "gateway": "$GATEWAY"}]],
	        "routes": [{"dst": "$SERVICE_SUBNET"}]
	      }
	    }
	  ]
	}
	EOF

	# Pods resolve only cluster names; the host's resolvers are not handed on.
	put "$node_dir/kubelet/resolv.conf" </dev/null
	put "$node_dir/kubelet/config.yaml" <<-EOF
	apiVersion: kubelet.config.k8s.io/v1beta1
	kind: KubeletConfiguration
	address: $GATEWAY
	port: 10250
	readOnlyPort: 0
	healthzBindAddress: 127.0.0.1
	healthzPort: 10248
	containerRuntimeEndpoint: unix://$sock
	podLogsDir: $node_dir/pod-logs
	resolvConf: $node_dir/kubelet/resolv.conf
	clusterDNS: [$GATEWAY]
	clusterDomain: $CLUSTER_DOMAIN
	cgroupDriver: cgroupfs
	failCgroupV1: false
	cgroupsPerQOS: false
	enforceNodeAllocatable: []
	failSwapOn: false
	imageGCHighThresholdPercent: 100
	imageGCLowThresholdPercent: 99
	evictionHard:
	  memory.available: "100Mi"
	  nodefs.available: "1%"
	  imagefs.available: "1%"
	  nodefs.inodesFree: "1%"
	authentication:
	  anonymous:
	    enabled: false
	  webhook:
	    enabled: true
	  x509:
	    clientCAFile: $state_dir/kwok/clusters/$name/pki/ca.crt
	authorization:
	  mode: Webhook
	registerWithTaints:
	- key: $NODE_TAINT_KEY
	  value: "true"
	  effect: NoSchedule
	serializeImagePulls: false
	EOF

	put "$node_dir/kube-proxy.yaml" <<-EOF
	apiVersion: kubeproxy.config.k8s.io/v1alpha1
	kind: KubeProxyConfiguration
	mode: iptables
	clusterCIDR: $POD_SUBNET
	hostnameOverride: $NODE_NAME
	bindAddress: 127.0.0.1
	# NodePorts on the bridge only: on 127.0.0.1 they would need the host's
	# net.ipv4.conf.all.route_localnet changed.
	nodePortAddresses: [$GATEWAY/32]
	healthzBindAddress: 127.0.0.1:10256
	metricsBindAddress: 127.0.0.1:10249
	clientConnection:
	  kubeconfig: $kubeconfig
	conntrack:
	  maxPerCore: 0
	  tcpEstablishedTimeout: 0s
	  tcpCloseWaitTimeout: 0s
	EOF

	put "$node_dir/coredns/Corefile" <<-EOF
	.:53 {
	    bind $GATEWAY
	    errors
	    kubernetes $CLUSTER_DOMAIN in-addr.arpa ip6.arpa {
	        kubeconfig $kubeconfig
	        pods insecure
	        fallthrough in-addr.arpa ip6.arpa
	    }
	    cache 5
	}
	EOF
}

# remember_host records what the real node changes on the host before it
# first does: host folders it creates, kernel settings it sets.
remember_host() {
	local p k v
	if [[ ! -f $created_file ]]; then
		for p in "${host_paths[@]}"; do
			[[ -e $p ]] || echo "$p"
		done >"$created_file.tmp"
		mv "$created_file.tmp" "$created_file"
	fi
	if [[ ! -f $sysctl_file ]]; then
		for k in "${kernel_keys[@]}"; do
			v=$(cat "/proc/sys/$k")
			echo "$k $v"
		done >"$sysctl_file.tmp"
		mv "$sysctl_file.tmp" "$sysctl_file"
	fi
}

# restore_host undoes what remember_host recorded.
restore_host() {
	local p k v
	if [[ -f $created_file ]]; then
		while read -r p; do
			[[ -n $p ]] && rm -rf "$p"
		done <"$created_file"
		rm -f "$created_file"
	fi
	if [[ -f $sysctl_file ]]; then
		while read -r k v; do
			[[ -n $k ]] && { echo "$v" >"/proc/sys/$k" || log "could not restore $k to $v"; }
		done <"$sysctl_file"
		rm -f "$sysctl_file"
	fi
}

image_ref() { "$root/hack/images.sh" ref "$1"; }

up() {
	require_root
	"$root/hack/tools.sh" node-packages kubernetes coredns
	if [[ -f $owner_file && $(cat "$owner_file") != "$name" ]]; then
		local other c running=false
		other=$(cat "$owner_file")
		for c in containerd kubelet kube-proxy coredns; do
			pid_alive "$c" "$state_dir/clusters/$other/node" && running=true
		done
		if [[ $running == false ]]; then
			# Left behind by a run that was killed: clear its mounts, bridge and rules.
			log "clearing what cluster \"$other\" left of the real node"
			"$root/hack/node.sh" down --name "$other"
		elif ! flock -n "$state_dir/in-use-$other.lock" true; then
			echo "hack/node.sh: cluster \"$other\" has the real node and a run is using it (make demo, make e2e or make test); only one cluster per machine can have it." >&2
			echo "hack/node.sh: wait for that run to end, or start this one without a real node (RUNWARDEN_REAL_NODE=false)." >&2
			exit 1
		elif [[ ${RUNWARDEN_TAKE_REAL_NODE:-} == true ]]; then
			log "stopping cluster \"$other\", which has the real node (only one cluster per machine can)"
			"$root/hack/cluster.sh" down --name "$other"
		else
			echo "hack/node.sh: cluster \"$other\" already has the real node; only one cluster per machine can." >&2
			echo "hack/node.sh: stop it first (hack/cluster.sh down --name $other), or start this one without a real node (RUNWARDEN_REAL_NODE=false)." >&2
			exit 1
		fi
	fi
	echo "$name" >"$owner_file"
	remember_host
	# containerd 1.6 always puts its shims' sockets under /run/containerd/s;
	# remember whether that folder was ours to remove at teardown.
	if [[ ! -e /run/containerd && ! -e $run_marker ]]; then
		touch "$run_marker"
	fi
	local start_s=$SECONDS
	# The registry the node pulls released images from.
	"$root/hack/tools.sh" registry
	"$root/hack/registry.sh" up
	ensure_bridge
	write_configs

	start containerd containerd --config "$node_dir/containerd/config.toml"
	wait_for "containerd" 150 ctr version
	# The sandbox image and the runner image; the chart's images join them
	# when they are built (hack/images.sh).
	"$root/hack/images.sh" load pause runner --address "$sock"

	start kubelet "$kube_bin/kubelet" --config "$node_dir/kubelet/config.yaml" \
		--kubeconfig "$kubeconfig" --root-dir "$node_dir/kubelet/root" --cert-dir "$node_dir/kubelet/pki" \
		--hostname-override "$NODE_NAME" --node-ip "$GATEWAY" --v 1
	start kube-proxy "$kube_bin/kube-proxy" --config "$node_dir/kube-proxy.yaml"
	start coredns "$coredns_bin/coredns" -conf "$node_dir/coredns/Corefile"

	wait_for "the node to register" 300 kubectl get node "$NODE_NAME"
	if ! kubectl wait --for=condition=Ready "node/$NODE_NAME" --timeout=90s >/dev/null; then
		log "not Ready after 90s; see $node_dir/logs/kubelet.log"
		tail -n 20 "$node_dir/logs/kubelet.log" >&2
		exit 1
	fi
	kubectl label node "$NODE_NAME" --overwrite runwarden.dev/node=real >/dev/null
	log "Ready in $((SECONDS - start_s))s"
}

# drain removes every pod from the node through the kubelet, so the kubelet
# and containerd tear down their containers, mounts and network namespaces.
drain() {
	pid_alive kubelet || return 0
	[[ -f $kubeconfig ]] || return 0
	kubectl get --raw /readyz >/dev/null 2>&1 || return 0
	local pods
	pods=$({ kubectl get pods -A --field-selector "spec.nodeName=$NODE_NAME" -o name 2>/dev/null || true; } | wc -l)
	[[ $pods -gt 0 ]] || return 0
	log "removing $pods pods"
	# Cordoned first, or the pods of Deployments pinned to the node come back.
	kubectl cordon "$NODE_NAME" >/dev/null 2>&1 || true
	kubectl delete pods -A --field-selector "spec.nodeName=$NODE_NAME" --grace-period=1 --wait=false >/dev/null 2>&1 || true
	# A pod leaves the API only once the kubelet has stopped its containers.
	wait_for "the node's pods to stop" 150 no_pods || true
}

# remove_kube_chains deletes the KUBE-* iptables chains the kubelet and
# kube-proxy made, and the rules of the built-in chains that jump to them.
remove_kube_chains() {
	local ipt table rule chains c
	for ipt in iptables ip6tables; do
		command -v "$ipt" >/dev/null || continue
		for table in filter nat mangle; do
			local rules
			rules=$("$ipt-save" -t "$table" 2>/dev/null | grep -E '^-A [A-Z]+ .*-j KUBE-' | grep -vE '^-A KUBE-' | sed 's/^-A/-D/' || true)
			while read -r rule; do
				[[ -n $rule ]] && { eval "\"$ipt\" -t $table $rule" 2>/dev/null || true; }
			done <<<"$rules"
			chains=$("$ipt-save" -t "$table" 2>/dev/null | grep -oE '^:KUBE-[A-Za-z0-9_-]+' | tr -d : || true)
			for c in $chains; do "$ipt" -t "$table" -F "$c" 2>/dev/null || true; done
			for c in $chains; do "$ipt" -t "$table" -X "$c" 2>/dev/null || true; done
		done
	done
}

no_pods() { [[ -z $(kubectl get pods -A --field-selector "spec.nodeName=$NODE_NAME" -o name 2>/dev/null) ]]; }

down() {
	if [[ ! -d $node_dir ]]; then
		return 0
	fi
	require_root
	drain
	stop kubelet
	stop coredns
	stop kube-proxy
	# kube-proxy removes the iptables rules it made; the kubelet's own
	# chains (KUBE-FIREWALL, the canaries) go here.
	"$kube_bin/kube-proxy" --cleanup >/dev/null 2>&1 || true
	remove_kube_chains
	if pid_alive containerd; then
		# Containers the kubelet did not remove: kill and delete them.
		for id in $(ctr tasks list -q 2>/dev/null); do
			ctr tasks kill -s SIGKILL "$id" >/dev/null 2>&1 || true
			ctr tasks delete -f "$id" >/dev/null 2>&1 || true
		done
		for id in $(ctr containers list -q 2>/dev/null); do
			ctr containers delete "$id" >/dev/null 2>&1 || true
		done
	fi
	stop containerd
	# The registry was started for this node (its storage stays).
	"$root/hack/registry.sh" down
	# The demo's Vault (hack/demo/vault.sh) listens on this node's bridge
	# gateway: it goes with the node, whichever run takes the node over.
	"$root/hack/demo/vault.sh" down
	# Anything still mounted under the node's folders (volumes, network
	# namespaces, snapshots), deepest first.
	local mounts
	mounts=$(awk -v d="$node_dir/" 'index($2, d) == 1 {print $2}' /proc/self/mounts | sort -r)
	for m in $mounts; do
		umount -l "$m" 2>/dev/null || true
	done
	# Veths of pods whose namespaces are gone vanish with them; the bridge goes last.
	ip link delete "$BRIDGE" 2>/dev/null || true
	# The kubelet links every container's log into /var/log/containers.
	find /var/log/containers -maxdepth 1 -type l -lname "$node_dir/*" -delete 2>/dev/null || true
	# The components' logs (containerd, kubelet, kube-proxy, CoreDNS) outlive
	# the node, the last node of each cluster name's: a failed run is read
	# after its cluster is gone.
	rm -rf "$state_dir/node-logs/$name"
	mkdir -p "$state_dir/node-logs/$name" && cp -a "$node_dir/logs/." "$state_dir/node-logs/$name/" 2>/dev/null || true
	rm -rf "$node_dir"
	if [[ -f $owner_file && $(cat "$owner_file") == "$name" ]]; then
		restore_host
		rm -f "$owner_file"
		if [[ -f $run_marker ]]; then
			rmdir /run/containerd/s /run/containerd/runc/k8s.io /run/containerd/runc /run/containerd 2>/dev/null || true
			rm -f "$run_marker"
		fi
	fi
	log "stopped and removed"
}

status() {
	local c
	for c in containerd kubelet kube-proxy coredns; do
		if pid_alive "$c"; then echo "$c: running"; else echo "$c: stopped"; fi
	done
}

case $cmd in
up) up ;;
down) down ;;
status) status ;;
socket) echo "$sock" ;;
*)
	sed -n '2,14p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac
