from pathlib import Path

from sglang_adaptive.bench import report

REPO = Path(__file__).resolve().parents[2]
H200 = REPO / "benchmark" / "results" / "2026-11-29-h200-core-worker" / "compare.jsonl"


def test_ratio_table_against_best_static_config():
    rows = report.load_rows(H200)
    text = report.ratio_table(rows)
    lines = {line.split(" | ")[0].strip("| "): line for line in text.splitlines()[2:]}
    assert set(lines) == {"1", "8", "32", "128"}
    header = text.splitlines()[0]
    assert header.startswith("| concurrency | plain | eagle3 | upstream-adaptive | adaptive-threshold |")
    # adaptive-threshold / best static: eagle3 wins at 1, plain at 128.
    assert "1.00 (eagle3)" in lines["1"] and "0.94 (plain)" in lines["128"]
    assert "0.30 (plain)" in lines["128"]  # upstream adaptive


def test_best_static_and_missing_cells():
    rows = [
        {"label": "plain", "concurrency": 4, "output_tok_per_s": 100},
        {"label": "mine", "concurrency": 4, "output_tok_per_s": 150},
        {"label": "mine", "concurrency": 8, "output_tok_per_s": 10},
        {"label": "noise", "concurrency": 8},  # not a result row
    ]
    assert report.best_static({"plain": 1, "eagle3": 2}) == ("eagle3", 2)
    assert report.best_static({"plain": 1, "eagle3": 2}, lower_is_better=True) == ("plain", 1)
    rows = [dict(r, workload="closed") for r in rows]
    text = report.ratio_table(rows)
    assert "| 4 | 100.0 | 150.0 | 1.50 (plain) |" in text
    assert "| 8 | - | 10.0 | - |" in text


def test_plots_are_written(tmp_path):
    rows = report.load_rows(H200)
    assert report.plot_sweep(rows, "output_tok_per_s", "tok/s", tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not report.plot_sweep([], "output_tok_per_s", "tok/s", tmp_path / "none.png")
