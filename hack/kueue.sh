#!/usr/bin/env bash
# Starts and stops Kueue (kueue.x-k8s.io, the batch queue) beside the local
# cluster, as a host process like the cluster's other control-plane parts. It
# manages batch/v1 Jobs only; its webhooks are called by URL on 127.0.0.1.
#
# Usage: hack/kueue.sh up|down|status [--name NAME] [--namespace-label KEY=VALUE]
#
#   up      apply Kueue's CRDs, start Kueue and register its webhooks; the
#           cluster must be running (hack/cluster.sh up). Does nothing if
#           Kueue already runs (with the same --namespace-label).
#           --namespace-label KEY=VALUE: Kueue manages, and its Job webhooks
#           see, the Jobs of namespaces labelled so only (its
#           managedJobsNamespaceSelector, and the webhooks'
#           namespaceSelector); the e2e suites run beside the Kueue tests
#           this way. Without it, every namespace's Jobs that name a
#           LocalQueue.
#   down    delete its webhook configurations, turn its CRDs' conversion
#           webhook off, stop it and remove its folder (its CRDs and objects
#           stay in the cluster)
#   status  say whether it runs and answers
#
# Environment (as hack/cluster.sh):
#   RUNWARDEN_CLUSTER_NAME   cluster name (default: runwarden)
#   RUNWARDEN_STATE_DIR      state folder (default: ${XDG_CACHE_HOME:-$HOME/.cache}/runwarden);
#                            Kueue's certificates, configuration, log and pid
#                            file are in $RUNWARDEN_STATE_DIR/clusters/NAME/kueue
#   RUNWARDEN_TOOLS_DIR      pinned tools folder (see hack/tools.sh)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
state_dir=${RUNWARDEN_STATE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/runwarden}
name=${RUNWARDEN_CLUSTER_NAME:-runwarden}

cmd=${1:-}
shift || true
namespace_label=
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
	--namespace-label)
		namespace_label=${2:?--namespace-label needs KEY=VALUE}
		shift 2
		;;
	--namespace-label=*)
		namespace_label=${1#--namespace-label=}
		shift
		;;
	*)
		echo "hack/kueue.sh: unknown argument \"$1\"" >&2
		exit 2
		;;
	esac
done

kube_bin=$("$root/hack/tools.sh" path kubernetes)
kueue_bin=$("$root/hack/tools.sh" path kueue)

cluster_dir=$state_dir/clusters/$name
kubeconfig=$cluster_dir/kubeconfig
kueue_dir=$cluster_dir/kueue
pid_file=$kueue_dir/kueue.pid
log_file=$kueue_dir/kueue.log
# Both webhook configurations carry this name; see webhooks below.
webhook_config=kueue-local
# The CRDs whose versions (v1beta1, stored, and v1beta2) Kueue converts
# between, as the module's config/components/crd/kustomization.yaml patches
# them. Without the conversion webhook the API server only relabels objects
# between versions and drops every field the other version lacks (a
# Workload's spec.priorityClassRef, for one).
conversion_crds=(localqueues clusterqueues cohorts workloads multikueueclusters)

log() { echo "kueue ($name): $*" >&2; }

if [[ -n $namespace_label && ! $namespace_label =~ ^[A-Za-z0-9./_-]+=[A-Za-z0-9._-]*$ ]]; then
	echo "hack/kueue.sh: --namespace-label wants KEY=VALUE (a label), not \"$namespace_label\"" >&2
	exit 2
fi
# The label, as a YAML map's one entry ("KEY": "VALUE"), or nothing.
label_entry=
if [[ -n $namespace_label ]]; then
	label_entry="\"${namespace_label%%=*}\": \"${namespace_label#*=}\""
fi

# shellcheck source=hack/lib/pidfile.sh
source "$root/hack/lib/pidfile.sh"
# shellcheck source=hack/lib/kubectl.sh
source "$root/hack/lib/kubectl.sh"
# shellcheck source=hack/lib/certs.sh
source "$root/hack/lib/certs.sh"

