#!/usr/bin/env bash
# Builds the control plane the end-to-end tests run against from the Go module proxy:
# kube-apiserver, kube-controller-manager, and the node's kubelet and kube-scheduler from
# k8s.io/kubernetes (go.mod here), the pause container's source (pause.c) from that module, etcd from
# go.etcd.io/etcd (etcd/go.mod); and for the node's volumes, the tests' CSI driver (csidriver/,
# this module) and external-provisioner (provisioner/go.mod). With --old, only an older
# kube-apiserver (v1.29/go.mod) for the chart's compatibility paths (tests/e2e/
# test_older_apiserver.py asks for it; CI builds it in the background while the other tests run).
# Cached under $EVI_TOOLS_DIR/controlplane/<versions>-<go.sum hash>/ (and controlplane-old/), so
# only a fresh machine builds them. Each build holds a lock: a second run waits for the first,
# then finds its binaries.
#   bash tests/controlplane/build.sh [--old]     build if missing, print the directory
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
TOOLS_DIR="${EVI_TOOLS_DIR:-$HOME/.cache/evi-tools}"
old=false
[ "${1:-}" = "--old" ] && old=true

version_of() { # module go.mod: its version, from a require block or a one-line require
  awk -v m="$1" '$1 == m { print $2; exit } $1 == "require" && $2 == m { print $3; exit }' "$2"
}
# The version the components report (/version, which helm's .Capabilities.KubeVersion reads),
# set as Kubernetes' own build does (hack/lib/version.sh).
version_ldflags() { # version
  local minor="${1#v1.}" flags="-s -w" pkg
  minor="${minor%%.*}"
  for pkg in k8s.io/client-go/pkg/version k8s.io/component-base/version; do
    flags+=" -X $pkg.gitVersion=$1 -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    flags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  echo "$flags"
}
# No DWARF from the compiler: the linker strips it anyway (-s -w), and it is a good part of
# the compile time.
export GOFLAGS="-mod=readonly -trimpath -gcflags=all=-dwarf=false"
export CGO_ENABLED=0
mkdir -p "$TOOLS_DIR"
start=$(date +%s)
lap=$start
took() { echo "  ($1 in $(( $(date +%s) - lap )) s)" >&2; lap=$(date +%s); } # per-part times, for CI's budget

if $old; then
  old_version="$(version_of k8s.io/kubernetes "$here/v1.29/go.mod")"
  [ -n "$old_version" ] || { echo "build.sh: the version of k8s.io/kubernetes not found in v1.29/go.mod" >&2; exit 2; }
  sum="$(cat "$here/v1.29/go.sum" "$here/build.sh" | sha256sum | cut -c1-12)"
  out="$TOOLS_DIR/controlplane-old/kube-apiserver-$old_version-$sum"
  exec 9>"$TOOLS_DIR/controlplane-old.lock"
  flock 9
  if [ ! -x "$out/kube-apiserver-$old_version" ]; then
    echo "building kube-apiserver $old_version" >&2
    rm -rf "$out.tmp"
    mkdir -p "$out.tmp"
    (cd "$here/v1.29" && go build -ldflags "$(version_ldflags "$old_version")" \
      -o "$out.tmp/kube-apiserver-$old_version" k8s.io/kubernetes/cmd/kube-apiserver) >&2
    rm -rf "$out"
    mv "$out.tmp" "$out"
    find "$TOOLS_DIR/controlplane-old" -mindepth 1 -maxdepth 1 ! -path "$out" -exec rm -rf {} + # older builds
    took "kube-apiserver $old_version"
  fi
  echo "$out"
  exit 0
fi

k8s_version="$(version_of k8s.io/kubernetes "$here/go.mod")"
etcd_version="$(version_of go.etcd.io/etcd/server/v3 "$here/etcd/go.mod")"
provisioner_version="$(version_of github.com/kubernetes-csi/external-provisioner/v5 "$here/provisioner/go.mod")"
[ -n "$k8s_version" ] && [ -n "$etcd_version" ] && [ -n "$provisioner_version" ] || { echo "build.sh: versions not found in go.mod" >&2; exit 2; }
sum="$(cat "$here/go.sum" "$here/etcd/go.sum" "$here/provisioner/go.sum" "$here/build.sh" | sha256sum | cut -c1-12)"
out="$TOOLS_DIR/controlplane/k8s-$k8s_version-etcd-$etcd_version-$sum"
# The tests' CSI driver changes more often than the rest: it is rebuilt alone (seconds, in this
# module) when its source changes, recorded beside it.
driver_sum="$(cat "$here/go.sum" "$here/csidriver/main.go" | sha256sum | cut -c1-12)"
build_driver() { # dir
  if [ "$(cat "$1/evi-csi-test-driver.sum" 2>/dev/null)" != "$driver_sum" ] || [ ! -x "$1/evi-csi-test-driver" ]; then
    (cd "$here" && go build -ldflags "-s -w" -o "$1/evi-csi-test-driver" ./csidriver) >&2
    echo "$driver_sum" > "$1/evi-csi-test-driver.sum"
    took "CSI test driver"
  fi
}
exec 9>"$TOOLS_DIR/controlplane.lock"
flock 9
if [ -x "$out/kube-apiserver" ] && [ -x "$out/kube-controller-manager" ] && [ -x "$out/etcd" ] \
  && [ -x "$out/kubelet" ] && [ -x "$out/kube-scheduler" ] \
  && [ -f "$out/pause.c" ] && [ -x "$out/csi-provisioner" ]; then
  build_driver "$out"
  echo "$out"
  exit 0
fi

rm -rf "$out.tmp"
mkdir -p "$out.tmp"
echo "building kube-apiserver, kube-controller-manager, kubelet and kube-scheduler $k8s_version (a few minutes on a fresh machine)" >&2
(cd "$here" && go build -ldflags "$(version_ldflags "$k8s_version")" -o "$out.tmp/" \
  k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler) >&2
took "kube-apiserver, kube-controller-manager, kubelet, kube-scheduler"
# The pause container's source, from the same module (the node's sandbox image is built from it).
k8s_dir="$(cd "$here" && go list -m -f '{{.Dir}}' k8s.io/kubernetes)"
cp "$k8s_dir/build/pause/linux/pause.c" "$out.tmp/pause.c"
echo "building etcd $etcd_version, the tests' CSI driver and external-provisioner $provisioner_version" >&2
(cd "$here/etcd" && go build -ldflags "-s -w" -o "$out.tmp/etcd" go.etcd.io/etcd/server/v3) >&2
took etcd
build_driver "$out.tmp"
(cd "$here/provisioner" && go build -ldflags "-s -w -X main.version=$provisioner_version" -o "$out.tmp/csi-provisioner" \
  github.com/kubernetes-csi/external-provisioner/v5/cmd/csi-provisioner) >&2
took "external-provisioner"
rm -rf "$out"
mv "$out.tmp" "$out"
find "$TOOLS_DIR/controlplane" -mindepth 1 -maxdepth 1 ! -path "$out" -exec rm -rf {} + # older builds
echo "control plane built in $(( $(date +%s) - start )) s" >&2
echo "$out"
