#!/usr/bin/env bash
# Builds the pinned tools runwarden needs from the Go module proxy into a cache
# folder outside the checkout, keyed by tool and version, so a fresh clone (and
# CI) reuses them. A tool is rebuilt only when its folder is missing; two runs
# that need the same missing tool build it once (the second waits).
#
# Usage: hack/tools.sh [all|path|TOOL...]
#   all        build every tool (default)
#   path TOOL  print the folder that holds TOOL's binaries (builds nothing)
#   TOOL...    build only these tools; "node-packages" installs the real
#              node's Debian packages (containerd, runc, CNI plugins, ...)
#              when missing, as root; "shared-libraries" compiles into Go's
#              build cache the packages runwarden, the Kubernetes tools and
#              OpenTofu share (done first whenever one of those builds)
#
# The cache folder is $RUNWARDEN_TOOLS_DIR, default
# ${XDG_CACHE_HOME:-$HOME/.cache}/runwarden/tools. Missing tools are built
# $RUNWARDEN_TOOLS_JOBS at a time (default 2: one build's single-threaded
# phases, module loading and linking, leave a core to the other); list the
# slowest first.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools_dir=${RUNWARDEN_TOOLS_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/runwarden/tools}

# The pinned versions. Keep docs/development.md in step.
KUBERNETES_VERSION=v1.37.2
ETCD_VERSION=v3.6.5
# kwok and both Helms are built in hack/tools/kubernetes with the Kubernetes
# libraries of KUBERNETES_VERSION (see its go.mod); their folders say so.
KWOK_VERSION=v0.8.0
HELM3_VERSION=v3.22.0
HELM4_VERSION=v4.3.1
KUSTOMIZE_VERSION=v5.8.2
OPA_VERSION=v1.22.2
GOLANGCI_LINT_VERSION=v2.15.0
BENCHSTAT_VERSION=v0.0.0-20260908200009-22c9c6c9d4da
CONTROLLER_GEN_VERSION=v0.23.0
# OpenTofu's wrapper module takes the libraries it shares with the others
# at their versions (hack/verify.sh): its folders name KUBERNETES_VERSION too.
OPENTOFU_VERSION=v1.12.6
COREDNS_VERSION=v1.15.0 # also in hack/tools/coredns/go.mod
VAULT_VERSION=v1.19.0 # also in hack/tools/vault/go.mod
KUEUE_VERSION=v0.15.0
# Prometheus v3.x: its Go module numbers v3.N.M as v0.3NN.M.
PROMETHEUS_VERSION=v0.316.0
REGISTRY_VERSION=v3.1.2
COSIGN_VERSION=v2.6.5 # also in hack/tools/cosign/go.mod
SYFT_VERSION=v1.57.1
# Also in hack/tools/gitea/go.mod (hack/verify.sh checks the two agree).
GITEA_VERSION=v1.26.0
# Only for make bench-release, beside the release's own image builder.
KO_VERSION=v0.19.1

# The slowest first (by their cold builds on a 2-core machine): with two
# builds at a time the short ones fill in beside the long ones, and none of
# the long ones starts last. The arm64 OpenTofu is the release test's runner
# image for linux/arm64.
all_tools=(kubernetes vault opentofu kueue syft gitea promtool opentofu-linux-arm64 golangci-lint kwok cosign helm4 opa coredns registry kustomize controller-gen etcd helm3 benchstat)

