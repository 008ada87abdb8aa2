# The webhook's image: a static (musl) release binary on a distroless base, non-root, no shell.
# Needs BuildKit (the default builder since Docker 23; DOCKER_BUILDKIT=1 before), which builds
# only the stages the target uses.
#
# A release build for both architectures, from source (pulls rust and distroless; the build
# stage runs on the builder's own platform and cross-compiles with cargo-zigbuild):
#   docker buildx build --platform linux/amd64,linux/arm64 --build-arg EVI_COMMIT=$(git rev-parse --short=12 HEAD) \
#     -t ephemeral-volume-injector .
# The same runtime stage from binaries built outside the image (what `make images` does: the
# machine cannot pull the build stage's images). The build context holds one binary per
# platform, as `make release-binaries` lays them out (target/release-context):
#   <context>/linux/amd64/ephemeral-volume-injector, <context>/linux/arm64/ephemeral-volume-injector
#   docker build --platform linux/arm64 --build-arg BINARY_FROM=prebuilt --build-arg RUNTIME_BASE=scratch \
#     -f Dockerfile -t ephemeral-volume-injector:arm64 target/release-context
#
# Base images are pinned by digest (the tag in a comment), so that a build takes the bytes that
# were reviewed; Dependabot moves them (.github/dependabot.yml). Refresh by hand with
# `crane digest <image>:<tag>` (the index digest, for every platform).
# gcr.io/distroless/static-debian12:nonroot
ARG RUNTIME_BASE=gcr.io/distroless/static-debian12@sha256:afa5c872c891853ca7fcf1f12c3edb23f7eeef36189728842dd51042ff57f7ab
ARG BINARY_FROM=build

# rust:1.95-bookworm
FROM --platform=$BUILDPLATFORM rust@sha256:6258907abe69656e41cd992e0b705cdcfabcbbe3db374f92ed2d47121282d4a1 AS build
ARG TARGETARCH
ARG EVI_COMMIT=""
WORKDIR /src
# zig (the C cross-compiler), cargo-zigbuild and PyYAML (release/pgo.py), checked by hash.
COPY .ci/requirements/build-stage.txt ./.ci/requirements/build-stage.txt
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3-pip=23.0.1+dfsg-1 \
 && rm -rf /var/lib/apt/lists/* \
 && pip3 install --no-cache-dir --break-system-packages --require-hashes -r .ci/requirements/build-stage.txt \
 && rustup target add x86_64-unknown-linux-musl aarch64-unknown-linux-musl \
 && rustup component add llvm-tools
COPY Cargo.toml Cargo.lock build.rs rustfmt.toml clippy.toml rust-toolchain.toml ./
COPY src ./src
COPY benches ./benches
# What the profile of the optimised build is trained on (release/pgo.py, as `make release-binaries`).
COPY release/pgo.py ./release/pgo.py
COPY tests/golden ./tests/golden
# Named by Cargo.toml ([[test]] golden): without it Cargo cannot read the manifest.
COPY tests/golden.rs ./tests/golden.rs
COPY tests/data/config.yaml ./tests/data/config.yaml
RUN case "$TARGETARCH" in \
      amd64) target=x86_64-unknown-linux-musl ;; \
      arm64) target=aarch64-unknown-linux-musl ;; \
      *) echo "unsupported TARGETARCH $TARGETARCH" >&2; exit 1 ;; \
    esac \
 && python3 release/pgo.py --out /tmp/evi.profdata \
 && EVI_COMMIT="$EVI_COMMIT" RUSTFLAGS="-Cprofile-use=/tmp/evi.profdata" \
      cargo zigbuild --release --locked --target "$target" --bin ephemeral-volume-injector \
 && mkdir /out \
 && cp "target/$target/release/ephemeral-volume-injector" /out/

# The binary from the build context instead, the one for the platform being built.
FROM scratch AS prebuilt
ARG TARGETPLATFORM
COPY ${TARGETPLATFORM}/ephemeral-volume-injector /out/ephemeral-volume-injector

FROM ${BINARY_FROM} AS binary

FROM ${RUNTIME_BASE}
COPY --from=binary /out/ephemeral-volume-injector /ephemeral-volume-injector
# mimalloc: commit memory on demand rather than a whole arena up front (idle RSS 15 → 8 MiB).
ENV MIMALLOC_ARENA_EAGER_COMMIT=0
USER 65532:65532
EXPOSE 8443 8080
ENTRYPOINT ["/ephemeral-volume-injector"]
CMD ["serve"]
