#!/usr/bin/env bash
# Run GPU jobs longer than one device command (10 minutes) on the lent GPU host.
#
#   start STEP...   copy the repo to /tmp/repo (later calls re-sync the working tree in
#                   place; the jobs must not read a tree being rewritten), install the
#                   plugin from there, and run the steps one after another in a new
#                   process session, which outlives the command;
#   wait SECONDS    follow the jobs for at most SECONDS, then copy each step's folder
#                   (as STEP.tgz, logs included) and the progress log to $OUT; also every
#                   SNAPSHOT_S seconds (default 120) while waiting, for a lease that ends first.
#
# Steps: tiny   GPU suite on the trained tiny pair with its GPU mutants (10 servers side by side)
#        dummy  GPU suite on the dummy Llama-3-8B-shaped pair (4 side by side)
#        k25    GPU suite on the Kimi-K2.5-shaped pair at TP 2 (needs 2 GPUs; 3 servers side by side)
#        k25bench  the benchmark on that pair with the users' flags: no-spec, static EAGLE-3,
#               threshold 5, closed loop at 1, 8, 32, 128 (run after k25: warm kernel caches)
#        k25deep  k25bench on the 16-layer target (benchmark/models/k25-tp2-l16): a decode step long
#               enough to hide the scheduler's host work, as on the users' 61 layers
#        k25goodput  issue 13 on the K2.5 shape: the goodput policy alone on the 16-layer target at TP 2,
#               c=1 and 128, beside k25deep's static rows of the same lease
#        bench  python -m sglang_adaptive.bench with its defaults (the README's main job)
#        stream the benchmark's streaming closed loop at 1 and 128 only: plain, static
#               EAGLE-3 and adaptive (about 6 minutes)
#        train  test/fixtures/train_tiny_pair.py with its GPU defaults, timed; runs
#               beside the next step (its time is then an upper bound)
#        trainmla  test/fixtures/train_tiny_mla_pair.py on the GPU into test/fixtures/tiny-mla-pair,
#               then tinymla; both beside the next steps
#        tinymla  the MLA pair's fp32 equality suite at TP 1 (and TP 2 with 2 GPUs)
#        quick  the tiny pair's fp32 equality for the switching configurations and goodput only
#        grammar  regex and JSON-schema requests through plain batches against no-spec (xgrammar;
#               test/gpu/test_grammar_plain.py, tiny pair, fp32)
#        kinds  every request kind through plain batches (test/gpu/test_request_kinds.py, tiny pair, fp32)
#        telemetry  the Prometheus series and per-request counters against the log and each other
#               (test/gpu/test_telemetry.py, tiny pair, fp32, alternation every 7 steps)
#        soakplus  the soak with kinds and telemetry beside it (they check correctness, not speed)
#        soakmla  one GPU: the soak (memory fraction 0.3) with trainmla and tinymla beside it
#        soakquick  one GPU: the soak (memory fraction 0.3), and quick beside it once the soak's server holds its memory
#        soak   benchmark/soak.py: 20 minutes of oscillating open-loop load, every request kind,
#               aborts, strict memory check, after a warm-up request per kind (about 25 minutes
#               with the server's start on a cold host: call wait three times)
#        goodput  issue 13's sweep: dummy 8B pair at simulated acceptance 1.3, 2.5, 3.5, closed loop
#               1-128 with 8 waves of requests, no-spec / static EAGLE-3 / threshold / goodput; on one
#               GPU it outlasts a session's device time: narrow it with GOODPUT_ACCS (e.g. "2.5" or "1.3,3.5"),
#               GOODPUT_CONFIGS, GOODPUT_RPC, GOODPUT_PHASES (e.g. 15:2,15:96,15:2)
#        goodput1  issue 13's sweep on one GPU, most wanted first, 8 waves per point: 2.5 (no-spec, static
#               EAGLE-3, goodput), 3.5 and 1.3 at 32-128 (EAGLE-3, goodput; no-spec does not depend on the
#               simulated acceptance), the tiny pair at 1, 8, 64 with 16 waves, threshold at 2.5;
#               GOODPUT_ROUNDS=N serves each configuration N times in turn (medians and spread)
#        goodputr  issue 13's points that missed 0.98x in goodput1, two rounds each (a, b, a, b on fresh
#               servers; medians and spread): 2.5 at 1, 32, 64, 128 (no-spec, static EAGLE-3, goodput),
#               then goodput alone at 1.3 (32-128) and 3.5 (64, 128), against 2.5's no-spec rows
#        goodputmid  issue 13 at c=32 and 64, where goodput missed 0.98x by 2-3% (2026-12-01-h200-goodput-rounds):
#               no-spec and goodput at 2.5, two rounds, then goodput at 1.3, one (about 10 minutes;
#               the keep-warm's share of the gap: kwside)
#        goodputspread  the tiny pair at c=1, 8, 64, output lengths 32-128 (--out-len-min 32), two rounds: requests finish apart, so
#               no server's prefills come in synchronised waves (with one length, speculating servers ran
#               3.5x as many prefill batches as no-spec: 2026-12-02-h200-goodput-mid)
#        goodputspread8b  the 8B pair with output lengths 128-384 (mean 256, --out-len-min 128): no-spec,
#               static EAGLE-3 and goodput at acceptance 2.5, c=32, and 3.5, c=64: by decode steps plain leads
#               at both, end to end static EAGLE-3 led at 3.5 (prefill batches: 2026-12-02-h200-goodput-spread;
#               about 10 minutes)
#        goodputhigh  no-spec and goodput at acceptance 2.5, fixed lengths, c=32, 64, 128: above the crossover,
#               where a policy change must not cost plain throughput (about 6 minutes)
#        goodput13  goodput alone at simulated acceptance 1.3, c=32 and 64 (against an earlier no-spec row;
#               about 2 minutes)
#        goodput35  goodput at simulated acceptance 3.5 beside static EAGLE-3 at c=4 and 64, the two
#               points of 3.5 that missed 0.98x in goodput1
#        goodputctx  goodputmiss trimmed to fit a lease that lost starts (~6 min before the tail): 3.5 at
#               c=64, its crossover (no-spec, static EAGLE-3, goodput, two rounds), goodput at 2.5, c=64 and 1.3,
#               c=32 and 128 (one round, against 3.5's no-spec rows), then the tiny pair at 1, 8, 64
#        goodputctx1  goodputctx's first point on what is left of a lease (~3 min): no-spec and goodput at
#               3.5, c=64 (static EAGLE-3 made 0.92x no-spec there in every lease so far)
#        goodputnext  after the prefill-price exploration (81f7584): the tiny pair at 1, 8, 64 (no-spec,
#               static EAGLE-3, goodput), the phased load 15 s at c=2, 15 at 96, 15 at 2 at acceptance 2.5
#               (same three), 3.5 at c=16, 32, 128 (same three) and goodput at 1.3, c=16, 32, 128 (~20 min)
#        goodputrest  goodputnext's last two steps, which its lease did not reach (~9 min):
#               3.5 at c=16, 32, 128 (no-spec, static EAGLE-3, goodput), goodput at 1.3 there
#        goodputfull  issue 13's whole 8B sweep on one lease, most wanted first: 2.5 (no-spec, static EAGLE-3,
#               goodput, threshold 16), 3.5 (the same less no-spec, which does not read the acceptance), 1.3
#               (goodput, threshold); c=1-128, 8 waves per point (~30 min: a lease reaches 2.5 and most of 3.5)
#        goodputfull13  goodputfull's 1.3, which its lease did not reach, with its own no-spec rows (~12 min)
#        goodputlow35  3.5 at c=2, 4 and 16, two rounds (static EAGLE-3, goodput): one server per point split
#               the fixed-length waves' refills differently (2026-12-06-h100-goodput-full)
#        goodputtiny  the tiny pair at c=1, 8, 64 (no-spec, static EAGLE-3, goodput), output lengths fixed at
#               128 and spread over 64-192 (2026-12-06-h100-goodput-13-low35-tiny; ~9 min)
#        tinyspread2  goodputtiny's spread half (64-192) in two rounds (a, b, c, a, b, c on fresh servers;
#               ~8 min): one server's speculative steps ran 0.86-1.18x another's on this host-bound pair;
#               the goodput servers log why each batch ran in its mode (--decision-log)
#        tinypinned  tinyspread2 in three rounds with --pin-cpus (each scheduler on a physical core of its
#               own, the rest elsewhere): the tiny pair's bars with the host's placement noise out (~13 min)
#        tinyinter  the tiny pair's three servers up at once, each scheduler on its own core, every point
#               measured in slices taken in turn (--interleave 8 --pin-cpus; spread lengths, 24 requests
#               per slot; ~4 min cold): host drift over seconds then slows every configuration alike
#        tinyc1judge  tinyinterjudge's c=1 alone with 96 requests (~2.5 min cold): its plain stretches, by reason
#        tinyc1quick  static EAGLE-3 and goodput alone at c=1, 48 requests (~3 min cold): what fits a short lease
#        tinyspecgap  where goodput's speculative steps lose 4-6% to static EAGLE-3's on the tiny pair at batch 1:
#               EAGLE-3, the adaptive worker that never goes plain (the controller's step timing, no policy
#               answer) and goodput, interleaved at c=1, 64 requests (~4.5 min cold)
#        tinygapsplit  tinyspecgap's split one step further, c=1, 32 requests: static EAGLE-3 and
#               never-plain with keep-warm none and kv (~4 min cold)
#        tinygapsplit2  never-plain's 0.1 ms split by what the server holds, c=1, 32 requests, 6 servers
#               interleaved: static EAGLE-3 without the plugin and with its hooks; with upstream's controller,
#               the adaptive subclass alone (adaptive-bare), with its plain attention backend
#               (adaptive-backend-only), with its plain graphs and keep-warm too (adaptive-worker-only);
#               never-plain (~8 min cold; the servers waiting their turn sleep on idle)
#        tinygapsplit3  tinygapsplit2's deciding three (static EAGLE-3, adaptive-bare, adaptive-worker-only)
#               with 96 requests in 16 slices (~5 min cold): what fits a short lease
#        tinygapgoodput  static EAGLE-3, never-plain and goodput at c=1, 96 requests in 16 slices (~5 min cold):
#               is goodput's c=1 gap its own per-batch work, measured in one run
#        tinyc1goodput  static EAGLE-3 and goodput alone at c=1, 96 requests in 16 slices (~4 min cold): the
#               tiny pair's c=1 bar in the least device time
#        tinyprofgap  SGLang's profiler (benchmark/profile_decode.py, 200 steps, Python frames) on static EAGLE-3
#               and never-plain at c=1 on the tiny pair, one after the other (~5 min cold): which functions,
#               calls or kernels make never-plain's speculative step 0.1 ms slower (traces stay under /tmp/traces)
#        tinyinterjudge  tinyinter without --decision-log (the log's line per batch costs the goodput
#               server host time static EAGLE-3 does not pay; ~5 min cold)
#        tinyjudgelong  tinyinterjudge with 96 requests per client in 16 slices (620 s on a fresh
#               machine: wait twice): slices of one host swing +-15%, so a 2% bar needs more of them
#        tinyjudgethreads  tinyjudgelong with benchmark/thread_sampler.py beside it: the threads of every
#               server process and of the bench, CPU time and the CPU each ran on every 0.5 s (threads.jsonl;
#               --summarize it): in a server's slow stretches, does another thread take its scheduler's
#               core, or run on a CPU that may share its physical core (the VM does not show which)
#        hostgoodput  the host timing of static EAGLE-3 and of goodput without and with --decision-log,
#               pinned, c=1, 8, 64 (~4 min): what the goodput policy adds to a speculative step
#        hostgap1  hostgoodput's host timing for static EAGLE-3 and never-plain, c=1 only, 32 requests (~4 min cold):
#               which scheduler function holds never-plain's 0.1 ms a speculative step (tinyprofgap found
#               run_batch's calls the same in both)
#        hostgap1r  hostgap1 with never-plain's server first
#        hostpinned  hosttiny's no-spec and always-plain servers with --pin-cpus: the plain step's extra host
#               time with the placement noise out (~3 min)
#        tinyc1  tinyspread2's c=1 alone, static EAGLE-3 and goodput, 48 requests each (~4 min cold)
#        goodputmiss  the points that missed 0.98x in 2026-12-04-h200-goodput-sweep, with rounds: 3.5 at c=16, 32,
#               64, 128 (no-spec, static EAGLE-3, goodput, two rounds each), goodput at 1.3, c=32 and 128, and
#               at 2.5, c=64 (two rounds each, against 3.5's no-spec rows: no-spec does not read the simulated
#               acceptance), then the tiny pair at 1, 8, 64 (one round; ~25 min)
#        hosttiny  the tiny pair (host-bound: 1-4 ms a step) with the host timing on, c=1, 8, 64: no-spec,
#               always plain, static EAGLE-3, always speculative; per-function tables at each batch size
#        flushgraphs  the deferred keep-warm writes' flush as graphs (the default) against the eager flush
#               (SGLANG_ADAPTIVE_KEEP_WARM_FLUSH_GRAPHS=1 and =0, each set explicitly):
#               the tiny pair's K/V test (alternate-50, eager and captured flush), host time of always plain
#               on the tiny pair (no-spec, eager flush, flush graphs), 8B always plain at c=32, 64 (both)
#        goodput2  issue 13's sweep on two GPUs at once, one bench per GPU (CUDA_VISIBLE_DEVICES,
#               own port): GPU 0 acceptance 2.5 with all four configurations and the phased load;
#               GPU 1 1.3 (no-spec, static EAGLE-3, goodput), then 3.5 (EAGLE-3, goodput; its
#               no-spec row is 1.3's), then the trained tiny pair (real acceptance) at 1, 8, 64
#        goodputfix  the goodput configuration alone after a policy fix, beside goodput2's static rows
#               (GPU 0: 2.5 with the phased load, 1.3 at 1-32, the tiny pair; GPU 1: grammar, the tiny
#               pair's no-spec and static EAGLE-3, 3.5 at 16-128)
#        keepwarm  issue 14: the draft keep-warm GPU test on the tiny pair (fp32: tokens against
#               no-spec, tokens per verify per strategy, recovery after 50-step plain stretches, the
#               K/V check)
#        keepwarmkv  the keep-warm test's kv configurations only (with no-spec and static EAGLE-3)
#        kwside  the kv writer on its side stream: the keep-warm test's alternate-1 kv configurations
#               (tokens, K/V check, unchecked kv's tokens per verify), then its cost always plain at
#               c=32 and 64 (none, kv on the side stream; kv on the forward stream in kwsame; ~11 min)
#        kwdefer  kv with its writes deferred (SGLANG_ADAPTIVE_KEEP_WARM_DEFER=8): the keep-warm test's
#               alternate-50 configurations (tokens, tokens per verify and the first step after a
#               stretch against per-step kv), then its cost always plain at c=32 and 64 beside none
#               and per-step kv (~12 min)
#        plainprefill  prefills without the draft's extend while decode runs plain, with deferred kv writes
#               (both defaults now): the keep-warm test's alternate-50 configurations against the draft's
#               extend at every prefill (tokens, tokens per verify, first step after a stretch), goodput
#               at 2.5 and c=64 beside no-spec, then always plain at c=64 with and without (~11 min)
#        ttftgap  where the adaptive server's longer TTFT at c=64 goes: dummy 8B pair, no-spec against
#               always-plain without keep-warm, closed c=64, scheduler host time per decode-64 and
#               extend iteration (sglang_adaptive.hosttime; ~6 min)
#        prefillgap  ttftgap with output lengths 128-384 and the default keep-warm: what a prefill batch
#               costs an always-plain server beside no-spec when prefills come between decode steps
#               (goodput spent ~4.5 ms more per prefill batch than no-spec in 2026-12-02-h200-goodput-spread;
#               ~6 min)
#        specgap  where goodput's speculative stretches lose to static EAGLE-3 (0.86x its speculative
#               decode windows at 3.5, c=64, lengths 128-384: 2026-12-03-h200-prefill-priced): host timing on,
#               static EAGLE-3, never plain (threshold 100000) and goodput, two rounds a, b, c, a, b, c; a
#               per-function report at decode-64, decode-63 and extend (~15 min)
#        plaingap  the same at 2.5, c=32 for the plain side (goodput plain on 90%: 0.906x no-spec): no-spec,
#               always plain (threshold 0) and goodput, one round (~7 min)
#        plaingap64  plaingap at 3.5, c=64: no-spec, always plain and goodput, where goodput's plain
#               stretch paid about 45 ms a prefill batch (2026-12-04-h200-prefill-sync; ~6 min)
#        prefillprof  what a prefill batch waits for: SGLang's profiler (benchmark/profile_decode.py, 60
#               forward steps after 8 s of load) on no-spec, static EAGLE-3, goodput and always plain at
#               3.5, c=64, lengths 128-384, where no-spec's extend iteration took 36 ms of host time and static
#               EAGLE-3's 19 (traces stay on the host, under /tmp/traces; ~10 min; PREFILLPROF_CONFIGS narrows it)
#        pricefix  a mode's unmeasured prefill price derived from the other's less the step-time difference:
#               lengths 128-384, 8 waves; 3.5, c=64: static EAGLE-3 and goodput, two rounds; 2.5, c=32: no-spec,
#               static EAGLE-3 and goodput (~13 min)
#        hostsync  test/gpu/test_host_sync.py alone: the keep-warm's hot-path bookkeeping under CUDA's
#               sync debug mode (seconds, no server)
#        syncfix  after the keep-warm's prefill sync was removed: test/gpu/test_host_sync.py, then specgap
#               and plaingap's points once each with static EAGLE-3 beside both (~11 min)
#        prefillcost  what an EAGLE-3 server's prefill costs beside no-spec's: 256-token prompts, 2 output
#               tokens, closed c=32 and 64, no-spec against always-plain without keep-warm (~5 min)
#        kwcost the keep-warm cost: dummy 8B pair always plain (threshold 0), none / kv / full at
#               c=1, 32, 128 (alone on the GPU); kwcost2: kv and none again at c=128, in that order
#        checks side by side (tiny pair, correctness only): grammar, kinds, and the keep-warm test's
#               ramp configurations with static EAGLE-3 under the same ramp
#        grammarmix  issue 15's throughput bar: the tiny pair at c=128 with 10% of requests
#               constrained to a JSON schema, no-spec against threshold 16 (plain at c=128)
#        barrier  wait for the steps running in the background (train, trainmla) before the next.
#               A TP 2 server started beside them refuses to start ("The memory capacity is
#               unbalanced": SGLang wants the same free memory on both GPUs), so run k25 before
#               trainmla or after a barrier
#        hosttime  scheduler host time per decode iteration (sglang_adaptive.hosttime): the k25
#               pair at K25_TP (default 2), no-spec against always-plain, closed loop 8, 32, 128
#
# usage, after `source .gpu-bundle/gpu/setup-host.sh`:
#   scripts/gpu-host-run.sh start train tiny dummy bench && scripts/gpu-host-run.sh wait 540
#   scripts/gpu-host-run.sh wait 590          # next call, within the machine's warm period
set -uo pipefail
W=/tmp/gpu-jobs
cmd="${1:?start STEP... | wait SECONDS}"
shift

if [ "$cmd" = start ]; then
    mkdir -p /tmp/repo "$W"
    tar -C "$(cd "$(dirname "$0")/.." && pwd)" --exclude=./.gpu-bundle -cf - . | tar -C /tmp/repo -xf -
    cd /tmp/repo || exit 1
    # shellcheck disable=SC1091
    source scripts/install-on-gpu-host.sh || exit 1
    export PYTHONUNBUFFERED=1
    # wait looks for "all done" after the last such line: a second start in one lease
    # must not find the first one's.
    echo "$(date +%T) run: $*" >>"$W/progress.log"
    setsid bash -c '
        W='"$W"'
        step() {  # name, command...
            local name="$1"; shift
            mkdir -p "$W/$name"
            echo "$(date +%T) start $name" >>"$W/progress.log"
            local t0=$SECONDS
            OUT="$W/$name" "$@" >"$W/$name/output.txt" 2>&1
            local rc=$?  # before any $(...) below resets it
            echo "$(date +%T) end $name rc=$rc after $((SECONDS - t0)) s" >>"$W/progress.log"
        }
        gp() {  # GPU, port, step name, bench arguments...: one bench on one GPU, beside another
            local gpu=$1 port=$2 name=$3; shift 3
            step "$name" env CUDA_VISIBLE_DEVICES="$gpu" python -m sglang_adaptive.bench --port "$port" \
                --requests-per-client 2 --rates "" --phases "" --out "$W/$name" "$@"
        }
        sweep() {  # step name, bench arguments...: one bench alone on the GPU, 8 waves per point
            local name=$1; shift
            step "$name" python -m sglang_adaptive.bench --requests-per-client "${GOODPUT_RPC:-8}" \
                --rates "" --phases "" --out "$W/$name" "$@"
        }
        tinyslices() {  # step name, requests per client, concurrencies, configurations, more bench arguments:
            # the tiny pair, its servers up at once, pinned, every point in 8 slices taken in turn (spread lengths)
            local name=$1 rpc=$2 closed=$3 configs=$4; shift 4
            GOODPUT_RPC=$rpc sweep "$name" --pair tiny --in-len 64 --closed "$closed" --configs "$configs" \
                --out-len 192 --out-len-min 64 --pin-cpus --interleave 8 "$@"
        }
        judgelong() {  # step name: tinyinterjudge with 96 requests per client in 16 slices
            tinyslices "$1" 96 1,8,64 plain,eagle3,adaptive-goodput --interleave 16
        }
        hostgap() {  # step name, servers in run order (eagle3, never): the host timing at c=1, 32
            # requests, pinned, one server after another, then the report of the two
            local name=$1; shift
            for r in "$@"; do
                local c=$r; [ "$r" = never ] && c=adaptive-never-plain
                ht "$name-$r" --configs "$c" --pin-cpus --closed 1 --requests-per-client 32
            done
            step "$name-report" python benchmark/hosttime_report.py --bucket decode-1 --json "$W/$name-report/hosttime.json" \
                eagle3="$W/$name-eagle3/timing" never-plain="$W/$name-never/timing"
        }
        plaincost() {  # step name, environment (VAR=value ..., or ""), bench arguments...: the keep-warm
            local name=$1 vars=$2; shift 2  # cost, always plain at c=32 and 64 (6 waves), alone on the GPU
            step "$name" env $vars python -m sglang_adaptive.bench --configs adaptive-threshold --threshold 0 \
                --closed 32,64 --requests-per-client 6 --rates "" --phases "" --out "$W/$name" "$@"
        }
        ht() {  # step name, bench arguments: the tiny pair (host-bound) with the host timing on
            step "$1" env SGLANG_ADAPTIVE_HOST_TIMING="$W/$1/timing" python -m sglang_adaptive.bench \
                --pair tiny --in-len 64 --out-len 128 --closed 1,8,64 --requests-per-client 8 \
                --rates "" --phases "" --out "$W/$1" "${@:2}"
        }
        gputest() {  # step name, port base, test file: one GPU test module on its own ports
            step "$1" env ADAPTIVE_GPU_REQUIRED=1 ADAPTIVE_GPU_PORT_BASE="$2" python -m pytest -m gpu "$3" -v \
                -p no:cacheprovider
        }
        tinymla() {  # MLA_TP_SIZES=2: TP 2 only
            step tinymla env ADAPTIVE_GPU_PARALLEL=6 ADAPTIVE_GPU_REQUIRED=1 ADAPTIVE_GPU_PORT_BASE=32000 \
                ADAPTIVE_GPU_TP_SIZES="${MLA_TP_SIZES:-}" \
                python -m pytest -m gpu \
                test/gpu/test_tiny_mla_pair.py -v -p no:cacheprovider
        }
        soak() {  # extra soak.py arguments
            step soak python benchmark/soak.py --minutes 20 --out "$W/soak" "$@"
        }
        trainmla() {  # train the MLA pair on the GPU, then serve it (tinymla)
            step trainmla python test/fixtures/train_tiny_mla_pair.py --device cuda \
                --out test/fixtures/tiny-mla-pair
            tinymla
        }
        quick() {  # extra environment assignments (VAR=value ...)
            step quick env ADAPTIVE_GPU_PARALLEL=8 ADAPTIVE_GPU_REQUIRED=1 "$@" \
                ADAPTIVE_GPU_ONLY=plain-fp32,alternate-1-fp32,alternate-7-fp32,threshold-8-ramp-fp32,threshold-0-fp32,goodput-fp32 \
                python -m pytest -m gpu test/gpu/test_tiny_pair.py -v -p no:cacheprovider \
                -k "fp32 and not eagle3 and not bf16"
        }
        for s in '"$*"'; do
            case "$s" in
            train) step train python test/fixtures/train_tiny_pair.py --out "$W/train/pair" & ;;
            trainmla) trainmla & ;;
            tinymla) tinymla ;;
            quick) quick ;;
            hosttime) for c in plain adaptive-threshold; do
                        step "hosttime-$c" env SGLANG_ADAPTIVE_HOST_TIMING="$W/hosttime-$c/timing" \
                            python -m sglang_adaptive.bench --pair k25 --tp "${K25_TP:-2}" --threshold 0 \
                            --configs "$c" --closed 8,32,128 --requests-per-client 2 --rates "" --phases "" \
                            --out "$W/hosttime-$c"
                      done
                      step hosttime python benchmark/hosttime_report.py --bucket decode-8 --bucket decode-32 \
                          --bucket decode-128 --json "$W/hosttime/hosttime.json" \
                          plain="$W/hosttime-plain/timing" adaptive="$W/hosttime-adaptive-threshold/timing" ;;
            tiny) step tiny env ADAPTIVE_GPU_PARALLEL=10 ADAPTIVE_GPU_REQUIRED=1 python -m pytest -m gpu test/gpu/test_tiny_pair.py -v -p no:cacheprovider --mutants ;;
            dummy) step dummy env ADAPTIVE_GPU_PARALLEL=4 ADAPTIVE_GPU_REQUIRED=1 python -m pytest -m gpu test/gpu/test_adaptive_worker.py -v -p no:cacheprovider ;;
            k25) step k25 env ADAPTIVE_GPU_PARALLEL=3 ADAPTIVE_GPU_REQUIRED=1 ADAPTIVE_REQUIRE_TP2=1 python -m pytest -m gpu test/gpu/test_k25_shape.py -v -p no:cacheprovider ;;
            k25bench) step k25bench python -m sglang_adaptive.bench --pair k25 --tp 2 --threshold 5 \
                        --configs plain,eagle3,adaptive-threshold --closed 1,8,32,128 --requests-per-client 2 \
                        --rates "" --phases "" --out "$W/k25bench" ;;
            k25deep) step k25deep python -m sglang_adaptive.bench --pair k25 --k25-layers 16 --tp 2 --threshold 5 \
                        --configs plain,eagle3,adaptive-threshold --closed 1,8,32,128 --requests-per-client 2 \
                        --rates "" --phases "" --out "$W/k25deep" ;;
            k25goodput) step k25goodput python -m sglang_adaptive.bench --pair k25 --k25-layers 16 --tp 2 \
                        --configs adaptive-goodput --closed 1,128 --requests-per-client 4 --rates "" --phases "" \
                        --out "$W/k25goodput" ;;
            bench) step bench python -m sglang_adaptive.bench --out "$W/bench" ;;
            soak) soak ;;
            grammar) gputest grammar 34000 test/gpu/test_grammar_plain.py ;;
            kinds) gputest kinds 33000 test/gpu/test_request_kinds.py ;;
            telemetry) gputest telemetry 35000 test/gpu/test_telemetry.py ;;
            soakplus) soak &
                    { gputest kinds 33000 test/gpu/test_request_kinds.py
                      gputest telemetry 35000 test/gpu/test_telemetry.py; } &
                    wait ;;
            soakmla) soak --mem-fraction-static 0.3 &
                    trainmla &
                    wait ;;
            soakquick) soak --mem-fraction-static 0.3 &
                    { sleep 90; quick ADAPTIVE_GPU_PORT_BASE=32000; } &
                    wait ;;
            goodput) accs="${GOODPUT_ACCS:-1.3,2.5,3.5}"
                      for acc in ${accs//,/ }; do
                        step "goodput-$acc" python -m sglang_adaptive.bench --acc-len "$acc" \
                            --configs "${GOODPUT_CONFIGS:-plain,eagle3,adaptive-threshold,adaptive-goodput}" \
                            --closed 1,2,4,8,16,32,64,128 --requests-per-client "${GOODPUT_RPC:-8}" --rates "" \
                            --phases "${GOODPUT_PHASES:-}" --out "$W/goodput-$acc"
                      done ;;
            goodput1) g1() {
                          sweep "$1" --closed "${G1_CLOSED:-1,2,4,8,16,32,64,128}" --rounds "${GOODPUT_ROUNDS:-1}" "${@:2}"
                      }
                      g1 g1-2.5 --acc-len 2.5 --configs plain,eagle3,adaptive-goodput
                      g1 g1-3.5 --acc-len 3.5 --configs eagle3,adaptive-goodput
                      G1_CLOSED=32,64,128 g1 g1-1.3 --acc-len 1.3 --configs eagle3,adaptive-goodput
                      G1_CLOSED=1,8,64 GOODPUT_RPC=16 g1 g1-tiny --pair tiny --in-len 64 --out-len 128 \
                          --configs plain,eagle3,adaptive-goodput
                      g1 g1-2.5-threshold --acc-len 2.5 --configs adaptive-threshold ;;
            goodputr) sweep gr-2.5 --rounds 2 --acc-len 2.5 --closed 1,32,64,128 --configs plain,eagle3,adaptive-goodput
                      sweep gr-1.3 --rounds 2 --acc-len 1.3 --closed 32,64,128 --configs adaptive-goodput
                      sweep gr-3.5 --rounds 2 --acc-len 3.5 --closed 64,128 --configs adaptive-goodput ;;
            goodputmid) sweep gm-2.5 --rounds 2 --acc-len 2.5 --closed 32,64 --configs plain,adaptive-goodput
                      sweep gm-1.3 --acc-len 1.3 --closed 32,64 --configs adaptive-goodput ;;
            goodputspread) GOODPUT_RPC=16 sweep gs-tiny --pair tiny --in-len 64 --out-len 128 --out-len-min 32 \
                            --closed 1,8,64 --rounds "${GOODPUT_ROUNDS:-2}" --configs plain,eagle3,adaptive-goodput ;;
            goodputspread8b) sweep gs8-2.5 --acc-len 2.5 --closed 32 --out-len 384 --out-len-min 128 \
                            --configs plain,eagle3,adaptive-goodput
                      sweep gs8-3.5 --acc-len 3.5 --closed 64 --out-len 384 --out-len-min 128 \
                            --configs plain,eagle3,adaptive-goodput ;;
            goodputhigh) sweep gh-2.5 --acc-len 2.5 --closed 32,64,128 --configs plain,adaptive-goodput ;;
            goodput13) sweep g13 --acc-len 1.3 --closed 32,64 --configs adaptive-goodput ;;
            goodput35) sweep g3-3.5 --acc-len 3.5 --closed 4,64 --configs eagle3,adaptive-goodput ;;
            goodputctx1) sweep gx-3.5 --acc-len 3.5 --closed 64 --configs plain,adaptive-goodput ;;
            goodputnext) GOODPUT_RPC=16 sweep gn-tiny --pair tiny --in-len 64 --out-len 128 --closed 1,8,64 \
                          --configs plain,eagle3,adaptive-goodput
                      step gn-phased python -m sglang_adaptive.bench --acc-len 2.5 --closed "" --rates "" \
                          --phases 15:2,15:96,15:2 --configs plain,eagle3,adaptive-goodput --out "$W/gn-phased" ;&
            goodputrest) sweep gn-3.5 --acc-len 3.5 --closed 16,32,128 --configs plain,eagle3,adaptive-goodput
                      sweep gn-1.3 --acc-len 1.3 --closed 16,32,128 --configs adaptive-goodput ;;
            goodputfull) full=(--closed 1,2,4,8,16,32,64,128)
                      sweep gf-2.5 "${full[@]}" --acc-len 2.5 --configs plain,eagle3,adaptive-goodput,adaptive-threshold
                      sweep gf-3.5 "${full[@]}" --acc-len 3.5 --configs eagle3,adaptive-goodput,adaptive-threshold
                      sweep gf-1.3 "${full[@]}" --acc-len 1.3 --configs adaptive-goodput,adaptive-threshold ;;
            goodputfull13) sweep gf-1.3 --closed 1,2,4,8,16,32,64,128 --acc-len 1.3 \
                          --configs plain,adaptive-goodput,adaptive-threshold ;;
            goodputlow35) sweep gl-3.5 --rounds 2 --acc-len 3.5 --closed 2,4,16 --configs eagle3,adaptive-goodput ;;
            goodputtiny) tiny=(--pair tiny --in-len 64 --closed 1,8,64 --configs plain,eagle3,adaptive-goodput)
                      GOODPUT_RPC=16 sweep gt-tiny "${tiny[@]}" --out-len 128
                      GOODPUT_RPC=16 sweep gt-tiny-spread "${tiny[@]}" --out-len 192 --out-len-min 64 ;;
            tinyc1) GOODPUT_RPC=48 sweep gt-tiny-c1 --pair tiny --in-len 64 --closed 1 \
                          --configs eagle3,adaptive-goodput --out-len 192 --out-len-min 64 --decision-log ;;
            tinypinned) GOODPUT_RPC=16 sweep gt-tiny-pinned --pair tiny --in-len 64 --closed 1,8,64 --rounds 3 \
                          --configs plain,eagle3,adaptive-goodput --out-len 192 --out-len-min 64 --decision-log \
                          --pin-cpus ;;
            tinyspread2) GOODPUT_RPC=16 sweep gt-tiny-spread2 --pair tiny --in-len 64 --closed 1,8,64 --rounds 2 \
                          --configs plain,eagle3,adaptive-goodput --out-len 192 --out-len-min 64 --decision-log ;;
            goodputctx) sweep gx-3.5 --rounds 2 --acc-len 3.5 --closed 64 --configs plain,eagle3,adaptive-goodput
                      sweep gx-2.5 --acc-len 2.5 --closed 64 --configs adaptive-goodput
                      sweep gx-1.3 --acc-len 1.3 --closed 32,128 --configs adaptive-goodput
                      GOODPUT_RPC=16 sweep gx-tiny --pair tiny --in-len 64 --out-len 128 --closed 1,8,64 \
                          --configs plain,eagle3,adaptive-goodput ;;
            goodputmiss) sweep gx-3.5 --rounds 2 --acc-len 3.5 --closed 16,32,64,128 --configs plain,eagle3,adaptive-goodput
                      sweep gx-1.3 --rounds 2 --acc-len 1.3 --closed 32,128 --configs adaptive-goodput
                      sweep gx-2.5 --rounds 2 --acc-len 2.5 --closed 64 --configs adaptive-goodput
                      GOODPUT_RPC=16 sweep gx-tiny --pair tiny --in-len 64 --out-len 128 --closed 1,8,64 \
                          --configs plain,eagle3,adaptive-goodput ;;
            goodput2) sweep=(--closed 1,2,4,8,16,32,64,128)
                      gp 0 30000 goodput-2.5 "${sweep[@]}" --acc-len 2.5 --configs plain,eagle3,adaptive-threshold,adaptive-goodput \
                          --phases 15:2,15:96,15:2 &
                      { gp 1 31000 goodput-1.3 "${sweep[@]}" --acc-len 1.3 --configs plain,eagle3,adaptive-goodput
                        gp 1 31000 goodput-3.5 "${sweep[@]}" --acc-len 3.5 --configs eagle3,adaptive-goodput
                        gp 1 31000 goodput-tiny --pair tiny --closed 1,8,64 --in-len 64 --out-len 128 \
                            --configs plain,eagle3,adaptive-goodput; } &
                      wait ;;
            goodputfix) { gp 0 30000 fix-2.5 --acc-len 2.5 --configs adaptive-goodput --closed 1,2,4,8,16,32,64,128 \
                            --phases 15:2,15:96,15:2
                        gp 0 30000 fix-1.3 --acc-len 1.3 --configs adaptive-goodput --closed 1,2,4,8,16,32
                        gp 0 30000 fix-tiny --pair tiny --closed 1,8,64 --in-len 64 --out-len 128 \
                            --configs adaptive-goodput; } &
                      { step grammar env CUDA_VISIBLE_DEVICES=1 ADAPTIVE_GPU_PORT_BASE=33000 ADAPTIVE_GPU_REQUIRED=1 \
                            timeout 420 python -m pytest -m gpu test/gpu/test_grammar_plain.py -v -p no:cacheprovider
                        gp 1 31000 fix-tiny-static --pair tiny --closed 1,8,64 --in-len 64 --out-len 128 \
                            --configs plain,eagle3
                        gp 1 31000 fix-3.5 --acc-len 3.5 --configs adaptive-goodput --closed 16,32,64,128; } &
                      wait ;;
            keepwarm) step keepwarm env ADAPTIVE_GPU_PARALLEL=8 ADAPTIVE_GPU_REQUIRED=1 python -m pytest -m gpu \
                        test/gpu/test_keep_warm.py -v -p no:cacheprovider ;;
            keepwarmkv) step keepwarm env ADAPTIVE_GPU_PARALLEL=8 ADAPTIVE_GPU_REQUIRED=1 \
                        ADAPTIVE_GPU_ONLY=plain,eagle3,plain-long,alternate-1-kv,alternate-7-kv,threshold-8-ramp-kv,alternate-50-kv,alternate-1-no-overlap-kv \
                        python -m pytest -m gpu test/gpu/test_keep_warm.py -v -p no:cacheprovider ;;
            kwcost) step kwcost python -m sglang_adaptive.bench --configs adaptive-threshold --threshold 0 \
                        --keep-warm none,kv,full --closed 1,32,128 --requests-per-client 6 --rates "" --phases "" \
                        --out "$W/kwcost" ;;
            kwside) step kwside-test env ADAPTIVE_GPU_PARALLEL=4 ADAPTIVE_GPU_REQUIRED=1 \
                        ADAPTIVE_GPU_ONLY=plain,alternate-1-kv,alternate-1-unchecked-kv,alternate-1-no-overlap-kv \
                        python -m pytest -m gpu test/gpu/test_keep_warm.py -v -p no:cacheprovider \
                        -k "greedy or writes_the or side_stream"
                    plaincost kwside SGLANG_ADAPTIVE_KEEP_WARM_DEFER=1 --keep-warm none,kv
                    plaincost kwsame "SGLANG_ADAPTIVE_KEEP_WARM_STREAM=0 SGLANG_ADAPTIVE_KEEP_WARM_DEFER=1" --keep-warm kv ;;
            kwdefer) step kwdefer-test env ADAPTIVE_GPU_PARALLEL=3 ADAPTIVE_GPU_REQUIRED=1 \
                        ADAPTIVE_GPU_ONLY=plain-long,alternate-50-kv,alternate-50-deferred-kv \
                        python -m pytest -m gpu test/gpu/test_keep_warm.py -v -p no:cacheprovider \
                        -k "alternate-50 or deferred"
                    plaincost kwdefer-per-step SGLANG_ADAPTIVE_KEEP_WARM_DEFER=1 --keep-warm none,kv
                    plaincost kwdefer SGLANG_ADAPTIVE_KEEP_WARM_DEFER=8 --keep-warm kv ;;
            plainprefill) step pp-test env ADAPTIVE_GPU_PARALLEL=4 ADAPTIVE_GPU_REQUIRED=1 \
                        ADAPTIVE_GPU_ONLY=plain-long,alternate-50-kv,alternate-50-draft-prefill-kv,alternate-50-deferred-kv \
                        python -m pytest -m gpu test/gpu/test_keep_warm.py -v -p no:cacheprovider \
                        -k "alternate-50 or deferred or prefills"
                    sweep pp-goodput --acc-len 2.5 --closed 64 --configs plain,adaptive-goodput
                    for v in 1 0; do
                        step "pp-plain-prefill-$v" env SGLANG_ADAPTIVE_PLAIN_PREFILL="$v" python -m sglang_adaptive.bench \
                            --configs adaptive-threshold --threshold 0 --closed 64 --requests-per-client 8 \
                            --rates "" --phases "" --out "$W/pp-plain-prefill-$v"
                    done ;;
            ttftgap) for c in plain adaptive-threshold; do
                        step "ttftgap-$c" env SGLANG_ADAPTIVE_HOST_TIMING="$W/ttftgap-$c/timing" \
                            python -m sglang_adaptive.bench --configs "$c" --threshold 0 --keep-warm none \
                            --closed 64 --requests-per-client 8 --rates "" --phases "" --out "$W/ttftgap-$c"
                      done
                      step ttftgap python benchmark/hosttime_report.py --bucket decode-64 --bucket extend \
                          --json "$W/ttftgap/hosttime.json" plain="$W/ttftgap-plain/timing" \
                          adaptive="$W/ttftgap-adaptive-threshold/timing" ;;
            hosttiny) ht ht-plain --configs plain
                      ht ht-always-plain --configs adaptive-threshold --threshold 0
                      ht ht-eagle3 --configs eagle3
                      ht ht-always-spec --configs adaptive-threshold --threshold 128
                      step ht-report python benchmark/hosttime_report.py --bucket decode-1 --bucket decode-8 \
                          --bucket decode-64 --json "$W/ht-report/hosttime.json" plain="$W/ht-plain/timing" \
                          always-plain="$W/ht-always-plain/timing" eagle3="$W/ht-eagle3/timing" \
                          always-spec="$W/ht-always-spec/timing" ;;
            tinyinter) tinyslices gt-tiny-inter 24 1,8,64 plain,eagle3,adaptive-goodput --decision-log ;;
            tinyc1judge) tinyslices gt-tiny-c1-judge 96 1 plain,eagle3,adaptive-goodput ;;
            tinyc1quick) tinyslices gt-tiny-c1-quick 48 1 eagle3,adaptive-goodput ;;
            tinyspecgap) tinyslices gt-tiny-specgap 64 1 eagle3,adaptive-never-plain,adaptive-goodput ;;
            tinyinterjudge) tinyslices gt-tiny-judge 24 1,8,64 plain,eagle3,adaptive-goodput ;;
            tinyjudgelong) judgelong gt-tiny-judge-long ;;
            tinyjudgethreads) mkdir -p "$W/gt-tiny-judge-threads"
                      python benchmark/thread_sampler.py --out "$W/gt-tiny-judge-threads/threads.jsonl" --seconds 900 \
                          --match sglang:: --match sglang.launch_server --match sglang_adaptive.bench &
                      sampler=$!
                      judgelong gt-tiny-judge-threads
                      kill "$sampler" ;;
            tinygapsplit) tinyslices gt-tiny-gapsplit 32 1 eagle3,adaptive-never-plain --keep-warm none,kv ;;
            tinygapsplit2) tinyslices gt-tiny-gapsplit2 32 1 \
                          eagle3-without-plugin,eagle3,adaptive-bare,adaptive-backend-only,adaptive-worker-only,adaptive-never-plain ;;
            tinygapsplit3) tinyslices gt-tiny-gapsplit3 96 1 eagle3,adaptive-bare,adaptive-worker-only \
                          --interleave 16 ;;
            tinygapgoodput) tinyslices gt-tiny-gapgoodput 96 1 eagle3,adaptive-never-plain,adaptive-goodput \
                          --interleave 16 ;;
            tinyc1goodput) tinyslices gt-tiny-c1goodput 96 1 eagle3,adaptive-goodput --interleave 16 ;;
            tinyprofgap) for cfg in eagle3 adaptive-never-plain; do
                        step "tp-$cfg" python benchmark/profile_decode.py --pair tiny --label "tiny-$cfg" --config "$cfg" \
                            --concurrency 1 --num 96 --input-len 64 --output-len 192 --output-len-min 64 --stream \
                            --warmup-s 6 --steps 200 --top 80 --trace-dir "/tmp/traces/tiny-$cfg"
                      done ;;
            hostgoodput) ht hg-eagle3 --configs eagle3 --pin-cpus
                        ht hg-goodput --configs adaptive-goodput --pin-cpus
                        ht hg-goodput-log --configs adaptive-goodput --pin-cpus --decision-log
                        step hg-report python benchmark/hosttime_report.py --bucket decode-1 --bucket decode-8 \
                            --bucket decode-64 --json "$W/hg-report/hosttime.json" eagle3="$W/hg-eagle3/timing" \
                            goodput="$W/hg-goodput/timing" goodput-log="$W/hg-goodput-log/timing" ;;
            hostgap1) hostgap hostgap1 eagle3 never ;;
            hostgap1r) hostgap hostgap1r never eagle3 ;;
            hostpinned) ht hp-plain --configs plain --pin-cpus
                        ht hp-always-plain --configs adaptive-threshold --threshold 0 --pin-cpus
                        step hp-report python benchmark/hosttime_report.py --bucket decode-1 --bucket decode-8 \
                            --bucket decode-64 --json "$W/hp-report/hosttime.json" plain="$W/hp-plain/timing" \
                            always-plain="$W/hp-always-plain/timing" ;;
            flushgraphs) step fg-test env ADAPTIVE_GPU_PARALLEL=4 ADAPTIVE_GPU_REQUIRED=1 \
                        ADAPTIVE_GPU_ONLY=plain-long,alternate-50-kv,alternate-50-deferred-kv,alternate-50-flush-graphs-kv \
                        python -m pytest -m gpu test/gpu/test_keep_warm.py -v -p no:cacheprovider \
                        -k "alternate-50 or deferred or captured_flush"
                    ht fg-plain --configs plain
                    SGLANG_ADAPTIVE_KEEP_WARM_FLUSH_GRAPHS=0 ht fg-eager --configs adaptive-threshold --threshold 0
                    SGLANG_ADAPTIVE_KEEP_WARM_FLUSH_GRAPHS=1 ht fg-graphs --configs adaptive-threshold --threshold 0
                    step fg-report python benchmark/hosttime_report.py --bucket decode-8 --bucket decode-64 \
                        --json "$W/fg-report/hosttime.json" plain="$W/fg-plain/timing" \
                        eager-flush="$W/fg-eager/timing" flush-graphs="$W/fg-graphs/timing"
                    plaincost fg-8b-graphs SGLANG_ADAPTIVE_KEEP_WARM_FLUSH_GRAPHS=1 --keep-warm kv
                    plaincost fg-8b-eager SGLANG_ADAPTIVE_KEEP_WARM_FLUSH_GRAPHS=0 --keep-warm kv ;;
            prefillgap) for c in plain adaptive-threshold; do
                        step "prefillgap-$c" env SGLANG_ADAPTIVE_HOST_TIMING="$W/prefillgap-$c/timing" \
                            python -m sglang_adaptive.bench --configs "$c" --threshold 0 --closed 64 \
                            --out-len 384 --out-len-min 128 --requests-per-client 8 --rates "" --phases "" \
                            --out "$W/prefillgap-$c"
                      done
                      step prefillgap python benchmark/hosttime_report.py --bucket decode-64 --bucket decode-63 \
                          --bucket extend --json "$W/prefillgap/hosttime.json" plain="$W/prefillgap-plain/timing" \
                          always-plain="$W/prefillgap-adaptive-threshold/timing" ;;
            specgap) step specgap scripts/hostgap.sh 3.5 64 2 eagle3 adaptive-never-plain adaptive-goodput ;;
            plaingap) step plaingap scripts/hostgap.sh 2.5 32 1 plain adaptive-threshold adaptive-goodput ;;
            plaingap64) step plaingap64 scripts/hostgap.sh 3.5 64 1 plain adaptive-threshold adaptive-goodput ;;
            hostsync) gputest hostsync 36000 test/gpu/test_host_sync.py ;;
            pricefix) sweep pf35 --rounds 2 --acc-len 3.5 --closed 64 --out-len 384 --out-len-min 128 \
                        --configs eagle3,adaptive-goodput
                      sweep pf25 --acc-len 2.5 --closed 32 --out-len 384 --out-len-min 128 \
                        --configs plain,eagle3,adaptive-goodput ;;
            prefillprof) for cfg in ${PREFILLPROF_CONFIGS:-plain eagle3 adaptive-goodput always-plain}; do
                        extra=(); c=$cfg
                        [ "$cfg" = always-plain ] && { c=adaptive-threshold; extra=(-- --speculative-disable-batch-threshold 0); }
                        step "prof-$cfg" python benchmark/profile_decode.py --label "$cfg" --config "$c" \
                            --acc-len 3.5 --concurrency 64 --num 512 --output-len 384 --output-len-min 128 \
                            --stream --warmup-s 8 --steps 60 --trace-dir "/tmp/traces/$cfg" "${extra[@]}"
                      done ;;
            syncfix) gputest hostsync 36000 test/gpu/test_host_sync.py
                      step syncfix35 scripts/hostgap.sh 3.5 64 1 eagle3 adaptive-never-plain adaptive-goodput
                      step syncfix25 scripts/hostgap.sh 2.5 32 1 plain eagle3 adaptive-goodput ;;
            prefillcost) step prefillcost python -m sglang_adaptive.bench --configs plain,adaptive-threshold \
                        --threshold 0 --keep-warm none --closed 32,64 --in-len 256 --out-len 2 \
                        --requests-per-client 8 --rates "" --phases "" --out "$W/prefillcost" ;;
            kwcost2) step kwcost2 python -m sglang_adaptive.bench --configs adaptive-threshold --threshold 0 \
                        --keep-warm kv,none --closed 128 --requests-per-client 6 --rates "" \
                        --phases "" --out "$W/kwcost2" ;;
            checks) gputest grammar 34000 test/gpu/test_grammar_plain.py &
                    gputest kinds 33000 test/gpu/test_request_kinds.py &
                    step keepwarmramp env ADAPTIVE_GPU_PARALLEL=6 ADAPTIVE_GPU_REQUIRED=1 ADAPTIVE_GPU_PORT_BASE=30000 \
                        ADAPTIVE_GPU_ONLY=plain,eagle3,eagle3-ramp,threshold-8-ramp-none,threshold-8-ramp-kv,threshold-8-ramp-full \
                        python -m pytest -m gpu test/gpu/test_keep_warm.py -v -p no:cacheprovider -k "ramp"
                    wait ;;
            grammarmix) step grammarmix python -m sglang_adaptive.bench --pair tiny --json-share 0.1 \
                        --configs plain,adaptive-threshold --closed 128 --requests-per-client 6 --in-len 64 \
                        --out-len 128 --rates "" --phases "" --out "$W/grammarmix" ;;
            barrier) wait ;;
            stream) step stream python -m sglang_adaptive.bench --configs plain,eagle3,adaptive-threshold \
                        --closed 1,128 --rates "" --phases "" --out "$W/stream" ;;
            *) echo "unknown step $s" >>"$W/progress.log" ;;
            esac
        done
        wait
        echo "$(date +%T) all done" >>"$W/progress.log"
    ' </dev/null >"$W/driver.log" 2>&1 &
    echo "started: $*"
    exit 0
