#!/usr/bin/env bash
# make release: builds runwarden's images for every platform, pushes them as
# multi-platform indexes, makes an SBOM of each platform's image, signs the
# images and attests the SBOMs with cosign, packages the chart with the
# images' digests pinned and pushes it as an OCI artifact, and signs it.
#
# Usage: hack/release.sh
#
# Environment:
#   RELEASE_REGISTRY   where to push, REGISTRY/NAMESPACE (default: the local
#                      registry of hack/registry.sh, localhost:5000/runwarden;
#                      it is started if it is not running). Images go to
#                      $RELEASE_REGISTRY/{dispatcher,webhook,postrender,runner},
#                      the chart to oci://$RELEASE_REGISTRY/charts/runwarden.
#   RELEASE_VERSION    the images' tag (default: git describe --tags --always
#                      --dirty). The chart's version is the tag without its
#                      "v" when it is a SemVer release tag (v1.2.3), else
#                      Chart.yaml's version with "-dev.g<commit>".
#   RELEASE_PLATFORMS  comma-separated (default: linux/amd64,linux/arm64)
#   RELEASE_SBOM       false: no SBOMs and no SBOM attestations (default:
#                      true; make demo, which shows signing, skips them)
#   RELEASE_CA_FILE    CA certificate the registry's TLS certificate is
#                      checked against, beside the system's (default: the
#                      local registry's CA when pushing there)
#   COSIGN_KEY         signing key: a cosign key file, or a KMS URI (default:
#                      the local key $RUNWARDEN_STATE_DIR/registry/cosign.key,
#                      made on first use with an empty password; a key's
#                      password is read from COSIGN_PASSWORD)
#   RELEASE_KEYLESS    true: sign keyless instead, with Sigstore's Fulcio and
#                      Rekor and the CI's OIDC identity (default: false)
#   RELEASE_TLOG       true: record key-made signatures in Rekor too (default:
#                      false; a local registry has no transparency log)
#   RELEASE_OUT        where the release record goes (default: bin/release):
#                      release.json (every reference and digest), the same as
#                      KEY=VALUE lines in release.env, the SBOMs (sbom/, empty
#                      with RELEASE_SBOM=false), the
#                      chart package and cosign.pub (with a key)
set -euo pipefail
shopt -s inherit_errexit

case ${1:-} in
"") ;;
-h | --help | help)
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//'
	exit 0
	;;
*)
	echo "hack/release.sh: takes no arguments (settings are environment variables; --help lists them)" >&2
	exit 2
	;;
esac

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
state_dir=${RUNWARDEN_STATE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/runwarden}
local_registry=$(hack/registry.sh address)
registry=${RELEASE_REGISTRY:-$local_registry/runwarden}
registry=${registry%/}
version=${RELEASE_VERSION:-$(git describe --tags --always --dirty)}
platforms=${RELEASE_PLATFORMS:-linux/amd64,linux/arm64}
out=${RELEASE_OUT:-bin/release}
keyless=${RELEASE_KEYLESS:-false}
sbom=${RELEASE_SBOM:-true}
images=(dispatcher webhook postrender runner)

log() { printf 'release: %s\n' "$*" >&2; }
fail() {
	log "$*"
	exit 1
}

[[ $sbom == true || $sbom == false ]] || fail "RELEASE_SBOM is \"$sbom\"; want true or false"
[[ $version =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$ ]] || fail "version \"$version\" is not a valid image tag"
chart_version=$(sed -n 's/^version: *//p' charts/runwarden/Chart.yaml)
if [[ $version =~ ^v([0-9]+\.[0-9]+\.[0-9]+(-[0-9A-Za-z.-]+)?)$ ]]; then
	chart_version=${BASH_REMATCH[1]}
else
	chart_version=$chart_version-dev.g$(git rev-parse --short=12 HEAD)
	if [[ $version == *-dirty ]]; then chart_version=$chart_version.dirty; fi
