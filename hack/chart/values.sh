#!/usr/bin/env bash
# Prints the chart's values (charts/causeway) naming pushed images by
# digest, from `hack/images push -refs` output ("NAME REF@DIGEST" lines):
#   hack/chart/values.sh REFS
# Every image the chart deploys must be in REFS (else exit 1, naming it).
set -euo pipefail
[ $# = 1 ] || { echo "usage: $0 REFS" >&2; exit 2; }
refs=$1
echo "images:"
# chart key:image name
for k in controlplane:controlplane nodeproxy:nodeproxy agent:causeway-agent cni:causeway-cni waypoint:waypoint; do
  # REPOSITORY@DIGEST: the tag dropped, the digest is what is pulled.
  ref=$(awk -v n="${k#*:}" '$1 == n {sub(/:[^:\/]*@/, "@", $2); print $2}' "$refs")
  [ -n "$ref" ] || { echo "values: $refs has no ${k#*:} image" >&2; exit 1; }
  repo=${ref%@*}
  echo "  ${k%%:*}: {name: ${repo##*/}, registry: ${repo%/*}, digest: ${ref#*@}}"
done
