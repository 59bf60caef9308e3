#!/usr/bin/env bash
# Compares the waypoint of two revisions under bench/waypoint: builds both,
# then alternates single-round runs of each (A, B, A, B, ...) so that both
# see the same host, and prints each run's waypoint/nginx ratios and their
# means and medians per revision, and per pair the ratio of the waypoint's
# own CPU per request (B/A; it does not carry nginx's run-to-run swings).
# On this kind of shared 2-core host single runs swing by 20 % or more; use
# 8 pairs or more for a change under 10 %.
#
#   bench/waypoint-ab.sh REV_A [REV_B] [PAIRS]   (REV_B defaults to the work tree)
#
# WAYPOINT_FLAGS adds flags to every run (default: 6 s windows, no direct
# or L4 reference runs); WAYPOINT_FLAGS_B adds more to B's alone (e.g.
# -waypoint-args "--tracing-endpoint=..." to compare one revision with a
# setting on and off: bench/README.md "Tracing").
set -uo pipefail
cd "$(dirname "$0")/.."
if [ $# -lt 1 ]; then
	sed -n '2,16p' "$0" >&2
	exit 2
fi
revA=$1
revB=${2:-}
pairs=${3:-8}
flags=${WAYPOINT_FLAGS:--rounds 1 -duration 6s -skip-direct -skip-l4 -policy-decisions 500}
flagsB=${WAYPOINT_FLAGS_B:-}

dir=$(mktemp -d)
cleanup() {
	git worktree remove --force "$dir/src" >/dev/null 2>&1
	rm -rf "$dir"
}
trap cleanup EXIT

# build REV OUT: the binaries of REV (the work tree when REV is empty).
build() {
	local src=.
	if [ -n "$1" ]; then
		git worktree remove --force "$dir/src" >/dev/null 2>&1
		git worktree add -q --detach "$dir/src" "$1" || return 1
		src=$dir/src
	fi
	(cd "$src" && go build -o "$2/" ./cmd/...)
}
build "$revA" "$dir/a" || { echo "bench: building $revA failed" >&2; exit 1; }
build "$revB" "$dir/b" || { echo "bench: building ${revB:-the work tree} failed" >&2; exit 1; }
go build -o "$dir/" ./bench/waypoint || exit 1

echo "# run A=${revA} B=${revB:-work tree}: rps_ratio cpu_per_req_ratio waypoint_us nginx_us"
for _ in $(seq "$pairs"); do
	for v in a b; do
		extra=()
		if [ "$v" = b ] && [ -n "$flagsB" ]; then
			eval "extra=($flagsB)" # quoted words, as the caller wrote them
		fi
		# shellcheck disable=SC2086
		"$dir/waypoint" -bin "$dir/$v" $flags "${extra[@]}" 2>&1 | awk -v v="$v" '
			$2 == "waypoint_rps_ratio" { r = $3 }
			$2 == "waypoint_cpu_per_req_ratio" { c = $3 }
			$2 == "waypoint_cpu_us_per_req" { w = $3 }
			$2 == "nginx_cpu_us_per_req" { n = $3 }
			END { if (r == "") { print "bench: a run failed" > "/dev/stderr"; exit 1 }; print toupper(v), r, c, w, n }'
	done
done | tee "$dir/runs"
awk '
	function median(a, n,    i, j, t) {
		for (i = 2; i <= n; i++) for (j = i; j > 1 && a[j-1] > a[j]; j--) { t = a[j]; a[j] = a[j-1]; a[j-1] = t }
		return n % 2 ? a[(n+1)/2] : (a[n/2] + a[n/2+1]) / 2
	}
	{ n[$1]++; r[$1, n[$1]] = $2; c[$1, n[$1]] = $3; w[$1, n[$1]] = $4; rs[$1] += $2; cs[$1] += $3; ws[$1] += $4 }
	END {
		for (v = 1; v <= 2; v++) {
			k = v == 1 ? "A" : "B"
			if (!n[k]) continue
			for (i = 1; i <= n[k]; i++) { ra[i] = r[k, i]; ca[i] = c[k, i] }
			printf "bench: ab_%s_rps_ratio_mean %.3f x\nbench: ab_%s_rps_ratio_median %.3f x\n", k, rs[k]/n[k], k, median(ra, n[k])
			printf "bench: ab_%s_cpu_per_req_ratio_mean %.3f x\nbench: ab_%s_cpu_per_req_ratio_median %.3f x\n", k, cs[k]/n[k], k, median(ca, n[k])
			printf "bench: ab_%s_waypoint_cpu_us_per_req_mean %.2f us\n", k, ws[k]/n[k]
		}
		# Pairwise: run i of B against run i of A, which saw nearly the same
		# host; the own CPU per request of the waypoint does not carry the
		# run-to-run swings of nginx, unlike the ratios above.
		if (n["A"] != n["B"] || !n["A"]) exit
		won = 0
		for (i = 1; i <= n["A"]; i++) { pw[i] = w["B", i] / w["A", i]; if (r["B", i] > r["A", i]) won++ }
		printf "bench: ab_B_vs_A_waypoint_cpu_us_per_req_median %.3f x\n", median(pw, n["A"])
		printf "bench: ab_B_won_rps_ratio_pairs %d of %d\n", won, n["A"]
	}' "$dir/runs"
