#!/usr/bin/env bash
# The demo's secret store: a HashiCorp Vault dev server (in memory) on the real
# node's bridge gateway, where runner pods reach the host, with one secret
# (secret/db, key password) and a token that may read only it, kept in the
# runner namespace's Secret vault-token for the webhook's policies to hand to
# the resolver init container.
#
# Usage: hack/demo/vault.sh up RUNNER_NAMESPACE | down | bin
#   bin  print the vault binary the demo runs (hack/tools.sh vault)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
state_dir=${RUNWARDEN_STATE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/runwarden}
pid_file=$state_dir/demo-vault.pid
addr=10.88.0.1:8200
export VAULT_ADDR=http://$addr

vault_bin() {
	echo "$("$root/hack/tools.sh" path vault)/vault"
}

down() {
	if [[ -f $pid_file ]] && kill -0 "$(cat "$pid_file")" 2>/dev/null; then
		kill "$(cat "$pid_file")"
		for _ in $(seq 50); do kill -0 "$(cat "$pid_file")" 2>/dev/null || break; sleep 0.1; done
	fi
	rm -f "$pid_file"
}

up() {
	local ns=$1 vault root_token
	vault=$(vault_bin)
	# Dev mode keeps everything in memory: each demo starts a fresh one.
	down
	mkdir -p "$state_dir/demo-vault-home"
	root_token=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
	HOME=$state_dir/demo-vault-home SKIP_SETCAP=1 nohup "$vault" server -dev -dev-root-token-id="$root_token" \
		-dev-listen-address="$addr" -dev-no-store-token >"$state_dir/demo-vault.log" 2>&1 &
	echo $! >"$pid_file"
	export VAULT_TOKEN=$root_token
	for _ in $(seq 100); do "$vault" status >/dev/null 2>&1 && break; sleep 0.1; done
	"$vault" status >/dev/null || { cat "$state_dir/demo-vault.log" >&2; return 1; }
	"$vault" kv put -mount=secret db password="demo-$(head -c 9 /dev/urandom | od -An -tx1 | tr -d ' \n')" >/dev/null
	printf 'path "secret/data/db" { capabilities = ["read"] }\n' | "$vault" policy write runner - >/dev/null
	local token
	token=$("$vault" token create -policy=runner -ttl=768h -field=token)
	local kubectl
	kubectl=$("$root/hack/tools.sh" path kubernetes)/kubectl
	"$kubectl" create secret generic vault-token -n "$ns" --from-literal=token="$token" --dry-run=client -o yaml |
		"$kubectl" apply -f - >/dev/null
	echo "Vault $("$vault" version | cut -d' ' -f2) serves at $VAULT_ADDR: secret/db (key password), readable with the token in Secret $ns/vault-token"
}

case ${1:-} in
up) up "${2:?usage: hack/demo/vault.sh up RUNNER_NAMESPACE}" ;;
down) down ;;
bin) vault_bin ;;
*)
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac
