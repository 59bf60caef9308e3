# Shared settings of the test cluster (sourced by build.sh, up.sh, down.sh,
# images.sh, e2e.sh, leftovers.sh); docs/cluster.md describes its design. Everything the cluster owns on the host is named here,
# so cluster-down can remove exactly that.
# shellcheck shell=bash

K8S_VERSION=v1.37.2
COREDNS_VERSION=v1.15.0
# CNCF distribution (`go list -m -versions github.com/distribution/distribution/v3`).
REGISTRY_VERSION=v3.1.2

CACHE=${CAUSEWAY_CACHE:-$HOME/.cache/causeway}
K8S_BIN=$CACHE/k8s-$K8S_VERSION/bin
# The plugins CoreDNS is built with (build.sh): those of coredns.yaml's
# Corefile, and forward and whoami for the Corefile of the conformance
# suite's coredns (conformance.sh pushes the same binary as its image). The
# cache is keyed by the list too, so a change to it builds anew.
COREDNS_PLUGINS=(reload ready health metrics errors log cache kubernetes forward whoami)
COREDNS_DIRECTIVES=(reload ready health prometheus errors log cache kubernetes forward whoami) # plugin.cfg order
COREDNS_BIN=$CACHE/coredns-$COREDNS_VERSION-$(printf '%s ' "${COREDNS_PLUGINS[@]}" | sha256sum | cut -c1-8)/bin
REGISTRY_BIN=$CACHE/distribution-$REGISTRY_VERSION/bin

# State of the running cluster: certificates, configs, logs, pid files, etcd
# data, the kubelet's root. admin.kubeconfig in it is the published kubeconfig.
CLUSTER_DIR=${CAUSEWAY_CLUSTER_DIR:-/var/lib/causeway-cluster}
RUN_DIR=/run/causeway-cluster
KUBECONFIG_ADMIN=$CLUSTER_DIR/admin.kubeconfig
LOG=$CLUSTER_DIR/log
CONTAINERD_SOCK=$RUN_DIR/containerd.sock

NODE_NAME=causeway-node
# The node address lives on an empty bridge (this kernel has no dummy links);
# the pod range on the CNI bridge; the service range, and the range static
# ingress Gateway addresses come from (as a network routes such addresses
# to the nodes), are routed to the node bridge. None of these is reachable
# off the machine (see the guard chain).
NODE_BRIDGE=cw-node
NODE_IP=10.250.0.1
NODE_RANGE=10.250.0.0/24
POD_BRIDGE=cni0
CLUSTER_CIDR=10.244.0.0/16
POD_CIDR=10.244.0.0/24
SERVICE_CIDR=10.96.0.0/24
STATIC_ADDRESS_RANGE=10.250.1.0/28
API_SERVICE_IP=10.96.0.1
DNS_SERVICE_IP=10.96.0.10
CLUSTER_DOMAIN=cluster.local
GUARD_CHAIN=CAUSEWAY-CLUSTER-GUARD

ETCD_URL=http://127.0.0.1:12379
ETCD_PEER_URL=http://127.0.0.1:12380
API_URL=https://$NODE_IP:6443

CNI_CONF=/etc/cni/net.d/10-causeway-bridge.conflist

# NODES (make cluster NODES=3): the host is node 1 ($NODE_NAME, the control
# plane's machine); node i > 1 is causeway-node-<i> at 10.250.0.<i> with
# its own network, mount and UTS namespaces, cgroup root, containerd,
# kubelet and kube-proxy (up.sh add_node). Each extra node keeps its state
# in $NODES_DIR/<name> and its namespace files in $RUN_DIR/nodes/<name>.
NODES=${NODES:-1}
MAX_NODES=9
NODES_DIR=$CLUSTER_DIR/nodes
node_name() { if [ "$1" = 1 ]; then echo "$NODE_NAME"; else echo "$NODE_NAME-$1"; fi; }
node_ip() { echo "${NODE_IP%.*}.$1"; }
# The paths a pod's hostPath or the runtime sees at fixed places, which an
# extra node gets from directories of its own ($NODES_DIR/<name>/root/<path>).
NODE_PATHS=(/etc/cni/net.d /opt/cni/bin /var/lib/cni /var/lib/kubelet /var/log/pods
  /var/log/containers /run/containerd /var/lib/containerd /run/netns /run/causeway)