# running reports whether the Kueue of the pid file still runs.
running() { pidfile_alive "$pid_file"; }

# healthy reports whether Kueue's health server at 127.0.0.1:$1 says it is
# ready (its webhook server is up).
healthy() {
	local fd line
	exec {fd}<>"/dev/tcp/127.0.0.1/$1" || return 1
	printf 'GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&"$fd"
	read -r -t 2 line <&"$fd" || true
	exec {fd}>&-
	[[ $line == "HTTP/1."?" 200 "* ]]
} 2>/dev/null

# free_port prints a TCP port no socket on the machine uses, below the
# kernel's ephemeral range (so no outgoing connection takes it meanwhile) and
# not one of the ports given as arguments.
free_port() {
	local used port
	used=" $* $(awk 'FNR > 1 { split($2, a, ":"); print a[2] }' /proc/net/tcp /proc/net/tcp6 2>/dev/null |
		while read -r hex; do printf '%d ' "0x$hex"; done) "
	for _ in $(seq 1 200); do
		port=$((20000 + RANDOM % 12000))
		[[ $used == *" $port "* ]] || {
			echo "$port"
			return 0
		}
	done
	echo "hack/kueue.sh: found no free TCP port between 20000 and 32000" >&2
	return 1
}

# make_certs makes a CA and a serving certificate for 127.0.0.1 signed by
# it: the API server calls the webhooks at https://127.0.0.1:PORT and checks
# the certificate against the CA bundle of the webhook configurations.
make_certs() {
	make_serving_certs "$kueue_dir/certs" "/CN=kueue-local-ca-$name" 127.0.0.1 IP:127.0.0.1 365 hack/kueue.sh
}

# write_config writes Kueue's Configuration: every server on loopback at the
# given ports, no leader election (one Kueue per cluster), certificates from
# make_certs, and batch/v1 Jobs as the only integration.
write_config() {
	local webhook_port=$1 health_port=$2 metrics_port=$3
	cat >"$kueue_dir/config.yaml" <<-EOF
	apiVersion: config.kueue.x-k8s.io/v1beta2
	kind: Configuration
	health:
	  healthProbeBindAddress: 127.0.0.1:$health_port
	metrics:
	  bindAddress: 127.0.0.1:$metrics_port
	webhook:
	  host: 127.0.0.1
	  port: $webhook_port
	  certDir: $kueue_dir/certs
	leaderElection:
	  leaderElect: false
	# As the module's config/components/manager/controller_manager_config.yaml
	# (Kueue's release manifests): client-go's defaults (5 requests/s) would
	# bound admission at a few Jobs a second.
	clientConnection:
	  qps: 50
	  burst: 100
	controller:
	  groupKindConcurrency:
	    Job.batch: 5
	    Workload.kueue.x-k8s.io: 5
	    LocalQueue.kueue.x-k8s.io: 1
	    Cohort.kueue.x-k8s.io: 1
	    ClusterQueue.kueue.x-k8s.io: 1
	    ResourceFlavor.kueue.x-k8s.io: 1
	# The certificates come from hack/kueue.sh, for 127.0.0.1: Kueue's own
	# are for a Service's DNS name, which the API server cannot reach here.
	internalCertManagement:
	  enable: false
	# A Job is Kueue's only if it names a LocalQueue (the label
	# kueue.x-k8s.io/queue-name); every other Job runs as without Kueue.
	manageJobsWithoutQueueName: false
	EOF
	# With --namespace-label, only in the namespaces so labelled: Kueue
	# v0.15 holds even Jobs that name a LocalQueue to this selector (its
	# feature ManagedJobsNamespaceSelectorAlwaysRespected, on by default).
	if [[ -n $label_entry ]]; then
		cat >>"$kueue_dir/config.yaml" <<-EOF
		managedJobsNamespaceSelector:
		  matchLabels: {$label_entry}
		EOF
	fi
	cat >>"$kueue_dir/config.yaml" <<-EOF
	integrations:
	  frameworks:
	  - batch/job
	featureGates:
	  # The on-demand visibility API server listens on every address at the
	  # fixed port 8082; nothing here uses it.
	  VisibilityOnDemand: false
	EOF
}

