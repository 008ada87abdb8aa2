#!/usr/bin/env bash
# The Go builds, the one list of them: CI's background builds (.ci/test starts this at the
# start, at a lower priority) and `make tools-go` (.ci/install-tools.sh --go). The
# modules first (.ci/prefetch-go.sh), then the control plane (the `controlplane` stage waits for
# it, before e2e), then the release tools and Prometheus (the node's tests wait for them: their
# fixtures ask tests/release/build-tools.sh), then the older kube-apiserver
# (tests/e2e/test_older_apiserver.py). Every build holds a lock and is cached, so whoever needs a
# tool waits for this build of it, and a failure here only means that they build it themselves
# (and show the error).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
start=$(date +%s)
failed=0
bash .ci/prefetch-go.sh
bash tests/controlplane/build.sh >/dev/null || { echo "go-tools: the control plane did not build" >&2; failed=1; }
bash tests/release/build-tools.sh registry crane cosign prometheus kwok cert-manager >/dev/null \
  || { echo "go-tools: the release tools did not build" >&2; failed=1; }
bash tests/controlplane/build.sh --old >/dev/null || { echo "go-tools: the older kube-apiserver did not build" >&2; failed=1; }
echo "go-tools: done in $(( $(date +%s) - start )) s" >&2
exit "$failed"
