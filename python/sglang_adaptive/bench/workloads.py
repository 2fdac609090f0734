"""The load shapes: closed-loop concurrency, open-loop request rate, and phases of
changing concurrency. Pure Python: what is sent when, not how."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

# Issue 15's structured-output mix: this share of requests carries a JSON schema.
# Long enough (20-60 tokens) that a constrained request stays in many decode batches.
JSON_SCHEMA = {"type": "object", "additionalProperties": False, "required": ["ok", "n", "tags"],
               "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0, "maximum": 999},
                              "tags": {"type": "array", "minItems": 4, "maxItems": 10,
                                       "items": {"enum": ["alpha", "beta", "gamma"]}}}}


def with_json_schema(reqs: list[dict], share: float) -> list[dict]:
    """Every ``round(1 / share)``-th request constrained to ``JSON_SCHEMA`` (it stops at
    the end of its document, so EOS is not ignored)."""
    if share <= 0:
        return reqs
    every = max(1, round(1 / share))
    return [{**r, "sampling_params": {**r["sampling_params"], "json_schema": json.dumps(JSON_SCHEMA),
                                      "ignore_eos": False}} if i % every == 0 else r
            for i, r in enumerate(reqs)]


def matches_json_schema(text: str) -> bool:
    """Whether ``text`` is one document of ``JSON_SCHEMA`` (checked by hand: the
    schema is small, and the package does not depend on a validator)."""
    try:
        doc = json.loads(text)
    except ValueError:
        return False
    if not isinstance(doc, dict) or set(doc) != {"ok", "n", "tags"}:
        return False
    n, tags = doc["n"], doc["tags"]
    return (isinstance(doc["ok"], bool) and isinstance(n, int) and not isinstance(n, bool) and 0 <= n <= 999
            and isinstance(tags, list) and 4 <= len(tags) <= 10 and all(t in ("alpha", "beta", "gamma") for t in tags))


@dataclass(frozen=True)
class Closed:
    """``concurrency`` requests always in flight until ``num_requests`` are done."""

    concurrency: int
    num_requests: int
    kind: str = "closed"

    @property
    def point(self) -> dict:
        return {"workload": self.kind, "concurrency": self.concurrency}


@dataclass(frozen=True)
class Open:
    """Poisson arrivals at ``rate`` requests/s, whatever is in flight."""

    rate: float
    num_requests: int
    seed: int = 0
    kind: str = "open"

    @property
    def point(self) -> dict:
        return {"workload": self.kind, "rate": self.rate}

    def arrival_times(self) -> list[float]:
        rng = random.Random(self.seed)
        t, times = 0.0, []
        for _ in range(self.num_requests):
            times.append(t)
            t += rng.expovariate(self.rate)
        return times


@dataclass(frozen=True)
class Phased:
    """Closed loop whose concurrency follows ``phases`` = ((seconds, concurrency), ...)."""

    phases: tuple
    kind: str = "phased"

    @property
    def point(self) -> dict:
        return {"workload": self.kind, "phases": [list(p) for p in self.phases]}

    def phase_at(self, t: float) -> int | None:
        """Index of the phase running ``t`` seconds from the start; None after the last."""
        end = 0.0
        for i, (seconds, _) in enumerate(self.phases):
            end += seconds
            if t < end:
                return i
        return None


def parse_ints(text: str) -> list[int]:
    return [int(x) for x in text.replace(",", " ").split()] if text else []


def parse_floats(text: str) -> list[float]:
    return [float(x) for x in text.replace(",", " ").split()] if text else []


def parse_phases(text: str) -> tuple:
    """``"20:2,20:64,20:2"`` -> ((20.0, 2), (20.0, 64), (20.0, 2))."""
    phases = []
    for item in text.replace(" ", "").split(","):
        if not item:
            continue
        seconds, _, concurrency = item.partition(":")
        if not concurrency:
            raise ValueError(f"phase {item!r} is not SECONDS:CONCURRENCY")
        phases.append((float(seconds), int(concurrency)))
    if not phases or any(s <= 0 or c < 0 for s, c in phases):
        raise ValueError(f"phases {text!r}: need SECONDS>0:CONCURRENCY>=0, comma separated")
    return tuple(phases)
