#!/usr/bin/env bash
# The host settings a CI run may touch, printed the same way each time so that two snapshots
# can be compared (.ci/test takes one before its first stage and fails if the one after differs):
# the kernel settings the node and the image build could set (forwarding, the kubelet's), the
# network namespaces and links, the mounts, and the iptables rules of the host's namespace.
# Everything the end-to-end tests do happens in namespaces of their own (tests/e2e/in-netns.sh),
# and what is not namespaced is put back by the node (tests/e2e/node.py): this holds them to it.
#   bash .ci/host-state.sh > before; …; bash .ci/host-state.sh | diff before -
set -uo pipefail
for key in net.ipv4.ip_forward net.ipv4.conf.all.forwarding net.ipv4.conf.default.forwarding \
    net.ipv6.conf.all.forwarding net.bridge.bridge-nf-call-iptables vm.overcommit_memory \
    kernel.panic kernel.panic_on_oops fs.inotify.max_user_instances fs.inotify.max_user_watches; do
  value="$(cat "/proc/sys/${key//.//}" 2>/dev/null)" || value=absent
  echo "sysctl $key=$value"
done
ip netns list 2>/dev/null | awk '{ print "netns " $1 }' | sort
ip -o link show 2>/dev/null | awk -F': ' '{ sub(/@.*/, "", $2); print "link " $2 }' | sort
# binfmt_misc is where qemu-user-static's install registers its handlers (the tools stage
# installs it, as it installs any package): a package's, not a test's.
findmnt -rn -o TARGET,FSTYPE 2>/dev/null | awk '$2 != "binfmt_misc" { print "mount " $1 " " $2 }' | sort -u
# Rules and chains only: with no iptables installed yet (a fresh machine), as with a clean one,
# there are none; the built-in chains' ACCEPT policies are left out for the same reason.
if command -v iptables >/dev/null; then
  for table in filter nat mangle raw; do
    iptables -t "$table" -S 2>/dev/null | grep -v -E '^-P [A-Z]+ ACCEPT$' | sed "s/^/iptables $table /"
  done
fi
exit 0
