#!/usr/bin/env bash
# Packs images from static binaries (hack/images, no Docker, no registry) and
# imports them into the test cluster's containerd.
#   images.sh system   the pause and CoreDNS images (up.sh runs this)
#   images.sh all      those and one image per Causeway command (make images)
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

what=${1:-all}
pkgs=(./hack/images/pause)
refs=("$IMAGE_PAUSE=$STATIC/pause")
case $what in
  system) ;;
  all)
    for c in "${COMMANDS[@]}"; do
      pkgs+=("./cmd/$c")
      refs+=("causeway.dev/$c:dev=$STATIC/$c")
    done ;;
  *) echo "usage: $0 [system|all]" >&2; exit 2 ;;
esac

"$HERE/build.sh" coredns
refs+=("$IMAGE_COREDNS=$COREDNS_BIN/coredns")
cd "$REPO"
mkdir -p "$STATIC" "$REPO/bin/tools" "$OUT"
CGO_ENABLED=0 go build -ldflags "-s -w" -o "$STATIC/" "${pkgs[@]}"
go build -o "$REPO/bin/tools/images" ./hack/images
"$REPO/bin/tools/images" -out "$OUT" "${refs[@]}" >"$OUT/.written"

if ! ctr --address "$CONTAINERD_SOCK" version >/dev/null 2>&1; then
  die "image archives are in $OUT, but the cluster's containerd ($CONTAINERD_SOCK) is not running: run 'make cluster' first"
fi
while IFS=$'\t' read -r ref file; do
  ctr_k8s images import "$file" >/dev/null
  step "image $ref imported"
done <"$OUT/.written"
