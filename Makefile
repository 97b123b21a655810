# runwarden's developer entry points. `make help` lists them.
SHELL := /usr/bin/env bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

GO ?= go
# runwarden's code is built, tested and linted as its released binaries are
# built (static, -trimpath): the images, the unit tests and the e2e suites'
# binaries then share one set of compiled packages, and a first make test
# compiles each dependency once, not once per build mode. (Pinned tools
# choose their own: hack/tools.sh.)
export CGO_ENABLED := 0
export GOFLAGS := $(strip -trimpath $(GOFLAGS))
# Pinned tools live outside the checkout (see hack/tools.sh).
tool = $(shell hack/tools.sh path $(1))
KUBE_BIN := $(call tool,kubernetes)
GOLANGCI_LINT := $(call tool,golangci-lint)/golangci-lint
OPA := $(call tool,opa)/opa
PROMTOOL := $(call tool,promtool)/promtool

BIN_DIR := bin
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)
LDFLAGS := -s -w -X github.com/runwarden/runwarden/internal/version.Version=$(VERSION)
# The binaries that exist so far; each is a package main in its own folder.
BINARIES := $(patsubst %/main.go,%,$(wildcard postrender/main.go webhook/main.go dispatcher/main.go))

# The suites take 5.5 to 7 minutes on an idle machine and up to 17 on a
# loaded day (Kueue, the chart, replicas and the chaos tests are most of
# it; docs/e2e.md); a hung test is
# stopped (with every goroutine's stack) well inside CI's 90-minute limit,
# even after a cold tool build.
E2E_TIMEOUT ?= 35m
# Where the local clusters keep their state (as hack/cluster.sh and hack/node.sh).
STATE_DIR := $(or $(RUNWARDEN_STATE_DIR),$(or $(XDG_CACHE_HOME),$(HOME)/.cache)/runwarden)
BENCH_COUNT ?= 3

.PHONY: help
help: ## Show this help.
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z0-9_-]+:.*## / {printf "  %-17s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.PHONY: tools
tools: ## Build every pinned tool into the cache folder (only what is missing).
	hack/tools.sh all

.PHONY: build
build: ## Build the runwarden binaries into bin/.
	@mkdir -p $(BIN_DIR)
	@for b in $(BINARIES); do \
		echo "go build runwarden-$$b"; \
		CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN_DIR)/runwarden-$$b ./$$b; \
	done
	$(GO) build ./...

.PHONY: test
test: tools verify lint unit e2e ## Run every check and test, e2e included (what CI runs).

.PHONY: unit
unit: policy-test monitoring-test ## Run the unit tests, the policy tests and the alert rule tests (the postrender tests compare with the pinned kustomize CLI).
	hack/tools.sh kustomize helm3 helm4
	$(GO) test -count=1 ./...

.PHONY: policy-test
policy-test: ## Run the Rego tests of policies/ with opa, failing below 90% coverage.
	hack/tools.sh opa
	@mkdir -p $(BIN_DIR)
	$(OPA) test --coverage --threshold 90 policies/ > bin/policy-coverage.json || { $(OPA) test -v policies/; exit 1; }
	$(OPA) test policies/

.PHONY: monitoring-test
monitoring-test: ## Check the chart's alert rules (charts/runwarden/monitoring) and run their unit tests with promtool.
	hack/tools.sh promtool
	$(PROMTOOL) check rules --lint=all --lint-fatal charts/runwarden/monitoring/rules.yaml
	$(PROMTOOL) test rules charts/runwarden/monitoring/rules_test.yaml

.PHONY: e2e
e2e: ## Run the e2e suites (RUNWARDEN_E2E_CLUSTER=local|kind|existing, default local).
	hack/tools.sh kubernetes etcd kwok coredns opentofu helm3 helm4 vault kueue registry cosign syft opentofu-linux-arm64 gitea
	@# The chart test releases for linux/arm64 too: compile for it here, outside the suites' timeout.
	GOARCH=arm64 CGO_ENABLED=0 $(GO) build -trimpath ./dispatcher ./webhook ./postrender
	@# One e2e run at a time on a machine; the cluster is stopped however the run ends (hack/e2e.sh).
	RUNWARDEN_TAKE_REAL_NODE=$${RUNWARDEN_TAKE_REAL_NODE:-true} hack/e2e.sh -count=1 -timeout $(E2E_TIMEOUT) -v ./e2e/

.PHONY: bench
bench: bench-postrender bench-webhook bench-dispatcher bench-gitea bench-failover bench-secrets bench-queueing bench-release ## Run every benchmark.

.PHONY: bench-dispatcher
bench-dispatcher: ## Benchmark tasks to Jobs (both sources) beside plain client-go loops, on the local cluster (RUNWARDEN_BENCH_TASKS, default 500; RUNWARDEN_BENCH_ROUNDS=R interleaves R runs of each; RUNWARDEN_BENCH_DRAIN=10000 adds the drain).
	hack/tools.sh kubernetes etcd kwok coredns opentofu
	@mkdir -p $(BIN_DIR)
	RUNWARDEN_REAL_NODE=false hack/e2e.sh -run '^$$' -bench BenchmarkDispatcherJobs -benchtime 1x -timeout 30m ./e2e/ | tee bin/bench-dispatcher.txt

