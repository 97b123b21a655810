#!/usr/bin/env bash
# Checks that need no cluster: gofmt, go.mod/go.sum tidiness (the main module
# and the tool wrapper modules) and go vet with every build tag.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
fail=0

unformatted=$(gofmt -l $(git ls-files '*.go'; git ls-files --others --exclude-standard '*.go'))
if [[ -n $unformatted ]]; then
	echo "verify: gofmt would change these files (run 'gofmt -w'):" >&2
	echo "$unformatted" >&2
	fail=1
fi

for mod in . hack/tools/*/; do
	if ! (cd "$mod" && go mod tidy -diff >/dev/null 2>&1); then
		echo "verify: $mod/go.mod or go.sum is not tidy (run 'go mod tidy' there)" >&2
		fail=1
	fi
done

# The wrapper modules pin what the tools are built from; tools.sh names the
# cache folder after its own version variables, so the two must agree or a
# bump would never rebuild (or would stamp old code with the new version).
for pin in kubernetes:k8s.io/kubernetes:KUBERNETES_VERSION kubernetes:sigs.k8s.io/kwok:KWOK_VERSION \
	kubernetes:helm.sh/helm/v3:HELM3_VERSION kubernetes:helm.sh/helm/v4:HELM4_VERSION etcd:go.etcd.io/etcd/server/v3:ETCD_VERSION \
	opentofu:github.com/opentofu/opentofu:OPENTOFU_VERSION vault:github.com/hashicorp/vault:VAULT_VERSION coredns:github.com/coredns/coredns:COREDNS_VERSION gitea:code.gitea.io/gitea:GITEA_VERSION \
	cosign:github.com/sigstore/cosign/v2:COSIGN_VERSION; do
	IFS=: read -r dir mod var <<<"$pin"
	want=$(sed -n "s/^$var=\([^ ]*\).*/\1/p" hack/tools.sh)
	got=$(awk -v m="$mod" '$1 == "require" && $2 == m {print $3} $1 == m {print $2}' "hack/tools/$dir/go.mod" | head -n 1)
	if [[ -z $want || $got != "$want" ]]; then
		echo "verify: hack/tools/$dir/go.mod requires $mod ${got:-(none)}, hack/tools.sh says $var=${want:-(none)}; make them agree" >&2
		fail=1
	fi
done

# One version of each shared library: runwarden (its programs, tests and e2e
# suites) and the programs of hack/tools/kubernetes (the cluster's binaries,
# kwok, both Helms), hack/tools/opentofu and hack/tools/cosign compile many
# of the same modules; a module whose packages two of them compile must be
# at one version in all, or each compiles it again (a first run builds
# minutes longer, and two builds of one library are two things to trust).
build_modules() {
	CGO_ENABLED=0 go list -deps \
		-f '{{with .Module}}{{.Path}} {{with .Replace}}{{.Version}}{{else}}{{.Version}}{{end}}{{end}}' "$@" | awk 'NF == 2' | sort -u
}
skew=$({
	build_modules -test -tags e2e ./... | sed 's/$/ runwarden/'
	for dir in kubernetes opentofu cosign; do
		# shellcheck disable=SC2046 # one argument per program
		(cd "hack/tools/$dir" && build_modules $(../../tools.sh programs "$dir")) | sed "s|\$| hack/tools/$dir|"
	done
} | awk '{v[$1] = v[$1] " " $3 "@" $2; if (!(($1, $2) in seen)) { seen[$1, $2] = 1; n[$1]++ } }
	END { for (m in n) if (n[m] > 1) print m ":" v[m] }' | sort)
if [[ -n $skew ]]; then
	echo "verify: these modules are compiled at more than one version (module: where@version ...); require the highest everywhere:" >&2
	echo "$skew" >&2
	fail=1
fi

opa=$(hack/tools.sh path opa)/opa
if [[ -x $opa ]]; then
	unformatted=$("$opa" fmt --list policies/)
	if [[ -n $unformatted ]]; then
		echo "verify: opa fmt would change these policies (run '$opa fmt -w policies/'):" >&2
		echo "$unformatted" >&2
		fail=1
	fi
	# With the webhook's own capabilities: a shipped policy calling a
	# built-in the webhook refuses (http.send, ...) fails here, not at load.
	caps=$(mktemp)
	if go run ./webhook policy capabilities >"$caps"; then
		"$opa" check --strict --capabilities "$caps" policies/ || fail=1
	else
		echo "verify: runwarden-webhook policy capabilities failed" >&2
		fail=1
	fi
	rm -f "$caps"
else
	echo "verify: opa is not built (hack/tools.sh opa); Rego checks skipped" >&2
	fail=1
fi

# Generated files must match their sources: regenerate and compare.
cg=$(hack/tools.sh path controller-gen)/controller-gen
if [[ -x $cg ]]; then
	gen=$(mktemp -d)
	cp -r dispatcher/api "$gen/before"
	"$cg" object paths=./dispatcher/api/... || { echo "verify: controller-gen object failed" >&2; fail=1; }
	"$cg" crd paths=./dispatcher/api/... output:crd:dir=dispatcher/api/v1alpha1/crd || { echo "verify: controller-gen crd failed" >&2; fail=1; }
	if ! diff -r "$gen/before" dispatcher/api >/dev/null; then
		echo "verify: dispatcher/api's generated files were stale (now regenerated; review and commit them, or run 'make generate')" >&2
		fail=1
	fi
	rm -rf "$gen"
else
	echo "verify: controller-gen is not built (hack/tools.sh controller-gen); generated files not checked" >&2
	fail=1
fi

# The chart carries copies of the CRD and the policies (make generate).
if ! diff -r dispatcher/api/v1alpha1/crd charts/runwarden/crds >/dev/null; then
	echo "verify: charts/runwarden/crds differs from dispatcher/api/v1alpha1/crd (run 'make generate')" >&2
	fail=1
fi
if ! diff -r --exclude='*.go' policies charts/runwarden/policies >/dev/null; then
	echo "verify: charts/runwarden/policies differs from policies/ (run 'make generate')" >&2
	fail=1
fi

go vet ./... || fail=1
go vet -tags e2e ./e2e/... || fail=1

if [[ $fail -ne 0 ]]; then
	exit 1
fi
echo "verify: ok"
