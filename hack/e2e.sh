#!/usr/bin/env bash
# Runs `go test -tags e2e` with the given arguments on the cluster
# RUNWARDEN_E2E_CLUSTER chooses (see docs/e2e.md), one run at a time on this
# machine, and stops the local e2e cluster however the run ends (tests
# failed, -timeout, Ctrl-C), unless RUNWARDEN_E2E_KEEP=true. After a
# successful run on a local cluster, checks nothing was left behind.
#
# Usage: hack/e2e.sh GO-TEST-ARGS...      (make e2e, make bench-dispatcher)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
state_dir=${RUNWARDEN_STATE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/runwarden}
kind=${RUNWARDEN_E2E_CLUSTER:-local}
name=${RUNWARDEN_E2E_CLUSTER_NAME:-runwarden-e2e}
keep=${RUNWARDEN_E2E_KEEP:-}

if [[ ${RUNWARDEN_E2E_LOCKED:-} != "$name" ]]; then
	mkdir -p "$state_dir"
	flock -n "$state_dir/e2e.lock" true || echo "e2e: another e2e run holds $state_dir/e2e.lock; waiting for it" >&2
	# flock -o keeps each lock in flock's own process: the cluster's
	# programs this run starts do not inherit it. in-use-NAME tells a
	# `make demo` started meanwhile not to take this cluster's real node.
	exec env RUNWARDEN_E2E_LOCKED="$name" flock -o "$state_dir/e2e.lock" \
		flock -o "$state_dir/in-use-$name.lock" "$0" "$@"
fi

child=""
stop_cluster() {
	local code=$?
	trap - EXIT INT TERM
	if [[ -n $child ]] && kill -0 "$child" 2>/dev/null; then
		kill -TERM -- "-$child" 2>/dev/null || true
		wait "$child" 2>/dev/null || true
	fi
	if [[ $code -ne 0 && $kind == local && $keep != true ]]; then
		echo "e2e: stopping cluster $name (the run ended with status $code)" >&2
		"$root/hack/cluster.sh" down --name "$name" || true
	fi
	exit "$code"
}
trap stop_cluster EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

cd "$root"
# In its own process group, waited for in the background: a signal to this
# script is handled at once (stopping the tests, then the cluster), not
# after the suite.
set -m
go test -tags e2e "$@" &
child=$!
set +m
wait "$child"
child=""
if [[ $kind == local && $keep != true ]]; then
	"$root/hack/check-clean.sh" --unless-running --name "$name"
fi
