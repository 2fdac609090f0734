"""What the adaptive server reports about itself: per-request speculative counters.

SGLang reports a request's ``spec_accept_length`` as ``completion_tokens /
spec_verify_ct``. A request that ran partly plain has plain tokens in
``completion_tokens`` and no verify for them, so that ratio counts them as if
they were accepted drafts (a load generator read 165 tokens per verify at
concurrency 128). On adaptive servers it becomes what a speculative step really
yields: one bonus token plus the accepted drafts, per verify
(``1 + spec_num_correct_drafts / spec_verify_ct``), counting speculative steps
and their tokens only. The rest of SGLang's per-request counters
(``spec_accept_rate``, verify counts, histograms) already count verifies only.
"""

from __future__ import annotations

from sglang_adaptive.args import get_config


def around_calculate_spec_decoding_metrics(original, self, meta_info, recv_obj, i):
    original(self, meta_info, recv_obj, i)
    verify_ct = meta_info.get("spec_verify_ct", 0)
    if verify_ct > 0 and get_config(self.server_args).enabled:
        meta_info["spec_accept_length"] = 1 + meta_info["spec_num_correct_drafts"] / verify_ct


# -- Prometheus series (``--enable-metrics``) ---------------------------------------
#
# Beside SGLang's own series, from TP rank 0's scheduler (every rank takes the same
# decisions; one copy is enough). SGLang runs prometheus_client in multiprocess mode,
# so series created in the scheduler process reach /metrics of the HTTP server.

METRIC_PREFIX = "sglang_adaptive_"
MODES = ("plain", "spec")


class NoTelemetry:
    """What the controller reports to when metrics are off: nothing, at no cost."""

    def on_batch(self, speculative: bool, switched: bool) -> None:
        pass

    def on_step_time(self, speculative: bool, seconds: float) -> None:
        pass

    def on_verify(self, requests: int, tokens: int) -> None:
        pass


class PrometheusTelemetry(NoTelemetry):
    def __init__(self, labels: dict | None = None, registry=None):
        from prometheus_client import REGISTRY, Counter, Gauge, Histogram

        registry = registry or REGISTRY
        self.labels = dict(labels or {})
        names = [*self.labels]
        self.batches = Counter(METRIC_PREFIX + "decode_batches", "Decode batches run, by mode.",
                               [*names, "mode"], registry=registry)
        self.switches = Counter(METRIC_PREFIX + "mode_switches", "Decode batches whose mode differs "
                                "from the batch before.", names, registry=registry)
        self.mode = Gauge(METRIC_PREFIX + "speculative_mode", "1 while decode batches speculate, 0 while "
                          "they run plain.", names, registry=registry, multiprocess_mode="mostrecent")
        self.verify_requests = Counter(METRIC_PREFIX + "verify_requests", "Requests verified in speculative "
                                       "batches.", names, registry=registry)
        self.verify_tokens = Counter(METRIC_PREFIX + "verify_tokens", "Tokens committed by those verifies "
                                     "(bonus + accepted drafts); / verify_requests = acceptance length.",
                                     names, registry=registry)
        self.step_seconds = Histogram(METRIC_PREFIX + "decode_step_seconds", "Wall time of a decode step as "
                                      "served (one scheduler iteration), by mode.", [*names, "mode"],
                                      registry=registry,
                                      buckets=(0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.015, 0.02, 0.03,
                                               0.05, 0.075, 0.1, 0.2, 0.5))
        # Children resolved once: the hot path only increments.
        self._batches = {m: self.batches.labels(**self.labels, mode=m) for m in MODES}
        self._steps = {m: self.step_seconds.labels(**self.labels, mode=m) for m in MODES}
        self._switches = self.switches.labels(**self.labels) if names else self.switches
        self._mode = self.mode.labels(**self.labels) if names else self.mode
        self._verify_requests = self.verify_requests.labels(**self.labels) if names else self.verify_requests
        self._verify_tokens = self.verify_tokens.labels(**self.labels) if names else self.verify_tokens

    def on_batch(self, speculative: bool, switched: bool) -> None:
        self._batches[MODES[speculative]].inc()
        self._mode.set(int(speculative))
        if switched:
            self._switches.inc()

    def on_step_time(self, speculative: bool, seconds: float) -> None:
        self._steps[MODES[speculative]].observe(seconds)

    def on_verify(self, requests: int, tokens: int) -> None:
        self._verify_requests.inc(requests)
        self._verify_tokens.inc(tokens)


def make_telemetry(server_args, tp_rank: int) -> NoTelemetry:
    if not getattr(server_args, "enable_metrics", False) or tp_rank != 0:
        return NoTelemetry()
    return PrometheusTelemetry({"model_name": server_args.served_model_name or server_args.model_path})
