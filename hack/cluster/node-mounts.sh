#!/usr/bin/env bash
# node-mounts.sh NODE: runs once in an extra node's new mount and UTS
# namespaces, already in its network namespace (up.sh add_node starts it with
# nsenter --net + unshare --mount --uts). It makes the node's fixed paths its
# own, as a machine of its own has them: every NODE_PATHS directory is
# $NODES_DIR/NODE/root/<path>, so the runtime, the kubelet and a pod's
# hostPath volume see the node's files and not the host's.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

name=$1
root=$NODES_DIR/$name/root
hostname "$name"

# The copies of the cluster's own mounts (the host node's pod volumes, the
# other nodes' namespace files, the host's /run/netns and its pod network
# namespaces) are not this node's, and would keep what they hold alive.
for m in $(awk -v a="$CLUSTER_DIR/" -v b="$RUN_DIR/" '
    index($5, a) == 1 || index($5, b) == 1 || $5 == "/run/netns" || index($5, "/run/netns/") == 1 {print $5}' \
  /proc/self/mountinfo | sort -ru); do
  umount -l "$m" 2>/dev/null || true
done

# /sys as this network namespace shows it (its own links); a fresh sysfs
# hides the cgroup tree, which moves over onto it ("ip netns exec" would
# remount /sys without it, and the kubelet needs it).
cg=$RUN_DIR/nodes/$name/cgroup
mount --rbind /sys/fs/cgroup "$cg"
mount -t sysfs sysfs /sys
mount --move "$cg" /sys/fs/cgroup

for p in "${NODE_PATHS[@]}"; do
  mkdir -p "$root$p" "$p"
  mount --bind "$root$p" "$p"
done
# A DaemonSet volume with mountPropagation HostToContainer needs a shared
# source; a machine under systemd has one.
mount --make-shared /run/netns
