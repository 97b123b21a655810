#!/usr/bin/env bash
# Builds runwarden's container images as archives without a container engine
# or registry (hack/image packs static binaries onto an empty base), and
# loads them into the real node's containerd.
#
# Usage: hack/images.sh ref IMAGE             print the image reference
#        hack/images.sh build IMAGE...        build archives (only when inputs changed)
#        hack/images.sh archive IMAGE         print the archive path (builds it if needed)
#        hack/images.sh load IMAGE... --address SOCK   import into containerd
#        hack/images.sh release-archive IMAGE ARCH VERSION
#                                             build IMAGE for linux/ARCH at VERSION
#                                             (hack/release.sh); print its archive path
#
# Images: pause (the pod sandbox), runner (busybox shell + OpenTofu),
# webhook, postrender and dispatcher (runwarden's own static binaries, non-root).
# Archives are in `docker save` format: `kind load image-archive` and
# `docker load` take them too. Each image's tag is a hash of its inputs, so
# an archive is rebuilt only when an input changes. Archives are kept in
# $RUNWARDEN_IMAGES_DIR (default: the images folder beside the pinned tools).
set -euo pipefail
shopt -s inherit_errexit

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
tools_dir=$("$root/hack/tools.sh" path kubernetes)
tools_dir=$(dirname "$tools_dir")
images_dir=${RUNWARDEN_IMAGES_DIR:-$tools_dir/images}
busybox=${RUNWARDEN_BUSYBOX:-/bin/busybox}
all_images=(pause runner webhook postrender dispatcher)

