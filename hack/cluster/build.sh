#!/usr/bin/env bash
# Builds the cluster's binaries into a cache outside the repository, keyed by
# version, and skips whatever is already there:
#   $CAUSEWAY_CACHE/k8s-v1.37.2/bin/{kube-apiserver,kube-controller-manager,
#     kube-scheduler,kubelet,kube-proxy,kubectl,etcd}
#   $CAUSEWAY_CACHE/coredns-v1.15.0-<plugins' hash>/bin/coredns
#   $CAUSEWAY_CACHE/distribution-v3.1.2/bin/registry
# (versions in lib.sh; CAUSEWAY_CACHE defaults to ~/.cache/causeway).
# Kubernetes comes from the Go module proxy (all six binaries in one go build,
# so they share compilation), etcd from Debian's etcd-server package, CoreDNS
# and the CNCF distribution registry (the cluster's image registry, and the
# one hack/images' tests push to) from the Go module proxy. Every result is written next to its final place and
# renamed into it, so an interrupted build is never taken for a finished one.
#
# Usage: build.sh [k8s|etcd|coredns|registry|all]   (default: all)
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
K8S_COMMANDS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl)

export GOTOOLCHAIN=local GOFLAGS=-buildvcs=false CGO_ENABLED=0

log() { printf '[build %s] %s\n' "$(date +%H:%M:%S)" "$*"; }

# have DIR NAME...: true when every NAME is an executable file in DIR.
have() {
  local dir=$1 name; shift
  for name in "$@"; do [ -x "$dir/$name" ] || return 1; done
}

# install_into DIR SRC...: copies SRC files into DIR through a temporary name
# in DIR, then renames, so DIR never holds a partial file under a final name.
install_into() {
  local dir=$1 src; shift
  mkdir -p "$dir"
  for src in "$@"; do
    cp "$src" "$dir/.$(basename "$src").tmp"
    chmod 0755 "$dir/.$(basename "$src").tmp"
    mv -f "$dir/.$(basename "$src").tmp" "$dir/$(basename "$src")"
  done
}