# webhooks prints Kueue's webhook configurations for batch/v1 Jobs and
# Kueue's own kinds, calling Kueue at https://127.0.0.1:$1 with the CA
# bundle $2. Rules, paths, failure policies and side effects are those of the
# module's config/components/webhook/manifests.yaml.
webhooks() {
	local port=$1 ca=$2 hook
	# entry NAME PATH OPERATIONS GROUP VERSION RESOURCES [job], lists in YAML flow style
	entry() {
		cat <<-EOF
		- name: $1
		  admissionReviewVersions: [v1]
		  clientConfig:
		    url: https://127.0.0.1:$port$2
		    caBundle: $ca
		  failurePolicy: Fail
		  sideEffects: None
		  rules:
		  - apiGroups: [$4]
		    apiVersions: [$5]
		    operations: [$3]
		    resources: [$6]
		EOF
		if [[ ${7:-} == job ]]; then
			cat <<-EOF
			  # Only Jobs that name a LocalQueue go to Kueue, so a Job without
			  # one never depends on Kueue running (failurePolicy Fail above).
			  # Kueue itself leaves such Jobs alone (manageJobsWithoutQueueName:
			  # false), so it misses nothing it would act on.
			  objectSelector:
			    matchExpressions:
			    - key: kueue.x-k8s.io/queue-name
			      operator: Exists
			EOF
			# --namespace-label: the namespaces Kueue manages Jobs in only.
			if [[ -n $label_entry ]]; then
				cat <<-EOF
				  namespaceSelector:
				    matchLabels: {$label_entry}
				EOF
			fi
		fi
	}
	cat <<-EOF
	apiVersion: admissionregistration.k8s.io/v1
	kind: MutatingWebhookConfiguration
	metadata:
	  name: $webhook_config
	  labels:
	    app.kubernetes.io/managed-by: runwarden-hack-kueue
	webhooks:
	EOF
	entry mjob.kb.io /mutate-batch-v1-job CREATE batch v1 jobs job
	for hook in clusterqueue resourceflavor workload; do
		entry "m$hook.kb.io" "/mutate-kueue-x-k8s-io-v1beta2-$hook" CREATE kueue.x-k8s.io v1beta2 "${hook}s"
	done
	cat <<-EOF
	---
	apiVersion: admissionregistration.k8s.io/v1
	kind: ValidatingWebhookConfiguration
	metadata:
	  name: $webhook_config
	  labels:
	    app.kubernetes.io/managed-by: runwarden-hack-kueue
	webhooks:
	EOF
	entry vjob.kb.io /validate-batch-v1-job "CREATE, UPDATE" batch v1 jobs job
	for hook in clusterqueue cohort resourceflavor; do
		entry "v$hook.kb.io" "/validate-kueue-x-k8s-io-v1beta2-$hook" "CREATE, UPDATE" kueue.x-k8s.io v1beta2 "${hook}s"
	done
	entry vworkload.kb.io /validate-kueue-x-k8s-io-v1beta2-workload "CREATE, UPDATE" kueue.x-k8s.io v1beta2 "workloads, workloads/status"
}

# webhook_serves reports whether the API server gets answers from Kueue's
# webhooks: a dry run of a ClusterQueue passes both of its webhooks.
webhook_serves() {
	kubectl create --dry-run=server --request-timeout=10s -o name -f - >/dev/null 2>&1 <<-EOF
	apiVersion: kueue.x-k8s.io/v1beta2
	kind: ClusterQueue
	metadata:
	  name: kueue-local-probe
	spec:
	  namespaceSelector: {}
	EOF
}

