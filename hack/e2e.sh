#!/usr/bin/env bash
# Runs `go test -tags e2e` with the given arguments on the cluster
# RUNWARDEN_E2E_CLUSTER chooses (see docs/e2e.md), one run at a time on this
# machine, and stops the local e2e cluster however the run ends (tests
# failed, -timeout, Ctrl-C), unless RUNWARDEN_E2E_KEEP=true. After a
# successful run on a local cluster, checks nothing was left behind. Tests
# that call t.Parallel() run RUNWARDEN_E2E_PARALLEL (default 6) at a time.
#
# Usage: hack/e2e.sh GO-TEST-ARGS...      (make e2e, make bench-dispatcher)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
state_dir=${RUNWARDEN_STATE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/runwarden}
kind=${RUNWARDEN_E2E_CLUSTER:-local}
name=${RUNWARDEN_E2E_CLUSTER_NAME:-runwarden-e2e}
keep=${RUNWARDEN_E2E_KEEP:-}
# How many e2e tests run side by side on the one cluster (go test -parallel;
# a -parallel among the arguments wins). The tests mostly wait on the
# cluster, so more than the 2 cores of the machines the suite is timed on:
# on one, idle, the suite took 354 s with 4 and 271 s with 6, its CPU then
# busy throughout (docs/e2e.md).
parallel=${RUNWARDEN_E2E_PARALLEL:-6}

# The locks are held on this script's own descriptors until it exits, after
# it has stopped the cluster however the run ended (a lock held by a flock
# process would go at once on Ctrl-C, while the cluster was still being
# stopped). The programs it starts get them closed: a cluster left running
# holds none. in-use-NAME tells a `make demo` started meanwhile not to take
# this cluster's real node.
mkdir -p "$state_dir"
exec {run_lock}>"$state_dir/e2e.lock"
if ! flock -n "$run_lock"; then
	echo "e2e: another e2e run holds $state_dir/e2e.lock; waiting for it" >&2
	flock "$run_lock"
fi
exec {use_lock}>"$state_dir/in-use-$name.lock"
flock "$use_lock"

# The output goes to a file as well as to stdout, for the summary of
# failures printed at the end (hack/lib/failures.awk); namespaces dumped on
# failure go beside it (harness.Dump).
log=$state_dir/e2e-last.log
export RUNWARDEN_E2E_DUMPS=$state_dir/e2e-dumps
rm -rf "$RUNWARDEN_E2E_DUMPS"
: >"$log"

child=""
tailer=""
stop_cluster() {
	local code=$?
	trap - EXIT INT TERM
	if [[ -n $child ]] && kill -0 "$child" 2>/dev/null; then
		# SIGINT, as Ctrl-C would send it: the go command waits for the
		# test binary, which stops its cluster (SIGTERM would end the go
		# command at once, and the test binary's output with it).
		kill -INT -- "-$child" 2>/dev/null || true
		local i
		for ((i = 0; i < 120; i++)); do
			kill -0 "$child" 2>/dev/null || break
			sleep 0.5
		done
		kill -KILL -- "-$child" 2>/dev/null || true
		wait "$child" 2>/dev/null || true
	fi
	if [[ -n $tailer ]]; then
		wait "$tailer" 2>/dev/null || true
	fi
	if [[ $code -ne 0 && $kind == local && $keep != true ]]; then
		echo "e2e: stopping cluster $name (the run ended with status $code)" >&2
		"$root/hack/cluster.sh" down --name "$name" {run_lock}>&- {use_lock}>&- || true
	fi
	# Last, where a reader of a long run's tail finds it: what each failed
	# test logged, gathered from the interleaved output.
	if [[ $code -ne 0 && -s $log ]]; then
		awk -f "$root/hack/lib/failures.awk" "$log" || true
		echo "e2e: the whole output: $log; failed features' namespaces in full: $RUNWARDEN_E2E_DUMPS; the real node's component logs: $state_dir/node-logs/$name" >&2
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
go test -tags e2e -parallel "$parallel" "$@" >"$log" 2>&1 {run_lock}>&- {use_lock}>&- &
child=$!
set +m
tail -n +1 -f --pid="$child" "$log" {run_lock}>&- {use_lock}>&- &
tailer=$!
wait "$child"
child=""
wait "$tailer" || true
tailer=""
if [[ $kind == local && $keep != true ]]; then
	"$root/hack/check-clean.sh" --unless-running --name "$name" {run_lock}>&- {use_lock}>&-
fi
