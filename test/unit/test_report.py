import json
from pathlib import Path

import pytest

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


def test_tradeoff_curves_pair_total_and_per_request_speed_in_concurrency_order(tmp_path):
    from sglang_adaptive.bench import report

    rows = [
        {"label": "plain", "workload": "closed", "concurrency": 128, "output_tok_per_s": 10000.0, "tpot_p50_ms": 10.0},
        {"label": "plain", "workload": "closed", "concurrency": 1, "output_tok_per_s": 100.0, "tpot_p50_ms": 9.0},
        {"label": "eagle3", "workload": "closed", "concurrency": 1, "output_tok_per_s": 250.0,
         "per_request_tok_per_s": 240.0},
        {"label": "eagle3", "workload": "open", "rate": 4, "output_tok_per_s": 90.0, "tpot_p50_ms": 5.0},
        {"label": "broken", "workload": "closed", "concurrency": 1, "output_tok_per_s": 0.0},
    ]
    curves = report.tradeoff_points(rows)
    assert curves == {"plain": [(100.0, 1e3 / 9.0, 1), (10000.0, 100.0, 128)], "eagle3": [(250.0, 240.0, 1)]}
    assert report.plot_tradeoff(rows, tmp_path / "t.png")
    assert (tmp_path / "t.png").read_bytes()[:4] == b"\x89PNG"
    assert not report.plot_tradeoff([], tmp_path / "none.png")
    from PIL import Image

    assert Image.open(tmp_path / "t.png").mode == "P"  # 64 colours: committed plots stay small


def test_rounds_report_medians_and_their_spread():
    rows = [{"label": label, "workload": "closed", "concurrency": c, "output_tok_per_s": v, "tpot_p50_ms": 1e3 / v,
             "round": r}
            for label, c, vs in [("plain", 128, (100.0, 110.0, 104.0)), ("adaptive-goodput", 128, (99.0, 101.0, 103.0)),
                                 ("plain", 1, (10.0,)), ("adaptive-goodput", 1, (20.0,))]
            for r, v in enumerate(vs, 1)]
    labels, table = report.pivot(rows)
    assert table == {1: {"plain": 10.0, "adaptive-goodput": 20.0}, 128: {"plain": 104.0, "adaptive-goodput": 101.0}}
    assert "| 128 | 104.0 | 101.0 | 0.97 (plain) |" in report.ratio_table(rows)
    spread = report.spread_table(rows)
    assert "| 128 | 10.0% (3) | 4.0% (3) |" in spread and "| 1 | - | - |" in spread
    assert "spread of output tok/s over rounds" in report.markdown(rows)
    (t1, p1, c1), (t128, p128, c128) = report.tradeoff_points(rows)["plain"]
    assert (t1, c1, t128, c128) == (10.0, 1, 104.0, 128) and (p1, p128) == pytest.approx((10.0, 104.0))
    single = [r for r in rows if r["round"] == 1]
    assert report.spread_table(single) == "" and "over rounds" not in report.markdown(single)


def test_the_report_compares_steady_decode_where_rows_carry_it():
    rows = [{"label": "plain", "workload": "closed", "concurrency": 64, "output_tok_per_s": 7800.0,
             "steady_decode_tok_per_s": 9800.0},
            {"label": "adaptive-goodput", "workload": "closed", "concurrency": 64, "output_tok_per_s": 7600.0,
             "steady_decode_tok_per_s": 9702.0}]
    text = report.markdown(rows)
    section = text.split("### Closed loop: steady decode tok/s")[1]
    assert "| 64 | 9800.0 | 9702.0 | 0.99 (plain) |" in section
    assert "steady decode" not in report.markdown([{**r, "steady_decode_tok_per_s": None} for r in rows])


def test_the_report_compares_speculative_windows_with_static_eagle3():
    rows = [{"label": "eagle3", "workload": "closed", "concurrency": 1, "output_tok_per_s": 800.0,
             "steady_spec_decode_tok_per_s": 818.0},
            {"label": "adaptive-goodput", "workload": "closed", "concurrency": 1, "output_tok_per_s": 600.0,
             "steady_spec_decode_tok_per_s": 613.5}]
    section = report.markdown(rows).split("### Closed loop: steady speculative decode tok/s")[1]
    assert "| 1 | 818.0 | 613.5 | 0.75 (eagle3) |" in section
    assert "steady speculative" not in report.markdown([{**r, "steady_spec_decode_tok_per_s": None} for r in rows])


