"""A streaming client for SGLang's native ``/generate`` with token-id prompts.

Why not ``python -m sglang.benchmark.serving``: in sglang 0.5.17 it times the first
token and the inter-token gaps from streamed ``text``, which a server started with
``--skip-tokenizer-init`` does not send (the shipped dummy pair has no tokenizer,
and its random-weight outputs are not text), so TTFT and TPOT come out empty; and
it has no load whose concurrency changes over time. This client streams token ids
and records, per request, when it was sent, when its first tokens arrived, when
it finished, and the server's own counters (``completion_tokens``,
``spec_verify_ct``).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass

import aiohttp

from sglang_adaptive.bench.workloads import Closed, Open, Phased
from sglang_adaptive.testing import client_session


@dataclass
class Record:
    start: float  # wall clock (time.time()) when sent
    first: float | None = None  # first streamed chunk carrying tokens
    end: float | None = None
    output_tokens: int = 0
    verify_ct: int = 0
    error: str | None = None
    constrained: bool = False  # carried a JSON schema
    text: str = ""  # the output text, where the server detokenizes
    phase: int | None = None  # a phased load's phase it was sent in, by the sender's clock


async def _one(session: aiohttp.ClientSession, url: str, req: dict, phase: int | None = None) -> Record:
    rec = Record(start=time.time(), constrained="json_schema" in req["sampling_params"], phase=phase)
    try:
        async with session.post(url + "/generate", json={**req, "stream": True}) as r:
            if r.status != 200:
                rec.error = f"HTTP {r.status}: {(await r.text())[:200]}"
                return rec
            meta = {}
            async for raw in r.content:
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                body = line[5:].strip()
                if body == b"[DONE]":
                    break
                chunk = json.loads(body)
                if rec.first is None and (chunk.get("output_ids") or chunk.get("text")):
                    rec.first = time.time()
                rec.text = chunk.get("text", rec.text)
                meta = chunk.get("meta_info") or meta
            rec.end = time.time()
            rec.output_tokens = int(meta.get("completion_tokens", 0))
            rec.verify_ct = int(meta.get("spec_verify_ct", 0) or 0)
    except Exception as e:  # recorded; the summary counts errors
        rec.error = f"{type(e).__name__}: {e}"[:200]
    return rec


async def _closed(url: str, reqs: list[dict], concurrency: int, timeout: float) -> list[Record]:
    records: list[Record] = []
    todo = iter(reqs)
    async with client_session(timeout) as s:
        async def worker():
            for req in todo:
                records.append(await _one(s, url, req))

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records


async def _open(url: str, reqs: list[dict], arrivals: list[float], timeout: float) -> list[Record]:
    async with client_session(timeout) as s:
        t0 = time.monotonic()

        async def at(delay, req):
            await asyncio.sleep(max(0.0, delay - (time.monotonic() - t0)))
            return await _one(s, url, req)

        return list(await asyncio.gather(*(at(d, r) for d, r in zip(arrivals, reqs))))


async def _phased(url: str, make_req, workload: Phased, timeout: float, tick: float = 0.02) -> list[Record]:
    records: list[Record] = []
    in_flight: set = set()
    async with client_session(timeout) as s:
        t0 = time.monotonic()
        n = 0
        while True:
            t = time.monotonic() - t0
            phase = workload.phase_at(t)
            if phase is None:
                break
            while len(in_flight) < workload.phases[phase][1]:
                task = asyncio.ensure_future(_one(s, url, make_req(n), phase))
                task.add_done_callback(lambda f: (in_flight.discard(f), records.append(f.result())))
                in_flight.add(task)
                n += 1
            await asyncio.sleep(tick)
        if in_flight:  # let the last phase's requests finish
            await asyncio.gather(*list(in_flight))
    return records


def run(url: str, workload, reqs_or_factory, timeout: float = 1800) -> tuple[list[Record], float, float]:
    """Drive ``workload``; returns (records, wall-clock start, seconds)."""
    start, t0 = time.time(), time.monotonic()
    if isinstance(workload, Closed):
        coro = _closed(url, reqs_or_factory, workload.concurrency, timeout)
    elif isinstance(workload, Open):
        coro = _open(url, reqs_or_factory, workload.arrival_times(), timeout)
    elif isinstance(workload, Phased):
        coro = _phased(url, reqs_or_factory, workload, timeout)
    else:
        raise TypeError(f"unknown workload {workload!r}")
    records = asyncio.run(coro)
    return records, start, time.monotonic() - t0
