#!/usr/bin/env bash
# make bench-release: the release's image step beside ko, the tool a user
# would reach for to build Go images without a container engine. Each run
# builds the dispatcher for linux/amd64 and linux/arm64 and pushes it as one
# index to the local registry (hack/registry.sh): runwarden's builder
# (hack/images.sh release-archive, then hack/release push-index) and
# `ko build --platform`, on the same base (an image of hack/image's, as an
# index in the registry), with Go's build cache warm for both and nothing
# else cached. It prints each run in the format of `go test -bench`, for
# benchstat, and fails if a tool gives two digests for the same input.
#
# Usage: hack/bench-release.sh [RUNS] (default 5)
set -euo pipefail
shopt -s inherit_errexit

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
runs=${1:-5}

hack/tools.sh registry ko benchstat
hack/registry.sh up
ca=$(hack/registry.sh ca)
reg=$(hack/registry.sh address)/bench
ko_bin=$(hack/tools.sh path ko)/ko
version=bench-$(git rev-parse --short HEAD)
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

go build -o "$work/release" ./hack/release
go build -o "$work/image" ./hack/image
# The base: /etc/passwd and /etc/group for user 65532 and the usual folders,
# for both platforms, as every runwarden image has.
for arch in amd64 arm64; do
	"$work/image" --ref "localhost/bench/base:$arch" --out "$work/base-$arch.tar" --arch "$arch" --uid 65532 --user runwarden >/dev/null
done
"$work/release" push-index --ref "$reg/base:v1" --ca-file "$ca" \
	--image "linux/amd64=$work/base-amd64.tar" --image "linux/arm64=$work/base-arm64.tar" >/dev/null

digest_of() { sed -n 's/.*"digest":"\(sha256:[0-9a-f]*\)".*/\1/p'; }

# own builds and pushes with runwarden's builder into a fresh image folder
# and prints the index digest.
own() {
	local dir=$work/img-$1 args=() arch a
	for arch in amd64 arm64; do
		a=$(RUNWARDEN_IMAGES_DIR=$dir hack/images.sh release-archive dispatcher "$arch" "$version" 2>/dev/null)
		args+=(--image "linux/$arch=$a")
	done
	"$work/release" push-index --ref "$reg/own:$version" --ca-file "$ca" "${args[@]}" | digest_of
}

# ko_build builds and pushes with ko and prints the index digest.
ko_build() {
	local out
	out=$(SSL_CERT_FILE=$ca KO_DOCKER_REPO=$reg/ko KO_DEFAULTBASEIMAGE=$reg/base:v1 KOCACHE="" \
		"$ko_bin" build --bare --platform linux/amd64,linux/arm64 --sbom none --tags "$version" ./dispatcher 2>"$work/ko.log") ||
		{ cat "$work/ko.log" >&2; return 1; }
	echo "${out##*@}"
}

# A first run of each warms Go's build cache for its flags.
own warm >/dev/null
ko_build >/dev/null

out=$root/bin/bench-release.txt
mkdir -p "$root/bin"
{
	echo "goos: linux"
	echo "goarch: $(go env GOARCH)"
	echo "pkg: github.com/runwarden/runwarden/hack/release"
} >"$out"
declare -A first
for i in $(seq 1 "$runs"); do
	for impl in runwarden ko; do
		start=$EPOCHREALTIME
		if [[ $impl == runwarden ]]; then d=$(own "$i"); else d=$(ko_build); fi
		end=$EPOCHREALTIME
		ns=$(awk -v a="$start" -v b="$end" 'BEGIN { printf "%.0f", (b - a) * 1e9 }')
		echo "BenchmarkReleaseImages/impl=$impl 1 $ns ns/op" | tee -a "$out"
		if [[ -z ${first[$impl]:-} ]]; then
			first[$impl]=$d
		elif [[ ${first[$impl]} != "$d" ]]; then
			echo "bench-release: $impl gave $d, and ${first[$impl]} before, for the same input" >&2
			exit 1
		fi
	done
done
echo "same digest on every run: runwarden ${first[runwarden]}, ko ${first[ko]}"
"$(hack/tools.sh path benchstat)/benchstat" -col /impl "$out"
