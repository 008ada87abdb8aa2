#!/usr/bin/env bash
# Downloads the Go modules that `make tools` builds from — the control plane's
# (tests/controlplane/build.sh), the release tools' and cert-manager's
# (tests/release/build-tools.sh) — so that the network part of the tools stage overlaps the
# CPU-bound lint and unit stages: .ci/go-tools.sh runs it first, in the Go builds .ci/test starts
# in the background. It builds nothing (`go list -deps` and `go install -n` only resolve and
# download); a failure only means the tools stage downloads that module itself. The package
# lists are build.sh's; a package missing here is merely downloaded later.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
export GOFLAGS="-mod=readonly -trimpath" CGO_ENABLED=0
list() { # dir packages...
  local dir="$1"; shift
  (cd "$dir" && go list -deps "$@" >/dev/null) || echo "prefetch: modules of $* ($dir) not downloaded" >&2
}
start=$(date +%s)
list tests/controlplane k8s.io/kubernetes/cmd/kube-apiserver k8s.io/kubernetes/cmd/kube-controller-manager \
  k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-scheduler ./csidriver
list tests/controlplane/v1.29 k8s.io/kubernetes/cmd/kube-apiserver
list tests/controlplane/etcd go.etcd.io/etcd/server/v3
list tests/controlplane/provisioner github.com/kubernetes-csi/external-provisioner/v5/cmd/csi-provisioner
bash tests/release/build-tools.sh --download-only >/dev/null || echo "prefetch: release tools' modules not downloaded" >&2
echo "prefetch: Go modules downloaded in $(( $(date +%s) - start )) s" >&2
