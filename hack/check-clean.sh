#!/usr/bin/env bash
# Checks that no local cluster left anything behind on the machine: no
# process, mount, bridge, iptables rule or listening port of ours. Prints
# what it finds and exits 1 if anything is left. `make e2e` runs it after the
# suite has torn its cluster down.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
state_dir=${RUNWARDEN_STATE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/runwarden}
tools_dir=$(dirname "$("$root/hack/tools.sh" path kubernetes)")
left=0

for c in pgrep ss; do
	command -v "$c" >/dev/null || { echo "check-clean: $c is missing (Debian packages procps, iproute2)" >&2; exit 1; }
done

unless_running=false
own=""
while [[ $# -gt 0 ]]; do
	case $1 in
	--unless-running) unless_running=true; shift ;;
	--name) own=${2:?--name needs a cluster name}; shift 2 ;;
	*) echo "hack/check-clean.sh: unknown argument \"$1\"" >&2; exit 2 ;;
	esac
done
report() {
	echo "check-clean: left behind: $*" >&2
	left=1
}

# --name NAME: the cluster whose run just ended; it must be gone.
# --unless-running: pass when other local clusters still run (a developer's
# own beside the e2e suite's), since their processes are meant to be there.
running=$(KWOK_WORKDIR=$state_dir/kwok "$("$root/hack/tools.sh" path kwok)/kwokctl" get clusters 2>/dev/null || true)
others=()
for c in $running; do
	if [[ $c == "$own" ]]; then
		report "cluster $own still runs"
	else
		others+=("$c")
	fi
done
if [[ $unless_running == true && ${#others[@]} -gt 0 ]]; then
	echo "check-clean: other local clusters still run (${others[*]}); their processes, mounts and rules are not checked" >&2
	exit $left
fi

# Cluster programs run from the cache folders or name them in their
# arguments (containerd and its shims); builds and linters do not count.
procs=$(pgrep -af "$state_dir/|$tools_dir/(kubernetes|etcd|kwok|coredns|kueue)-" | awk '$2 != "go" && $2 !~ /(pgrep|check-clean|bash|flock)$/' || true)
[[ -z $procs ]] || report "processes:"$'\n'"$procs"

mounts=$(awk -v d="$state_dir/" 'index($2, d) == 1 {print $2}' /proc/self/mounts)
[[ -z $mounts ]] || report "mounts:"$'\n'"$mounts"

if [[ -n $(ls -A /run/containerd/s 2>/dev/null) ]]; then
	report "containerd shim sockets in /run/containerd/s"
fi

if ip link show rwbr0 >/dev/null 2>&1; then
	report "bridge rwbr0"
fi

if command -v iptables-save >/dev/null 2>&1; then
	rules=$(iptables-save 2>/dev/null | grep -c -e 'KUBE-' -e 'CNI-' || true)
	[[ $rules -eq 0 ]] || report "$rules iptables lines naming KUBE- or CNI- chains"
fi

links=$(find /var/log/containers -maxdepth 1 -type l -lname "$state_dir/*" 2>/dev/null || true)
[[ -z $links ]] || report "container log links in /var/log/containers:"$'\n'"$links"

if [[ ! -f $state_dir/real-node.owner && -f $state_dir/real-node.sysctl ]]; then
	report "kernel settings the kubelet changed, not restored (saved in $state_dir/real-node.sysctl)"
fi

ports=$(ss -Hltnu 2>/dev/null | awk '{print $5}' | grep -E '(^|:)(10248|10249|10250|10256)$|^10\.88\.0\.1:' || true)
[[ -z $ports ]] || report "listening ports:"$'\n'"$ports"

if [[ $left -eq 0 ]]; then
	echo "check-clean: nothing left behind"
fi
exit $left
