#!/usr/bin/env bash
# The benchmarks' workload images, pushed to the test cluster's registry
# like the mesh's own (hack/cluster/images.sh), for this machine's platform:
#
#   bench/images-k8s.sh NAME...
#
# NAME is fortio (fortio.org/fortio at FORTIO_VERSION from the Go module
# proxy, built once into bin/fortio@VERSION) or a program under bench/
# (inpod, faultsk8s), built from this checkout. Writes
# bin/cluster-images/bench.txt, "NAME REF@DIGEST" per image.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=../hack/cluster/lib.sh
. "$REPO/hack/cluster/lib.sh"
FORTIO_VERSION=${FORTIO_VERSION:-v1.68.2}
[ $# -gt 0 ] || { echo "usage: $0 fortio|BENCH_PROGRAM..." >&2; exit 2; }
# Flags first: the packer's flag parsing stops at its first package.
bins=()
pkgs=()
for name in "$@"; do
  case $name in
    fortio)
      dir=$REPO/bin/fortio@$FORTIO_VERSION
      [ -x "$dir/fortio" ] ||
        (cd /tmp && CGO_ENABLED=0 GOBIN=$dir go install -ldflags "-s -w" "fortio.org/fortio@$FORTIO_VERSION")
      bins+=(-binary "$dir/fortio") ;;
    *)
      [ -d "$REPO/bench/$name" ] || { echo "$0: no program bench/$name" >&2; exit 2; }
      pkgs+=("./bench/$name") ;;
  esac
done
mkdir -p "$REPO/bin/cluster-images"
(cd "$REPO" && go run ./hack/images push -registry "$REGISTRY_HOST/causeway" -platforms "linux/$(go env GOARCH)" \
  -registry-ca "$CLUSTER_DIR/pki/ca.crt" -refs "$REPO/bin/cluster-images/bench.txt" "${bins[@]}" "${pkgs[@]}") >/dev/null
while read -r _ ref; do step "image $ref pushed"; done <"$REPO/bin/cluster-images/bench.txt"
