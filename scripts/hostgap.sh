#!/usr/bin/env bash
# Host time of configurations side by side on the 8B pair with spread output lengths
# (128-384): each configuration served ROUNDS times in turn (a, b, c, a, b, c) on a
# fresh server with SGLANG_ADAPTIVE_HOST_TIMING on, then benchmark/hosttime_report.py
# at decode-C, decode-(C-1) and extend. Everything lands under $OUT (one folder per
# server, report.md, hosttime.json). Run by gpu-host-run.sh's specgap and plaingap.
# usage: OUT=DIR scripts/hostgap.sh ACC_LEN CONCURRENCY ROUNDS CONFIG...
set -uo pipefail
acc=${1:?acc} c=${2:?concurrency} rounds=${3:?rounds}
shift 3
labels=()
for r in $(seq "$rounds"); do
    for cfg in "$@"; do
        n="$cfg-$r"
        labels+=("$n=$OUT/$n/timing")
        SGLANG_ADAPTIVE_HOST_TIMING="$OUT/$n/timing" python -m sglang_adaptive.bench --acc-len "$acc" \
            --configs "$cfg" --threshold 0 --closed "$c" --out-len 384 --out-len-min 128 \
            --requests-per-client 8 --rates "" --phases "" --out "$OUT/$n" >"$OUT/$n.log" 2>&1
        echo "$(date +%T) $n rc=$?: $(grep -o 'closed c=.*' "$OUT/$n.log" | head -1)"
    done
done
cat "$OUT"/*/results.jsonl >"$OUT/results.jsonl" 2>/dev/null
python benchmark/hosttime_report.py --bucket "decode-$c" --bucket "decode-$((c - 1))" --bucket extend \
    --json "$OUT/hosttime.json" "${labels[@]}" >"$OUT/report.md"