fi

snapshot() {  # each step's folder as STEP.tgz, and the progress log, into $OUT
    cp "$W/progress.log" "$OUT/" 2>/dev/null
    for d in "$W"/*/; do
        tar -C "$W" -czf "$OUT/$(basename "$d").tgz" "$(basename "$d")" 2>/dev/null
    done
}

if [ "$cmd" = wait ]; then
    deadline=$((SECONDS + ${1:?seconds}))
    seen=0
    every=${SNAPSHOT_S:-120}
    next_snapshot=$((SECONDS + every))
    while [ $SECONDS -lt $deadline ]; do
        n=$( (wc -l <"$W/progress.log") 2>/dev/null || echo 0)
        if [ "$n" -gt "$seen" ]; then sed -n "$((seen + 1)),${n}p" "$W/progress.log"; seen=$n; fi
        awk '/ run: /{d=0} /all done/{d=1} END{exit !d}' "$W/progress.log" 2>/dev/null && break
        # A lease can end before this wait does (the session's device time runs out, and the
        # command is killed): what $OUT holds then still comes back, so keep it current.
        if [ $SECONDS -ge $next_snapshot ]; then snapshot; next_snapshot=$((SECONDS + every)); fi
        sleep 5
    done
    snapshot
    for d in "$W"/*/; do
        echo "== $(basename "$d"): $(tail -n 3 "$d/output.txt" 2>/dev/null | tr '\n' ' ')"
    done
    exit 0
fi
echo "unknown command $cmd" >&2
exit 2
