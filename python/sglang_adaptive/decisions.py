"""Decision log: why the policy ran each decode batch in its mode.

Off unless ``SGLANG_ADAPTIVE_DECISION_LOG`` names a file. Then rank 0 appends one JSON
line per decode batch: the batch size, its tokens of context, the mode it ran in, and
the policy's own account (``ModePolicy.explain``: for goodput why it answered as it
did, its acceptance estimate and both modes' predicted tokens/s). The cost table
(``--speculative-cost-table-path``) says what the policy knows; this says what it did
with it, batch by batch. For diagnosis only: a second prediction and a line written per
batch cost about 70 us on the H100's host, 2% of a tiny-pair step (1-3 ms), so runs
that judge throughput leave it off.
"""

from __future__ import annotations

import json
import os

ENV = "SGLANG_ADAPTIVE_DECISION_LOG"


class NoDecisionLog:
    def record(self, policy, speculative: bool, batch_size: int, context: int) -> None:
        pass


class DecisionLog(NoDecisionLog):
    def __init__(self, path: str):
        # Line-buffered: a reader (the benchmark, between load points) sees every batch so far.
        self._file = open(path, "a", buffering=1)
        self._batches = 0

    def record(self, policy, speculative: bool, batch_size: int, context: int) -> None:
        # Before the policy hears of the launch: its answer for this batch is still cached.
        line = {"batch": self._batches, "batch_size": batch_size, "context": context,
                "speculative": speculative, **policy.explain(batch_size, context)}
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._batches += 1


def make_decision_log(writes: bool) -> NoDecisionLog:
    """``writes``: this rank keeps the log (rank 0; every rank decides alike)."""
    path = os.environ.get(ENV)
    return DecisionLog(path) if path and writes else NoDecisionLog()