def test_the_report_lists_prefill_batches_without_ratios():
    # A count, not a speed: no "vs best static" column, whose max-is-best rule would misread it.
    rows = [{"label": "eagle3", "workload": "closed", "concurrency": 4, "output_tok_per_s": 1488.0,
             "prefill_batches": 10},
            {"label": "adaptive-goodput", "workload": "closed", "concurrency": 4, "output_tok_per_s": 1402.0,
             "prefill_batches": 15}]
    section = report.markdown(rows).split("### Closed loop: prefill batches")[1].split("###")[0]
    assert section.splitlines()[2] == "| concurrency | eagle3 | adaptive-goodput |"
    assert "| 4 | 10 | 15 |" in section
    assert "prefill batches" not in report.markdown([{**r, "prefill_batches": None} for r in rows])


def test_interleaved_points_are_judged_slice_by_slice():
    # Slice 2 ran while the host was slow for everyone: whole-point medians would blur
    # it, the paired ratio does not. The better static mode changes between slices.
    rows = [
        {"label": "plain", "workload": "closed", "concurrency": 8, "output_tok_per_s": 1,
         "slice_tok_per_s": [100.0, 50.0, 120.0]},
        {"label": "eagle3", "workload": "closed", "concurrency": 8, "output_tok_per_s": 1,
         "slice_tok_per_s": [110.0, 40.0, 100.0]},
        {"label": "adaptive-goodput", "workload": "closed", "concurrency": 8, "output_tok_per_s": 1,
         "slice_tok_per_s": [121.0, 49.0, 114.0]},
        {"label": "adaptive-goodput", "workload": "closed", "concurrency": 1, "output_tok_per_s": 1},
    ]
    table = report.paired_slices_table(rows)
    # 121/110 = 1.10, 49/50 = 0.98, 114/120 = 0.95
    assert table.splitlines()[2] == "| 8 | 0.980 (0.95-1.10, 3 slices) |"
    assert len(table.splitlines()) == 3  # c=1 was not interleaved
    assert "interleaved" in report.markdown(rows)
    assert report.paired_slices_table([r for r in rows if "slice_tok_per_s" not in r]) == ""


def _interleaved_run(path, goodput_slices):
    """A results file of one interleaved point (c=8): static EAGLE-3 at 100 tok/s in
    every slice, no-spec at 90, goodput as given."""
    rows = [{"label": "plain", "concurrency": 8, "output_tok_per_s": 1, "slice_tok_per_s": [90.0] * 4},
            {"label": "eagle3", "concurrency": 8, "output_tok_per_s": 1, "slice_tok_per_s": [100.0] * 4},
            {"label": "adaptive-goodput", "concurrency": 8, "output_tok_per_s": 1,
             "slice_tok_per_s": goodput_slices}]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_interleaved_runs_read_together_pool_their_slices_with_an_interval(tmp_path, capsys):
    # Two runs of the same point, each one round: read together, the second run's
    # slices must not replace the first's (both are round 1 of their label).
    first = _interleaved_run(tmp_path / "a.jsonl", [90.0, 92.0, 94.0, 96.0])
    second = _interleaved_run(tmp_path / "b.jsonl", [102.0, 104.0, 106.0, 108.0])
    report.main([first, second, "--out", str(tmp_path / "pooled")])
    line = next(x for x in (tmp_path / "pooled" / "report.md").read_text().splitlines() if x.startswith("| 8 | 0."))
    median_part, interval = line.split("; median's 95% interval ")
    assert median_part == "| 8 | 0.990 (0.90-1.08, 8 slices"
    low, high = (float(x) for x in interval.rstrip(") |").split("-"))
    # The median of 8 resampled ratios lies between their 2nd and 7th smallest at the
    # 95% ends, and the interval holds the median itself.
    assert 0.90 <= low < 0.99 < high <= 1.08
    assert report.median_interval([0.97] * 8) == (0.97, 0.97)
    # One outlying slice in ten moves the median of a resample only when half the draws
    # hit it (p = 0.0016): a few of 2000 resamples, inside the 2.5% at either end.
    assert report.median_interval([0.5] + [1.0] * 9) == (1.0, 1.0)
    assert report.median_interval([1.5] + [1.0] * 9) == (1.0, 1.0)
    # One run alone: 4 slices, fewer than the interval needs.
    report.main([first, "--out", str(tmp_path / "one")])
    assert "| 8 | 0.930 (0.90-0.96, 4 slices) |" in (tmp_path / "one" / "report.md").read_text()
    capsys.readouterr()
