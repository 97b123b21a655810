#!/usr/bin/env bash
# make demo: starts the local cluster with its real node and registry,
# releases runwarden into that registry (signed images for this machine's
# platform and the chart, as make release does for every platform),
# verifies the release with cosign, installs the chart from the registry by
# the digest it verified, with Helm through runwarden-postrender and a
# Kustomize overlay, checks that every container of every release pod runs a
# released image, submits five RunnerTasks, and shows what happened.
#
# It builds only what it shows: the host's platform, no SBOMs (make release
# and its e2e test make the other platforms, the SBOMs and their
# attestations), and Vault's minimal build (the one make test runs too).
# The runwarden images build beside the tools.
#
# Usage: hack/demo.sh [build]
#   build  only build the tools and images the demo needs, and stop
#
# Environment: RUNWARDEN_DEMO_HELM=helm4 uses Helm v4 and the plugin
# (default helm3); RUNWARDEN_DEMO_OVERLAY picks the overlay (default
# kustomize/labels).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
helm_tool=${RUNWARDEN_DEMO_HELM:-helm3}
overlay=${RUNWARDEN_DEMO_OVERLAY:-kustomize/labels}
ns=runwarden
runners=runwarden-runners
case ${1:-} in
"" | build) ;;
*)
	sed -n '2,/^set -euo/p' "${BASH_SOURCE[0]}" | sed '$d' | sed 's/^# \{0,1\}//' >&2
	exit 2
	;;
esac

step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "Building the tools and images this demo needs (once; later runs reuse them)"
arch=$(go env GOARCH)
version=$(git describe --tags --always --dirty)
mkdir -p bin
# The release's images, built beside the tools (each waits for nothing but
# the runner's OpenTofu); hack/release.sh finds them built. Its output goes to
# a log, shown when it fails.
images_log=bin/demo-images.log
(
	set -euo pipefail
	# The runner image needs Debian's busybox-static, and the real node the rest.
	if [[ $(id -u) -eq 0 ]]; then hack/tools.sh node-packages; fi
	for image in dispatcher webhook postrender; do
		hack/images.sh release-archive "$image" "$arch" "$version" >/dev/null
	done
	# The real node's sandbox image (hack/node.sh loads it).
	hack/images.sh build pause
	hack/tools.sh opentofu
	hack/images.sh release-archive runner "$arch" "$version" >/dev/null
	hack/images.sh build runner
) >"$images_log" 2>&1 &
images_pid=$!
# wait_images waits for the images, and stops the demo when they failed.
wait_images() {
	if ! wait "$images_pid"; then
		cat "$images_log" >&2
		echo "demo: building the images failed (above, from $images_log)" >&2
		exit 1
	fi
	sed 's/^/  /' "$images_log"
}
# The slowest first: two builds at a time (hack/tools.sh), beside the images.
if ! hack/tools.sh kubernetes vault etcd kwok coredns opentofu registry cosign helm4 "$helm_tool"; then
	wait "$images_pid" || true
	exit 1
fi
if [[ ${1:-} == build ]]; then
	wait_images
	exit 0
fi
kubectl_bin=$(hack/tools.sh path kubernetes)/kubectl
helm_bin=$(hack/tools.sh path "$helm_tool")/helm

step "Starting the local cluster: control plane, simulated nodes, a real node"
hack/cluster.sh up
export KUBECONFIG
KUBECONFIG=$(hack/cluster.sh kubeconfig)
kubectl() { "$kubectl_bin" "$@"; }
kubectl get nodes -o wide

step "Releasing runwarden into the local registry, as make release does"
wait_images
echo "Images for linux/$arch (make release adds linux/arm64 and an SBOM of each), cosign signatures, and the"
echo "chart with the images' digests, pushed to https://$(hack/registry.sh address) (hack/registry.sh: TLS from a local CA the node trusts)."
RELEASE_OUT=bin/release RELEASE_VERSION=$version RELEASE_PLATFORMS=linux/$arch RELEASE_SBOM=false hack/release.sh >/dev/null
# shellcheck disable=SC1091 # written by hack/release.sh
source bin/release/release.env
ca=$(hack/registry.sh ca)
cosign_bin=$(hack/tools.sh path cosign)/cosign
# cosign_verify runs cosign verify (or verify-attestation) with the release's
# key, and shows what cosign said only when it fails.
cosign_verify() {
	local out
	if ! out=$("$cosign_bin" "$1" --key bin/release/cosign.pub --insecure-ignore-tlog --registry-cacert "$ca" "${@:2}" 2>&1); then
		echo "$out" >&2
		echo "demo: cosign $1 ${*:2} failed: this is a bug" >&2
		exit 1
	fi
}
grep -E '^RELEASE_' bin/release/release.env | sed 's/^/  /'

# The chart is verified and installed by the digest make release signed,
# never by its tag: a chart pushed to the tag in between is not installed.
if [[ ! ${RELEASE_CHART_DIGEST:-} =~ ^sha256:[0-9a-f]{64}$ ]]; then
	echo "demo: bin/release/release.env gives the chart digest \"${RELEASE_CHART_DIGEST:-}\", not a sha256 digest: this is a bug" >&2
	exit 1
