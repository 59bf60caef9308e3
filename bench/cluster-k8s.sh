#!/usr/bin/env bash
# What the test cluster itself costs (bench/README.md, "The test cluster"):
# for each node count, ROUNDS times, the time `make cluster` takes from
# nothing to every node Ready with CoreDNS answering, and the resident
# memory of its daemons once up (shared control plane and registry; each
# node's containerd, kubelet and kube-proxy; the pods' processes not
# counted), then cluster-down. Prints "bench: <name> <value> <unit>" lines
# and the medians. Needs root and no running cluster.
#
#   bench/cluster-k8s.sh            # 1 and 3 nodes, 3 rounds each
#   NODE_COUNTS="3" ROUNDS=1 bench/cluster-k8s.sh
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
CLUSTER=$HERE/../hack/cluster
# shellcheck source=../hack/cluster/lib.sh
. "$CLUSTER/lib.sh"

need_root
cluster_running && die "a test cluster is running: this benchmark brings its own up and down"
NODE_COUNTS=${NODE_COUNTS:-1 3}
ROUNDS=${ROUNDS:-3}

# rss_mib DAEMON: the resident memory of DAEMON's recorded process, MiB.
rss_mib() {
  local pid
  pid=$(cat "$CLUSTER_DIR/run/$1.pid")
  awk '/^VmRSS:/ {printf "%.1f", $2 / 1024}' "/proc/$pid/status"
}

add() { awk -v a="$1" -v b="$2" 'BEGIN {printf "%.1f", a + b}'; }
median() { sort -n | awk '{v[NR]=$1} END {print (NR % 2) ? v[(NR+1)/2] : (v[NR/2]+v[NR/2+1])/2}'; }

declare -A samples
for n in $NODE_COUNTS; do
  for ((r = 1; r <= ROUNDS; r++)); do
    t0=$(date +%s.%N)
    NODES=$n "$CLUSTER/up.sh" >/dev/null
    up=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN {printf "%.1f", b - a}')
    shared=0
    for d in etcd kube-apiserver kube-controller-manager kube-scheduler registry; do
      shared=$(add "$shared" "$(rss_mib "$d")")
    done
    total=$shared
    for ((i = 1; i <= n; i++)); do
      node=0
      for d in "${NODE_DAEMONS[@]}"; do
        if [ "$i" = 1 ]; then d1=$d; else d1=$d@$(node_name "$i"); fi
        node=$(add "$node" "$(rss_mib "$d1")")
      done
      echo "bench: cluster_${n}nodes_round${r}_node${i}_rss $node MiB"
      samples[$n.node]+="$node "
      total=$(add "$total" "$node")
    done
    echo "bench: cluster_${n}nodes_round${r}_up $up s"
    echo "bench: cluster_${n}nodes_round${r}_shared_rss $shared MiB"
    echo "bench: cluster_${n}nodes_round${r}_total_rss $total MiB"
    samples[$n.up]+="$up "
    samples[$n.shared]+="$shared "
    samples[$n.total]+="$total "
    "$CLUSTER/down.sh" >/dev/null
  done
  for k in up shared total node; do
    unit=MiB
    [ "$k" = up ] && unit=s
    echo "bench: cluster_${n}nodes_${k}$([ "$k" = up ] || echo _rss)_median $(tr ' ' '\n' <<<"${samples[$n.$k]}" | grep . | median) $unit"
  done
done
