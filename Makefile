# planner-operator: build, test and generate.
# Every target here works; targets are added as the features behind them land.

CARGO ?= cargo
# Two cores on our machines: one job per core, no incremental cache in CI.
export CARGO_BUILD_JOBS ?= 2

.PHONY: build test lint fmt manifests check-manifests docs check-docs check-chart-docs check-links check-workflows tools tools-bin dynamo image release push-image cluster-up cluster-down e2e e2e-kind chart-test demo bench bench-budget bench-replay tune help

## build: compile the operator and crd-gen (debug)
build:
	$(CARGO) build --workspace --locked

## test: every unit and schema test (no cluster needed); fails on stale manifests
test:
	$(CARGO) test --workspace --locked

## lint: formatting check, clippy with warnings denied, and no function over 150 lines outside tests
lint:
	$(CARGO) fmt --all -- --check
	bash tools/fn-length.sh
	$(CARGO) clippy --workspace --all-targets --all-features --locked -- -D warnings

## fmt: format the code
fmt:
	$(CARGO) fmt --all

## manifests: regenerate the CRDs in config/crd/ and the chart (crds/; the DGD CRD in files/crds/) from the Rust types
manifests:
	$(CARGO) run --quiet --locked -p crd-gen

## check-manifests: fail when the committed CRDs differ from the Rust types
check-manifests:
	$(CARGO) run --quiet --locked -p crd-gen -- --check

## docs: regenerate the generated documentation: the chart's README.md from values.yaml (helm-docs), the API
##       reference in docs/reference/ and the CRDs (crd-gen), the run flags table in docs/planner.md
docs: tools manifests
	@bash tools/docs.sh generate
	UPDATE_DOCS=1 $(CARGO) test --quiet --locked -p planner-operator --test docs_flags

## check-docs: fail when generated files are stale (the CRDs, the API reference in docs/reference/, the chart's
##             README.md; make test checks the flags table), a relative link in the Markdown points nowhere, or the
##             GitHub workflows do not pass actionlint; each failure names the file and how to fix it (needs make tools)
check-docs: check-manifests check-chart-docs check-links check-workflows

## check-links: fail when a relative link or anchor in the repository's Markdown points nowhere
check-links:
	@python3 tools/check-links.py

## check-chart-docs: fail when charts/planner-operator/README.md differs from what make docs writes
check-chart-docs: tools
	@bash tools/docs.sh check

## check-workflows: actionlint (from make tools) on .github/workflows/*.yml, their shell steps included
check-workflows: tools
	@bash tools/check-workflows.sh

## tools: build etcd, kube-apiserver, -controller-manager, -scheduler, kubectl, kwok, helm, Prometheus, the
##        image writer, helm-docs, actionlint and crane from tools/ into a cache outside the repo (a no-op when
##        cached; needs Go >= 1.26)
tools:
	@bash tools/build.sh

## tools-bin: print the tools cache's bin directory (helm, kubectl, crane, ...: "$$(make -s tools-bin)/crane")
tools-bin:
	@bash -c 'source tools/env.sh && echo "$$TOOLS_BIN"'

## dynamo: install NVIDIA Dynamo's frontend, mocker engines and replay (PyPI, pinned in tools/dynamo/) into a
##         virtual environment in the tools cache, with the test model they serve (a no-op when cached;
##         needs a Python >= 3.10 with venv)
dynamo:
	@bash tools/dynamo-venv.sh

## image: the release image without a container runtime: release build, distroless-like root filesystem,
##        target/image/planner-operator-<version>.tar (docker load -i); runs its entrypoint to check it
##        (IMAGE_ARCH=arm64 bash tools/image.sh cross-builds linux/arm64: see tools/image.sh)
image: tools
	@CARGO="$(CARGO)" bash tools/image.sh

## release: everything a release publishes, in target/release-artifacts/<version>/: the image tarball of
##          make image (linux/amd64; RELEASE_PLATFORMS="linux/amd64 linux/arm64" cross-builds arm64 too), the
##          chart package, the CRDs, SHA256SUMS; then checks the folder (tools/release-check.sh)
release: image
	@CARGO="$(CARGO)" bash tools/release.sh