# folder prints the cache folder of one tool.
folder() {
	case $1 in
	kubernetes) echo "$tools_dir/kubernetes-$KUBERNETES_VERSION" ;;
	etcd) echo "$tools_dir/etcd-$ETCD_VERSION" ;;
	kwok) echo "$tools_dir/kwok-$KWOK_VERSION-k8s-$KUBERNETES_VERSION" ;;
	helm3) echo "$tools_dir/helm-$HELM3_VERSION-k8s-$KUBERNETES_VERSION" ;;
	helm4) echo "$tools_dir/helm-$HELM4_VERSION-k8s-$KUBERNETES_VERSION" ;;
	kustomize) echo "$tools_dir/kustomize-$KUSTOMIZE_VERSION" ;;
	opa) echo "$tools_dir/opa-$OPA_VERSION" ;;
	golangci-lint) echo "$tools_dir/golangci-lint-$GOLANGCI_LINT_VERSION" ;;
	benchstat) echo "$tools_dir/benchstat-$BENCHSTAT_VERSION" ;;
	controller-gen) echo "$tools_dir/controller-gen-$CONTROLLER_GEN_VERSION" ;;
	opentofu) echo "$tools_dir/opentofu-$OPENTOFU_VERSION-k8s-$KUBERNETES_VERSION" ;;
	coredns) echo "$tools_dir/coredns-$COREDNS_VERSION-node" ;;
	vault) echo "$tools_dir/vault-$VAULT_VERSION-minimal-kubeauth" ;;
	kueue) echo "$tools_dir/kueue-$KUEUE_VERSION" ;;
	promtool) echo "$tools_dir/promtool-$PROMETHEUS_VERSION-nosd" ;;
	registry) echo "$tools_dir/registry-$REGISTRY_VERSION" ;;
	cosign) echo "$tools_dir/cosign-$COSIGN_VERSION-k8s-$KUBERNETES_VERSION" ;;
	syft) echo "$tools_dir/syft-$SYFT_VERSION" ;;
	ko) echo "$tools_dir/ko-$KO_VERSION" ;;
	gitea) echo "$tools_dir/gitea-$GITEA_VERSION" ;;
	# Not a tool: a record that Go's build cache holds the packages below,
	# for the go.sum files they were compiled from.
	shared-libraries)
		local sum
		sum=$(cat "$root/go.sum" "$root"/hack/tools/{kubernetes,opentofu}/go.sum | sha256sum)
		echo "$tools_dir/shared-libraries-${sum:0:16}"
		;;
	# Another architecture's programs, for the release's multi-platform images.
	opentofu-linux-*) echo "$tools_dir/opentofu-$OPENTOFU_VERSION-k8s-$KUBERNETES_VERSION-${1#opentofu-}" ;;
	busybox-linux-*)
		local v
		v=$(host_busybox_version) || return 1
		echo "$tools_dir/busybox-${v//[:~]/_}-${1#busybox-}"
		;;
	*)
		echo "hack/tools.sh: unknown tool \"$1\"; known tools: ${all_tools[*]}" >&2
		return 2
		;;
	esac
}

# install_mod builds Go packages at a pinned version with `go install`.
install_mod() {
	local out=$1
	shift
	GOBIN=$out CGO_ENABLED=0 go install -trimpath -ldflags "-s -w" "$@"
}

