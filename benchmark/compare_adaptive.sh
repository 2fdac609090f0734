#!/usr/bin/env bash
# Same-run throughput comparison on one GPU host (dummy Llama-3-8B-shaped pair,
# simulated acceptance): plain decode, static EAGLE-3, upstream
# --speculative-adaptive, and this package's threshold policy. Prints one JSON line
# per configuration and concurrency (loadgen.py's format) and writes them to
# $OUT/compare.jsonl, server logs beside it.
#
# usage (from the repo root, SGLang and this package installed; see README):
#   benchmark/compare_adaptive.sh "1 8 32 128"
# env: ACC_LEN (2.5), STEPS (3), THRESHOLD (16), LABELS (which configs, default all),
#      EXTRA_CONCS (concurrencies for the plugin-overhead configs, default "1 32")
set -uo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
concs="${1:-1 8 32 128}"
steps="${STEPS:-3}"
acc="${ACC_LEN:-2.5}"
thr="${THRESHOLD:-16}"
labels="${LABELS:-plain eagle3 upstream-adaptive adaptive-threshold eagle3-without-plugin}"
extra_concs="${EXTRA_CONCS:-1 32}"
export LOG_DIR="${OUT:-/tmp}" MODEL="$repo/benchmark/models/llama3-8b"
common=(--attention-backend triton --sampling-backend pytorch --mem-fraction-static 0.7
        --max-running-requests 128 --cuda-graph-max-bs 128 --grammar-backend none
        --cuda-graph-backend-prefill disabled)
spec=(--speculative-algorithm EAGLE3 --speculative-draft-model-path "$repo/benchmark/models/llama3-8b-eagle3"
      --speculative-num-steps "$steps" --speculative-eagle-topk 1
      --speculative-num-draft-tokens $((steps + 1)))
run() {  # label concurrencies env... -- server args...
    local label="$1" c="$2"; shift 2
    local envs=(); while [ "$1" != "--" ]; do envs+=("$1"); shift; done; shift
    env "${envs[@]}" "$repo/benchmark/sweep.sh" "$label" "$c" "$@" | tee -a "$LOG_DIR/compare.log"
}
for label in $labels; do
    case "$label" in
    plain) run plain "$concs" -- "${common[@]}" ;;
    eagle3) run eagle3 "$concs" SGLANG_SIMULATE_ACC_LEN="$acc" -- "${common[@]}" "${spec[@]}" ;;
    upstream-adaptive) run upstream-adaptive "$concs" SGLANG_SIMULATE_ACC_LEN="$acc" -- \
        "${common[@]}" "${spec[@]}" --speculative-adaptive \
        --speculative-adaptive-config "$repo/benchmark/upstream-adaptive-max3.json" ;;
    adaptive-threshold) run adaptive-threshold "$concs" SGLANG_SIMULATE_ACC_LEN="$acc" -- \
        "${common[@]}" "${spec[@]}" --speculative-disable-batch-threshold "$thr" ;;
    # Static EAGLE-3 with SGLang's plugin loading restricted to another name: the
    # same server without this package's hooks (the 'eagle3' label has them, policy off).
    eagle3-without-plugin) run eagle3-without-plugin "$extra_concs" SGLANG_SIMULATE_ACC_LEN="$acc" \
        SGLANG_PLUGINS=none -- "${common[@]}" "${spec[@]}" ;;
    adaptive-never-plain) run adaptive-never-plain "$extra_concs" SGLANG_SIMULATE_ACC_LEN="$acc" -- \
        "${common[@]}" "${spec[@]}" --speculative-disable-batch-threshold 100000 ;;
    *) echo "unknown label $label"; exit 2 ;;
    esac
done
grep -h '^{' "$LOG_DIR/compare.log" >"$LOG_DIR/compare.jsonl"