# fail_start reports a failed start with the end of Kueue's log, stops it
# and deletes its webhook configurations.
fail_start() {
	log "$1; the last lines of $log_file:"
	tail -n 20 "$log_file" >&2 || true
	stop_kueue || true
	delete_webhooks
	exit 1
}

up() {
	local missing=()
	for b in "$kube_bin/kubectl" "$kueue_bin/kueue"; do
		[[ -x $b ]] || missing+=("$b")
	done
	if [[ ${#missing[@]} -gt 0 ]]; then
		echo "hack/kueue.sh: missing binaries: ${missing[*]}" >&2
		echo "hack/kueue.sh: run 'hack/tools.sh kubernetes kueue' to build them" >&2
		exit 1
	fi
	local c
	for c in openssl unshare setsid; do
		if ! command -v "$c" >/dev/null; then
			echo "hack/kueue.sh: $c is missing (Debian packages openssl, util-linux)" >&2
			exit 1
		fi
	done
	if ! api_ready; then
		echo "hack/kueue.sh: cluster $name is not running; start it first: hack/cluster.sh up --name $name" >&2
		exit 1
	fi
	if running; then
		local had
		had=$(cat "$kueue_dir/namespace-label" 2>/dev/null || true)
		if [[ $had != "$namespace_label" ]]; then
			echo "hack/kueue.sh: Kueue already runs with --namespace-label \"$had\", not \"$namespace_label\"; stop it first: hack/kueue.sh down --name $name" >&2
			exit 1
		fi
		log "already running (pid $(cut -d' ' -f1 "$pid_file"), log $log_file)"
		return 0
	fi
	local start=$SECONDS
	rm -rf "$kueue_dir"
	mkdir -p "$kueue_dir"
	make_certs
	local webhook_port health_port metrics_port
	webhook_port=$(free_port)
	health_port=$(free_port "$webhook_port")
	metrics_port=$(free_port "$webhook_port" "$health_port")
	write_config "$webhook_port" "$health_port" "$metrics_port"
	printf '%s' "$namespace_label" >"$kueue_dir/namespace-label"

	kubectl apply --server-side --force-conflicts --field-manager=runwarden-hack-kueue -f "$kueue_bin/crds/" >/dev/null
	kubectl wait --for=condition=Established -f "$kueue_bin/crds/" --timeout=60s >/dev/null
	local ca
	ca=$(base64 -w0 <"$kueue_dir/certs/ca.crt")
	# Before Kueue starts, as in its own installation: it serves the
	# conversion of its own informers' reads too.
	convert_by_webhook "$webhook_port" "$ca" || fail_start "turning on the conversion webhook of Kueue's CRDs failed"

	# With its own certificate management off, Kueue v0.15 reads the metrics
	# server's certificate from the fixed path /etc/kueue/metrics/certs. It
	# runs in a mount namespace of its own where an overlay on /etc, its
	# upper layer on a tmpfs, holds that folder: nothing on the machine
	# changes, and the mounts go when Kueue exits. Without root, a user
	# namespace allows them.
	mkdir -p "$kueue_dir/etc"
	local ns=(unshare --mount --propagation private)
	[[ $(id -u) -eq 0 ]] || ns=(unshare --user --map-root-user --mount --propagation private)
	local pid
	# setsid, unshare and sh exec one another: the PID is Kueue's.
	# shellcheck disable=SC2016 # expanded by that sh
	setsid "${ns[@]}" -- sh -c '
		mount -t tmpfs -o mode=0700 kueue-etc "$1" &&
			mkdir -p "$1/upper/kueue/metrics/certs" "$1/work" &&
			cp "$2/tls.crt" "$2/tls.key" "$1/upper/kueue/metrics/certs/" &&
			mount -t overlay overlay -o "lowerdir=/etc,upperdir=$1/upper,workdir=$1/work" /etc &&
			shift 2 && exec "$@"' \
		sh "$kueue_dir/etc" "$kueue_dir/certs" \
		"$kueue_bin/kueue" --config "$kueue_dir/config.yaml" --kubeconfig "$kubeconfig" \
		>"$log_file" 2>&1 </dev/null &
	pid=$!
	pidfile_record "$pid_file" "$pid"

	local ready=false
	for _ in $(seq 1 300); do
		running || fail_start "Kueue exited"
		if healthy "$health_port"; then
			ready=true
			break
		fi
		sleep 0.2
	done
	[[ $ready == true ]] || fail_start "Kueue did not become ready in 60s"

	webhooks "$webhook_port" "$ca" | kubectl apply --server-side --force-conflicts --field-manager=runwarden-hack-kueue -f - >/dev/null
	ready=false
	for _ in $(seq 1 60); do
		if webhook_serves; then
			ready=true
			break
		fi
		running || fail_start "Kueue exited"
		sleep 0.5
	done
	[[ $ready == true ]] || fail_start "the API server got no answer from Kueue's webhooks in 30s"
	log "ready in $((SECONDS - start))s (pid $pid, webhooks on 127.0.0.1:$webhook_port, log $log_file)"
}

# stop_kueue signals Kueue and waits for it to exit (10 s, then SIGKILL).
stop_kueue() { pidfile_stop "$pid_file"; }

# convert_by_webhook has the API server convert Kueue's objects between
# versions by calling Kueue at https://127.0.0.1:$1/convert with the CA
# bundle $2.
convert_by_webhook() {
	local port=$1 ca=$2 crd
	for crd in "${conversion_crds[@]}"; do
		kubectl patch crd "$crd.kueue.x-k8s.io" --type=merge --field-manager=runwarden-hack-kueue -p "$(printf \
			'{"spec":{"conversion":{"strategy":"Webhook","webhook":{"conversionReviewVersions":["v1"],"clientConfig":{"url":"https://127.0.0.1:%s/convert","caBundle":"%s"}}}}}' \
			"$port" "$ca")" >/dev/null
	done
}

# delete_webhooks deletes the webhook configurations and turns the
# conversion webhook off again (the CRDs stay), if the cluster answers:
# nothing in the cluster then waits on a stopped Kueue.
delete_webhooks() {
	local crd
	if [[ -x $kube_bin/kubectl ]] && api_ready; then
		kubectl_again delete mutatingwebhookconfiguration,validatingwebhookconfiguration "$webhook_config" \
			--ignore-not-found --request-timeout=20s >/dev/null
		for crd in "${conversion_crds[@]}"; do
			if kubectl_again get crd "$crd.kueue.x-k8s.io" -o jsonpath='{.spec.conversion.strategy}' --request-timeout=20s 2>/dev/null | grep -qx Webhook; then
				kubectl_again patch crd "$crd.kueue.x-k8s.io" --type=merge --request-timeout=20s \
					-p '{"spec":{"conversion":{"strategy":"None","webhook":null}}}' >/dev/null
			fi
		done
	fi
}

down() {
	# The webhooks go first: with failurePolicy Fail, a Job that names a
	# queue could not be created, nor Kueue's objects read, while they point
	# at a stopped Kueue.
	delete_webhooks
	if stop_kueue; then
		log "stopped"
	elif [[ -d $kueue_dir ]]; then
		log "not running"
	fi
	if [[ -d $kueue_dir ]]; then
		rm -rf "$kueue_dir"
	fi
}

status() {
	local health
	if ! running; then
		echo "kueue ($name): not running"
		return 1
	fi
	health=$(sed -n 's/^  healthProbeBindAddress: 127.0.0.1://p' "$kueue_dir/config.yaml")
	if healthy "$health"; then
		echo "kueue ($name): running and ready (pid $(cut -d' ' -f1 "$pid_file"), log $log_file)"
	else
		echo "kueue ($name): running but not ready (pid $(cut -d' ' -f1 "$pid_file"), log $log_file)"
		return 1
	fi
}

case $cmd in
up) up ;;
down) down ;;
status) status ;;
*)
	sed -n '2,27p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac
