#!/usr/bin/env bash
# Start an SGLang server with the given extra arguments, wait until it is ready,
# run loadgen.py at each concurrency, then stop the server.
# usage: sweep.sh LABEL "CONCURRENCIES" [server args...]
# env: MODEL (target dir), PORT, NUM_PER_C (requests per concurrency, default 4*c, min 8),
#      IN_LEN, OUT_LEN, LOG_DIR
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
label="$1"; concs="$2"; shift 2
model="${MODEL:-$here/models/llama3-8b}"  # the dummy Llama-3-8B-shaped target this repo ships
port="${PORT:-30000}"
log_dir="${LOG_DIR:-/tmp}"
log="$log_dir/server-$label.log"
setsid python3 -m sglang.launch_server --model-path "$model" --load-format dummy \
    --skip-tokenizer-init --port "$port" --host 127.0.0.1 "$@" >"$log" 2>&1 &
pid=$!
t0=$(date +%s)
until curl -sf "http://127.0.0.1:$port/health_generate" >/dev/null 2>&1; do
    if ! kill -0 $pid 2>/dev/null; then echo "[$label] server died; log tail:"; tail -40 "$log"; exit 1; fi
    if [ $(( $(date +%s) - t0 )) -gt ${START_TIMEOUT:-420} ]; then echo "[$label] start timeout"; tail -40 "$log"; kill -KILL -- -"$pid"; exit 1; fi
    sleep 2
done
echo "[$label] ready after $(( $(date +%s) - t0 )) s"
for c in $concs; do
    n=$(( c * 4 )); [ $n -lt 8 ] && n=8; n=${NUM_PER_C:-$n}
    python3 "$here/loadgen.py" --url "http://127.0.0.1:$port" --label "$label" \
        --concurrency "$c" --num "$n" --input-len "${IN_LEN:-256}" --output-len "${OUT_LEN:-256}"
done
stop_server() {
    kill -TERM -- -"$pid" 2>/dev/null
    for _ in $(seq 30); do kill -0 "$pid" 2>/dev/null || return 0; sleep 1; done
    kill -KILL -- -"$pid" 2>/dev/null; wait "$pid" 2>/dev/null
}
stop_server
echo "[$label] done"