fi
chart_ref=$RELEASE_CHART@$RELEASE_CHART_DIGEST

step "Verifying the release before installing it (cosign verify)"
cosign_verify verify "${chart_ref#oci://}" >/dev/null
echo "  the chart ${chart_ref#oci://} (version $RELEASE_CHART_VERSION): signature verified"
for image in "$RELEASE_IMAGE_DISPATCHER" "$RELEASE_IMAGE_WEBHOOK" "$RELEASE_IMAGE_RUNNER"; do
	cosign_verify verify "$image" >/dev/null
	echo "  $image: signature verified"
done

step "Installing the chart from the registry with $helm_tool, through runwarden-postrender and $overlay"
echo "helm upgrade --install runwarden $chart_ref --ca-file $ca ... (the digest just verified)"
mkdir -p bin
# -trimpath as the images' builds: their compiled packages are reused.
CGO_ENABLED=0 go build -trimpath -o bin/runwarden-postrender ./postrender
postrender=(--post-renderer "$root/bin/runwarden-postrender")
helm_env=()
if [[ $helm_tool == helm4 ]]; then
	plugins=$root/bin/helm-plugins
	mkdir -p "$plugins/runwarden-postrender/bin"
	cp postrender/plugin/plugin.yaml "$plugins/runwarden-postrender/"
	cp bin/runwarden-postrender "$plugins/runwarden-postrender/bin/"
	helm_env=(HELM_PLUGINS="$plugins")
	postrender=(--post-renderer runwarden-postrender)
fi
# A demo re-run starts from a clean slate of tasks.
kubectl delete runnertasks --all -n "$runners" --ignore-not-found --wait=true >/dev/null 2>&1 || true
env "${helm_env[@]}" "$helm_bin" upgrade --install runwarden "$chart_ref" --ca-file "$ca" \
	--namespace "$ns" --create-namespace -f hack/demo/values.yaml \
	"${postrender[@]}" --post-renderer-args --kustomize --post-renderer-args "$root/$overlay" \
	--wait --timeout 3m
kubectl get deployments,pods -n "$ns" -o wide
echo "Every object carries the overlay's labels, e.g. the dispatcher Deployment:"
kubectl get deployment -n "$ns" runwarden-dispatcher -o jsonpath='{.metadata.labels}'; echo
echo "The node pulled the released images from the registry; every container of every release pod (init"
echo "containers included) runs one, named by its digest, and what it pulled verifies:"
# One line per container: pod, kind, name, the image it names, what the
# node pulled (empty until it has a status).
containers=$(kubectl get pods -n "$ns" -o go-template='{{range $p := .items}}{{range .spec.initContainers}}{{$p.metadata.name}} init {{.name}} {{.image}} {{$name := .name}}{{range $p.status.initContainerStatuses}}{{if eq .name $name}}{{.imageID}}{{end}}{{end}}{{"\n"}}{{end}}{{range .spec.containers}}{{$p.metadata.name}} container {{.name}} {{.image}} {{$name := .name}}{{range $p.status.containerStatuses}}{{if eq .name $name}}{{.imageID}}{{end}}{{end}}{{"\n"}}{{end}}{{range .spec.ephemeralContainers}}{{$p.metadata.name}} ephemeral {{.name}} {{.image}} {{$name := .name}}{{range $p.status.ephemeralContainerStatuses}}{{if eq .name $name}}{{.imageID}}{{end}}{{end}}{{"\n"}}{{end}}{{end}}')
if [[ -z $containers ]]; then
	echo "  no release pod has a container: this is a bug" >&2
	exit 1
fi
released() { [[ $1 == "$RELEASE_IMAGE_DISPATCHER" || $1 == "$RELEASE_IMAGE_WEBHOOK" ]]; }
declare -A verified=()
while read -r pod kind name image pulled; do
	if ! released "$image" || ! released "${pulled:-}"; then
		echo "  pod $pod, $kind $name: image $image, pulled ${pulled:-nothing yet}; not a released image by digest: this is a bug" >&2
		exit 1
	fi
	if [[ -z ${verified[$pulled]:-} ]]; then
		cosign_verify verify "$pulled" >/dev/null
		verified[$pulled]=1
	fi
	echo "  pod $pod, $kind $name: $pulled, signature verified"
done <<<"$containers"

step "Starting the demo's secret store: a Vault dev server the runner pods reach"
hack/demo/vault.sh up "$runners"

step "Submitting five RunnerTasks (hack/demo/tasks.yaml)"
kubectl apply -f hack/demo/tasks.yaml
deadline=$((SECONDS + 180))
while :; do
	phases=$(kubectl get runnertasks -n "$runners" -o jsonpath='{range .items[*]}{.status.phase}{"\n"}{end}')
	done_count=$(grep -cE '^(Succeeded|Failed|Cancelled)$' <<<"$phases" || true)
	[[ $done_count -ge 5 ]] && break
	if [[ $SECONDS -gt $deadline ]]; then
		echo "demo: tasks did not finish within 3 minutes" >&2
		kubectl get runnertasks,jobs,pods -n "$runners" -o wide >&2
		kubectl logs -n "$ns" deployment/runwarden-dispatcher --tail 30 >&2 || true
		exit 1
	fi
	sleep 1