# Sysctls the kubelet, kube-proxy and the bridge plugin may change; up.sh
# records them once and down.sh puts them back.
SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward
  net.ipv4.conf.all.route_localnet net.bridge.bridge-nf-call-iptables
  net.bridge.bridge-nf-call-ip6tables)

# Daemons in start order (down.sh stops them in reverse).
DAEMONS=(etcd kube-apiserver kube-controller-manager kube-scheduler registry containerd kubelet kube-proxy)
# Those of an extra node, each run as DAEMON@NODE.
NODE_DAEMONS=(containerd kubelet kube-proxy)

# The cluster's image registry (CNCF distribution): on the node bridge, so
# every node (and a node in a network namespace) routes to it; TLS with a
# certificate of the cluster's CA, which containerd trusts for this host
# alone (docs/images.md). Its data lives in $CLUSTER_DIR/registry.
REGISTRY_HOST=$NODE_IP:5000
IMAGE_PAUSE=$REGISTRY_HOST/causeway/pause:dev
IMAGE_COREDNS=$REGISTRY_HOST/causeway/coredns:$COREDNS_VERSION

step() { printf '[cluster %s] %s\n' "$(date +%H:%M:%S)" "$*"; }
die() { printf '[cluster %s] error: %s\n' "$(date +%H:%M:%S)" "$*" >&2; exit 1; }

need_root() {
  [ "$(id -u)" = 0 ] || die "must run as root (it creates bridges, iptables rules, cgroups and mounts)"
}

# pid_alive NAME: true when NAME's recorded process is running (checked by
# its executable's name too, so a stale pid file never names a stranger).
# An extra node's daemon is DAEMON@NODE.
pid_alive() {
  local f=$CLUSTER_DIR/run/$1.pid exe
  [ -f "$f" ] || return 1
  exe=$(readlink "/proc/$(cat "$f")/exe" 2>/dev/null) || return 1
  [ "${exe##*/}" = "${1%%@*}" ]
}

# default_devices: devices holding an IPv4 default route (where the guard drops).
default_devices() { ip -4 route show default | awk '{for (i=1;i<NF;i++) if ($i=="dev") print $(i+1)}' | sort -u; }

kubectl_admin() { "$K8S_BIN/kubectl" --kubeconfig "$KUBECONFIG_ADMIN" "$@"; }
# cluster_running: the test cluster is up and its API server answers.
cluster_running() {
  [ -x "$K8S_BIN/kubectl" ] && [ -f "$KUBECONFIG_ADMIN" ] &&
    kubectl_admin get --raw /readyz --request-timeout=3s >/dev/null 2>&1
}
# cluster_for_run WHAT: uses the running test cluster, or brings one up and
# removes it when the calling script exits (also when it fails).
cluster_for_run() {
  local hack
  hack=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  if cluster_running; then
    step "$1: using the running cluster"
  else
    step "$1: bringing a cluster of $NODES node(s) up for this run (removed afterwards)"
    # down.sh fails the run when it leaves anything behind.
    # shellcheck disable=SC2064 # the path, now
    trap "'$hack/down.sh' || exit 1" EXIT
    "$hack/up.sh"
  fi
}

# Host directories the cluster writes into: up.sh lists what each held before,
# down.sh removes what was added (the whole directory if it was not there).
# Children come before their parents.
# (An extra node's mount namespace needs every NODE_PATHS directory to exist
# on the host, to mount its own over it.)
TRACKED_DIRS=(/etc/cni/net.d /etc/cni /opt/cni/bin /opt/cni /var/lib/cni /run/containerd
  /var/log/containers /var/log/pods /var/lib/kubelet /var/lib/containerd /run/causeway)
dir_key() { printf 'dir%s' "${1//\//_}"; }

