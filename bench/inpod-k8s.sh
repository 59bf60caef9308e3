#!/usr/bin/env bash
# In-pod capture on the test cluster (bench/README.md, "In-pod capture on
# Kubernetes"). Not part of make test; needs root (the cluster).
#
#   bench/inpod-k8s.sh [pair]   throughput, connection rate and fortio latency
#                               between two captured pods against the same
#                               pair in a namespace outside the mesh, one run
#   bench/inpod-k8s.sh restart  new connections at a fixed rate and held ones
#                               from a captured pod while the node proxy pod
#                               is deleted and the DaemonSet recreates it
#                               (HOW=delete, the default) or the DaemonSet
#                               is rolled (HOW=rollout: kubectl rollout restart)
#
# Uses the running cluster (make cluster) or brings one up and removes it
# afterwards. Installs the mesh (bin/cluster-images/mesh, images.sh) if absent.
# ROUNDS (3), SECONDS_PER (10), QPS (200), FORTIO_T (20s), GAP_T (60s),
# GAP_RATE (100) tune it. Prints `bench: <name> <value> <unit>` lines.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
REPO=$(cd "$HERE/.." && pwd)
# shellcheck source=../hack/cluster/lib.sh
. "$REPO/hack/cluster/lib.sh"
need_root
mode=${1:-pair}
ROUNDS=${ROUNDS:-3}
SECONDS_PER=${SECONDS_PER:-10}
QPS=${QPS:-200}
FORTIO_T=${FORTIO_T:-20s}
GAP_T=${GAP_T:-60s}
GAP_RATE=${GAP_RATE:-100}
HOW=${HOW:-delete}
MESH_NS=cw-bench-mesh
PLAIN_NS=cw-bench-plain
k() { kubectl_admin "$@"; }
say() { printf '[bench %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }

cluster_for_run inpod-k8s
if ! k -n causeway-system get daemonset causeway-nodeproxy >/dev/null 2>&1; then
  "$REPO/hack/cluster/images.sh" all
  k apply --server-side -k "$REPO/bin/cluster-images/mesh" >/dev/null
fi
k -n causeway-system rollout status daemonset/causeway-nodeproxy --timeout=180s >/dev/null
k -n causeway-system rollout status deployment/causeway-controlplane --timeout=180s >/dev/null

# The workload images: bench/inpod and fortio.
"$HERE/images-k8s.sh" inpod fortio
INPOD_IMAGE=$(awk '$1 == "inpod" {print $2}' "$REPO/bin/cluster-images/bench.txt")
FORTIO_IMAGE=$(awk '$1 == "fortio" {print $2}' "$REPO/bin/cluster-images/bench.txt")

# Two pods per namespace: a server (sink + request/response, fortio server)
# and a client (both programs idle, run through kubectl exec).
pods() {
  local ns=$1
  for role in server client; do
    local cmd='[serve]'
    [ $role = client ] && cmd='[idle]'
    cat <<EOF
---
apiVersion: v1
kind: Pod
metadata: {name: $role, namespace: $ns, labels: {app: bench-$role}}
spec:
  terminationGracePeriodSeconds: 1
  containers:
  - {name: inpod, image: $INPOD_IMAGE, imagePullPolicy: IfNotPresent, args: $cmd}
  - {name: fortio, image: $FORTIO_IMAGE, imagePullPolicy: IfNotPresent, args: [server, -http-port, "8080", -grpc-port, disabled, -redirect-port, disabled, -tcp-port, disabled, -udp-port, disabled]}
EOF
  done
}
k create namespace $MESH_NS --dry-run=client -o yaml | k apply -f - >/dev/null
k label namespace $MESH_NS causeway.dev/dataplane-mode=mesh --overwrite >/dev/null
k create namespace $PLAIN_NS --dry-run=client -o yaml | k apply -f - >/dev/null
# Fresh pods each run: the images keep their tag when the programs change.
for ns in $MESH_NS $PLAIN_NS; do k -n $ns delete pod --all --wait=true >/dev/null; done
{ pods $MESH_NS; pods $PLAIN_NS; } | k apply -f - >/dev/null
for ns in $MESH_NS $PLAIN_NS; do k -n $ns wait --for=condition=Ready pod --all --timeout=120s >/dev/null; done
MESH_IP=$(k -n $MESH_NS get pod server -o jsonpath='{.status.podIP}')
PLAIN_IP=$(k -n $PLAIN_NS get pod server -o jsonpath='{.status.podIP}')
say "servers: mesh $MESH_IP, plain $PLAIN_IP; load: $(uptime)"

# run NS ARGS...: the inpod client in NS's client pod.
run() { local ns=$1; shift; k -n "$ns" exec client -c inpod -- /usr/local/bin/inpod "$@"; }
ip_of() { if [ "$1" = $MESH_NS ]; then echo "$MESH_IP"; else echo "$PLAIN_IP"; fi; }
name_of() { if [ "$1" = $MESH_NS ]; then echo mesh; else echo plain; fi; }
value() { awk -v n="$1" '$1 == "bench:" && $2 == n { print $3 }'; }
median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.3f", a / b }'; }
report() { printf 'bench: %s %s %s\n' "$1" "$2" "$3"; }

# nodeproxy_opened DIRECTION: connections the node proxy opened in that
# direction (outbound: from the client pod's 15001; inbound: HBONE into the
# server pod's 15008) with the mesh namespace's identity as the destination:
# proof that the mesh pair is captured on both ends.
nodeproxy_opened() {
  nodeproxy_metrics | awk -v want="destination_principal=\"spiffe://cluster.local/ns/$MESH_NS/" -v dir="direction=\"$1\"" \
    '/^tcp_connections_opened_total/ && index($0, want) && index($0, dir) { s += $NF } END { print s + 0 }'
}

# nodeproxy_metrics: the node proxy's /metrics (on the pod bridge only).
nodeproxy_metrics() {
  local ip
  ip=$(k -n causeway-system get pod -l app.kubernetes.io/name=causeway-nodeproxy -o jsonpath='{.items[0].status.podIP}')
  ip route get "$ip" | grep -q "dev $POD_BRIDGE" || die "$ip is not on $POD_BRIDGE"
  curl -sf "http://$ip:15020/metrics"
}

# netns_of IP: the network namespace (as `ip netns` names it) that holds
# address IP, empty when none does.
netns_of() {
  local n
  for n in $(ip netns list | awk '{ print $1 }'); do
    if ip netns exec "$n" ip -4 -o addr show | grep -qF " $1/"; then echo "$n"; return; fi
  done
}

# timewait IP, conntrack_of IP: TIME_WAIT sockets and conntrack entries
# in the network namespace of the pod with address IP ("?" when it is not
# found).
timewait() {
  local n
  n=$(netns_of "$1")
  if [ -n "$n" ]; then ip netns exec "$n" ss -Htan state time-wait | wc -l; else echo '?'; fi
}
conntrack_of() {
  local n
  n=$(netns_of "$1")
  if [ -n "$n" ]; then ip netns exec "$n" cat /proc/sys/net/netfilter/nf_conntrack_count; else echo '?'; fi
}

# state: what could wear down round after round (issue 36 item 6): the
# node proxy's goroutines and open files, conntrack entries (host, mesh
# client pod, mesh server pod) and TIME_WAIT sockets in each client and
# server pod.
state() {
  local metrics mc pc
  metrics=$(nodeproxy_metrics)
  mc=$(k -n $MESH_NS get pod client -o jsonpath='{.status.podIP}')
  pc=$(k -n $PLAIN_NS get pod client -o jsonpath='{.status.podIP}')
  printf 'node proxy goroutines %s open files %s; conntrack host %s, mesh client %s, mesh server %s; TIME_WAIT mesh client %s server %s, plain client %s server %s' \
    "$(awk '$1 == "go_goroutines" { print $2 }' <<<"$metrics")" "$(awk '$1 == "process_open_fds" { print $2 }' <<<"$metrics")" \
    "$(cat /proc/sys/net/netfilter/nf_conntrack_count)" \
    "$(conntrack_of "$mc")" "$(conntrack_of "$MESH_IP")" \
    "$(timewait "$mc")" "$(timewait "$MESH_IP")" "$(timewait "$pc")" "$(timewait "$PLAIN_IP")"
}

pair() {
  local out0 in0
  out0=$(nodeproxy_opened outbound)
  in0=$(nodeproxy_opened inbound)
  declare -A tput crr
  for r in $(seq "$ROUNDS"); do
    for ns in $PLAIN_NS $MESH_NS; do
      tput[$ns]+="$(run $ns stream -to "$(ip_of $ns)" -t "${SECONDS_PER}s" | value throughput) "
      crr[$ns]+="$(run $ns crr -to "$(ip_of $ns)" -t "${SECONDS_PER}s" -c 4 | value connections) "
    done
    say "round $r: throughput ${tput[$PLAIN_NS]}/ ${tput[$MESH_NS]}; conn/s ${crr[$PLAIN_NS]}/ ${crr[$MESH_NS]}"
    say "after round $r: $(state)"
  done
  declare -A p50 p99
  for ns in $PLAIN_NS $MESH_NS; do
    local out
    out=$(k -n "$ns" exec client -c fortio -- /usr/local/bin/fortio load -quiet -qps "$QPS" -c 4 -t "$FORTIO_T" \
      -r 0.00001 -p 50,99 -json - "http://$(ip_of $ns):8080/echo" 2>/dev/null)
    p50[$ns]=$(jq '.DurationHistogram.Percentiles[] | select(.Percentile == 50) | .Value * 1000' <<<"$out")
    p99[$ns]=$(jq '.DurationHistogram.Percentiles[] | select(.Percentile == 99) | .Value * 1000' <<<"$out")
    say "fortio $(name_of $ns): $(jq -c '{qps: .ActualQPS, codes: .RetCodes}' <<<"$out")"
  done
  for ns in $PLAIN_NS $MESH_NS; do
    local n
    n=$(name_of $ns)
    report "${n}_throughput" "$(tr ' ' '\n' <<<"${tput[$ns]}" | grep . | median)" MB/s
    report "${n}_connections" "$(tr ' ' '\n' <<<"${crr[$ns]}" | grep . | median)" conn/s
    report "${n}_latency_p50" "${p50[$ns]}" ms
    report "${n}_latency_p99" "${p99[$ns]}" ms
  done
  local m p
  m=$(tr ' ' '\n' <<<"${tput[$MESH_NS]}" | grep . | median); p=$(tr ' ' '\n' <<<"${tput[$PLAIN_NS]}" | grep . | median)
  report mesh_vs_plain_throughput_ratio "$(ratio "$m" "$p")" x
  m=$(tr ' ' '\n' <<<"${crr[$MESH_NS]}" | grep . | median); p=$(tr ' ' '\n' <<<"${crr[$PLAIN_NS]}" | grep . | median)
  report mesh_vs_plain_connections_ratio "$(ratio "$m" "$p")" x
  report mesh_vs_plain_latency_p50_ratio "$(ratio "${p50[$MESH_NS]}" "${p50[$PLAIN_NS]}")" x
  report mesh_vs_plain_latency_p99_ratio "$(ratio "${p99[$MESH_NS]}" "${p99[$PLAIN_NS]}")" x
  report mesh_nodeproxy_outbound_opened "$(($(nodeproxy_opened outbound) - out0))" conn
  report mesh_nodeproxy_inbound_opened "$(($(nodeproxy_opened inbound) - in0))" conn
  say "load: $(uptime)"
}

restart() {
  local old out start
  old=$(k -n causeway-system get pod -l app.kubernetes.io/name=causeway-nodeproxy -o jsonpath='{.items[0].metadata.name}')
  out=$(mktemp)
  start=$(date +%s.%N)
  run $MESH_NS gap -to "$MESH_IP" -t "$GAP_T" -rate "$GAP_RATE" -hold 8 -name restart >"$out" &
  local client=$!
  sleep 10
  local del
  del=$(date +%s.%N)
  case $HOW in
    delete) say "deleting $old"; k -n causeway-system delete pod "$old" --wait=false >/dev/null ;;
    rollout) say "rolling the DaemonSet"; k -n causeway-system rollout restart daemonset/causeway-nodeproxy >/dev/null ;;
    *) die "HOW=$HOW: want delete or rollout" ;;
  esac
  # Until the new pod is ready and the old one is gone, noting when each
  # happened.
  local new="" ready="" gone=""
  while [ -z "$ready" ] || [ -z "$gone" ]; do
    if [ -z "$ready" ]; then
      new=$(k -n causeway-system get pod -l app.kubernetes.io/name=causeway-nodeproxy \
        -o jsonpath='{range .items[?(@.metadata.name!="'"$old"'")]}{.metadata.name}{"\t"}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}' |
        awk '$2 == "True" { print $1 }')
      [ -z "$new" ] || { ready=$(date +%s.%N); say "$new ready"; }
    fi
    if [ -z "$gone" ] && ! k -n causeway-system get pod "$old" >/dev/null 2>&1; then
      gone=$(date +%s.%N); say "$old gone"
    fi
    sleep 0.2
  done
  wait $client
  cat "$out"
  rm -f "$out"
  report restart_old_pod_gone_at "$(awk -v a="$gone" -v s="$start" 'BEGIN { printf "%.3f", a - s }')" s
  report restart_fault_at "$(awk -v a="$del" -v s="$start" 'BEGIN { printf "%.3f", a - s }')" s
  report restart_new_pod_ready_at "$(awk -v a="$ready" -v s="$start" 'BEGIN { printf "%.3f", a - s }')" s
  say "load: $(uptime)"
}

case $mode in
  pair) pair ;;
  restart) restart ;;
  *) die "usage: $0 [pair|restart]" ;;
esac