# build_wrapper builds packages of a wrapper module under hack/tools/.
build_wrapper() {
	local dir=$1 out=$2 ldflags=$3
	shift 3
	(cd "$root/hack/tools/$dir" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w $ldflags" -o "$out/" "$@")
}

# recipe builds one tool into the folder $2.
recipe() {
	local out=$2
	case $1 in
	kubernetes)
		local v=$KUBERNETES_VERSION minor=${KUBERNETES_VERSION#v1.}
		minor=${minor%%.*}
		build_wrapper kubernetes "$out" \
			"-X k8s.io/component-base/version.gitVersion=$v -X k8s.io/component-base/version.gitMajor=1 -X k8s.io/component-base/version.gitMinor=$minor -X k8s.io/component-base/version.gitTreeState=clean" \
			k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
			k8s.io/kubernetes/cmd/kube-scheduler k8s.io/kubernetes/cmd/kubectl \
			k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy
		;;
	etcd)
		# The package's folder is named "v3"; name the binary what it is.
		(cd "$root/hack/tools/etcd" && CGO_ENABLED=0 go build -trimpath -ldflags "-s -w" -o "$out/etcd" go.etcd.io/etcd/server/v3)
		;;
	# kwok and the Helms with the Kubernetes libraries the cluster's
	# binaries and runwarden compile (hack/tools/kubernetes).
	kwok)
		build_wrapper kubernetes "$out" "" sigs.k8s.io/kwok/cmd/kwok sigs.k8s.io/kwok/cmd/kwokctl
		;;
	helm3)
		build_wrapper kubernetes "$out" "" helm.sh/helm/v3/cmd/helm
		;;
	helm4)
		build_wrapper kubernetes "$out" "" helm.sh/helm/v4/cmd/helm
		;;
	kustomize)
		install_mod "$out" "sigs.k8s.io/kustomize/kustomize/v5@$KUSTOMIZE_VERSION"
		;;
	opa)
		install_mod "$out" "github.com/open-policy-agent/opa@$OPA_VERSION"
		;;
	golangci-lint)
		install_mod "$out" "github.com/golangci/golangci-lint/v2/cmd/golangci-lint@$GOLANGCI_LINT_VERSION"
		;;
	benchstat)
		install_mod "$out" "golang.org/x/perf/cmd/benchstat@$BENCHSTAT_VERSION"
		;;
	controller-gen)
		install_mod "$out" "sigs.k8s.io/controller-tools/cmd/controller-gen@$CONTROLLER_GEN_VERSION"
		;;
	opentofu)
		# Static, so it runs in the runner image with nothing but busybox beside it.
		build_wrapper opentofu "$out" "-X github.com/opentofu/opentofu/version.dev=no" github.com/opentofu/opentofu/cmd/tofu
		;;
	vault)
		# Vault built with its own "minimal" tag (its Makefile's
		# BUILD_MINIMAL): the core secret engines (kv and transit among
		# them) and auth methods (token, userpass, approle, cert, jwt),
		# without the cloud plugins and storage backends, a quarter fewer
		# packages to compile. The Kubernetes auth method the e2e suite
		# uses is not among them: it is built beside it as the external
		# plugin Vault publishes it as, at the version Vault's own go.mod
		# builds in, into plugins/ (a dev server's -dev-plugin-dir). The
		# plugin's packages are the server's, compiled once.
		build_wrapper vault "$out" "" -tags minimal github.com/hashicorp/vault
		build_wrapper vault "$out/plugins" "" github.com/hashicorp/vault-plugin-auth-kubernetes/cmd/vault-plugin-auth-kubernetes
		;;
	coredns)
		# With the plugins the real node's Corefile uses (hack/tools/coredns).
		build_wrapper coredns "$out" "" .
		;;
	kueue)
		# The controller, and its CRDs beside it (hack/kueue.sh applies them):
		# the same module version, so the two always match.
		install_mod "$out" "sigs.k8s.io/kueue/cmd/kueue@$KUEUE_VERSION"
		local mod
		mod=$(go mod download -json "sigs.k8s.io/kueue@$KUEUE_VERSION" | sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
		if [[ -z $mod || ! -d $mod/config/components/crd/bases ]]; then
			echo "kueue: no CRDs found in the module folder \"$mod\"" >&2
			return 1
		fi
		mkdir -p "$out/crds"
		cp "$mod"/config/components/crd/bases/*.yaml "$out/crds/"
		# The module cache is read-only; the copies need not be.
		chmod u+w "$out"/crds/*.yaml
		;;
	promtool)
		# Without Prometheus's service discovery plugins (its own build tag):
		# the rule checks and tests need none, and the cloud SDKs they
		# import are most of what a full build compiles.
		install_mod "$out" -tags remove_all_sd "github.com/prometheus/prometheus/cmd/promtool@$PROMETHEUS_VERSION"
		;;
	registry)
		# The CNCF distribution registry (hack/registry.sh runs it).
		install_mod "$out" "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION"
		;;
	cosign)
		# With the shared libraries' versions (hack/tools/cosign), stamped
		# with its version as its own release build does.
		build_wrapper cosign "$out" "-X sigs.k8s.io/release-utils/version.gitVersion=$COSIGN_VERSION" github.com/sigstore/cosign/v2/cmd/cosign
		;;
	syft)
		install_mod "$out" "github.com/anchore/syft/cmd/syft@$SYFT_VERSION"
		;;
	ko)
		install_mod "$out" "github.com/google/ko@$KO_VERSION"
		;;
	gitea)
		# With SQLite, which is cgo (mattn/go-sqlite3; without cgo it builds
		# a stub that fails at start), so gcc from the distribution. Without
		# Gitea's bindata tag it reads its templates, locales and public
		# files from STATIC_ROOT_PATH: the module's, copied beside the binary
		# (e2e/harness/gitea.go points there), so the tool folder stands alone.
		if ! command -v gcc >/dev/null; then
			echo "gitea: its SQLite driver is cgo and needs a C compiler: install Debian's gcc" >&2
			return 1
		fi
		(cd "$root/hack/tools/gitea" &&
			CGO_ENABLED=1 go build -trimpath -tags "sqlite sqlite_unlock_notify" \
				-ldflags "-s -w -X main.Version=${GITEA_VERSION#v} -X 'main.Tags=sqlite sqlite_unlock_notify'" \
				-o "$out/gitea" code.gitea.io/gitea)
		local mod
		mod=$(cd "$root/hack/tools/gitea" && go list -m -f '{{.Dir}}' code.gitea.io/gitea)
		if [[ -z $mod || ! -d $mod/options/locale ]]; then
			echo "gitea: no locales found in the module folder \"$mod\"" >&2
			return 1
		fi
		mkdir -p "$out/static"
		cp -r "$mod/templates" "$mod/options" "$mod/public" "$out/static/"
		chmod -R u+w "$out/static"
		;;
	shared-libraries)
		# The packages that two or more of runwarden's programs, the
		# programs of hack/tools/kubernetes (the cluster's binaries, kwok,
		# the Helms) and OpenTofu compile, at one version in all of them
		# (hack/verify.sh), compiled into Go's build cache before any of
		# those builds starts: builds side by side (two tools at a time,
		# runwarden's images beside them) then find them compiled instead
		# of each compiling them at the same time. The lists are kept
		# beside the record.
		(cd "$root" && CGO_ENABLED=0 go list -deps ./dispatcher ./webhook ./postrender | sort -u) >"$out/runwarden.txt"
		local dir
		for dir in kubernetes opentofu; do
			# shellcheck disable=SC2046 # one argument per program
			(cd "$root/hack/tools/$dir" && CGO_ENABLED=0 go list -deps $(programs "$dir") | sort -u) >"$out/$dir.txt"
		done
		# What the Kubernetes programs share with either of the others is
		# compiled in their module, what runwarden and OpenTofu alone share
		# in OpenTofu's.
		sort -u <(comm -12 "$out/kubernetes.txt" "$out/runwarden.txt") <(comm -12 "$out/kubernetes.txt" "$out/opentofu.txt") >"$out/in-kubernetes.txt"
		comm -12 "$out/runwarden.txt" "$out/opentofu.txt" | comm -23 - "$out/in-kubernetes.txt" >"$out/in-opentofu.txt"
		rm "$out"/{runwarden,kubernetes,opentofu}.txt
		if [[ ! -s $out/in-kubernetes.txt ]]; then
			echo "shared-libraries: the Kubernetes programs share no package with runwarden or OpenTofu" >&2
			return 1
		fi
		# shellcheck disable=SC2046 # one argument per package
		(cd "$root/hack/tools/kubernetes" && CGO_ENABLED=0 go build -trimpath $(cat "$out/in-kubernetes.txt"))
		if [[ -s $out/in-opentofu.txt ]]; then
			# shellcheck disable=SC2046 # one argument per package
			(cd "$root/hack/tools/opentofu" && CGO_ENABLED=0 go build -trimpath $(cat "$out/in-opentofu.txt"))
		fi
		;;
	opentofu-linux-*)
		GOOS=linux GOARCH=${1#opentofu-linux-} build_wrapper opentofu "$out" "-X github.com/opentofu/opentofu/version.dev=no" github.com/opentofu/opentofu/cmd/tofu
		;;
	busybox-linux-*)
		# Debian's busybox-static for another architecture, the very version
		# the host has (so the host's busybox lists its applets), fetched
		# and checked by apt against Debian's signed package lists, in a
		# folder of its own: the host's apt state is left alone.
		local arch=${1#busybox-linux-} v apt
		v=$(host_busybox_version)
		apt=$out/.apt
		mkdir -p "$apt"/state/lists/partial "$apt"/cache/archives/partial
		local opts=(-o "Dir::State=$apt/state" -o "Dir::Cache=$apt/cache" -o "APT::Architecture=$arch"
			-o "APT::Architectures::=$arch" -o Debug::NoLocking=1 -o APT::Sandbox::User=root)
		apt-get "${opts[@]}" update
		(cd "$apt" && apt-get "${opts[@]}" download "busybox-static:$arch=$v")
		dpkg-deb -x "$apt"/busybox-static_*.deb "$apt/root"
		cp "$apt/root/bin/busybox" "$out/busybox"
		rm -rf "$apt"
		;;
	esac
}

# host_busybox_version prints the version of the host's Debian package
# busybox-static.
host_busybox_version() {
	local v
	v=$(dpkg-query -W -f '${Version}' busybox-static 2>/dev/null) || true
	if [[ -z $v ]]; then
		echo "hack/tools.sh: another architecture's busybox is fetched at the host's version of Debian's busybox-static, which is not installed (hack/tools.sh node-packages)" >&2
		return 1
	fi
	echo "$v"
}

# Debian packages the real node needs, and a file each one installs.
node_packages=(
	containerd:/usr/bin/containerd
	runc:/usr/sbin/runc
	containernetworking-plugins:/usr/lib/cni/bridge
	busybox-static:/bin/busybox
	iptables:/usr/sbin/iptables
	conntrack:/usr/sbin/conntrack
	iproute2:/usr/sbin/ip
	procps:/usr/bin/pgrep
)

# ensure_node_packages installs the real node's Debian packages that are
# missing (as root, with apt-get).
ensure_node_packages() {
	local missing=() p
	for p in "${node_packages[@]}"; do
		# The file alone can mislead: Debian's dynamic busybox also installs /bin/busybox.
		if [[ ! -e ${p#*:} ]] || { command -v dpkg-query >/dev/null &&
			[[ $(dpkg-query -W -f '${Status}' "${p%%:*}" 2>/dev/null) != "install ok installed" ]]; }; then
			missing+=("${p%%:*}")
		fi
	done
	[[ ${#missing[@]} -eq 0 ]] && return 0
	if [[ $(id -u) -ne 0 ]]; then
		echo "tools: the real node needs these Debian packages: ${missing[*]}; install them as root" >&2
		return 1
	fi
	echo "tools: installing Debian packages: ${missing[*]}" >&2
	local start=$SECONDS log
	log=$(mktemp)
	# A fresh machine may be running its own apt (daily updates) at boot:
	# wait for its lock rather than fail at once.
	if ! { apt-get -o DPkg::Lock::Timeout=300 update &&
		DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=300 install -y --no-install-recommends "${missing[@]}"; } >"$log" 2>&1; then
		echo "tools: FAILED to install ${missing[*]}; the last lines of apt-get's output:" >&2
		tail -n 20 "$log" >&2
		rm -f "$log"
		return 1
	fi
	rm -f "$log"
	echo "tools: installed ${missing[*]} in $((SECONDS - start))s" >&2
}

# programs prints the packages the wrapper module hack/tools/$1 builds, as
# its tools.go records them (one import per line, or a single import).
programs() {
	sed -n 's/^\(import\)\{0,1\}[[:space:]]*_ "\(.*\)"$/\2/p' "$root/hack/tools/$1/tools.go"
}

# outputs prints the files a tool's folder holds when built, relative to it.
outputs() {
	case $1 in
	kubernetes) echo kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy ;;
	kwok) echo kwok kwokctl ;;
	helm3 | helm4) echo helm ;;
	opentofu | opentofu-linux-*) echo tofu ;;
	vault) echo vault plugins/vault-plugin-auth-kubernetes ;;
	kueue) echo kueue crds ;;
	gitea) echo gitea static/options/locale static/templates static/public ;;
	shared-libraries) echo in-kubernetes.txt ;;
	busybox-linux-*) echo busybox ;;
	*) echo "$1" ;;
	esac
}

# missing_outputs prints the files of tool $1 missing from folder $2, or
# present but not executable where a program is expected.
missing_outputs() {
	local f missing=()
	for f in $(outputs "$1"); do
		if [[ ! -e $2/$f ]]; then
			missing+=("$f")
		elif [[ -f $2/$f && $f != *.txt && ! -x $2/$f ]]; then
			missing+=("$f (not executable)")
		fi
	done
	echo "${missing[*]}"
}

# ensure builds one tool unless its folder already exists. It builds into a
# temporary folder and renames it at the end, so an interrupted build never
# leaves a half-filled folder that looks complete.
ensure() {
	local name=$1 out lock
	if [[ $name == node-packages ]]; then
		ensure_node_packages
		return
	fi
	out=$(folder "$name") || return 2
	[[ -d $out ]] && return 0
	# One build of a tool at a time on the machine: a second run waits for the
	# first and then finds the folder.
	mkdir -p "$tools_dir"
	exec {lock}>"$out.lock"
	flock "$lock"
	if [[ -d $out ]]; then
		exec {lock}>&-
		return 0
	fi
	local tmp=$out.tmp.$$ log
	log=$(mktemp)
	# Under the lock no build of this tool runs: any temporary folder is
	# left from one that was killed.
	rm -rf "$out".tmp.*
	mkdir -p "$tmp"
	echo "tools: building $name into $out" >&2
	local start=$SECONDS
	# The recipe runs in a process of its own: called in a condition here
	# (or where ensure itself is), bash would ignore set -e in it, and a
	# failed step followed by one that succeeds would count as built. Then
	# every file the tool is made of must be there.
	local missing=""
	if ! "${BASH_SOURCE[0]}" recipe "$name" "$tmp" >"$log" 2>&1 || ! missing=$(missing_outputs "$name" "$tmp") || [[ -n $missing ]]; then
		echo "tools: FAILED to build $name after $((SECONDS - start))s; the last lines of its output:" >&2
		tail -n 30 "$log" >&2
		if [[ -n $missing ]]; then
			echo "tools: $name's build left out: $missing" >&2
		fi
		rm -rf "$tmp" "$log"
		exec {lock}>&-
		return 1
	fi
	rm -f "$log"
	mv "$tmp" "$out"
	exec {lock}>&-
	echo "tools: built $name in $((SECONDS - start))s" >&2
}

# ensure_all ensures every tool named, $RUNWARDEN_TOOLS_JOBS builds at a
# time, in the order given; it fails when any of them failed (after the
# others finished).
ensure_all() {
	local jobs=${RUNWARDEN_TOOLS_JOBS:-2} t rc failed=0
	if [[ ! $jobs =~ ^[1-9][0-9]*$ ]]; then
		echo "hack/tools.sh: RUNWARDEN_TOOLS_JOBS is \"$jobs\"; want a number of builds at a time, 1 or more" >&2
		return 2
	fi
	if [[ $jobs -eq 1 || $# -le 1 ]]; then
		for t in "$@"; do ensure "$t"; done
		return
	fi
	# Every name checked before any build starts.
	local todo=() dir
	for t in "$@"; do
		if [[ $t != node-packages ]]; then
			dir=$(folder "$t") || return 2
			# Tools already built need no slot.
			[[ -d $dir ]] && continue
		fi
		todo+=("$t")
	done
	# The shared libraries first, on every core, when a build that shares
	# them is to run (see shared-libraries in recipe).
	for t in "${todo[@]}"; do
		case $t in
		kubernetes | kwok | helm3 | helm4 | opentofu)
			ensure shared-libraries || return 1
			break
			;;
		esac
	done
	for t in "${todo[@]}"; do
		while [[ $(jobs -rp | wc -l) -ge $jobs ]]; do
			wait -n && rc=0 || rc=$?
			[[ $rc -eq 0 ]] || failed=1
		done
		ensure "$t" &
	done
	# wait -n answers 127 once no job is left to report.
	while :; do
		wait -n && rc=0 || rc=$?
		[[ $rc -eq 127 ]] && break
		[[ $rc -eq 0 ]] || failed=1
	done
	return "$failed"
}

main() {
	local cmd=${1:-all}
	case $cmd in
	path)
		folder "${2:?usage: hack/tools.sh path TOOL}"
		;;
	programs)
		# Internal (hack/verify.sh): what hack/tools/$2 builds.
		programs "${2:?usage: hack/tools.sh programs WRAPPER}"
		;;
	recipe)
		# Internal (ensure): build tool $2 into the folder $3.
		recipe "${2:?}" "${3:?}"
		;;
	all)
		ensure_all "${all_tools[@]}"
		if [[ $(id -u) -eq 0 ]]; then
			ensure_node_packages
		else
			echo "tools: not root, so the real node's Debian packages were not checked" >&2
		fi
		;;
	-h | --help | help)
		sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
		;;
	*)
		ensure_all "$@"
		;;
	esac
}

main "$@"
