#!/usr/bin/env bash
# Prints the path of a Go program built once from the Go module proxy at a
# pinned version and cached with the Kubernetes binaries ($CAUSEWAY_CACHE,
# default ~/.cache/causeway, under NAME-VERSION/), so every worktree and run
# after the first reuses it. Build output, and the build's time, go to
# stderr. $CAUSEWAY_<NAME> (upper case), when set, names the binary to use
# instead.
#
# Usage: hack/cached-go-install.sh NAME VERSION PACKAGE [go install flags...]
set -euo pipefail
[ $# -ge 3 ] || { echo "usage: $0 NAME VERSION PACKAGE [go install flags...]" >&2; exit 2; }
NAME=$1 VERSION=$2 PKG=$3
shift 3
override=CAUSEWAY_$(echo "$NAME" | tr '[:lower:]' '[:upper:]')
if [ -n "${!override:-}" ]; then
  [ -x "${!override}" ] || { echo "$NAME: $override=${!override} is not executable" >&2; exit 1; }
  echo "${!override}"
  exit 0
fi
CACHE=${CAUSEWAY_CACHE:-$HOME/.cache/causeway}
DIR=$CACHE/$NAME-$VERSION
BIN=$DIR/$NAME
if [ ! -x "$BIN" ]; then
  mkdir -p "$CACHE"
  tmp=$(mktemp -d "$CACHE/.$NAME-build.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  echo "$NAME: building $PKG $VERSION into $DIR (once)" >&2
  start=$(date +%s)
  # go install pkg@version: the program's own go.mod, not this module's.
  GOBIN=$tmp CGO_ENABLED=0 GOFLAGS= go install -trimpath "$@" "$PKG@$VERSION" >&2
  mkdir -p "$DIR"
  mv "$tmp/$(basename "$PKG")" "$BIN"
  echo "$NAME: built in $(($(date +%s) - start)) s" >&2
fi
echo "$BIN"