.PHONY: bench-gitea
bench-gitea: ## Benchmark the Gitea source against the pinned Gitea: queued jobs to Jobs beside a FetchTask loop (RUNWARDEN_BENCH_TASKS, default 200), then a step's lines to Gitea on the real node beside an UpdateLog loop (RUNWARDEN_BENCH_LINES, default 20000).
	hack/tools.sh kubernetes etcd kwok coredns opentofu gitea
	@mkdir -p $(BIN_DIR)
	RUNWARDEN_REAL_NODE=false hack/e2e.sh -run '^$$' -bench BenchmarkGiteaJobs -benchtime 3x -timeout 30m ./e2e/ | tee bin/bench-gitea.txt
	RUNWARDEN_TAKE_REAL_NODE=$${RUNWARDEN_TAKE_REAL_NODE:-true} hack/e2e.sh -run '^$$' -bench BenchmarkGiteaLogLines -benchtime 3x -timeout 30m ./e2e/ | tee -a bin/bench-gitea.txt

.PHONY: bench-failover
bench-failover: ## Benchmark failover of two dispatcher replicas (both sources): from the leader's SIGKILL or SIGTERM to the new leader's first Job.
	hack/tools.sh kubernetes etcd kwok coredns opentofu
	@mkdir -p $(BIN_DIR)
	RUNWARDEN_REAL_NODE=false hack/e2e.sh -run '^$$' -bench BenchmarkDispatcherFailover -benchtime 3x -timeout 30m ./e2e/ | tee bin/bench-failover.txt

.PHONY: bench-queueing
bench-queueing: ## Benchmark tasks to admitted Jobs with the dispatcher's own slots and through Kueue, same run (RUNWARDEN_BENCH_TASKS, default 200).
	hack/tools.sh kubernetes etcd kwok coredns opentofu kueue benchstat
	@mkdir -p $(BIN_DIR)
	RUNWARDEN_REAL_NODE=false hack/e2e.sh -run '^$$' -bench BenchmarkQueueing -benchtime 1x -count 3 -timeout 30m ./e2e/ | tee bin/bench-queueing.txt
	$(call tool,benchstat)/benchstat -col /impl bin/bench-queueing.txt

.PHONY: bench-release
bench-release: ## Benchmark the release's image build and push (dispatcher, two platforms) beside ko build, on the local registry.
	hack/tools.sh registry ko benchstat opentofu
	hack/bench-release.sh

.PHONY: bench-secrets
bench-secrets: ## Benchmark a runner pod's start with 10 Vault references against none, on the local cluster's real node.
	hack/tools.sh kubernetes etcd kwok coredns opentofu vault benchstat
	@mkdir -p $(BIN_DIR)
	hack/e2e.sh -run '^$$' -bench BenchmarkSecretsPodStart -benchtime 5x -count 6 -timeout 30m ./e2e/ | tee bin/bench-secrets.txt
	$(call tool,benchstat)/benchstat -col /refs bin/bench-secrets.txt

.PHONY: bench-webhook
bench-webhook: ## Benchmark the webhook: handler and policy evaluation, and a TLS load test beside opa run --server (BENCH_RECORD=1 records the first for bench-guard).
	hack/tools.sh opa
	@mkdir -p $(BIN_DIR)
	GOGC=400 $(GO) test -run '^$$' -bench '^(BenchmarkEval|BenchmarkHandle|BenchmarkServeHTTP)$$' -benchmem -count 6 ./webhook/policy/ ./webhook/admission/ | tee bin/bench-webhook-go.txt
	$(if $(BENCH_RECORD),mkdir -p docs/bench && cp bin/bench-webhook-go.txt docs/bench/webhook.txt && echo "recorded docs/bench/webhook.txt for make bench-guard")
	GOGC=400 $(GO) test -run '^$$' -bench BenchmarkWebhookLoad -benchtime 1x -count 1 -timeout 20m ./webhook/ | tee bin/bench-webhook-load.txt

.PHONY: bench-guard
bench-guard: ## Before a change lands: BenchmarkHandle, BenchmarkServeHTTP and BenchmarkEval against docs/bench/webhook.txt (BENCH_GUARD_BASE=REV: against REV built and run beside them); fails past +10% time (significant) or any added allocation.
	hack/bench-guard.sh $(if $(BENCH_GUARD_BASE),--base $(BENCH_GUARD_BASE))

.PHONY: bench-postrender
bench-postrender: ## Benchmark runwarden-postrender beside the kustomize CLI script and a plain YAML round trip (the benchmark overlay, the same with replacements, the labels overlay), then Render alone in a warm process.
	hack/tools.sh kustomize benchstat
	@mkdir -p $(BIN_DIR)
	$(GO) test -run '^$$' -bench 'BenchmarkPostrender' -benchtime 1x -count $(BENCH_COUNT) -timeout 60m ./postrender/render/ | tee bin/bench-postrender.txt
	$(call tool,benchstat)/benchstat -col /impl bin/bench-postrender.txt
	GOGC=400 $(GO) test -run '^$$' -bench 'BenchmarkRenderInProcess' -count 6 ./postrender/render/ | tee bin/bench-postrender-inprocess.txt
	$(call tool,benchstat)/benchstat bin/bench-postrender-inprocess.txt

