"""Test and benchmark aids: start SGLang servers in turn and drive them with fixed requests.

Used by the GPU tests and the benchmark scripts. Servers run with
``--skip-tokenizer-init`` and take token ids; by default each is stopped before the
next starts, so one GPU runs them in turn (``run_configs`` can overlap small ones).
"""

from __future__ import annotations

import asyncio
import os
import random
import re
import signal
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from sglang_adaptive.controller import RECOVERY_LOG_PATTERN, RECOVERY_STEP_PATTERN, STATS_LOG_PATTERN

COMMON_ARGS = [
    "--attention-backend", "triton",
    "--sampling-backend", "pytorch",
    "--grammar-backend", "none",
    "--cuda-graph-backend-prefill", "disabled",
    "--mem-fraction-static", "0.7",
]


def without_flags(args, flags) -> list:
    """``args`` without the ``--flag value`` pairs of ``flags``."""
    out, skip = [], False
    for i, arg in enumerate(args):
        if skip:
            skip = False
            continue
        if arg in flags and i + 1 < len(args):
            skip = True
            continue
        out.append(arg)
    return out


# Static EAGLE-3, the reference: with this package installed EAGLE/EAGLE3 switch
# modes by default (the goodput policy); upstream's worker needs the policy off.
STATIC_ARGS = ("--speculative-switch-policy", "off")


def eagle3_args(draft, steps: int = 3) -> list[str]:
    return [
        "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", str(draft),
        "--speculative-num-steps", str(steps),
        "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", str(steps + 1),
    ]


@dataclass
class Server:
    label: str
    args: list[str]
    env: dict = field(default_factory=dict)
    port: int = 30000
    log_dir: Path = Path(os.environ.get("OUT", "/tmp"))
    proc: subprocess.Popen | None = None
    # Token ids in and out, no tokenizer; grammar backends need the tokenizer.
    skip_tokenizer_init: bool = True

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log_path(self) -> Path:
        return self.log_dir / f"server-{self.label}.log"

    def command(self) -> list[str]:
        cmd = [sys.executable, "-m", "sglang.launch_server", "--host", "127.0.0.1",
               "--port", str(self.port), *(["--skip-tokenizer-init"] if self.skip_tokenizer_init else []),
               *self.args]
        if "--nccl-port" not in self.args:
            # Upstream picks a free port for torch.distributed's rendezvous when it starts;
            # servers started side by side raced for the same one (EADDRINUSE).
            cmd += ["--nccl-port", str(self.port + 5)]
        return cmd

    def start(self, timeout: float = 600) -> float:
        env = {**os.environ, **self.env}
        cmd = self.command()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "w") as log:  # the child keeps its own descriptor
            log.write(" ".join(cmd) + "\n")
            log.flush()
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env,
                                         start_new_session=True)
        t0 = time.time()
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"[{self.label}] server exited; log tail:\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health_generate", timeout=5) as r:
                    if r.status == 200:
                        return time.time() - t0
            except Exception:
                pass
            if time.time() - t0 > timeout:
                self.stop()
                raise RuntimeError(f"[{self.label}] start timeout; log tail:\n{self.tail()}")
            time.sleep(2)

    def tail(self, n: int = 60) -> str:
        return "\n".join(self.log_text().splitlines()[-n:])

    def log_text(self) -> str:
        """The server's log so far; empty if it never started."""
        try:
            return self.log_path.read_text()
        except OSError:
            return ""

    def settle(self, quiet: float = 1.0, limit: float = 10.0) -> None:
        """Wait until the log has not grown for ``quiet`` seconds (at most ``limit``).

        The last response reaches the client while the overlap scheduler may still
        run or log the batch it launched after it; stopping then drops that batch's
        lines, and a log-based count (graph replays against mode counters) comes up
        one short.
        """
        deadline, size, since = time.time() + limit, -1, time.time()
        while time.time() < deadline:
            now = self.log_path.stat().st_size if self.log_path.exists() else 0
            if now != size:
                size, since = now, time.time()
            elif time.time() - since >= quiet:
                return
            time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(timeout=30)
        except Exception:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc = None

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.stop()


