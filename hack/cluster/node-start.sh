#!/usr/bin/env bash
# node-start.sh I: extra node I, stopped by node-stop.sh, boots again: its
# underlay link up, then its containerd, kubelet and kube-proxy as up.sh
# started them; returns once the node is Ready. Its pods come back as after
# a reboot without a drain: the kubelet makes every sandbox anew, in no
# order of ours (docs/cluster.md "Losing a node").
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

need_root
i=${1:-}
need_extra_node node-start.sh "$i"
name=$(node_name "$i")
t=$SECONDS
ip link set "cw-n$i" up
start_node_daemons "$i"
step "$name: started in $((SECONDS - t))s"
