#!/bin/sh
# artifact_load.sh - load-to-first-inference time of a compiled .kiln
# artifact against loading and optimizing its source model
# (docs/KILN_FORMAT.md, "Load time").
#
#   bench/artifact_load.sh [-n RUNS] MODEL.onnx|FOLDER ...
#
# For each model: write MODEL's .kiln (fp32, batch 1 precompiled) with the C
# API (build/tests/unit_kiln_artifact --save; `kiln compile` once it lands),
# then run `kiln bench --iterations 1 --warmup 0` on the source and on the
# .kiln, interleaved, RUNS times each (default 3), each in a fresh process,
# and print the median "load to first inference" of both and their ratio.
# BUILD (default build/) names the build folder.
set -eu
runs=3
if [ "${1:-}" = "-n" ]; then runs=$2; shift 2; fi
build=${BUILD:-build}
kiln=$build/kiln
tool=$build/tests/unit_kiln_artifact
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
first_ms() { # the "load to first inference N ms" figure of kiln bench
    "$kiln" bench "$1" --iterations 1 --warmup 0 2>&1 |
        sed -n 's/.*load to first inference \([0-9.]*\) ms.*/\1/p'
}
median() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf '%-28s %14s %14s %8s\n' model "source ms" ".kiln ms" speedup
for model in "$@"; do
    art=$tmp/$(basename "$(dirname "$model")")_$(basename "$model").kiln
    "$tool" --save "$model" "$art" fp32 1
    : >"$tmp/src" && : >"$tmp/art"
    i=0
    while [ $i -lt "$runs" ]; do
        first_ms "$model" >>"$tmp/src"
        first_ms "$art" >>"$tmp/art"
        i=$((i + 1))
    done
    s=$(median <"$tmp/src")
    a=$(median <"$tmp/art")
    printf '%-28s %14s %14s %7.1fx\n' "$(basename "$(dirname "$model")")" "$s" "$a" \
        "$(echo "$s $a" | awk '{print $1 / $2}')"
done
