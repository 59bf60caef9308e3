#!/usr/bin/env bash
# Prints the path of a Go program built once from the Go module proxy at a
# pinned version and cached with the Kubernetes binaries ($CAUSEWAY_CACHE,
# default ~/.cache/causeway, under NAME-VERSION/), so every worktree and run
# after the first reuses it. Build output, and the build's time, go to
# stderr. $CAUSEWAY_<NAME> (upper case), when set, names the binary to use
# instead.
#
# Usage: hack/cached-go-install.sh [--module] NAME VERSION PACKAGE [go install flags...]
#
# --module builds through a throwaway module that requires the program as
# a tool: `go install pkg@version` refuses a program whose go.mod has
# replace directives (Jaeger's).
set -euo pipefail
VIA_MODULE=
if [ "${1:-}" = --module ]; then
  VIA_MODULE=1
  shift
fi
[ $# -ge 3 ] || { echo "usage: $0 [--module] NAME VERSION PACKAGE [go install flags...]" >&2; exit 2; }
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
  if [ -n "$VIA_MODULE" ]; then
    (
      cd "$tmp"
      go mod init causeway.local/build-"$NAME"
      GOFLAGS= go get -tool "$PKG@$VERSION"
      GOBIN=$tmp CGO_ENABLED=0 GOFLAGS= go install -trimpath "$@" tool
    ) >&2 2>&1
  else
    # go install pkg@version: the program's own go.mod, not this module's.
    GOBIN=$tmp CGO_ENABLED=0 GOFLAGS= go install -trimpath "$@" "$PKG@$VERSION" >&2
  fi
  mkdir -p "$DIR"
  mv "$tmp/$(basename "$PKG")" "$BIN"
  echo "$NAME: built in $(($(date +%s) - start)) s" >&2
fi
echo "$BIN"
