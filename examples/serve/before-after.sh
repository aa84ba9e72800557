#!/bin/sh
# Before/after rows as in bench/results/2026-12-06.md ("Before and after"):
# per config, gpuplane's models at SLO (starved models) and maxRateAt90
# over rates 0.5,1,2,4, with the gpuplane binary given.
#
#   git worktree add /tmp/before-src 9e17580   (or 874eb3f for the newer section)
#   (cd /tmp/before-src && go build -o /tmp/gp-before ./cmd/gpuplane)
#   go build -o /tmp/gp-after ./cmd/gpuplane
#   examples/serve/before-after.sh /tmp/gp-before examples/serve/*.yaml
#   examples/serve/before-after.sh /tmp/gp-after examples/serve/*.yaml
set -e
bin=$1
shift
for f in "$@"; do
	n=$(basename "$f" .yaml)
	r=$("$bin" simulate serve --config "$f" --policy gpuplane 2>/dev/null |
		awk '/models at SLO/ {m = $4 " of " $6} /starved models/ {s = $3} END {print m " (" s ")"}')
	x=$("$bin" simulate serve --config "$f" --policy gpuplane --sweep-rate 0.5,1,2,4 2>/dev/null |
		awk '$1 == "gpuplane" {print "×" $NF}')
	echo "| $n | $r | $x |"
done
