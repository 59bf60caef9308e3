#!/usr/bin/env bash
# Packs images from static binaries (hack/images, no Docker, no registry) and
# imports them into the test cluster's containerd.
#   images.sh system           the pause and CoreDNS images (up.sh runs this)
#   images.sh all              those and one image per Causeway command (make images)
#   images.sh extra REF=BIN... only the given static binaries, each as the
#                              entrypoint of image REF (the benchmarks'
#                              workloads: bench/images-k8s.sh)
# Names: causeway.dev/<command>:dev, causeway.dev/pause:dev,
# causeway.dev/coredns:<version>. Archives land in $IMAGES_DIR (bin/images).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=lib.sh
. "$HERE/lib.sh"
REPO=$(cd "$HERE/../.." && pwd)
OUT=${IMAGES_DIR:-$REPO/bin/images}
STATIC=$REPO/bin/static
# One image per command: every directory under cmd/.
COMMANDS=()
for d in "$REPO"/cmd/*/; do d=${d%/}; COMMANDS+=("${d##*/}"); done

usage() { echo "usage: $0 [system|all|extra REF=BINARY...]" >&2; exit 2; }
what=${1:-all}
pkgs=()
refs=()
case $what in
  system|all)
    pkgs+=(./hack/images/pause)
    refs+=("$IMAGE_PAUSE=$STATIC/pause")
    if [ "$what" = all ]; then
      for c in "${COMMANDS[@]}"; do
        pkgs+=("./cmd/$c")
        refs+=("causeway.dev/$c:dev=$STATIC/$c")
      done
    fi
    "$HERE/build.sh" coredns
    refs+=("$IMAGE_COREDNS=$COREDNS_BIN/coredns") ;;
  extra)
    shift
    [ $# -gt 0 ] || usage
    for r in "$@"; do [[ $r == ?*=?* ]] || usage; done
    refs=("$@") ;;
  *) usage ;;
esac

cd "$REPO"
mkdir -p "$STATIC" "$REPO/bin/tools" "$OUT"
[ ${#pkgs[@]} -eq 0 ] || CGO_ENABLED=0 go build -ldflags "-s -w" -o "$STATIC/" "${pkgs[@]}"
go build -o "$REPO/bin/tools/images" ./hack/images
"$REPO/bin/tools/images" -out "$OUT" "${refs[@]}" >"$OUT/.written"

if ! ctr --address "$CONTAINERD_SOCK" version >/dev/null 2>&1; then
  die "image archives are in $OUT, but the cluster's containerd ($CONTAINERD_SOCK) is not running: run 'make cluster' first"
fi
while IFS=$'\t' read -r ref file; do
  ctr_k8s images import "$file" >/dev/null
  step "image $ref imported"
done <"$OUT/.written"
