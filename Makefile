# The development loop, in named stages. `make lint` takes seconds and needs nothing but the
# Rust toolchain; `make ci` is what CI runs (.ci/test), fast toolless stages first.
#
#   make lint    fmt, clippy, doc, the scripts lint                 (Rust toolchain only)
#   make unit    every Rust test: unit, golden, property, CLI, docs, the server over real TLS
#   make tools   helm, kubectl, the Python tools, cargo-deny, the control plane (cached by version)
#   make audit   cargo deny: licenses, bans, sources                (needs: tools)
#   make chart   golden outputs against the Kubernetes schema, the chart's values documented
#                (charts/values-doc.py), its tests, yamllint, hadolint, trivy (needs: tools)
#   make e2e     the real chart and binary against etcd, kube-apiserver and
#                kube-controller-manager, and on a real node (kubelet, containerd) the image
#                built from the Dockerfile (needs: tools; root: network namespaces)
#   make ci      all of the above, in that order
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
TOOLS_DIR ?= $(or $(EVI_TOOLS_DIR),$(HOME)/.cache/evi-tools)
export PATH := $(TOOLS_DIR)/bin:$(PATH)
export CARGO_TERM_COLOR ?= never
CARGO_DENY_VERSION := 0.20.2
CARGO_DENY := $(TOOLS_DIR)/cargo-deny-$(CARGO_DENY_VERSION)/bin/cargo-deny
# Every integration test binary but the server's, which runs alone: each of its tests drives
# a real server under load, and two side by side on 2 cores starve each other.
TESTS := $(filter-out server,$(basename $(notdir $(wildcard tests/*.rs))))

.PHONY: ci lint unit build musl tools audit chart e2e
ci: lint unit tools audit chart e2e

lint:
	bash .ci/lint-pipes.sh
	cargo fmt --all -- --check
	rustfmt --check --edition 2024 fuzz/fuzz_targets/*.rs
	@out="$$(gofmt -l tests/controlplane/csidriver)"; [ -z "$$out" ] || { echo "gofmt: $$out"; exit 1; }
	cargo clippy --all-targets --locked -- -D warnings
	RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --lib --locked

unit:
	cargo test --locked --no-fail-fast --lib --bins $(addprefix --test ,$(TESTS))
	cargo test --locked --no-fail-fast --test server -- --test-threads=1

# The debug binary the chart and end-to-end tests call.
build:
	cargo build --locked --bins

# The static (musl) release binary the image is built from (needs: tools).
musl:
	CC_x86_64_unknown_linux_musl=musl-gcc cargo build --release --locked \
	  --target x86_64-unknown-linux-musl --bin ephemeral-volume-injector

tools:
	bash .ci/install-tools.sh

audit:
	$(CARGO_DENY) --locked check licenses bans sources

chart: build
	for v in 1.29.0 1.33.0 1.37.0; do \
	  kubernetes-validate --strict --quiet -k "$$v" tests/golden/*/output.json; \
	  echo "golden outputs valid for Kubernetes $$v"; \
	done
	python3 charts/values-doc.py --check
	python3 -m pytest -q tests/chart
	yamllint -d '{extends: relaxed, rules: {line-length: {max: 120}}}' \
	  charts/ephemeral-volume-injector/values.yaml charts/ephemeral-volume-injector/Chart.yaml \
	  tests/data/*.yaml tests/golden/*/*.yaml
	hadolint Dockerfile
	trivy config --quiet --skip-check-update --severity HIGH,CRITICAL --exit-code 1 charts/ephemeral-volume-injector
	trivy config --quiet --skip-check-update --severity HIGH,CRITICAL --exit-code 1 \
	  --helm-set tls.mode=selfManaged --ignorefile charts/trivyignore-selfmanaged charts/ephemeral-volume-injector
	dir="$$(mktemp -d)" && cp Dockerfile .dockerignore "$$dir/" && \
	  trivy config --quiet --skip-check-update --severity HIGH,CRITICAL --exit-code 1 "$$dir"; \
	  rc=$$?; rm -rf "$$dir"; exit $$rc

# In a network and mount namespace of their own, with a real node (EVI_REQUIRE_NODE: its
# tests fail rather than skip).
e2e: build musl
	EVI_REQUIRE_NODE=1 bash tests/e2e/in-netns.sh python3 -m pytest -q tests/e2e
