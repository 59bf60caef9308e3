#!/usr/bin/env bash
# The benchmarks' workload images on the test cluster, as
# causeway.dev/<name>:dev, packed and imported by hack/cluster/images.sh
# (extra) like the mesh's own:
#
#   bench/images-k8s.sh NAME...
#
# NAME is fortio (fortio.org/fortio at FORTIO_VERSION from the Go module
# proxy, built once into bin/fortio@VERSION) or a program under bench/
# (inpod, faultsk8s), built static from this checkout.
set -euo pipefail
REPO=$(cd "$(dirname "$0")/.." && pwd)
FORTIO_VERSION=${FORTIO_VERSION:-v1.68.2}
[ $# -gt 0 ] || { echo "usage: $0 fortio|BENCH_PROGRAM..." >&2; exit 2; }
refs=()
for name in "$@"; do
  case $name in
    fortio)
      dir=$REPO/bin/fortio@$FORTIO_VERSION
      [ -x "$dir/fortio" ] ||
        (cd /tmp && CGO_ENABLED=0 GOBIN=$dir go install -ldflags "-s -w" "fortio.org/fortio@$FORTIO_VERSION")
      refs+=("causeway.dev/fortio:dev=$dir/fortio") ;;
    *)
      [ -d "$REPO/bench/$name" ] || { echo "$0: no program bench/$name" >&2; exit 2; }
      (cd "$REPO" && CGO_ENABLED=0 go build -ldflags "-s -w" -o "$REPO/bin/static/" "./bench/$name")
      refs+=("causeway.dev/$name:dev=$REPO/bin/static/$name") ;;
  esac
done
exec "$REPO/hack/cluster/images.sh" extra "${refs[@]}"