def make_requests(n: int, seed: int = 0, vocab: int = 32000, in_range=(8, 600),
                  out_range=(4, 160)) -> list[dict]:
    """Mixed prompt and output lengths, greedy."""
    rng = random.Random(seed)
    reqs = []
    for _ in range(n):
        in_len = rng.randint(*in_range)
        reqs.append({
            "input_ids": [rng.randrange(1000, vocab) for _ in range(in_len)],
            "sampling_params": {"max_new_tokens": rng.randint(*out_range),
                                "temperature": 0.0, "ignore_eos": True},
        })
    return reqs


# SGLang's HTTP server closes a connection idle for SGLANG_TIMEOUT_KEEP_ALIVE seconds;
# aiohttp keeps idle ones 15 s, so a request sent on one just as the server closes it
# fails before reaching the server (ServerDisconnectedError or "Can not write request
# body"). Our client drops idle connections at half the server's figure instead.
SERVER_KEEP_ALIVE_ENV = "SGLANG_TIMEOUT_KEEP_ALIVE"
SERVER_KEEP_ALIVE_DEFAULT_S = 5


def client_keepalive_s() -> float:
    """Seconds an idle client connection is kept: half the server's keep-alive, read
    from the same environment variable the server reads."""
    return int(os.environ.get(SERVER_KEEP_ALIVE_ENV, SERVER_KEEP_ALIVE_DEFAULT_S)) / 2


def client_session(timeout: float, keepalive_s: float | None = None) -> aiohttp.ClientSession:
    # aiohttp caps a session at 100 connections by default; a concurrency above that
    # would silently run as 100.
    keepalive = client_keepalive_s() if keepalive_s is None else keepalive_s
    return aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout),
                                 connector=aiohttp.TCPConnector(limit=0, keepalive_timeout=keepalive))


async def post_generate(session: aiohttp.ClientSession, url: str, req: dict):
    """One non-streaming ``/generate``; its response body (a list when ``n`` > 1)."""
    async with session.post(url + "/generate", json=req) as r:
        body = await r.json()
        if r.status != 200:
            raise RuntimeError(f"HTTP {r.status}: {body}")
        return body


async def disconnect_midstream(session: aiohttp.ClientSession, url: str, req: dict, chunks: int = 4) -> str:
    """Stream ``req`` and drop the connection after ``chunks`` chunks: the server must
    abort the request on its own. Returns "disconnected", or what happened instead."""
    async with session.post(url + "/generate", json={**req, "stream": True}) as r:
        seen = 0
        async for line in r.content:
            if line.strip().startswith(b"data:"):
                seen += 1
                if seen >= chunks:
                    return "disconnected"
    return "finished before the disconnect"


async def abort_by_rid(session: aiohttp.ClientSession, url: str, req: dict, after: float) -> str:
    """Send ``req`` (it needs a ``rid``), ``/abort_request`` it ``after`` seconds later;
    returns the abort call's HTTP status and the request's finish reason, e.g. "200 abort"."""
    task = asyncio.ensure_future(post_generate(session, url, req))
    await asyncio.sleep(after)
    async with session.post(url + "/abort_request", json={"rid": req["rid"]}) as r:
        status = r.status
    body = await task
    return f"{status} {body['meta_info']['finish_reason']['type']}"


async def _run(url: str, reqs: list[dict], concurrency, timeout: float) -> list[dict]:
    """``concurrency``: an int, or a list of (start_index, concurrency) ramp steps."""
    results: list[dict | None] = [None] * len(reqs)
    ramp = [(0, concurrency)] if isinstance(concurrency, int) else list(concurrency)
    async with client_session(timeout) as s:
        async def one(i):
            results[i] = await post_generate(s, url, reqs[i])

        for k, (start, c) in enumerate(ramp):
            end = ramp[k + 1][0] if k + 1 < len(ramp) else len(reqs)
            todo = iter(range(start, end))

            async def worker(todo=todo):  # the workers of one ramp step share its queue
                for i in todo:
                    await one(i)

            await asyncio.gather(*(worker() for _ in range(c)))
    return results


