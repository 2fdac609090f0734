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
