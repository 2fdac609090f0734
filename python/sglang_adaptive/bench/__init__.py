"""The benchmark suite: one command that serves a target/draft pair in every mode and measures it.

``python -m sglang_adaptive.bench`` (or ``sglang-adaptive-bench``) starts each server
configuration in turn with identical settings (``configs``), drives it with each
workload (``workloads``) through a streaming client (``client``), summarises every
load point (``metrics``) and writes JSON lines, a Markdown table and PNG plots
(``report``).
"""
