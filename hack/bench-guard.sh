#!/usr/bin/env bash
# make bench-guard: the webhook's hot path against its last recorded figures,
# before a change lands. It runs BenchmarkHandle and BenchmarkServeHTTP
# (webhook/admission: the handler, and the same served over HTTP) and
# BenchmarkEval (webhook/policy) with -count 6, as `make bench-webhook` does
# (GOGC=400, as the binary sets it), prints benchstat's comparison with the
# record in docs/bench/webhook.txt, and fails on:
#   - time/op: an increase that benchstat finds significant (p < 0.05) and
#     larger than BENCH_GUARD_TIME_PCT percent (default 10);
#   - allocs/op: any increase (allocation counts do not depend on the
#     machine's load, so this part holds on a busy machine too).
# Time is only comparable on a machine as idle as the one the record was
# made on; BENCH_GUARD_TIME_PCT=off checks allocations alone.
#
# A change that costs time or allocations on purpose records the new
# figures in its own commit: hack/bench-guard.sh --record (or
# `make bench-webhook BENCH_RECORD=1`) writes docs/bench/webhook.txt.
#
# hack/bench-guard.sh --compare FILE compares a run already made (the
# output of `make bench-webhook`, bin/bench-webhook-go.txt) without running.
#
# hack/bench-guard.sh --base REV (make bench-guard BENCH_GUARD_BASE=REV)
# compares with the same benchmarks built from REV (a worktree of it)
# instead of the record, in the same run: six rounds, each running REV's
# benchmarks twice and then this tree's twice (twelve runs a side), so a
# slow spell of the machine falls on both. A record made at another time
# can be 10-15% off on this machine for the same code; the two sides of one
# interleaved run are not.
#
# Usage: hack/bench-guard.sh [--record | --compare FILE | --base REV]
set -euo pipefail
shopt -s inherit_errexit

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
record=docs/bench/webhook.txt
threshold=${BENCH_GUARD_TIME_PCT:-10}

hack/tools.sh benchstat >/dev/null
benchstat=$(hack/tools.sh path benchstat)/benchstat
mkdir -p bin
out=bin/bench-guard.txt
benchmarks='^(BenchmarkEval|BenchmarkHandle|BenchmarkServeHTTP)$'
packages=(webhook/policy webhook/admission)
rounds=6

# interleaved REV: builds the benchmarks' test binaries from a worktree of REV
# and from this tree, and runs them in turn, -count 2 of each per round;
# writes bin/bench-guard-base.txt and $out.
interleaved() {
	local rev=$1 tmp commit pkg round side dir
	commit=$(git rev-parse --verify --quiet "$rev^{commit}") || {
		echo "bench-guard: --base $rev names no commit" >&2
		return 2
	}
	tmp=$(mktemp -d)
	# shellcheck disable=SC2064 # expand now: tmp is local
	trap "git -C '$root' worktree remove --force '$tmp/base' >/dev/null 2>&1; rm -rf '$tmp'" EXIT
	git worktree add --detach --quiet "$tmp/base" "$commit"
	for pkg in "${packages[@]}"; do
		(cd "$tmp/base" && go test -c -o "$tmp/base-${pkg//\//-}.test" "./$pkg")
		go test -c -o "$tmp/head-${pkg//\//-}.test" "./$pkg"
	done
	: >bin/bench-guard-base.txt
	: >"$out"
	for round in $(seq "$rounds"); do
		echo "bench-guard: round $round of $rounds, $rev ($(git rev-parse --short "$commit")) then this tree" >&2
		for side in base head; do
			for pkg in "${packages[@]}"; do
				dir=$root/$pkg
				[[ $side == base ]] && dir=$tmp/base/$pkg
				(cd "$dir" && GOGC=400 "$tmp/$side-${pkg//\//-}.test" -test.run '^$' -test.bench "$benchmarks" -test.benchmem -test.count 2) |
					if [[ $side == base ]]; then cat >>bin/bench-guard-base.txt; else tee -a "$out"; fi
			done
		done
	done
}

case ${1:-} in
--compare)
	out=${2:?hack/bench-guard.sh --compare FILE: name the run to compare}
	;;
--base)
	interleaved "${2:?hack/bench-guard.sh --base REV: name the revision to compare with}"
	record=bin/bench-guard-base.txt
	;;
*)
	GOGC=400 go test -run '^$' -bench "$benchmarks" -benchmem -count "$rounds" \
		./webhook/policy/ ./webhook/admission/ | tee "$out"
	;;
esac

if [[ ${1:-} == --record ]]; then
	mkdir -p "$(dirname "$record")"
	cp "$out" "$record"
	echo "bench-guard: recorded $out as $record; commit it with the change it measures"
	exit 0
fi
if [[ ! -f $record ]]; then
	echo "bench-guard: no record in $record; make one with hack/bench-guard.sh --record" >&2
	exit 1
fi

echo
"$benchstat" "$record" "$out"
echo
# benchstat's CSV: a header row per unit (",sec/op,CI,sec/op,CI,vs base,P"),
# then one row per benchmark: name, old, CI, new, CI, change ("~" when not
# significant), p-value and count.
against=$record
[[ ${1:-} == --base ]] && against="$2, run beside this tree"
"$benchstat" -format csv "$record" "$out" 2>/dev/null | awk -F, -v pct="$threshold" -v against="$against" '
	$1 == "" && $2 != "" { unit = $2; next }
	$1 == "" || $1 == "geomean" || NF < 6 { next }
	$2 == "" || $4 == "" {
		printf "bench-guard: %s %s is in only one of the record and this run\n", $1, unit
		next
	}
	unit == "sec/op" && pct != "off" && $6 ~ /^\+/ {
		change = $6; gsub(/[+%]/, "", change)
		if (change + 0 > pct + 0) {
			printf "bench-guard: %s time/op +%s%% (%s), past the %s%% allowed\n", $1, change, $7, pct
			failed = 1
		}
	}
	unit == "allocs/op" && $4 + 0 > $2 + 0 {
		printf "bench-guard: %s allocs/op %s, was %s\n", $1, $4, $2
		failed = 1
	}
	END {
		if (failed) {
			printf "bench-guard: FAIL: a regression against %s; make the change cheaper, or record the new figures (hack/bench-guard.sh --record) in the commit that costs them, saying why\n", against
			exit 1
		}
		printf "bench-guard: ok against %s\n", against
	}'