done

step "What happened"
kubectl get runnertasks -n "$runners"
for task in tofu-apply failing-step too-slow refused-by-policy cannot-schedule; do
	echo
	kubectl get runnertask "$task" -n "$runners" -o jsonpath='{.metadata.name}{": "}{.status.phase}{" ("}{.status.reason}{") exit="}{.status.exitCode}{"\n  job: "}{.status.jobName}{"\n  message: "}{.status.message}{"\n"}' | cut -c1-300
	job=$(kubectl get runnertask "$task" -n "$runners" -o jsonpath='{.status.jobName}')
	pod=""
	if [[ -n $job ]]; then
		pod=$(kubectl get pods -n "$runners" -l "batch.kubernetes.io/job-name=$job" -o jsonpath='{.items[0].metadata.name}' 2>/dev/null || true)
	fi
	if [[ -n $pod ]]; then
		kubectl get pod -n "$runners" "$pod" -o jsonpath='{"  pod: "}{.metadata.name}{" on node "}{.spec.nodeName}{"\n  env (identity, resolved references): "}{range .spec.containers[0].env[*]}{.name}{"="}{.value}{.valueFrom.secretKeyRef.name}{.valueFrom.fileKeyRef.path}{" "}{end}{"\n  init containers: "}{range .spec.initContainers[*]}{.name}{" ("}{.image}{"; env: "}{range .env[*]}{.name}{" "}{end}{") "}{end}{"\n  projected token audiences: "}{range .spec.volumes[*]}{.projected.sources[*].serviceAccountToken.audience}{" "}{end}{"\n  node selector: "}{.spec.nodeSelector}{"\n  tolerations: "}{range .spec.tolerations[*]}{.key}{"="}{.value}{":"}{.effect}{" "}{end}{"\n  required node affinity: "}{.spec.affinity.nodeAffinity.requiredDuringSchedulingIgnoredDuringExecution.nodeSelectorTerms[*].matchExpressions}{"\n  annotations: "}{.metadata.annotations}{"\n"}'
	fi
done
job=$(kubectl get runnertask tofu-apply -n "$runners" -o jsonpath='{.status.jobName}')
echo
echo "The OpenTofu runner's own output (kubectl logs job/$job):"
logs=$(kubectl logs -n "$runners" "job/$job")
while IFS= read -r line; do echo "  | $line"; done <<<"$logs"
echo
# Where the value came from: the reference the task carries,
# ${vault:<path>.<key>@<namespace>}, read as the webhook's parser reads it.
ref=$(kubectl get runnertask tofu-apply -n "$runners" -o jsonpath='{.spec.env[?(@.name=="TF_VAR_db_password")].value}')
# shellcheck disable=SC2016
if [[ $ref != '${vault:'*'}' ]]; then
	echo "  the task's TF_VAR_db_password is $ref, not a Vault reference: this is a bug" >&2
	exit 1
fi
# shellcheck disable=SC2016
body=${ref#'${vault:'}
body=${body%'}'}
path_key=${body%@*}
path=${path_key%.*}
key=${path_key##*.}
echo "TF_VAR_db_password came from $ref: Vault, path $path, key $key. The init container"
echo "runwarden-secrets fetched it with the token of Secret vault-token and wrote it to an in-memory env file;"
echo "the runner container read it through valueFrom.fileKeyRef and was not given the token."
value=$(VAULT_ADDR=http://10.88.0.1:8200 VAULT_TOKEN=$(kubectl get secret vault-token -n "$runners" -o jsonpath='{.data.token}' | base64 -d) \
	"$(hack/demo/vault.sh bin)" kv get -mount="${path%%/*}" -field="$key" "${path#*/}")
if [[ -z $value ]] || ! grep -qxF "db_password_length = ${#value}" <<<"$logs"; then
	echo "  OpenTofu did not report db_password_length = ${#value}, the length of the value in Vault: this is a bug" >&2
	exit 1
fi
echo "OpenTofu read it as var.db_password (sensitive) and printed only its length: db_password_length = ${#value},"
echo "the length of the value in Vault. The value is in no object:"
if kubectl get pods,jobs,runnertasks,events -n "$runners" -o yaml | grep -qF -- "$value"; then
	echo "  the value is in the cluster's objects: this is a bug" >&2
	exit 1
fi
echo "  kubectl get pods,jobs,runnertasks,events -o yaml | grep <value>: nothing"
echo
echo "The state OpenTofu keeps in the cluster:"
kubectl get secret tfstate-default-demo -n "$runners"
kubectl get lease lock-tfstate-default-demo -n "$runners"
cat <<EOF

Done. The cluster keeps running. Look around:
  export KUBECONFIG=$KUBECONFIG
  $kubectl_bin get runnertasks,jobs,pods -n $runners
  $kubectl_bin logs -n $ns deployment/runwarden-webhook
Run it again with 'make demo'; remove everything with 'make demo-down'.
EOF
