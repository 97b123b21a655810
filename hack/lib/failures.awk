# Reads the output of `go test -v` and prints, for each test that failed,
# what it logged (t.Log, t.Error, t.Fatal: the lines "    file.go:N: ..."
# and up to 4 lines each continues with), the last 30 messages of each, so a
# failure stays readable after a long, interleaved run. A namespace's dump
# (harness.Dump) is left out: it is in the full output. A panic (a -timeout
# included) is repeated with the 12 lines after it, which name the tests
# still running.
#
# Usage: awk -f hack/lib/failures.awk GO-TEST-OUTPUT
/^panic: / && panicked == "" { panicked = $0; plines = 12; next }
plines > 0 { panicked = panicked "\n" $0; plines--; next }
/^=== (RUN|NAME|CONT|PAUSE) / { cur = $3; keep = 0; next }
/^ *--- FAIL: / {
	if (!($3 in failed)) { order[++n] = $3 }
	failed[$3] = 1
	keep = 0
	next
}
/^ *--- (PASS|SKIP): / { keep = 0; next }
/^    [^ ]+\.go:[0-9]+: / {
	keep = ($0 !~ /^    [^ ]+\.go:[0-9]+: dump /)
	if (keep) {
		c = ++count[cur]
		msg[cur, c] = substr($0, 1, 400)
		more = 0
	}
	next
}
/^        / {
	if (keep && more < 4) {
		more++
		msg[cur, count[cur]] = msg[cur, count[cur]] "\n" substr($0, 1, 400)
	}
	next
}
{ keep = 0 }
END {
	if (panicked != "") { printf "\nthe run panicked:\n%s\n", panicked }
	if (n == 0) { exit }
	printf "\n%d test(s) failed; what each logged:\n", n
	for (i = 1; i <= n; i++) {
		name = order[i]
		if (count[name] == 0) { continue }
		printf "--- FAIL: %s\n", name
		first = count[name] > 30 ? count[name] - 29 : 1
		if (first > 1) { printf "    (its first %d messages left out)\n", first - 1 }
		for (c = first; c <= count[name]; c++) { print msg[name, c] }
	}
}
