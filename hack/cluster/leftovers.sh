#!/usr/bin/env bash
# Lists whatever of the test cluster is still on the host (down.sh runs it
# last; run it by hand after `make cluster-down`): processes naming the
# cluster's directories, network namespaces, links, routes, iptables chains,
# mounts, cgroups and files. Exits 1 when anything is left.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

left=0
report() {
  local what=$1 found
  found=$(cat)
  [ -z "$found" ] && return
  left=1
  printf 'cluster leftover: %s:\n' "$what" >&2
  sed 's/^/  /' <<<"$found" >&2
}

# Processes: the cluster's daemons and container shims, whose command lines
# name its directories (configurations, data, sockets); not a client such
# as kubectl with its kubeconfig. Containers are in the cgroups below.
for p in /proc/[0-9]*; do
  exe=$(readlink "$p/exe" 2>/dev/null) || continue
  case ${exe##*/} in
    containerd-shim* | containerd) ;;
    *) [[ " ${DAEMONS[*]} " == *" ${exe##*/} "* ]] || continue ;;
  esac
  c=$(tr '\0' ' ' 2>/dev/null <"$p/cmdline") || continue
  case $c in *"$CLUSTER_DIR"* | *"$RUN_DIR"*) echo "pid ${p#/proc/}: $c" ;; esac
done | report processes

ip netns list 2>/dev/null | awk -v n="$NODE_NAME" '$1 == n || index($1, n "-") == 1 || $1 ~ /^cni-/ {print $1}' |
  report "network namespaces"
for l in "$NODE_BRIDGE" "$POD_BRIDGE"; do
  ip link show "$l" >/dev/null 2>&1 && echo "$l"
done | report links
ip -o link show | awk -F': ' '{sub(/@.*/, "", $2); print $2}' | grep -E '^cw-n[0-9]+$' | report "node veths"
for r in "$CLUSTER_CIDR" "$NODE_RANGE" "$SERVICE_CIDR" "$STATIC_ADDRESS_RANGE"; do
  ip -4 route show table all root "$r"
done | report routes
for ipt in iptables ip6tables; do
  for t in filter nat mangle raw; do
    "$ipt-save" -t "$t" 2>/dev/null | grep -E "^:(KUBE-|$GUARD_CHAIN )" | sed "s/^/$ipt -t $t /"
  done
done | report "iptables chains"
awk -v a="$CLUSTER_DIR" -v b="$RUN_DIR" -v n="/run/netns/$NODE_NAME" '
  index($5, a) == 1 || index($5, b) == 1 || index($5, n) == 1 || index($5, "/run/netns/cni-") == 1 {print $5}' \
  /proc/self/mountinfo | report mounts
for h in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/"$NODE_NAME"-*; do
  [ -d "$h" ] && echo "$h"
done | report cgroups
for f in "$CLUSTER_DIR" "$RUN_DIR" "$CNI_CONF" /var/lib/cni/networks/causeway; do
  [ -e "$f" ] && echo "$f"
done | report files
exit $left