fi
if [[ $version == *-dirty ]]; then
	log "the checkout has changes that are not committed: version $version (its images are not reproducible from a commit)"
fi

if [[ $sbom == true ]]; then hack/tools.sh cosign syft helm4; else hack/tools.sh cosign helm4; fi
cosign_bin=$(hack/tools.sh path cosign)/cosign
syft_bin=$(hack/tools.sh path syft)/syft
helm_bin=$(hack/tools.sh path helm4)/helm

ca_file=${RELEASE_CA_FILE:-}
if [[ $registry == "$local_registry"/* ]]; then
	hack/tools.sh registry
	hack/registry.sh up
	ca_file=${ca_file:-$(hack/registry.sh ca)}
fi
cosign_tls=()
helm_tls=()
push_tls=()
if [[ -n $ca_file ]]; then
	cosign_tls=(--registry-cacert "$ca_file")
	helm_tls=(--ca-file "$ca_file")
	push_tls=(--ca-file "$ca_file")
fi

# Signing: a key (the local one by default), or keyless.
sign_opts=(--yes)
if [[ $keyless == true ]]; then
	log "signing keyless (Fulcio certificate, Rekor transparency log)"
else
	key=${COSIGN_KEY:-}
	if [[ -z $key ]]; then
		key=$state_dir/registry/cosign.key
		if [[ ! -f $key ]]; then
			mkdir -p "$(dirname "$key")"
			(cd "$(dirname "$key")" && COSIGN_PASSWORD="" "$cosign_bin" generate-key-pair --output-key-prefix cosign >/dev/null 2>&1)
			log "made the local signing key $key (its public key: ${key%.key}.pub)"
		fi
		export COSIGN_PASSWORD=${COSIGN_PASSWORD:-}
	fi
	# A local registry has no transparency log to reach; a real release
	# with a key may upload (RELEASE_TLOG=true).
	sign_opts+=(--key "$key" "--tlog-upload=${RELEASE_TLOG:-false}")
fi

rm -rf "$out"
mkdir -p "$out/sbom"
start=$SECONDS
declare -A index_digest
json_images=""
env_images=""
IFS=, read -ra plats <<<"$platforms"
for image in "${images[@]}"; do
	args=()
	for p in "${plats[@]}"; do
		[[ $p == linux/* ]] || fail "platform $p: only linux/ARCH images are built"
		archive=$(hack/images.sh release-archive "$image" "${p#linux/}" "$version")
		args+=(--image "$p=$archive")
		[[ $sbom == true ]] || continue
		# The SBOM of what goes into this platform's image, read from the
		# archive itself (its programs' Go modules, busybox's version).
		"$syft_bin" scan "docker-archive:$archive" -q -o "spdx-json=$out/sbom/$image-${p#linux/}.spdx.json" \
			--source-name "$registry/$image" --source-version "$version"
	done
	pushed=$(go run ./hack/release push-index --ref "$registry/$image:$version" "${push_tls[@]}" "${args[@]}")
	digest=$(sed -n 's/.*"digest":"\(sha256:[0-9a-f]*\)".*/\1/p' <<<"$pushed")
	[[ -n $digest ]] || fail "push-index printed no digest: $pushed"
	index_digest[$image]=$digest
	log "pushed $registry/$image:$version@$digest"
	# Sign the index and each platform's image (--recursive): a node verifies
	# the one it pulled.
	"$cosign_bin" sign "${sign_opts[@]}" "${cosign_tls[@]}" --recursive "$registry/$image@$digest" >/dev/null 2>"$out/cosign.log" ||
		{ cat "$out/cosign.log" >&2; fail "signing $registry/$image@$digest failed"; }
	for p in "${plats[@]}"; do
		[[ $sbom == true ]] || break
		pd=$(sed -n "s#.*\"${p}\":\"\(sha256:[0-9a-f]*\)\".*#\1#p" <<<"$pushed")
		[[ -n $pd ]] || fail "push-index printed no digest for $p: $pushed"
		"$cosign_bin" attest "${sign_opts[@]}" "${cosign_tls[@]}" --type spdxjson \
			--predicate "$out/sbom/$image-${p#linux/}.spdx.json" "$registry/$image@$pd" >/dev/null 2>"$out/cosign.log" ||
			{ cat "$out/cosign.log" >&2; fail "attesting the SBOM of $registry/$image@$pd failed"; }
	done
	json_images+="${json_images:+,}\"$image\":$pushed"
	env_images+="RELEASE_IMAGE_${image^^}=$registry/$image@$digest"$'\n'
done
rm -f "$out/cosign.log"

# The chart, with the released images pinned by digest.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -r charts/runwarden "$work/runwarden"
go run ./hack/release chart-values --file "$work/runwarden/values.yaml" --registry "$registry" --tag "$version" \
	--digest "dispatcher=${index_digest[dispatcher]}" --digest "webhook=${index_digest[webhook]}" \
	--digest "runner=${index_digest[runner]}"
# Helm v4 packages each file with its modification time: the commit's time
# for all of them makes the package the same bytes from the same commit.
find "$work/runwarden" -exec touch -h -d "@$(git log -1 --format=%ct)" {} +
"$helm_bin" lint "$work/runwarden" >/dev/null || { "$helm_bin" lint "$work/runwarden" >&2; fail "the release chart does not pass helm lint"; }
"$helm_bin" package "$work/runwarden" --version "$chart_version" --app-version "$version" -d "$out" >/dev/null
package=$out/runwarden-$chart_version.tgz
push_out=$("$helm_bin" push "$package" "oci://$registry/charts" "${helm_tls[@]}" 2>&1) || { echo "$push_out" >&2; fail "helm push failed"; }
chart_digest=$(sed -n 's/^Digest: *\(sha256:[0-9a-f]*\)$/\1/p' <<<"$push_out")
[[ -n $chart_digest ]] || fail "helm push printed no digest: $push_out"
"$cosign_bin" sign "${sign_opts[@]}" "${cosign_tls[@]}" "$registry/charts/runwarden@$chart_digest" >/dev/null 2>"$work/cosign.log" ||
	{ cat "$work/cosign.log" >&2; fail "signing the chart failed"; }
log "pushed oci://$registry/charts/runwarden:$chart_version@$chart_digest"

if [[ $keyless != true ]]; then
	"$cosign_bin" public-key --key "$key" >"$out/cosign.pub"
fi
cat >"$out/release.json" <<-EOF
{"version":"$version","registry":"$registry","chart":{"ref":"oci://$registry/charts/runwarden","version":"$chart_version","digest":"$chart_digest"},"images":{$json_images}}
EOF
# The same for shell scripts (make demo): KEY=VALUE lines.
{
	echo "RELEASE_VERSION=$version"
	echo "RELEASE_CHART=oci://$registry/charts/runwarden"
	echo "RELEASE_CHART_VERSION=$chart_version"
	echo "RELEASE_CHART_DIGEST=$chart_digest"
	printf '%s' "$env_images"
} >"$out/release.env"
log "done in $((SECONDS - start))s: $out/release.json, $out/release.env"
if [[ $keyless == true ]]; then
	verify="cosign verify --certificate-identity-regexp IDENTITY --certificate-oidc-issuer ISSUER"
else
	verify="cosign verify --key $out/cosign.pub --insecure-ignore-tlog"
fi
# Verify and install by the digest that was signed: a tag can be moved
# between the two.
cat <<-EOF
Verify it:
  $verify${ca_file:+ --registry-cacert $ca_file} $registry/charts/runwarden@$chart_digest
Install what was verified, by the same digest (chart version $chart_version):
  helm install runwarden oci://$registry/charts/runwarden@$chart_digest${ca_file:+ --ca-file $ca_file}
EOF
