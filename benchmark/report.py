"""Tables and plots from benchmark JSON lines; see sglang_adaptive.bench.report.

usage: python benchmark/report.py RESULTS.jsonl [--out DIR]
"""

from sglang_adaptive.bench.report import main

if __name__ == "__main__":
    main()