build_k8s() {
  if have "$K8S_BIN" "${K8S_COMMANDS[@]}"; then
    log "kubernetes $K8S_VERSION: cached in $K8S_BIN"; return
  fi
  local work; work=$(mktemp -d "$CACHE/.k8s-build.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" RETURN
  log "kubernetes $K8S_VERSION: resolving modules (scratch module in $work)"
  local gomod
  gomod=$(cd "$work" && go mod download -json "k8s.io/kubernetes@$K8S_VERSION" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
  [ -f "$gomod" ] || { log "no go.mod for k8s.io/kubernetes@$K8S_VERSION"; return 1; }
  # Kubernetes' own go.mod points its staging modules at ./staging/...; a
  # module that requires k8s.io/kubernetes must replace each with its
  # published v0.x twin.
  local staging_version=v0.${K8S_VERSION#v1.}
  {
    echo "module causeway.dev/k8s-build"
    echo
    echo "go 1.26"
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\) => \./staging/.*#\1#p' "$gomod" |
      sort -u | while read -r m; do echo "replace $m => $m $staging_version"; done
  } >"$work/go.mod"
  log "kubernetes $K8S_VERSION: $(grep -c '^replace' "$work/go.mod") staging replacements"
  local pkgs=() c
  for c in "${K8S_COMMANDS[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$c"); done
  local base=k8s.io/component-base/version
  local minor=${K8S_VERSION#v1.}; minor=${minor%%.*}
  log "kubernetes $K8S_VERSION: go build of ${K8S_COMMANDS[*]} (cold: 7-10 min, 2.7 GB RAM)"
  mkdir -p "$work/out"
  (cd "$work" && go build -mod=mod -trimpath -o out/ \
    -ldflags "-s -w -X $base.gitVersion=$K8S_VERSION -X $base.gitMajor=1 -X $base.gitMinor=$minor -X $base.gitTreeState=clean" \
    "${pkgs[@]}")
  local outs=()
  for c in "${K8S_COMMANDS[@]}"; do outs+=("$work/out/$c"); done
  install_into "$K8S_BIN" "${outs[@]}"
  log "kubernetes $K8S_VERSION: installed into $K8S_BIN"
}

build_etcd() {
  if have "$K8S_BIN" etcd; then log "etcd: cached in $K8S_BIN"; return; fi
  local work; work=$(mktemp -d "$CACHE/.etcd-build.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" RETURN
  log "etcd: apt-get download etcd-server (no service is started)"
  (cd "$work" && { apt-get download etcd-server >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get download etcd-server >/dev/null; }; })
  dpkg-deb -x "$work"/etcd-server_*.deb "$work/root"
  install_into "$K8S_BIN" "$work/root/usr/bin/etcd"
  log "etcd: $("$K8S_BIN/etcd" --version | head -1), installed into $K8S_BIN"
}

# CoreDNS is built with only the plugins its Corefiles use (COREDNS_PLUGINS
# in lib.sh; the way CoreDNS documents for custom builds): the stock main
# links every plugin and its cloud SDKs, which triples a cold build.

build_coredns() {
  if have "$COREDNS_BIN" coredns; then log "coredns $COREDNS_VERSION: cached in $COREDNS_BIN"; return; fi
  local work; work=$(mktemp -d "$CACHE/.coredns-build.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" RETURN
  log "coredns $COREDNS_VERSION: go build from the module proxy, plugins ${COREDNS_PLUGINS[*]}"
  cat >"$work/go.mod" <<MOD
module causeway.dev/coredns-build

go 1.26

require github.com/coredns/coredns $COREDNS_VERSION
MOD
  {
    echo "package main"
    echo
    echo "import ("
    echo '	"github.com/coredns/coredns/core/dnsserver"'
    echo '	"github.com/coredns/coredns/coremain"'
    local p
    for p in "${COREDNS_PLUGINS[@]}"; do echo "	_ \"github.com/coredns/coredns/plugin/$p\""; done
    echo ")"
    echo
    echo "func main() {"
    printf '\tif err := dnsserver.SetDirectives([]string{'
    printf '"%s", ' "${COREDNS_DIRECTIVES[@]}"
    printf '}); err != nil {\n\t\tpanic(err)\n\t}\n'
    echo "	coremain.Run()"
    echo "}"
  } >"$work/main.go"
  mkdir -p "$work/out"
  (cd "$work" && go build -mod=mod -trimpath -ldflags "-s -w" -o out/coredns .)
  install_into "$COREDNS_BIN" "$work/out/coredns"
  log "coredns $COREDNS_VERSION: installed into $COREDNS_BIN"
}

build_registry() {
  if have "$REGISTRY_BIN" registry; then log "registry $REGISTRY_VERSION: cached in $REGISTRY_BIN"; return; fi
  local work; work=$(mktemp -d "$CACHE/.registry-build.XXXXXX")
  # shellcheck disable=SC2064
  trap "rm -rf '$work'" RETURN
  log "registry $REGISTRY_VERSION: go install from the module proxy"
  (cd "$work" && GOBIN=$work/out go install -trimpath -ldflags "-s -w" \
    "github.com/distribution/distribution/v3/cmd/registry@$REGISTRY_VERSION")
  install_into "$REGISTRY_BIN" "$work/out/registry"
  log "registry $REGISTRY_VERSION: installed into $REGISTRY_BIN"
}

mkdir -p "$CACHE"
# One builder at a time: a second caller waits and then finds the cache full.
exec 9>"$CACHE/.build.lock"
flock 9

case ${1:-all} in
  k8s) build_k8s ;;
  etcd) build_etcd ;;
  coredns) build_coredns ;;
  registry) build_registry ;;
  all) build_etcd; build_k8s; build_coredns; build_registry ;;
  *) echo "usage: $0 [k8s|etcd|coredns|registry|all]" >&2; exit 2 ;;
esac
