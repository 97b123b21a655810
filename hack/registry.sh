#!/usr/bin/env bash
# Starts and stops the local OCI registry: the CNCF distribution registry
# (hack/tools.sh registry), as a host process serving HTTPS on loopback with
# a certificate from a local CA. The real node's containerd trusts that CA
# (hack/node.sh), so it pulls runwarden's released images from here, and
# `make release` pushes images, signatures, SBOMs and the chart here.
#
# Usage: hack/registry.sh up|down|status|address|ca
#
#   up       start the registry (makes its CA and certificate once); does
#            nothing if it already runs
#   down     stop it; what it stores stays for the next start
#   status   say whether it runs and answers
#   address  print its address, HOST:PORT (what image references start with)
#   ca       print the path of its CA certificate (for helm --ca-file,
#            cosign --registry-cacert, containerd's hosts.toml)
#
# There is one registry on the machine, shared by every local cluster. It
# listens on 127.0.0.1 only and asks for no credentials: only processes on
# this machine reach it, and containerd pulls on the host's network.
#
# Environment:
#   RUNWARDEN_REGISTRY_PORT  its port (default 5000)
#   RUNWARDEN_STATE_DIR      state folder (default: ${XDG_CACHE_HOME:-$HOME/.cache}/runwarden);
#                            the registry's CA, certificate, storage, log and
#                            pid file are in $RUNWARDEN_STATE_DIR/registry
#   RUNWARDEN_TOOLS_DIR      pinned tools folder (see hack/tools.sh)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
state_dir=${RUNWARDEN_STATE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/runwarden}
port=${RUNWARDEN_REGISTRY_PORT:-5000}
address=localhost:$port

reg_dir=$state_dir/registry
certs=$reg_dir/certs
pid_file=$reg_dir/registry.pid
log_file=$reg_dir/registry.log

log() { echo "registry ($address): $*" >&2; }

# shellcheck source=hack/lib/pidfile.sh
source "$root/hack/lib/pidfile.sh"
# shellcheck source=hack/lib/certs.sh
source "$root/hack/lib/certs.sh"

running() { pidfile_alive "$pid_file"; }

# answers reports whether the registry answers the distribution API's base
# endpoint over TLS, checked against its CA.
answers() {
	curl -fsS --max-time 2 --cacert "$certs/ca.crt" "https://$address/v2/" >/dev/null 2>&1
}

# make_certs makes the local CA (once: containerd and helm keep trusting it
# across restarts) and the registry's certificate for localhost and
# 127.0.0.1, signed by it.
make_certs() {
	[[ -f $certs/ca.crt && -f $certs/tls.crt && -f $certs/tls.key ]] && return 0
	make_serving_certs "$certs" "/CN=runwarden local registry CA" localhost DNS:localhost,IP:127.0.0.1 3650 hack/registry.sh
}

write_config() {
	cat >"$reg_dir/config.yml" <<-EOF
	version: 0.1
	log:
	  level: info
	  formatter: text
	storage:
	  filesystem:
	    rootdirectory: $reg_dir/storage
	  delete:
	    enabled: true
	http:
	  addr: 127.0.0.1:$port
	  # One instance: the secret only signs its own upload state.
	  secret: runwarden-local-$(openssl rand -hex 16)
	  tls:
	    certificate: $certs/tls.crt
	    key: $certs/tls.key
	    minimumtls: tls1.2
	EOF
}

up() {
	local bin
	bin=$("$root/hack/tools.sh" path registry)/registry
	if [[ ! -x $bin ]]; then
		echo "hack/registry.sh: $bin is missing; run 'hack/tools.sh registry' to build it" >&2
		exit 1
	fi
	local c
	for c in openssl curl setsid; do
		if ! command -v "$c" >/dev/null; then
			echo "hack/registry.sh: $c is missing (Debian packages openssl, curl, util-linux)" >&2
			exit 1
		fi
	done
	if running && answers; then
		return 0
	fi
	if running; then
		log "runs but does not answer; restarting it"
		stop_registry
	fi
	if answers; then
		echo "hack/registry.sh: something else answers at https://$address; stop it or set RUNWARDEN_REGISTRY_PORT" >&2
		exit 1
	fi
	local start=$SECONDS pid
	mkdir -p "$reg_dir/storage"
	make_certs
	write_config
	setsid "$bin" serve "$reg_dir/config.yml" >>"$log_file" 2>&1 </dev/null &
	pid=$!
	pidfile_record "$pid_file" "$pid"
	for _ in $(seq 1 100); do
		if ! running; then
			log "exited; the last lines of $log_file:"
			tail -n 20 "$log_file" >&2
			if grep -q 'address already in use' "$log_file"; then
				echo "hack/registry.sh: port $port is taken; see 'ss -ltnp' or set RUNWARDEN_REGISTRY_PORT" >&2
			fi
			exit 1
		fi
		if answers; then
			log "ready in $((SECONDS - start))s (pid $pid, CA $certs/ca.crt, log $log_file)"
			return 0
		fi
		sleep 0.1
	done
	log "did not answer in 10s; the last lines of $log_file:"
	tail -n 20 "$log_file" >&2
	stop_registry
	exit 1
}

stop_registry() { pidfile_stop "$pid_file" || true; }

case ${1:-} in
up) up ;;
down)
	if running; then
		stop_registry
		log "stopped (its storage stays in $reg_dir/storage)"
	fi
	;;
status)
	if running && answers; then
		log "running (pid $(cut -d' ' -f1 "$pid_file")), answering"
	elif running; then
		log "running but not answering"
		exit 1
	else
		log "not running"
		exit 1
	fi
	;;
address) echo "$address" ;;
ca) echo "$certs/ca.crt" ;;
*)
	sed -n '2,27p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac
