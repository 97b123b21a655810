# shellcheck shell=bash
# Host processes the local cluster's scripts start (hack/node.sh,
# hack/kueue.sh, hack/registry.sh), each tracked by a pid file holding
# "PID START": its PID and when it started, so a later process that reuses
# the PID is never taken for it. Sourced, not run.

# started prints when process $1 started (clock ticks after boot).
started() {
	local stat
	stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
	# Fields after the command name, which may hold spaces: state is 1st, start time 20th.
	stat=${stat##*) }
	awk '{print $20}' <<<"$stat"
}

# pidfile_record FILE PID writes the pid file of process PID.
pidfile_record() {
	echo "$2 $(started "$2")" >"$1"
}

# pidfile_alive FILE reports whether the process of the pid file still runs.
pidfile_alive() {
	local pid since
	[[ -f $1 ]] || return 1
	read -r pid since <"$1" || true
	[[ -n $pid && -n $since ]] || return 1
	[[ $(started "$pid") == "$since" ]]
}

# pidfile_stop FILE stops the process of the pid file (SIGTERM, SIGKILL
# after 10 s) and removes the file; it returns 1 when none was running.
pidfile_stop() {
	local pid
	if ! pidfile_alive "$1"; then
		rm -f "$1"
		return 1
	fi
	read -r pid _ <"$1"
	if kill -TERM "$pid" 2>/dev/null; then
		for _ in $(seq 1 100); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$pid" 2>/dev/null || true
	fi
	rm -f "$1"
}