.PHONY: helm-plugin
helm-plugin: ## Install the Helm v4 post-renderer plugin into HELM_PLUGINS (default: helm's own folder).
	@[ -n "$${HELM_PLUGINS:-}" ] || hack/tools.sh helm4
	@mkdir -p $(BIN_DIR)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(BIN_DIR)/runwarden-postrender ./postrender
	@dir="$${HELM_PLUGINS:-$$($(call tool,helm4)/helm env HELM_PLUGINS)}/runwarden-postrender"; \
	mkdir -p "$$dir/bin" && cp postrender/plugin/plugin.yaml "$$dir/" && cp $(BIN_DIR)/runwarden-postrender "$$dir/bin/" && \
	echo "installed the runwarden-postrender plugin in $$dir"
	@[ -n "$${HELM_PLUGINS:-}" ] || echo "note: Helm v3 shares this folder and loads no plugin while a v4 one is there; see docs/postrender.md"

.PHONY: lint
lint: ## Run golangci-lint.
	hack/tools.sh golangci-lint
	$(GOLANGCI_LINT) run ./...

.PHONY: generate
generate: ## Regenerate the RunnerTask deepcopy code and CRD, and the chart's copies of the CRD and policies.
	hack/tools.sh controller-gen
	$(call tool,controller-gen)/controller-gen object paths=./dispatcher/api/...
	$(call tool,controller-gen)/controller-gen crd paths=./dispatcher/api/... output:crd:dir=dispatcher/api/v1alpha1/crd
	cp dispatcher/api/v1alpha1/crd/*.yaml charts/runwarden/crds/
	rm -f charts/runwarden/policies/*.rego && cp policies/*.rego charts/runwarden/policies/

.PHONY: verify
verify: ## Check formatting, go.mod tidiness, Rego format and checks, generated files, go vet.
	hack/tools.sh opa controller-gen
	hack/verify.sh

.PHONY: cluster-up
cluster-up: ## Start the local cluster with its real node and the local registry (RUNWARDEN_REAL_NODE=false: simulated nodes only, no registry).
	hack/tools.sh kubernetes etcd kwok registry
	hack/cluster.sh up

.PHONY: release
release: ## Build, sign and push multi-platform images, SBOMs and the chart (default: to the local registry; see docs/release.md).
	hack/tools.sh registry cosign syft helm4 opentofu opentofu-linux-arm64
	hack/release.sh

.PHONY: registry-up
registry-up: ## Start the local OCI registry alone (make cluster-up starts it with the real node).
	hack/tools.sh registry
	hack/registry.sh up

.PHONY: registry-down
registry-down: ## Stop the local OCI registry (what it stores stays).
	hack/registry.sh down

.PHONY: kueue-up
kueue-up: ## Start Kueue beside the running local cluster, for batch/v1 Jobs (see docs/development.md).
	hack/tools.sh kubernetes kueue
	hack/kueue.sh up

.PHONY: kueue-down
kueue-down: ## Stop Kueue and remove its webhooks (its CRDs stay); cluster-down does this too.
	hack/kueue.sh down

.PHONY: images
images: ## Build the image archives (pause, runner, webhook, postrender, dispatcher); load them into a running real node.
	hack/tools.sh node-packages
	hack/images.sh build
	@sock=$$(hack/node.sh socket); if [ -S "$$sock" ]; then hack/images.sh load pause runner webhook postrender dispatcher --address "$$sock"; \
	else echo "images: no real node running; archives are in $$(dirname $$(hack/images.sh archive pause))"; fi

.PHONY: cluster-down
cluster-down: ## Stop the local cluster and remove its state.
	hack/cluster.sh down

.PHONY: kubeconfig
kubeconfig: ## Print the local cluster's kubeconfig path.
	@hack/cluster.sh kubeconfig

.PHONY: demo
demo: ## Start the local cluster, release runwarden into its registry, install the chart from there through the post-renderer, run tasks, show the result.
	@mkdir -p "$(STATE_DIR)"
	@# in-use-NAME: while the demo runs, an e2e run does not take its real node.
	RUNWARDEN_TAKE_REAL_NODE=$${RUNWARDEN_TAKE_REAL_NODE:-true} flock -o "$(STATE_DIR)/in-use-$${RUNWARDEN_CLUSTER_NAME:-runwarden}.lock" hack/demo.sh

.PHONY: demo-down
demo-down: ## Remove the demo: the local cluster and everything it holds, and the demo's Vault.
	hack/demo/vault.sh down
	hack/cluster.sh down

.PHONY: clean
clean: ## Remove build outputs (not the tool cache; see docs/development.md).
	rm -rf $(BIN_DIR)
