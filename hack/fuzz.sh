#!/bin/sh
# Runs every fuzz target of the module for FUZZTIME each (default 3m), one
# after another, so each gets the machine's cores. `make test` runs it with
# a short FUZZTIME; `make fuzz` with the default. A crasher is written by
# `go test` to the package's testdata/fuzz/<Target>/: commit it as a seed
# with the fix. FUZZ_MATCH narrows the targets (a grep pattern).
set -eu
cd "$(dirname "$0")/.."
: "${GO:=go}"
: "${FUZZTIME:=3m}"
: "${FUZZ_MATCH:=.}"
failed=""
targets=$(grep -rn --include='*_test.go' '^func Fuzz[A-Za-z0-9_]*(f \*testing.F)' . |
	sed 's#^\./\(.*\)/[^/]*_test.go:[0-9]*:func \(Fuzz[A-Za-z0-9_]*\).*#\1 \2#' | sort -u | grep -e "$FUZZ_MATCH" || true)
if [ -z "$targets" ]; then
	echo "fuzz: no targets match $FUZZ_MATCH" >&2
	exit 1
fi
echo "$targets" | while read -r pkg target; do
	echo "== $target (./$pkg) for $FUZZTIME"
	if ! $GO test -run '^$' -fuzz "^$target\$" -fuzztime "$FUZZTIME" "./$pkg" >"${TMPDIR:-/tmp}/fuzz.$$.log" 2>&1; then
		cat "${TMPDIR:-/tmp}/fuzz.$$.log"
		echo "FAIL $target (./$pkg)"
		echo "$target" >>"${TMPDIR:-/tmp}/fuzz.$$.failed"
	else
		tail -n 1 "${TMPDIR:-/tmp}/fuzz.$$.log"
	fi
done
rm -f "${TMPDIR:-/tmp}/fuzz.$$.log"
if [ -s "${TMPDIR:-/tmp}/fuzz.$$.failed" ]; then
	failed=$(tr '\n' ' ' <"${TMPDIR:-/tmp}/fuzz.$$.failed")
	rm -f "${TMPDIR:-/tmp}/fuzz.$$.failed"
	echo "fuzz: failed: $failed" >&2
	exit 1
fi
