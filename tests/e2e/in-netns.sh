#!/usr/bin/env bash
# Runs a command (the end-to-end tests) in a network namespace and a mount namespace of its
# own, made for this run and removed after it, on success or failure:
# - the network namespace has loopback and a bridge link `evi-node0` holding the node's
#   address 10.213.0.1/24 (the kubelet refuses a loopback node IP, and the kernel has no dummy
#   links). The control plane, the webhook, the node and every pod live in it: nothing the
#   tests send leaves it, and the iptables rules the kubelet and the tests write are its own.
# - the mount namespace is private: every mount the kubelet and containerd make (volumes,
#   overlay root filesystems, the secrets' tmpfs) ends with the last process in it; the fixed
#   host paths they write to (pods' network namespaces, runc and shim state, CNI results,
#   container log links, Docker's key) are tmpfs in it, and the empty directories made for
#   those mounts are removed after.
# The host settings that are not namespaced (the kubelet's sysctls, cgroups) are recorded and
# put back by the node itself (tests/e2e/node.py).
#   bash tests/e2e/in-netns.sh python3 -m pytest -q tests/e2e
set -euo pipefail
ns="evi-e2e-$$"
# The node's cgroup root (tests/e2e/node.py): the pods' processes are found by it if the tests
# are killed before they stop them.
export EVI_CGROUP_ROOT="evi-e2e-$$"
private=(/run/netns /run/containerd /run/docker /var/lib/kubelet /var/lib/cni /var/log/containers
         /var/log/pods /opt/containerd /etc/docker)
created=()
netns_was_mounted=1
# The cleanup is set before anything is made, and undoes only what this run made.
cleanup() {
  local pids=() pid
  # Processes left in the node's cgroups (the tests stop them; a SIGKILL does not let them):
  # containers outlive their shims, reparented to PID 1.
  local left
  left="$(grep -l "/$EVI_CGROUP_ROOT\(/\|\$\)" /proc/[0-9]*/cgroup 2>/dev/null || true)"
  for pid in $(printf '%s\n' "$left" | cut -s -d/ -f3); do
    [ "$pid" = "$$" ] || kill -9 "$pid" 2>/dev/null || true
  done
  # and their cgroups, deepest first, once empty (the node removes them when it is stopped).
  find /sys/fs/cgroup/*/"$EVI_CGROUP_ROOT" -depth -type d -exec rmdir {} + 2>/dev/null || true
  if ip netns list | awk -v n="$ns" '$1 == n { found = 1 } END { exit !found }'; then
    mapfile -t pids < <(ip netns pids "$ns" 2>/dev/null || true)
    [ "${#pids[@]}" -eq 0 ] || kill -9 "${pids[@]}" 2>/dev/null || true
    ip netns delete "$ns"
  fi
  if [ "$netns_was_mounted" = 0 ] && mountpoint -q /run/netns && [ -z "$(ls -A /run/netns)" ]; then
    umount /run/netns || true
  fi
  [ "${#created[@]}" -eq 0 ] || rmdir "${created[@]}" 2>/dev/null || true
  rm -rf "${TMPDIR:-/tmp}/evi-e2e-$$-docker"
}
trap cleanup EXIT
# A signal ends the script through its EXIT trap (bash runs none for an untrapped one); the
# tests, in the same process group, stop their node and control plane first.
trap 'exit 143' TERM
trap 'exit 130' INT
for d in "${private[@]}"; do
  if [ ! -e "$d" ]; then
    mkdir -p "$d"
    created+=("$d")
  fi
done
# `ip netns add` makes /run/netns a mount point on the host (a bind mount of itself) when it
# is not one yet: put back as found, unless another run's namespace is in it.
mountpoint -q /run/netns || netns_was_mounted=0
ip netns add "$ns"
ip -n "$ns" link set lo up
ip -n "$ns" link add evi-node0 type bridge
ip -n "$ns" addr add 10.213.0.1/24 dev evi-node0
ip -n "$ns" link set evi-node0 up
# shellcheck disable=SC2016 # $d and $@ are the inner bash's, expanded there
EVI_NETNS="$ns" EVI_NODE_IP=10.213.0.1 DOCKER_CONFIG="${TMPDIR:-/tmp}/evi-e2e-$$-docker" \
  unshare --mount --propagation private -- nsenter --net="/run/netns/$ns" -- \
  bash -c 'for d in '"${private[*]}"'; do mount -t tmpfs -o mode=0755 evi-e2e "$d"; done; exec "$@"' \
  in-netns "$@"
