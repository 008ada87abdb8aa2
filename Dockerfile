# The webhook's image: a static (musl) release binary on a distroless base, non-root, no shell.
# Needs BuildKit (the default builder since Docker 23; DOCKER_BUILDKIT=1 before), which builds
# only the stages the target uses.
#
# A release build, from source (pulls rust and distroless):
#   docker build -t ephemeral-volume-injector .
# The same runtime stage from a binary built outside the image (what CI does: the machine
# cannot pull the build stage's images). The build context is a directory holding the binary:
#   cargo build --release --locked --target x86_64-unknown-linux-musl --bin ephemeral-volume-injector
#   docker build --build-arg BINARY_FROM=prebuilt --build-arg RUNTIME_BASE=scratch \
#     -f Dockerfile -t ephemeral-volume-injector <dir with ephemeral-volume-injector>
ARG RUNTIME_BASE=gcr.io/distroless/static-debian12:nonroot
ARG BINARY_FROM=build

FROM rust:1.95-bookworm AS build
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/* \
 && rustup target add x86_64-unknown-linux-musl
WORKDIR /src
COPY Cargo.toml Cargo.lock rustfmt.toml clippy.toml rust-toolchain.toml ./
COPY src ./src
COPY benches ./benches
RUN cargo build --release --locked --target x86_64-unknown-linux-musl --bin ephemeral-volume-injector \
 && mkdir /out \
 && cp target/x86_64-unknown-linux-musl/release/ephemeral-volume-injector /out/

# The binary from the build context instead.
FROM scratch AS prebuilt
COPY ephemeral-volume-injector /out/ephemeral-volume-injector

FROM ${BINARY_FROM} AS binary

FROM ${RUNTIME_BASE}
COPY --from=binary /out/ephemeral-volume-injector /ephemeral-volume-injector
# mimalloc: commit memory on demand rather than a whole arena up front (idle RSS 15 → 8 MiB).
ENV MIMALLOC_ARENA_EAGER_COMMIT=0
USER 65532:65532
EXPOSE 8443 8080
ENTRYPOINT ["/ephemeral-volume-injector"]
CMD ["serve"]
