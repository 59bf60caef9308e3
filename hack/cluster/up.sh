#!/usr/bin/env bash
# Brings up the one-node test cluster (make cluster). Every step is idempotent:
# a component that is already running is left alone, so running this twice
# never starts a second cluster, and running it after a half start finishes
# the job. A component that is not ready within its bound stops the script
# with its name and the last lines of its log; hack/cluster/down.sh cleans up.
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"

need_root
if ! [[ $NODES =~ ^[1-9]$ ]] || ((NODES > MAX_NODES)); then die "NODES=$NODES: from 1 to $MAX_NODES"; fi
T0=$SECONDS
PKI=$CLUSTER_DIR/pki
ETC=$CLUSTER_DIR/etc

# ensure_packages: containerd, runc, the CNI plugins, iptables and openssl
# from Debian. Installing containerd starts no service here (policy-rc.d).
ensure_packages() {
  local need=() p
  for p in containerd:containerd runc:runc iptables:iptables openssl:openssl curl:curl; do
    command -v "${p%%:*}" >/dev/null 2>&1 || need+=("${p#*:}")
  done
  [ -x /usr/lib/cni/bridge ] || need+=(containernetworking-plugins)
  [ ${#need[@]} -eq 0 ] && return
  step "packages: apt-get install ${need[*]}"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
}

# record_host_state: what cluster-down must put back, written once per cluster.
record_host_state() {
  local before=$CLUSTER_DIR/before
  [ -d "$before" ] && return
  mkdir -p "$before.tmp"
  local s d
  for s in "${SYSCTLS[@]}"; do
    if v=$(sysctl -n "$s" 2>/dev/null); then printf '%s=%s\n' "$s" "$v"; fi
  done >"$before.tmp/sysctls"
  for d in "${TRACKED_DIRS[@]}"; do
    if [ -d "$d" ]; then ls -A "$d" >"$before.tmp/$(dir_key "$d")"; fi
  done
  ip netns list 2>/dev/null | awk '{print $1}' >"$before.tmp/netns"
  mv "$before.tmp" "$before"
}

# share_netns: the node agent's /run/netns volume is HostToContainer, which
# the runtime accepts only from a shared or slave mount ("path /run/netns is
# mounted on / but it is not a shared or slave mount" on a host whose / is
# private and where nothing made /run/netns a mount of its own yet).
share_netns() {
  mkdir -p /run/netns
  if ! awk '$5 == "/run/netns" {found=1} END {exit !found}' /proc/self/mountinfo; then
    mount --bind /run/netns /run/netns
    touch "$CLUSTER_DIR/before/netns-mount"
  fi
  mount --make-shared /run/netns
}

setup_network() {
  share_netns
  if ! ip link show "$NODE_BRIDGE" >/dev/null 2>&1; then
    ip link add "$NODE_BRIDGE" type bridge
  fi
  ip addr replace "$NODE_IP/32" dev "$NODE_BRIDGE"
  ip link set "$NODE_BRIDGE" up
  ip route replace "$SERVICE_CIDR" dev "$NODE_BRIDGE" src "$NODE_IP"
  ip route replace "$STATIC_ADDRESS_RANGE" dev "$NODE_BRIDGE" src "$NODE_IP"
  ip route replace blackhole "$CLUSTER_CIDR"
  ip route replace blackhole "$NODE_RANGE"
  install_guard
}

# install_guard: a chain jumped first from OUTPUT and FORWARD that drops the
# cluster's ranges on every default-route device, so no pod, node or service
# address ever leaves the machine. kube-proxy puts its own jumps on top when
# it starts; calling this again moves ours back to position 1.
install_guard() {
  iptables -w -N "$GUARD_CHAIN" 2>/dev/null || iptables -w -F "$GUARD_CHAIN"
  local dev r
  for dev in $(default_devices); do
    for r in "$CLUSTER_CIDR" "$SERVICE_CIDR" "$NODE_RANGE" "$STATIC_ADDRESS_RANGE"; do
      iptables -w -A "$GUARD_CHAIN" -o "$dev" -d "$r" -j DROP
      iptables -w -A "$GUARD_CHAIN" -o "$dev" -s "$r" -j DROP
    done
  done
  for c in OUTPUT FORWARD; do
    while iptables -w -D "$c" -j "$GUARD_CHAIN" 2>/dev/null; do :; done
    iptables -w -I "$c" 1 -j "$GUARD_CHAIN"
  done
}

# cert NAME SUBJECT EXTENSIONS...: an EC P-256 key and a certificate signed by the CA.
cert() {
  local name=$1 subj=$2; shift 2
  openssl ecparam -name prime256v1 -genkey -noout -out "$name.key" 2>/dev/null
  openssl req -new -key "$name.key" -subj "$subj" -out "$name.csr"
  openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 3650 \
    -out "$name.crt" -extfile <(printf '%s\n' basicConstraints=critical,CA:FALSE \
      keyUsage=critical,digitalSignature,keyEncipherment "$@") 2>/dev/null
  rm -f "$name.csr"
}

gen_pki() {
  [ -d "$PKI" ] && return
  step "certificates: CA, serving and client certificates, service-account key"
  rm -rf "$PKI.tmp" && mkdir -p "$PKI.tmp"
  (
    cd "$PKI.tmp"
    umask 077
    openssl ecparam -name prime256v1 -genkey -noout -out ca.key 2>/dev/null
    openssl req -x509 -new -key ca.key -subj /CN=causeway-cluster-ca -days 3650 -out ca.crt \
      -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign
    san_api="subjectAltName=IP:$NODE_IP,IP:$API_SERVICE_IP,IP:127.0.0.1,DNS:localhost,DNS:kubernetes"
    san_api+=",DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.$CLUSTER_DOMAIN"
    cert apiserver /CN=kube-apiserver extendedKeyUsage=serverAuth "$san_api"
    cert kubelet-serving "/O=system:nodes/CN=system:node:$NODE_NAME" extendedKeyUsage=serverAuth \
      "subjectAltName=IP:$NODE_IP,DNS:$NODE_NAME"
    cert apiserver-kubelet-client /O=system:masters/CN=kube-apiserver-kubelet-client extendedKeyUsage=clientAuth
    cert admin /O=system:masters/CN=causeway-admin extendedKeyUsage=clientAuth
    cert controller-manager /CN=system:kube-controller-manager extendedKeyUsage=clientAuth
    cert scheduler /CN=system:kube-scheduler extendedKeyUsage=clientAuth
    cert kubelet "/O=system:nodes/CN=system:node:$NODE_NAME" extendedKeyUsage=clientAuth
    cert kube-proxy /CN=system:kube-proxy extendedKeyUsage=clientAuth
    cert registry /CN=causeway-registry extendedKeyUsage=serverAuth "subjectAltName=IP:$NODE_IP"
    openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out sa.key 2>/dev/null
    openssl pkey -in sa.key -pubout -out sa.pub
  )
  mv "$PKI.tmp" "$PKI"
}

# kubeconfig NAME CERT: a kubeconfig with the certificates embedded, so it
# works when copied elsewhere.
kubeconfig() {
  local name=$1 c=$2 out=$CLUSTER_DIR/$1.kubeconfig
  [ -f "$out" ] && return
  (umask 077 && cat >"$out.tmp" <<KC)
apiVersion: v1
kind: Config
clusters:
- name: causeway
  cluster:
    server: $API_URL
    certificate-authority-data: $(base64 -w0 "$PKI/ca.crt")
users:
- name: $name
  user:
    client-certificate-data: $(base64 -w0 "$PKI/$c.crt")
    client-key-data: $(base64 -w0 "$PKI/$c.key")
contexts:
- name: causeway
  context: {cluster: causeway, user: $name}
current-context: causeway
KC
  mv "$out.tmp" "$out"
}

# put FILE: writes stdin to FILE unless FILE already holds exactly that (a
# running kube-proxy exits when its configuration file is written to).
put() {
  local f=$1
  cat >"$f.tmp"
  if cmp -s "$f.tmp" "$f"; then rm -f "$f.tmp"; else mv "$f.tmp" "$f"; fi
}

# containerd_config STATE_DIR RUN_STATE_DIR SOCKET: a node's containerd
# configuration; every node pulls from the cluster's registry alike.
containerd_config() {
  sed -e "s#@STATE_DIR@#$1#g" -e "s#@RUN_STATE_DIR@#$2#g" -e "s#@CONTAINERD_SOCK@#$3#g" \
    -e "s#@CERTS_D@#$ETC/certs.d#g" -e "s#@IMAGE_PAUSE@#$IMAGE_PAUSE#g" \
    -e "s#@RUNC@#$(command -v runc)#g" "$HERE/containerd.toml"
}

# kubelet_config NODE_IP CONTAINERD_SOCK SERVING_CERT: a node's kubelet
# configuration, with the lines on stdin appended.
kubelet_config() {
  cat <<CFG
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $1
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: $PKI/ca.crt}
authorization: {mode: Webhook}
tlsCertFile: $3.crt
tlsPrivateKeyFile: $3.key
containerRuntimeEndpoint: unix://$2
# cgroup v1 here; containerd 1.6 cannot report its driver, so say it.
failCgroupV1: false
cgroupDriver: cgroupfs
# No CAP_SYS_RESOURCE on these machines.
oomScoreAdj: 0
clusterDomain: $CLUSTER_DOMAIN
clusterDNS: [$DNS_SERVICE_IP]
# Pods get only the cluster's DNS: nothing resolves through the host's.
resolvConf: ""
failSwapOn: false
# Never collect images (the registry keeps them anyway), and keep working
# on a busy shared disk.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
# A lost node is NotReady (its pods no longer ready endpoints) 20s after
# its last lease renewal, not 50s: the controller manager's
# --node-monitor-grace-period 20s, with a lease renewed every 5s (a
# quarter of its duration) as the default 40s lease is every 10s.
nodeLeaseDurationSeconds: 20
CFG
  cat
}

# kube_proxy_config NODE NODE_IP: a node's kube-proxy configuration.
kube_proxy_config() {
  cat <<CFG
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: $CLUSTER_DIR/kube-proxy.kubeconfig}
hostnameOverride: $1
mode: iptables
clusterCIDR: $CLUSTER_CIDR
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
# NodePorts only on the node's underlay address, never on the host's real
# interfaces.
nodePortAddresses: [$2/32]
iptables: {localhostNodePorts: false}
# Zero leaves the host's conntrack sysctls alone (and an extra node's
# namespace may not write them at all).
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s}
CFG
}

