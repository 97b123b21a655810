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
# Usage: hack/bench-guard.sh [--record | --compare FILE]
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
if [[ ${1:-} == --compare ]]; then
	out=${2:?hack/bench-guard.sh --compare FILE: name the run to compare}
else
	GOGC=400 go test -run '^$' -bench '^(BenchmarkEval|BenchmarkHandle|BenchmarkServeHTTP)$' -benchmem -count 6 \
		./webhook/policy/ ./webhook/admission/ | tee "$out"
fi

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
"$benchstat" -format csv "$record" "$out" 2>/dev/null | awk -F, -v pct="$threshold" '
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
			print "bench-guard: FAIL: a regression against docs/bench/webhook.txt; make the change cheaper, or record the new figures (hack/bench-guard.sh --record) in the commit that costs them, saying why"
			exit 1
		}
		print "bench-guard: ok against docs/bench/webhook.txt"
	}'