# start NAME CMD...: runs CMD detached (its own session, so no timeout or
# make process group takes it down) unless NAME already runs.
start() {
  local name=$1; shift
  if pid_alive "$name"; then
    step "$name: already running (pid $(cat "$CLUSTER_DIR/run/$name.pid"))"
    return
  fi
  step "$name: starting"
  setsid nohup "$@" >>"$LOG/$name.log" 2>&1 </dev/null &
  local pid=$!
  echo "$pid" >"$CLUSTER_DIR/run/$name.pid"
  # setsid, nohup (and nsenter) exec the daemon in turn; until then
  # pid_alive would take it for gone.
  for _ in $(seq 50); do
    if pid_alive "$name" || ! kill -0 "$pid" 2>/dev/null; then break; fi
    sleep 0.1
  done
}

# ready NAME BOUND CHECK...: waits until CHECK succeeds; past BOUND seconds, or
# when NAME's process is gone, stops with NAME and the end of its log.
ready() {
  local name=$1 bound=$2; shift 2
  local daemon=${name%%/*} t=$SECONDS
  until "$@" >/dev/null 2>&1; do
    local why=""
    if [ -f "$CLUSTER_DIR/run/$daemon.pid" ] && ! pid_alive "$daemon"; then
      why="$daemon exited"
    elif ((SECONDS - t >= bound)); then
      why="$name not ready within ${bound}s"
    fi
    if [ -n "$why" ]; then
      printf '[cluster %s] error: %s; last lines of %s:\n' "$(date +%H:%M:%S)" "$why" "$LOG/$daemon.log" >&2
      tail -n 25 "$LOG/$daemon.log" >&2 2>/dev/null || echo "(no log)" >&2
      echo "run 'make cluster-down' to clean up" >&2
      exit 1
    fi
    sleep 0.5
  done
  step "$name: ready ($((SECONDS - t))s)"
}

node_ready() {
  [ "$(kubectl_admin get node "${1:-$NODE_NAME}" -o 'jsonpath={.status.conditions[?(@.type=="Ready")].status}')" = True ]
}
# node_cidr NODE: the pod range the controller-manager gave the node.
node_cidr() {
  local c
  c=$(kubectl_admin get node "$1" -o 'jsonpath={.spec.podCIDR}') && [ -n "$c" ] && echo "$c"
}

# need_extra_node SCRIPT I: stops SCRIPT unless I names an extra node of
# the running cluster (node-stop.sh, node-start.sh).
need_extra_node() {
  [[ $2 =~ ^[2-9]$ ]] || die "usage: $1 I (an extra node, 2..$MAX_NODES; node 1 is the host)"
  local name
  name=$(node_name "$2")
  [ -f "$NODES_DIR/$name/kubelet.yaml" ] && [ -e "/run/netns/$name" ] || die "$name is not a node of the running cluster"
}

# start_node_daemons I [REGISTERED CMD...]: extra node I's containerd,
# kubelet and kube-proxy, in its namespaces (up.sh add_node, node-start.sh),
# each ready before the next; REGISTERED runs with the node's pod range
# appended once the kubelet has registered (up.sh writes the node's CNI
# configuration then).
start_node_daemons() {
  local i=$1 name dir run ip; shift
  name=$(node_name "$i") ip=$(node_ip "$i")
  dir=$NODES_DIR/$name run=$RUN_DIR/nodes/$name
  local in_node=(nsenter --net="/run/netns/$name" --mount="$run/mnt" --uts="$run/uts")
  start "containerd@$name" "${in_node[@]}" containerd --config "$dir/containerd.toml"
  ready "containerd@$name" 30 ctr --address "$run/containerd.sock" version
  start "kubelet@$name" "${in_node[@]}" "$K8S_BIN/kubelet" --config "$dir/kubelet.yaml" \
    --kubeconfig "$CLUSTER_DIR/kubelet-$name.kubeconfig" --hostname-override "$name" --node-ip "$ip"
  if (($# > 0)); then
    ready "kubelet@$name/podCIDR" 60 node_cidr "$name"
    "$@" "$(node_cidr "$name")"
  fi
  ready "kubelet@$name/node-Ready" 90 node_ready "$name"
  start "kube-proxy@$name" "${in_node[@]}" "$K8S_BIN/kube-proxy" --config "$dir/kube-proxy.yaml"
  ready "kube-proxy@$name" 60 nsenter --net="/run/netns/$name" curl -fsS --max-time 2 http://127.0.0.1:10256/healthz
}