write_configs() {
  mkdir -p "$ETC" "$LOG" "$CLUSTER_DIR/run" "$RUN_DIR"
  kubeconfig admin admin
  kubeconfig controller-manager controller-manager
  kubeconfig scheduler scheduler
  kubeconfig kubelet kubelet
  kubeconfig kube-proxy kube-proxy
  containerd_config "$CLUSTER_DIR/containerd" "$RUN_DIR/containerd" "$CONTAINERD_SOCK" | put "$ETC/containerd.toml"
  mkdir -p "$ETC/certs.d/$REGISTRY_HOST"
  put "$ETC/certs.d/$REGISTRY_HOST/hosts.toml" <<CFG
server = "https://$REGISTRY_HOST"

[host."https://$REGISTRY_HOST"]
  capabilities = ["pull", "resolve"]
  ca = "$PKI/ca.crt"
CFG
  # The Gateway API conformance suite's images (registry.k8s.io/gateway-api/...,
  # make conformance) come from the cluster's registry under the same
  # paths: nothing is pulled from outside the machine.
  mkdir -p "$ETC/certs.d/registry.k8s.io"
  put "$ETC/certs.d/registry.k8s.io/hosts.toml" <<CFG
server = "https://$REGISTRY_HOST"

[host."https://$REGISTRY_HOST"]
  capabilities = ["pull", "resolve"]
  ca = "$PKI/ca.crt"
CFG
  put "$ETC/registry.yml" <<CFG
version: 0.1
log: {level: warn, accesslog: {disabled: true}}
storage:
  filesystem: {rootdirectory: $CLUSTER_DIR/registry}
  delete: {enabled: true}
http:
  addr: $REGISTRY_HOST
  tls: {certificate: $PKI/registry.crt, key: $PKI/registry.key}
CFG
  kubelet_config "$NODE_IP" "$CONTAINERD_SOCK" "$PKI/kubelet-serving" <<CFG | put "$ETC/kubelet.yaml"
podLogsDir: $CLUSTER_DIR/pod-logs
CFG
  kube_proxy_config "$NODE_NAME" "$NODE_IP" | put "$ETC/kube-proxy.yaml"
}