## push-image: push the image of make image to REGISTRY (make push-image REGISTRY=ghcr.io/me) with crane, no
##             Docker; prints the helm --set flags that install it (credentials: crane auth login, docker
##             login, or REGISTRY_USERNAME and REGISTRY_PASSWORD)
push-image: image
	@CARGO="$(CARGO)" REGISTRY="$(REGISTRY)" bash tools/push-image.sh

## cluster-up: start the local control plane with fake GPU nodes; eval "$(make -s cluster-up)"
cluster-up: tools
	@bash tools/cluster-up.sh

## cluster-down: stop the local control plane and remove its state
cluster-down:
	@bash tools/cluster-down.sh

## e2e: end-to-end tests against KUBECONFIG (default: the cluster of cluster-up)
e2e:
	@CARGO="$(CARGO)" bash tools/e2e.sh

## chart-test: helm lint and helm template of charts/planner-operator in every mode, its RBAC against
##             operator/src/rbac.rs (needs helm from make tools, no cluster; make e2e runs them too)
chart-test: tools
	@CARGO="$(CARGO)" bash tools/chart-test.sh

## e2e-kind: the same tests on a kind cluster (needs Docker and kind; see e2e/kind/)
e2e-kind: tools
	@CARGO="$(CARGO)" bash e2e/kind/run.sh

## demo: the planner closed loop on a local control plane: the operator, NVIDIA Dynamo's real frontend and
##       mocker engines (make dynamo), a load generator and Prometheus; one line per 10 s decision as the load
##       rises and falls. Ctrl-C (or DEMO_SECONDS) stops and cleans up
demo:
	@CARGO="$(CARGO)" bash tools/demo.sh

## bench: scaling-quality benchmark (release build): every policy on the traces in ../shared/data/traces/
##        (bench/suite.json) with the h100-llama3.3-70b-tp4 profile at k=1 and k=4, with replicas serving
##        60 s, 180 s and 300 s after they are asked for (the sla-* policies told to expect that delay until they
##        measure it), then the same runs with one pool of aggregated engines
##        (its own section); writes bench/results.md and bench/figures/.
##        `cargo bench -p planner-sim --bench simulator` times a one-hour replay.
bench:
	$(CARGO) run --release --locked -p planner-sim -- simulate --suite bench/suite.json \
		--profile h100-llama3.3-70b-tp4 --rate-scale 1 --rate-scale 4 \
		--scale-up-delay-s 60 --scale-up-delay-s 180 --scale-up-delay-s 300 --expect-scale-up-delay \
		--out bench/figures --report bench/results.md
	$(CARGO) run --release --locked -p planner-sim -- simulate --suite bench/suite.json \
		--profile h100-llama3.3-70b-tp4 --rate-scale 1 --rate-scale 4 --aggregated \
		--scale-up-delay-s 60 --scale-up-delay-s 180 --scale-up-delay-s 300 --expect-scale-up-delay \
		--policy sla-arima --policy load-based --policy hpa --policy fixed-peak \
		--out bench/figures --report bench/results.md --append-report

## bench-budget: three graphs (bench/budget.json: traces in ../shared/data/traces/) sharing one GPU budget,
##               against the same GPUs split statically per graph; writes bench/budget.md
bench-budget:
	$(CARGO) run --release --locked -p planner-sim -- budget --config bench/budget.json \
		--profile h100-llama3.3-70b-tp4 --report bench/budget.md

## bench-replay: the same runs in NVIDIA Dynamo's offline replay (make dynamo): its mocker engines timed by the
##               bench profile and its router, with sla-arima and hpa through `planner-sim bridge`, Dynamo's
##               own planner and a fixed pool; writes bench/replay.md (settings: tools/bench-replay.sh)
bench-replay:
	@CARGO="$(CARGO)" bash tools/bench-replay.sh

## tune: the search the queueing planner's defaults come from (release build), on the runs of make bench: prints
##       what each stage found and what every value of every tuned setting scores around the winner (about a
##       minute on 2 cores once built; planner-sim tune --help for the budget, seed and knobs)
tune:
	$(CARGO) run --release --locked -p planner-sim -- tune --suite bench/suite.json --profile h100-llama3.3-70b-tp4

## help: list the targets
help:
	@grep -E '^## ' $(MAKEFILE_LIST) | sed 's/^## /  /'
