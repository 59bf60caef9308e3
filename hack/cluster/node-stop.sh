#!/usr/bin/env bash
# node-stop.sh I: extra node I of the running test cluster (2..NODES) is
# lost at once, as a machine whose power is cut: its containerd, kubelet
# and kube-proxy and every process of its pods are killed (SIGKILL, no
# drain, no CNI DEL), its pods' network namespaces go as a reboot loses
# them, and its underlay link goes down, so the rest of the cluster sees
# nothing more from it, not even a reset. node-start.sh I brings it back
# (docs/cluster.md "Losing a node"). Its files, its own network namespace
# and its mount namespace stay, as a machine's disk does.
#
# node-stop.sh --daemons I kills only the node's containerd, kubelet and
# kube-proxy (SIGKILL), as a crash of the runtime and the kubelet: the
# pods, their sandboxes and the link stay.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

need_root
daemons_only=false
if [ "${1:-}" = --daemons ]; then daemons_only=true && shift; fi
i=${1:-}
need_extra_node "node-stop.sh [--daemons]" "$i"
name=$(node_name "$i") run=$RUN_DIR/nodes/$name

kill_daemons() {
  local d
  for d in "${NODE_DAEMONS[@]}"; do
    if pid_alive "$d@$name"; then kill -9 "$(cat "$CLUSTER_DIR/run/$d@$name.pid")"; fi
  done
}
if $daemons_only; then
  kill_daemons
  step "$name: containerd, kubelet and kube-proxy killed (the pods run on)"
  exit 0
fi

step "$name: lost (daemons and pods killed, pods' network namespaces gone, cw-n$i down)"
# The link first: from now on nothing the node still sends arrives.
ip link set "cw-n$i" down
kill_daemons
# The containers' shims (by the node's containerd socket in their command
# line), then whatever runs in the node's cgroups, until nothing does
# (a process may fork while its siblings die).
for p in /proc/[0-9]*; do
  case $(tr '\0' ' ' 2>/dev/null <"$p/cmdline") in
    *containerd-shim*"-address $run/containerd.sock"*) kill -9 "${p#/proc/}" 2>/dev/null || true ;;
  esac
done
for _ in $(seq 50); do
  procs=$(find /sys/fs/cgroup/*/"$name" -name cgroup.procs -exec cat {} + 2>/dev/null | sort -u) || true
  [ -z "$procs" ] && break
  # shellcheck disable=SC2086 # one pid a word
  kill -9 $procs 2>/dev/null || true
  sleep 0.1
done
[ -z "$procs" ] || die "$name: processes left in its cgroups: $procs"
# The pods' network namespaces (bound under the node's /run/netns, in its
# mount namespace): a reboot loses them, and with them the pods' links
# and capture rules.
nsenter --mount="$run/mnt" sh -c 'for n in /run/netns/cni-*; do [ -e "$n" ] || continue; umount "$n" && rm -f "$n"; done'
step "$name: stopped"