# setup_cni ROOT POD_CIDR: the CNI plugins and the primary bridge network of
# a node whose fixed paths are under ROOT (/ for the host's node).
setup_cni() {
  local root=${1%/} cidr=$2 p
  mkdir -p "$root/opt/cni/bin" "$root/etc/cni/net.d"
  for p in /usr/lib/cni/*; do
    [ -e "$root/opt/cni/bin/${p##*/}" ] || ln -s "$p" "$root/opt/cni/bin/${p##*/}"
  done
  # isDefaultGateway and no ipam routes: both together fail ("file exists").
  put "$root$CNI_CONF" <<CNI
{
  "cniVersion": "1.0.0",
  "name": "causeway",
  "plugins": [
    {
      "type": "bridge",
      "bridge": "$POD_BRIDGE",
      "isGateway": true,
      "isDefaultGateway": true,
      "ipMasq": false,
      "hairpinMode": true,
      "ipam": {"type": "host-local", "ranges": [[{"subnet": "$cidr", "gateway": "${cidr%.*}.1"}]]}
    }
  ]
}
CNI
}

api_get() {
  curl -fsS --max-time 3 --cacert "$PKI/ca.crt" --cert "$PKI/admin.crt" --key "$PKI/admin.key" "$API_URL$1"
}

# add_node I: extra node I (docs/cluster.md): a network namespace on the
# node bridge (the underlay), mount and UTS namespaces of its own
# (node-mounts.sh), a cgroup root, certificates, and its containerd,
# kubelet and kube-proxy run inside those namespaces.
add_node() {
  local i=$1 name ip dir run root veth cidr h t=$SECONDS
  name=$(node_name "$i") ip=$(node_ip "$i")
  dir=$NODES_DIR/$name run=$RUN_DIR/nodes/$name root=$NODES_DIR/$name/root veth=cw-n$i
  step "$name: network namespace, $veth into $NODE_BRIDGE ($ip), cgroup root /$name"
  mkdir -p "$dir" "$run/cgroup"
  ip netns list | awk '{print $1}' | grep -qx "$name" || ip netns add "$name"
  ip link show "$veth" >/dev/null 2>&1 || ip link add "$veth" type veth peer name eth0 netns "$name"
  ip link set "$veth" master "$NODE_BRIDGE" up
  ip -n "$name" link set lo up
  ip -n "$name" addr replace "$ip/24" dev eth0
  ip -n "$name" link set eth0 up
  # No default route: only the cluster's ranges leave the node.
  ip -n "$name" route replace "$CLUSTER_CIDR" via "$NODE_IP"
  ip -n "$name" route replace "$SERVICE_CIDR" via "$NODE_IP"
  nsenter --net="/run/netns/$name" sysctl -qw net.ipv4.ip_forward=1
  ip route replace "$ip/32" dev "$NODE_BRIDGE" src "$NODE_IP"
  # Two kubelets on one cgroup root destroy each other's pods.
  for h in /sys/fs/cgroup/*/; do
    mkdir -p "$h$name"
    if [ -f "${h}cpuset.cpus" ]; then
      cat "${h}cpuset.cpus" >"$h$name/cpuset.cpus"
      cat "${h}cpuset.mems" >"$h$name/cpuset.mems"
    fi
  done
  if ! awk -v f="$run/mnt" '$5 == f {found=1} END {exit !found}' /proc/self/mountinfo; then
    touch "$run/mnt" "$run/uts"
    nsenter --net="/run/netns/$name" unshare --mount="$run/mnt" --uts="$run/uts" --propagation private \
      "$HERE/node-mounts.sh" "$name"
  fi

  if [ ! -f "$PKI/kubelet-$name.crt" ]; then
    (
      cd "$PKI"
      umask 077
      cert "kubelet-serving-$name" "/O=system:nodes/CN=system:node:$name" extendedKeyUsage=serverAuth \
        "subjectAltName=IP:$ip,DNS:$name"
      cert "kubelet-$name" "/O=system:nodes/CN=system:node:$name" extendedKeyUsage=clientAuth
    )
  fi
  kubeconfig "kubelet-$name" "kubelet-$name"
  containerd_config "$dir/containerd" "$run/containerd" "$run/containerd.sock" | put "$dir/containerd.toml"
  kubelet_config "$ip" "$run/containerd.sock" "$PKI/kubelet-serving-$name" <<CFG | put "$dir/kubelet.yaml"
cgroupRoot: /$name
CFG
  kube_proxy_config "$name" "$ip" | put "$dir/kube-proxy.yaml"

  # The CNI configuration needs the node's range, given once it registered.
  start_node_daemons "$i" setup_cni "$root"
  cidr=$(node_cidr "$name")
  step "$name: added in $((SECONDS - t))s (pods $cidr)"
}

# route_pod_ranges: host-gateway routing, as on a flat network of machines:
# the host and every node send each node's pod range to that node's address.
route_pod_ranges() {
  local i j cidr ip
  for ((i = 1; i <= NODES; i++)); do
    cidr=$(node_cidr "$(node_name "$i")") ip=$(node_ip "$i")
    for ((j = 1; j <= NODES; j++)); do
      if ((j == i)); then continue; fi
      if ((j == 1)); then
        ip route replace "$cidr" via "$ip" dev "$NODE_BRIDGE"
      else
        ip -n "$(node_name "$j")" route replace "$cidr" via "$ip" dev eth0
      fi
    done
  done
}
coredns_ready() {
  [ "$(kubectl_admin -n kube-system get deployment coredns -o 'jsonpath={.status.availableReplicas}')" = 1 ]
}
default_sa() { kubectl_admin -n default get serviceaccount default; }

step "binaries: $K8S_BIN, $COREDNS_BIN"
"$HERE/build.sh" all
ensure_packages
mkdir -p "$CLUSTER_DIR"
record_host_state
step "network: node bridge $NODE_BRIDGE ($NODE_IP), routes, guard chain $GUARD_CHAIN"
setup_network
gen_pki
write_configs

start etcd "$K8S_BIN/etcd" --name causeway --data-dir "$CLUSTER_DIR/etcd" \
  --listen-client-urls "$ETCD_URL" --advertise-client-urls "$ETCD_URL" \
  --listen-peer-urls "$ETCD_PEER_URL" --initial-advertise-peer-urls "$ETCD_PEER_URL" \
  --initial-cluster "causeway=$ETCD_PEER_URL" --logger zap
ready etcd 30 curl -fsS --max-time 2 "$ETCD_URL/health"

start kube-apiserver "$K8S_BIN/kube-apiserver" \
  --etcd-servers "$ETCD_URL" \
  --bind-address "$NODE_IP" --advertise-address "$NODE_IP" --secure-port 6443 \
  --service-cluster-ip-range "$SERVICE_CIDR" \
  --tls-cert-file "$PKI/apiserver.crt" --tls-private-key-file "$PKI/apiserver.key" \
  --client-ca-file "$PKI/ca.crt" \
  --kubelet-client-certificate "$PKI/apiserver-kubelet-client.crt" \
  --kubelet-client-key "$PKI/apiserver-kubelet-client.key" \
  --kubelet-certificate-authority "$PKI/ca.crt" \
  --service-account-key-file "$PKI/sa.pub" --service-account-signing-key-file "$PKI/sa.key" \
  --service-account-issuer "https://kubernetes.default.svc.$CLUSTER_DOMAIN" \
  --kubelet-preferred-address-types InternalIP \
  --authorization-mode Node,RBAC --enable-admission-plugins NodeRestriction \
  --allow-privileged --profiling=false
ready kube-apiserver 90 api_get /readyz

start kube-controller-manager "$K8S_BIN/kube-controller-manager" \
  --kubeconfig "$CLUSTER_DIR/controller-manager.kubeconfig" \
  --authentication-kubeconfig "$CLUSTER_DIR/controller-manager.kubeconfig" \
  --authorization-kubeconfig "$CLUSTER_DIR/controller-manager.kubeconfig" \
  --bind-address 127.0.0.1 --leader-elect=false \
  --allocate-node-cidrs --cluster-cidr "$CLUSTER_CIDR" --node-cidr-mask-size 24 \
  --node-monitor-period 2s --node-monitor-grace-period 20s \
  --service-cluster-ip-range "$SERVICE_CIDR" \
  --root-ca-file "$PKI/ca.crt" --service-account-private-key-file "$PKI/sa.key" \
  --use-service-account-credentials --profiling=false
start kube-scheduler "$K8S_BIN/kube-scheduler" \
  --kubeconfig "$CLUSTER_DIR/scheduler.kubeconfig" \
  --authentication-kubeconfig "$CLUSTER_DIR/scheduler.kubeconfig" \
  --authorization-kubeconfig "$CLUSTER_DIR/scheduler.kubeconfig" \
  --bind-address 127.0.0.1 --leader-elect=false --profiling=false
ready kube-controller-manager 60 curl -fsSk --max-time 2 https://127.0.0.1:10257/healthz
ready kube-scheduler 60 curl -fsSk --max-time 2 https://127.0.0.1:10259/healthz

start registry "$REGISTRY_BIN/registry" serve "$ETC/registry.yml"
ready registry 30 curl -fsS --max-time 2 --cacert "$PKI/ca.crt" "https://$REGISTRY_HOST/v2/"
step "images: $IMAGE_PAUSE, $IMAGE_COREDNS pushed to the registry"
"$HERE/images.sh" system

step "cni: $CNI_CONF, plugins linked into /opt/cni/bin"
setup_cni / "$POD_CIDR"
start containerd containerd --config "$ETC/containerd.toml"
ready containerd 30 ctr --address "$CONTAINERD_SOCK" version

start kubelet "$K8S_BIN/kubelet" --config "$ETC/kubelet.yaml" \
  --kubeconfig "$CLUSTER_DIR/kubelet.kubeconfig" --root-dir "$CLUSTER_DIR/kubelet" \
  --hostname-override "$NODE_NAME" --node-ip "$NODE_IP"
ready kubelet/node-Ready 90 node_ready

start kube-proxy "$K8S_BIN/kube-proxy" --config "$ETC/kube-proxy.yaml"
ready kube-proxy 60 curl -fsS --max-time 2 http://127.0.0.1:10256/healthz
install_guard

step "coredns: Deployment and Service kube-system/kube-dns ($DNS_SERVICE_IP)"
sed -e "s#@IMAGE_COREDNS@#$IMAGE_COREDNS#g" -e "s#@DNS_SERVICE_IP@#$DNS_SERVICE_IP#g" \
  -e "s#@CLUSTER_DOMAIN@#$CLUSTER_DOMAIN#g" "$HERE/coredns.yaml" | kubectl_admin apply -f - >/dev/null
ready kubelet/coredns 120 coredns_ready
ready kube-controller-manager/default-serviceaccount 60 default_sa

if ((NODES > 1)); then
  if ! mountpoint -q "$RUN_DIR/nodes"; then
    # The nodes' namespace files are bound here: it must be a private mount.
    mkdir -p "$RUN_DIR/nodes"
    mount --bind "$RUN_DIR/nodes" "$RUN_DIR/nodes"
    mount --make-private "$RUN_DIR/nodes"
  fi
  for ((n = 2; n <= NODES; n++)); do add_node "$n"; done
  route_pod_ranges
fi

step "cluster up in $((SECONDS - T0))s: export KUBECONFIG=$KUBECONFIG_ADMIN"
