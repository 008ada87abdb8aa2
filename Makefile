# The development loop, in named stages. `make lint` takes seconds and needs nothing but the
# Rust toolchain; `make ci` is exactly what CI runs (.ci/run: .ci/test, the one list of the
# stages below), fast toolless stages first.
#
#   make lint    fmt, clippy, doc; the scripts: shellcheck, ruff, no early-closing pipe reader
#                (the Rust toolchain and pip: .ci/lint-scripts.sh installs the two linters)
#   make unit    every Rust test: unit, golden, property, CLI, docs, the server over real TLS
#   make tools   helm, kubectl, the Python tools, cargo-deny, the control plane (cached by version);
#                tools-base is all but the Go builds that only e2e needs, tools-go those
#                (controlplane: the control plane alone)
#   make audit   cargo deny: licenses, bans, sources                (needs: tools)
#   make chart   golden outputs against the Kubernetes schema, the chart's values documented
#                (charts/values-doc.py), its tests, yamllint, hadolint, actionlint, trivy
#                (needs: tools)
#   make release the release artifacts: static binaries for linux/amd64 and linux/arm64, the
#                arm64 one checked under qemu against the amd64 one on every golden case, the
#                image index (OCI layout, target/oci) and the SBOM (needs: tools; root: dockerd)
#   make e2e     the real chart and binary against etcd, kube-apiserver and
#                kube-controller-manager, and on a real node (kubelet, containerd) the image
#                index pulled by digest from the run's own registry, the chart from oci://,
#                both signed (needs: tools, release; root: network namespaces)
#   make ci      all of the above, in that order (.ci/test)
SHELL := bash
.SHELLFLAGS := -euo pipefail -c
TOOLS_DIR ?= $(or $(EVI_TOOLS_DIR),$(HOME)/.cache/evi-tools)
export PATH := $(TOOLS_DIR)/bin:$(PATH)
export CARGO_TERM_COLOR ?= never
CARGO_DENY_VERSION := 0.20.2
CARGO_DENY := $(TOOLS_DIR)/cargo-deny-$(CARGO_DENY_VERSION)/bin/cargo-deny
# Every integration test binary but the server's and the fairness one, which run alone: each
# of their tests drives a real server under load, and two side by side on 2 cores starve
# each other.
TESTS := $(filter-out server fairness,$(basename $(notdir $(wildcard tests/*.rs))))

VERSION := $(shell awk -F'"' '/^version = / { print $$2; exit }' Cargo.toml)
COMMIT := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)
# The two platforms of the image: Go's architecture names and Rust's target triples.
PLATFORMS := amd64:x86_64-unknown-linux-musl arm64:aarch64-unknown-linux-musl
CARGO_CYCLONEDX_VERSION := 0.5.9
CARGO_CYCLONEDX := $(TOOLS_DIR)/cargo-cyclonedx-$(CARGO_CYCLONEDX_VERSION)/bin/cargo-cyclonedx

.PHONY: ci lint unit build musl release-binaries release images sbom tools tools-base tools-go controlplane audit advisories chart e2e
# What CI runs (.ci/run): .ci/test, which holds the one list of stages and runs each with make,
# with CI's release profile and the Go builds in the background.
ci:
	bash .ci/test

lint:
	bash .ci/lint-pipes.sh
	bash .ci/lint-scripts.sh
	cargo fmt --all -- --check
	rustfmt --check --edition 2024 fuzz/fuzz_targets/*.rs
	@out="$$(gofmt -l tests/controlplane/csidriver tests/controlplane/certmanager)"; [ -z "$$out" ] || { echo "gofmt: $$out"; exit 1; }
	cargo clippy --all-targets --locked -- -D warnings
	RUSTDOCFLAGS="-D warnings" cargo doc --no-deps --lib --locked

unit:
	cargo test --locked --no-fail-fast --lib --bins $(addprefix --test ,$(TESTS))
	cargo test --locked --no-fail-fast --test server -- --test-threads=1
	cargo test --locked --no-fail-fast --test fairness -- --test-threads=1

# The debug binary the chart and end-to-end tests call.
build:
	cargo build --locked --bins

# The static (musl) release binaries the image is built from, for both platforms, with
# cargo-zigbuild (zig is the C cross-compiler ring, mimalloc and psm need); laid out for the
# Dockerfile's prebuilt stage as target/release-context/linux/<arch>/ (needs: tools).
#
# Both are optimised with a profile (profile-guided optimisation): release/pgo.py builds the
# webhook instrumented for this machine, has it answer every golden case's review over TLS
# (HTTP/2 and HTTP/1.1) and merges what ran into $(PGO_PROFILE) — made again when the code,
# the golden cases or the script change. benches/README.md ("Profile-guided optimisation"):
# ~40 % less CPU per request. EVI_PGO=off builds without it.
PGO_PROFILE := $(CURDIR)/target/pgo/evi.profdata
$(PGO_PROFILE): $(shell find src -name '*.rs') build.rs Cargo.toml Cargo.lock rust-toolchain.toml \
    release/pgo.py tests/data/config.yaml $(wildcard tests/golden/*/input.*)
	python3 release/pgo.py --out $@
ifneq ($(EVI_PGO),off)
release-binaries release: export RUSTFLAGS := $(strip $(RUSTFLAGS) -Cprofile-use=$(PGO_PROFILE))
endif
release-binaries: $(if $(filter off,$(EVI_PGO)),,$(PGO_PROFILE))
	EVI_COMMIT=$(COMMIT) cargo zigbuild --release --locked --bin ephemeral-volume-injector \
	  $(foreach p,$(PLATFORMS),--target $(word 2,$(subst :, ,$(p))))
	$(foreach p,$(PLATFORMS),install -D -m 0755 \
	  target/$(word 2,$(subst :, ,$(p)))/release/ephemeral-volume-injector \
	  target/release-context/linux/$(word 1,$(subst :, ,$(p)))/ephemeral-volume-injector;)
musl: release-binaries

# The image index: one image per platform from the Dockerfile, as an OCI layout (target/oci).
# Uses the Docker daemon of DOCKER_HOST, or starts one of its own for the build (root). The
# tests build on scratch (nothing can be pulled here); a release on distroless (RUNTIME_BASE).
RUNTIME_BASE ?= scratch
images: release-binaries
	python3 release/images.py --context target/release-context --out target/oci \
	  --tag $(VERSION) --commit $(COMMIT) --base $(RUNTIME_BASE) $(if $(DOCKER_HOST),,--private-dockerd $(CURDIR)/target/dockerd)

# The CycloneDX SBOM of the binary's dependencies (Cargo.lock, normal dependencies only).
sbom:
	$(CARGO_CYCLONEDX) cyclonedx --format json --spec-version 1.5 --no-build-deps \
	  --override-filename ephemeral-volume-injector.cdx
	mkdir -p target/sbom && mv ephemeral-volume-injector.cdx.json target/sbom/

# Everything a release publishes (release/publish.sh pushes and signs it), and the arm64
# binary checked under qemu-user against the amd64 one on every golden case. Then the load
# guard: the amd64 binary against the bare TLS server (benches/tls_baseline.rs), built alike
# and from the very dependency builds the webhook's binary was (same flags, same profile: only
# its own file is compiled), so that the ratio is the webhook's own work (benches/load.sh
# --guard; fails only on a gross regression of the CPU ratio benches/README.md records).
release: images sbom
	python3 -m pytest -q tests/release
	EVI_COMMIT=$(COMMIT) cargo zigbuild --release --locked --bin tls-baseline \
	  --target x86_64-unknown-linux-musl
	BIN=target/x86_64-unknown-linux-musl/release/ephemeral-volume-injector \
	  BASE=target/x86_64-unknown-linux-musl/release/tls-baseline bash benches/load.sh --guard
tools:
	bash .ci/install-tools.sh
# What audit, chart and release need; the Go builds only e2e needs (tools = both).
tools-base:
	bash .ci/install-tools.sh --base
tools-go:
	bash .ci/install-tools.sh --go
# The control plane alone: what every end-to-end test needs first (the node's tests build, or
# wait for, the release tools and Prometheus themselves: tests/release/build-tools.sh).
controlplane:
	bash tests/controlplane/build.sh

audit:
	$(CARGO_DENY) --locked check licenses bans sources
# The RustSec advisories of Cargo.lock's crates. The database is fetched from GitHub, which this
# project's CI machine cannot reach: the release workflow's build job runs it (needs: tools).
advisories:
	$(CARGO_DENY) --locked check advisories

chart: build
	for v in 1.29.0 1.33.0 1.37.0; do \
	  kubernetes-validate --strict --quiet -k "$$v" tests/golden/*/output.json; \
	  echo "golden outputs valid for Kubernetes $$v"; \
	done
	python3 charts/values-doc.py --check
	python3 -m pytest -q tests/chart
	yamllint -d '{extends: relaxed, rules: {line-length: {max: 120}}}' \
	  charts/ephemeral-volume-injector/values.yaml charts/ephemeral-volume-injector/Chart.yaml \
	  tests/data/*.yaml tests/golden/*/*.yaml monitoring/*.yaml
	hadolint Dockerfile
	$(TOOLS_DIR)/release/bin/actionlint -no-color .github/workflows/*.yml
	# trivy's misconfiguration checks at every severity, on the chart as rendered (default and
	# self-managed TLS) and on the Dockerfile; each finding accepted has its reason in the
	# ignore file (charts/trivyignore, charts/trivyignore-selfmanaged).
	trivy config --quiet --skip-check-update --exit-code 1 --ignorefile charts/trivyignore charts/ephemeral-volume-injector
	trivy config --quiet --skip-check-update --exit-code 1 \
	  --helm-set tls.mode=selfManaged --ignorefile charts/trivyignore-selfmanaged charts/ephemeral-volume-injector
	dir="$$(mktemp -d)"; trap 'rm -rf "$$dir"' EXIT; cp Dockerfile .dockerignore "$$dir/"; \
	  trivy config --quiet --skip-check-update --exit-code 1 --ignorefile charts/trivyignore "$$dir"

# In a network and mount namespace of their own, with a real node (EVI_REQUIRE_NODE: its
# tests fail rather than skip).
# `make e2e T=tests/e2e/test_admission.py` (or `T=tests/e2e/test_node.py::test_name`) runs one
# module or test with only what it needs: the debug binary always; the image index and the SBOM
# only for a module that uses the published release (its `published` fixture: test_node.py,
# test_node_faults.py). Without T, every module, after everything.
T ?=
E2E_RELEASE := $(if $(T),$(shell grep -qw published $(firstword $(subst ::, ,$(T))) 2>/dev/null && echo yes),yes)
e2e: build $(if $(E2E_RELEASE),images sbom)
	EVI_REQUIRE_NODE=1 bash tests/e2e/in-netns.sh python3 -m pytest -q --durations=30 $(or $(T),tests/e2e)
