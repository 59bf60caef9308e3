#!/usr/bin/env bash
# Removes every trace of the test cluster (make cluster-down): pods (so the
# CNI plugin releases their addresses), every node's daemons, kube-proxy's
# rules, the guard chain, the extra nodes' namespaces, bridges, routes, pod
# network namespaces, CNI files, kubelet mounts and cgroups, and puts back
# the sysctls up.sh recorded; then leftovers.sh checks that nothing is left. Harmless to run
# twice, and after a half start.
set -uo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

need_root
BEFORE=$CLUSTER_DIR/before

api_up() { kubectl_admin get --raw /readyz --request-timeout=3s >/dev/null 2>&1; }

# stop NAME: SIGTERM, up to 15 s, then SIGKILL; by recorded pid only.
stop() {
  local name=$1 f=$CLUSTER_DIR/run/$1.pid pid
  [ -f "$f" ] || return 0
  pid=$(cat "$f")
  if pid_alive "$name"; then
    step "$name: stopping (pid $pid)"
    kill "$pid" 2>/dev/null
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || break; sleep 0.5; done
    kill -9 "$pid" 2>/dev/null
  fi
  rm -f "$f"
}

# extra_nodes: the names of the extra nodes up.sh added (whatever NODES is
# now).
extra_nodes() {
  local d
  for d in "$NODES_DIR"/*/; do [ -d "$d" ] && basename "$d"; done
}

# kubepods_cgroups: the kubelets' pod cgroups in every cgroup v1 hierarchy
# (and the v2 tree), and the extra nodes' cgroup roots, deepest first.
kubepods_cgroups() {
  local h
  for h in /sys/fs/cgroup/*/kubepods /sys/fs/cgroup/kubepods /sys/fs/cgroup/*/"$NODE_NAME"-*; do
    [ -d "$h" ] && find "$h" -depth -type d
  done
}

if [ -x "$K8S_BIN/kubectl" ] && [ -f "$KUBECONFIG_ADMIN" ] && api_up; then
  # Without the controllers nothing recreates the pods deleted next.
  stop kube-controller-manager
  stop kube-scheduler
  if pid_alive kubelet; then
    step "pods: deleting all (the kubelet runs CNI DEL for each)"
    kubectl_admin delete pods --all --all-namespaces --grace-period=1 --wait --timeout=60s >/dev/null 2>&1 ||
      step "pods: not all gone in 60s, removing what is left by force"
  fi
fi

# The extra nodes at once (each daemon takes a second or two to stop).
for n in $(extra_nodes); do
  (for ((i = ${#NODE_DAEMONS[@]} - 1; i >= 0; i--)); do stop "${NODE_DAEMONS[i]}@$n"; done) &
done
wait
for ((i = ${#DAEMONS[@]} - 1; i >= 0; i--)); do stop "${DAEMONS[i]}"; done

# Containers the kubelets did not get to: their shims (found by a socket of
# ours in their command line) and the processes left in the pod cgroups.
for p in /proc/[0-9]*; do
  case $(tr '\0' ' ' 2>/dev/null <"$p/cmdline") in
    *containerd-shim*"-address $RUN_DIR/"*) kill -9 "${p#/proc/}" 2>/dev/null ;;
  esac
done
for cg in $(kubepods_cgroups); do
  [ -f "$cg/cgroup.procs" ] && xargs -r kill -9 <"$cg/cgroup.procs" 2>/dev/null
done

if [ -x "$K8S_BIN/kube-proxy" ]; then
  step "kube-proxy: --cleanup (its iptables rules)"
  "$K8S_BIN/kube-proxy" --cleanup >/dev/null 2>&1
fi
# What --cleanup leaves: the kubelet's KUBE-FIREWALL, KUBE-KUBELET-CANARY and
# KUBE-IPTABLES-HINT, in both families. Only this cluster may run Kubernetes
# here, so every KUBE- chain is ours.
step "iptables: the kubelet's KUBE- chains"
for ipt in iptables ip6tables; do
  for t in filter nat mangle raw; do
    "$ipt-save" -t "$t" 2>/dev/null | grep -E '^-A (INPUT|OUTPUT|FORWARD|PREROUTING|POSTROUTING) .*-j KUBE-' |
      while IFS= read -r rule; do eval "$ipt -w -t $t ${rule/#-A/-D}"; done
    chains=$("$ipt-save" -t "$t" 2>/dev/null | sed -n 's/^:\(KUBE-[^ ]*\) .*/\1/p')
    for c in $chains; do "$ipt" -w -t "$t" -F "$c"; done
    for c in $chains; do "$ipt" -w -t "$t" -X "$c"; done
  done
done

step "network: guard chain, nodes' network namespaces, bridges, routes, pod network namespaces"
# An extra node's namespace takes its veth, its iptables rules and its
# routes with it (its pods' namespaces went with their pods).
for n in $(extra_nodes); do
  ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$n" && ip netns delete "$n"
done
for c in OUTPUT FORWARD; do
  while iptables -w -D "$c" -j "$GUARD_CHAIN" 2>/dev/null; do :; done
done
iptables -w -F "$GUARD_CHAIN" 2>/dev/null && iptables -w -X "$GUARD_CHAIN"
for ns in $(ip netns list 2>/dev/null | awk '$1 ~ /^cni-/ {print $1}'); do
  grep -qx "$ns" "$BEFORE/netns" 2>/dev/null || ip netns delete "$ns"
done
if [ -f "$BEFORE/netns-mount" ]; then umount /run/netns 2>/dev/null || umount -l /run/netns; fi
# An extra node's veth goes with its namespace, which its mount namespace's
# /sys holds until that is unmounted below: take it now.
for l in $(ip -o link show | awk -F': ' '{sub(/@.*/, "", $2); print $2}' | grep -E '^cw-n[0-9]+$'); do
  ip link delete "$l" 2>/dev/null || true # gone meanwhile with its namespace
done
for l in "$POD_BRIDGE" "$NODE_BRIDGE"; do
  ip link show "$l" >/dev/null 2>&1 && ip link delete "$l"
done
for r in "$CLUSTER_CIDR" "$NODE_RANGE"; do
  ip route show type blackhole "$r" | grep -q . && ip route delete blackhole "$r"
done
for r in "$SERVICE_CIDR" "$STATIC_ADDRESS_RANGE"; do
  if ip route show "$r" | grep -q .; then ip route delete "$r"; fi
done

step "mounts and cgroups: kubelet and containerd"
# Deepest first; the kubelet bind-mounts its root rshared.
for m in $(awk -v a="$CLUSTER_DIR" -v b="$RUN_DIR" 'index($5, a) == 1 || index($5, b) == 1 {print $5}' /proc/self/mountinfo | sort -r); do
  umount "$m" 2>/dev/null || umount -l "$m"
done
for cg in $(kubepods_cgroups); do rmdir "$cg" 2>/dev/null; done

step "host files: CNI configuration and plugins, CNI state, kubelet directories"
for d in "${TRACKED_DIRS[@]}"; do
  [ -d "$d" ] || continue
  list=$BEFORE/$(dir_key "$d")
  if [ ! -f "$list" ]; then
    [ -d "$BEFORE" ] && rm -rf "$d"
    continue
  fi
  for e in $(ls -A "$d"); do grep -qxF "$e" "$list" || rm -rf "${d:?}/$e"; done
done

if [ -f "$BEFORE/sysctls" ]; then
  step "sysctls: restoring $(tr '\n' ' ' <"$BEFORE/sysctls")"
  while IFS= read -r kv; do sysctl -q -w "$kv" >/dev/null; done <"$BEFORE/sysctls"
fi

rm -rf "$RUN_DIR" "$CLUSTER_DIR"
"$HERE/leftovers.sh" || die "cluster-down left the above behind"
step "cluster removed"