def generate(url: str, reqs: list[dict], concurrency=8, timeout: float = 900) -> list[dict]:
    return asyncio.run(_run(url, reqs, concurrency, timeout))


def output_ids(results: list[dict]) -> list[list[int]]:
    return [r["output_ids"] for r in results]


METRIC_SAMPLE_RE = re.compile(r"^([A-Za-z_:][\w:]*)(?:\{([^}]*)\})? (\S+)$", re.M)
METRIC_LABEL_RE = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')


def scrape_metrics(url: str) -> str:
    """The server's ``/metrics`` text (``--enable-metrics``); empty if it does not answer."""
    try:
        with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
            return r.read().decode()
    except OSError:
        return ""


def metric_value(text: str, name: str, **labels) -> float | None:
    """The sum of the samples of ``name`` in a ``/metrics`` text whose labels include
    ``labels`` (other labels, e.g. model_name or tp_rank, are summed over); None if
    there is none."""
    found = [float(value) for sample, label_text, value in METRIC_SAMPLE_RE.findall(text)
             if sample == name and labels.items() <= dict(METRIC_LABEL_RE.findall(label_text or "")).items()]
    return sum(found) if found else None


def mismatching_requests(a: list[list[int]], b: list[list[int]]) -> list[int]:
    """Indices of the requests whose output ids differ between two runs."""
    return [i for i, (x, y) in enumerate(zip(a, b)) if x != y]


def with_top_logprobs(reqs: list[dict], k: int = 3) -> list[dict]:
    """The same requests, also asking for the top-``k`` logprobs of every output token."""
    return [{**r, "return_logprob": True, "top_logprobs_num": k} for r in reqs]


@dataclass(frozen=True)
class Divergence:
    """Where a request first left the reference server's greedy path.

    ``gap``: the reference's logprob of its own token minus its logprob of the token
    the other server chose there (inf when that token is not in the reference's
    top-k). A numerical near-tie has a gap of a few bf16 rounding steps; a defect
    (a skipped position, a stale KV entry) picks a token the reference ranks far
    below.
    """

    request: int
    token: int
    gap: float


def divergences(ref_results: list[dict], got_ids: list[list[int]]) -> list[Divergence]:
    """The first divergence of every request whose output differs from the reference's.

    ``ref_results``: the reference server's responses to ``with_top_logprobs`` requests.
    Only the first divergence counts: after it the two servers continue different texts.
    """
    out = []
    for i, (ref, got) in enumerate(zip(ref_results, got_ids)):
        want = ref["output_ids"]
        if want == got:
            continue
        j = next((k for k, (p, q) in enumerate(zip(want, got)) if p != q), None)
        if j is None:  # same prefix, different length: not a numerical effect
            out.append(Divergence(i, min(len(want), len(got)), float("inf")))
            continue
        top = {tok: lp for lp, tok, *_ in ref["meta_info"]["output_top_logprobs"][j]}
        out.append(Divergence(i, j, top[want[j]] - top.get(got[j], float("-inf"))))
    return out


def beyond_ties(ref_results: list[dict], got_ids: list[list[int]], *, tie_gap: float,
                max_ties: int) -> list[str]:
    """What keeps ``got_ids`` from being the reference's greedy tokens up to numerical
    ties: any divergence at a gap above ``tie_gap``, or more than ``max_ties`` of them.
    Empty when only near-ties flipped.

    For a target whose speculative verify runs other kernels than its decode (MLA:
    extend against decode attention), upstream's static EAGLE-3 itself leaves the
    no-spec path at near-ties, in fp32 too; a defect picks a token the reference
    ranks clearly lower.
    """
    div = divergences(ref_results, got_ids)
    problems = [f"request {d.request} leaves the reference at token {d.token} with a gap of {d.gap:.4g} "
                f"(ties: <= {tie_gap:g})" for d in div if d.gap > tie_gap]
    if len(div) > max_ties:
        problems.append(f"{len(div)} requests diverge at ties, more than {max_ties}")
    return problems