# inputs prints what an image is made of; its hash is the image tag.
inputs() {
	case $1 in
	pause)
		go version
		cat "$root/hack/pause/main.go" "$root"/hack/image/*.go
		;;
	runner)
		local tofu
		tofu=$("$root/hack/tools.sh" path opentofu)
		echo "opentofu $tofu"
		if [[ ! -x $busybox ]] || ! file_is_static "$busybox"; then
			echo "hack/images.sh: the runner image needs a static busybox at $busybox (Debian package busybox-static)" >&2
			return 1
		fi
		sha256sum "$busybox"
		cat "$root"/hack/image/*.go
		declare -f recipe
		;;
	webhook | postrender | dispatcher)
		go version
		# Test files are never built into a binary: editing one rebuilds no image.
		(cd "$root" && git ls-files -co --exclude-standard -- '*.go' ':!:*_test.go' go.mod go.sum 'policies/*.rego' | sort | xargs sha256sum)
		cat "$root"/hack/image/*.go
		declare -f recipe
		;;
	*)
		echo "hack/images.sh: unknown image \"$1\"; known images: ${all_images[*]}" >&2
		return 2
		;;
	esac
}

tag() {
	local h tofu
	h=$(inputs "$1" | sha256sum)
	case $1 in
	runner)
		tofu=$("$root/hack/tools.sh" path opentofu)
		tofu=$(basename "$tofu")
		echo "tofu-${tofu#opentofu-}-${h:0:12}"
		;;
	*) echo "${h:0:12}" ;;
	esac
}

# A failed command inside an argument does not stop the script, even with
# errexit: every $(...) below is a plain assignment of its own.
ref() {
	local t
	t=$(tag "$1")
	echo "localhost/runwarden/$1:$t"
}

archive_path() {
	local t
	t=$(tag "$1")
	echo "$images_dir/$1-$t.tar"
}

# recipe builds image $1 into archive $2, for this machine's architecture or
# for GOARCH $3, with version $4 (default: the image's tag) in its programs
# and labels.
recipe() {
	local image=$1 out=$2 arch=${3:-$(go env GOARCH)} version=${4:-} work r t tofu bb
	local applets=() labels=()
	t=$(tag "$image")
	r="localhost/runwarden/$image:$t"
	if [[ -n $version ]]; then
		r="localhost/runwarden/$image:$version"
		labels=(--label "org.opencontainers.image.version=$version")
	fi
	version=${version:-$t}
	work=$(mktemp -d)
	# shellcheck disable=SC2064 # expand now: $work is local
	trap "rm -rf '$work'; trap - RETURN" RETURN
	case $image in
	pause)
		(cd "$root" && GOARCH=$arch CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "-s -w" -o "$work/pause" ./hack/pause)
		(cd "$root" && go run ./hack/image --ref "$r" --out "$out" --arch "$arch" "${labels[@]}" \
			--file "$work/pause=/pause" --entrypoint /pause --uid 65535 --user pause \
			--label org.opencontainers.image.title=runwarden-pause)
		;;
	runner)
		if [[ ! -x $busybox ]] || ! file_is_static "$busybox"; then
			echo "hack/images.sh: the runner image needs a static busybox at $busybox (Debian package busybox-static)" >&2
			return 1
		fi
		bb=$busybox
		if [[ $arch == "$(go env GOARCH)" ]]; then
			"$root/hack/tools.sh" opentofu
			tofu=$("$root/hack/tools.sh" path opentofu)
		else
			# Another architecture's OpenTofu and busybox (the same Debian
			# version as $busybox, which lists the applets).
			"$root/hack/tools.sh" "opentofu-linux-$arch" "busybox-linux-$arch"
			tofu=$("$root/hack/tools.sh" path "opentofu-linux-$arch")
			bb=$("$root/hack/tools.sh" path "busybox-linux-$arch")/busybox
			applets=(--applets-from "$busybox")
		fi
		(cd "$root" && go run ./hack/image --ref "$r" --out "$out" --arch "$arch" "${labels[@]}" \
			--busybox "$bb" "${applets[@]}" \
			--file "$tofu/tofu=/usr/local/bin/tofu" \
			--uid 65532 --user runner --workdir /home/runner --cmd /bin/sh \
			--env HOME=/home/runner \
			--label org.opencontainers.image.title=runwarden-runner)
		;;
	webhook | postrender | dispatcher)
		# The libraries it shares with the tools, compiled once for all (a
		# build beside the tools' waits for them).
		if [[ $arch == "$(go env GOARCH)" ]]; then
			"$root/hack/tools.sh" shared-libraries
		fi
		(cd "$root" && GOARCH=$arch CGO_ENABLED=0 go build -trimpath -buildvcs=false -ldflags "-s -w -X github.com/runwarden/runwarden/internal/version.Version=$version" \
			-o "$work/runwarden-$image" "./$image")
		(cd "$root" && go run ./hack/image --ref "$r" --out "$out" --arch "$arch" "${labels[@]}" \
			--file "$work/runwarden-$image=/usr/local/bin/runwarden-$image" \
			--entrypoint "/usr/local/bin/runwarden-$image" --uid 65532 --user runwarden \
			--label "org.opencontainers.image.title=runwarden-$image" \
			--label "org.opencontainers.image.source=https://github.com/runwarden/runwarden")
		;;
	esac
}

file_is_static() { ! ldd "$1" >/dev/null 2>&1; }

# build_archive OUT NAME IMAGE [ARCH VERSION] builds IMAGE (as recipe does)
# into archive OUT unless it is there, one build of NAME at a time (two runs
# would write one archive), and removes the older archives OUT replaces
# (NAME-*.tar beside it).
build_archive() {
	local out=$1 name=$2 image=$3 arch=${4:-} version=${5:-} dir
	[[ -f $out ]] && return 0
	dir=$(dirname "$out")
	mkdir -p "$dir"
	exec {lock}>"$dir/.$name.lock"
	flock "$lock"
	if [[ ! -f $out ]]; then
		local start=$SECONDS
		echo "images: building $name${version:+ $version}" >&2
		recipe "$image" "$out.tmp" "$arch" "$version" >/dev/null
		mv "$out.tmp" "$out"
		find "$dir" -maxdepth 1 -name "$name-*.tar" ! -name "$(basename "$out")" -delete
		echo "images: built $name in $((SECONDS - start))s ($out)" >&2
	fi
	exec {lock}>&-
}

build() {
	build_archive "$(archive_path "$1")" "$1" "$1"
}

# release_archive builds image $1 for GOARCH $2 at version $3 (once for the
# same inputs) and prints its archive's path. hack/release.sh pushes these.
release_archive() {
	local image=$1 arch=$2 version=$3 h out
	h=$({
		inputs "$image"
		echo "release $arch $version"
	} | sha256sum)
	out=$images_dir/release/$image-$arch-${h:0:12}.tar
	build_archive "$out" "$image-$arch" "$image" "$arch" "$version"
	echo "$out"
}

load() {
	local address="" images=()
	while [[ $# -gt 0 ]]; do
		case $1 in
		--address) address=${2:?--address needs a socket}; shift 2 ;;
		*) images+=("$1"); shift ;;
		esac
	done
	[[ -n $address ]] || { echo "hack/images.sh load: --address SOCK is required" >&2; return 2; }
	local image r archive
	for image in "${images[@]}"; do
		build "$image"
		r=$(ref "$image")
		archive=$(archive_path "$image")
		if ctr --address "$address" --namespace k8s.io --connect-timeout 5s --timeout 300s images list -q 2>/dev/null | grep -qxF "$r"; then
			continue
		fi
		ctr --address "$address" --namespace k8s.io --connect-timeout 5s --timeout 300s images import --snapshotter native "$archive" >/dev/null
		echo "images: loaded $r" >&2
	done
}

cmd=${1:-}
shift || true
case $cmd in
ref) ref "${1:?usage: hack/images.sh ref IMAGE}" ;;
archive)
	build "${1:?usage: hack/images.sh archive IMAGE}"
	archive_path "$1"
	;;
build)
	[[ $# -gt 0 ]] || set -- "${all_images[@]}"
	for i in "$@"; do build "$i"; done
	;;
load) load "$@" ;;
release-archive) release_archive "${1:?usage: hack/images.sh release-archive IMAGE ARCH VERSION}" "${2:?ARCH}" "${3:?VERSION}" ;;
*)
	sed -n '2,20p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac
