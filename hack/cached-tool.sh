# Sourced by the scripts that build a tool once from the Go module proxy at
# a pinned version and keep it with the Kubernetes binaries
# ($CAUSEWAY_CACHE, default ~/.cache/causeway), so every worktree and run
# after the first reuses it (hack/chart/helm.sh, hack/tracing/jaeger.sh).
#
#   cached_tool NAME VERSION OVERRIDE_VAR BUILD_FUNCTION
#
# prints the path of $CAUSEWAY_CACHE/NAME-VERSION/NAME, first running
# BUILD_FUNCTION DIR (which must leave the binary at DIR/NAME) when it is
# missing; build output goes to stderr. $OVERRIDE_VAR, when set, names the
# binary to use instead.
cached_tool() {
  local name=$1 version=$2 override=$3 build=$4
  if [ -n "${!override:-}" ]; then
    [ -x "${!override}" ] || { echo "$name: $override=${!override} is not executable" >&2; return 1; }
    echo "${!override}"
    return 0
  fi
  local cache=${CAUSEWAY_CACHE:-$HOME/.cache/causeway}
  local dir=$cache/$name-$version
  if [ ! -x "$dir/$name" ]; then
    mkdir -p "$cache"
    local tmp start
    tmp=$(mktemp -d "$cache/.$name-build.XXXXXX")
    echo "$name: building $version into $dir (once)" >&2
    start=$(date +%s)
    if ! "$build" "$tmp" >&2 || [ ! -x "$tmp/$name" ]; then
      rm -rf "$tmp"
      echo "$name: build failed" >&2
      return 1
    fi
    mkdir -p "$dir"
    mv "$tmp/$name" "$dir/$name"
    rm -rf "$tmp"
    echo "$name: built in $(($(date +%s) - start)) s" >&2
  fi
  echo "$dir/$name"
}