STATS_RE = re.compile(STATS_LOG_PATTERN)
# SGLang's log prefix names the tensor-parallel rank of a scheduler when --tp > 1:
# "[2026-11-30 12:00:00 TP1] ..." (other ranks, such as " EP1", may follow it).
TP_RANK_RE = re.compile(r"^\[[^\]]* TP(\d+)[\] ]")


def _tp_rank(line: str) -> int:
    m = TP_RANK_RE.search(line)
    return int(m.group(1)) if m else 0


# The scheduler's decode line: running requests, acceptance (logged by speculative
# batches only; "" for the adaptive worker's plain ones), queued requests.
DECODE_LINE_RE = re.compile(
    r"Decode batch, #running-req: (\d+),(?:.*?accept len: ([\d.]+),)?.*?#queue-req: (\d+)")


# Lines a healthy server never logs: a scheduler exception, upstream's leak checks
# (strict under SGLANG_ENABLE_STRICT_MEM_CHECK_DURING_BUSY), a failed assertion.
LOG_ERROR_MARKERS = ("Traceback (most recent call last)", "memory leak detected", "AssertionError",
                     "use-after-free", "CUDA error")


@dataclass
class Run:
    """What one server configuration produced: responses and its log."""

    results: list | None
    log: str
    error: str | None = None

    @property
    def ids(self):
        return None if self.results is None else output_ids(self.results)

    def problems(self) -> list[str]:
        """Why this run cannot be trusted: the server did not start or serve every
        request, or its log shows an error. Empty for a healthy run."""
        found = []
        if self.error is not None:
            found.append(f"server error: {self.error}")
        elif self.results is None or any(r is None for r in self.results):
            found.append("not every request was answered")
        found += [f"{m!r} in the server log" for m in LOG_ERROR_MARKERS if m in self.log]
        return found

    def check(self) -> Run:
        """Fail the calling test unless the run is healthy; returns the run."""
        problems = self.problems()
        assert not problems, "; ".join(problems)[:4000]
        return self

    def stats(self, rank: int = 0) -> dict:
        """The adaptive worker's last statistics line of a tensor-parallel rank
        (needs --decode-log-interval 1)."""
        per_rank = self.stats_per_rank()
        assert per_rank, "no AdaptiveEAGLE statistics in the server log"
        assert rank in per_rank, f"no AdaptiveEAGLE statistics of TP rank {rank}; ranks {sorted(per_rank)}"
        return per_rank[rank]

    def stats_per_rank(self) -> dict[int, dict]:
        """TP rank -> its last statistics line. Every rank's scheduler logs its own
        (prefixed " TPn" when --tp > 1; no prefix means rank 0)."""
        out = {}
        for line in self._lines_with("AdaptiveEAGLE decode batches"):
            m = STATS_RE.search(line)
            if m:
                total, plain, spec, switches, reserve, prefills = m.groups()
                out[_tp_rank(line)] = dict(total=int(total), plain=int(plain), spec=int(spec),
                                           switches=int(switches), max_reserve=int(reserve or 0),
                                           plain_prefills=int(prefills or 0))
        return out

    def replays(self, mode: str, rank: int = 0) -> int:
        """Target decode-graph replays in ``mode`` on one TP rank (needs
        SGLANG_LOG_DECODE_GRAPH_KEY=1)."""
        pattern = re.compile(rf"Decode graph replay: worker=target .* mode={mode} ")
        return sum(1 for line in self._lines_with("Decode graph replay") if pattern.search(line)
                   and _tp_rank(line) == rank)

    def _lines_with(self, needle: str):
        return (line for line in self.log.splitlines() if needle in line)

    def peak_running(self) -> int:
        return max(int(n) for n, _, _ in DECODE_LINE_RE.findall(self.log))

    def memory_bound_concurrency(self) -> float:
        """Mean running requests over the decode batches logged while requests waited
        in the queue (needs --decode-log-interval 1): then the KV budget, not the load,
        set how many ran. 0.0 if nothing ever waited. Steadier than the peak, which a
        single step's timing decides."""
        running = [int(n) for n, _, q in DECODE_LINE_RE.findall(self.log) if int(q) > 0]
        return sum(running) / len(running) if running else 0.0

    def spec_accept_length(self, max_batch: int | None = None) -> float:
        """Tokens per verify in the speculative decode batches, from the scheduler's
        decode log (needs --decode-log-interval 1), weighted by batch size; plain
        batches do not count, nor (with ``max_batch``) batches of more requests.
        nan if no batch counts."""
        batches = [(int(n), float(a)) for n, a, _ in DECODE_LINE_RE.findall(self.log)
                   if a and (max_batch is None or int(n) <= max_batch)]
        requests = sum(n for n, _ in batches)
        return sum(n * a for n, a in batches) / requests if requests else float("nan")

    def recovery(self) -> dict:
        """The last acceptance-after-plain-stretch profile of TP rank 0 (controller's
        RecoveryProfile): {"min_stretch": N, "steps": {place: (tokens per verify,
        verifies)}}, the place "deep" for the steps past the profile's depth. Empty
        when none was logged."""
        found = {}
        for line in self._lines_with("AdaptiveEAGLE acceptance after plain stretches"):
            m = re.search(RECOVERY_LOG_PATTERN, line)
            if m and _tp_rank(line) == 0:
                steps = {("deep" if p.startswith(">") else int(p)): (float(a), int(n))
                         for p, a, n in re.findall(RECOVERY_STEP_PATTERN, m.group(2))}
                found = {"min_stretch": int(m.group(1)), "steps": steps}
        return found

    def accept_length(self) -> float:
        """Tokens per verify over all requests (meaningful when every step speculates)."""
        tokens = sum(r["meta_info"]["completion_tokens"] for r in self.results)
        verifies = sum(r["meta_info"].get("spec_verify_ct", 0) for r in self.results)
        return tokens / verifies if verifies else float("nan")


PORT_BASE_ENV = "ADAPTIVE_GPU_PORT_BASE"


def run_configs(configs: dict, reqs: list[dict], parallel: int | None = None,
                requests_for: dict | None = None) -> dict[str, Run]:
    """Start each ``label -> (server args, env, concurrency)`` and send it ``reqs``
    (or ``requests_for[label]``, e.g. the same requests asking for logprobs).

    ``parallel`` (default: env ``ADAPTIVE_GPU_PARALLEL``, else 1) servers share the
    GPU at a time, each on its own port: worth it for small models, whose servers
    spend their start-up on the CPU and leave the GPU idle. Every configuration
    gets the same requests, so outputs stay comparable; only timing differs.
    """
    if parallel is None:
        parallel = int(os.environ.get("ADAPTIVE_GPU_PARALLEL", "1"))
    # Suites run side by side on one host need disjoint ports (HTTP port, and +5 for
    # torch.distributed's rendezvous).
    port_base = int(os.environ.get(PORT_BASE_ENV, "30000"))

    def one(index: int, label: str) -> Run:
        args, env, concurrency = configs[label]
        srv = Server(label, args, env, port=port_base + 10 * index)
        results, error = None, None
        try:
            srv.start()
            results = generate(srv.url, (requests_for or {}).get(label, reqs), concurrency)
            srv.settle()
        except Exception as e:  # recorded; the tests that need this run fail on it
            error = str(e)[-4000:]
        finally:
            srv.stop()
        return Run(results, srv.log_text(), error)

    labels = list(configs)
    with ThreadPoolExecutor(max_workers=max(1, parallel)) as pool:
        futures = {label: pool.submit(one, i, label) for i, label in enumerate(labels)}
        return {label: futures[label].result() for label in labels}
