"""JSON lines -> Markdown tables (ratios to the best static configuration) and PNG plots.

Rows: one JSON object per configuration x load point, with ``label``, ``workload``
(``closed``, ``open`` or ``phased``; rows without it, as the retired ``benchmark/loadgen.py`` printed
them, count as closed) and the metrics of ``metrics.summarize``. Plots need
matplotlib; without it the tables are still written.

usage: python -m sglang_adaptive.bench.report RESULTS.jsonl [MORE.jsonl ...] [--out DIR]
(several files: rows of runs made in parts, e.g. one configuration per device call, or
interleaved runs of the same points, whose slices the interleaved table pools)
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path
from statistics import median

from sglang_adaptive.bench.configs import LABELS as ORDER, STATIC


# The index of the results file a row was read from (``main``; rows handed over in
# memory count as file 0): the interleaved slices of separate runs are pooled, not
# taken for one another.
SOURCE = "_source"


def load_rows(path) -> list[dict]:
    rows = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line.startswith("{"):
            row = json.loads(line)
            if {"label", "output_tok_per_s"} <= row.keys():
                row.setdefault("workload", "closed")
                rows.append(row)
    return rows


def pivot(rows: list[dict], metric: str = "output_tok_per_s", key: str = "concurrency",
          workload: str = "closed") -> tuple[list[str], dict]:
    """labels in display order, {load point: {label: value}}; the median where
    several rows (rounds, ``--rounds``) measured one label at one point."""
    labels, samples = _samples(rows, metric, key, workload)
    return labels, {point: {label: median(v) for label, v in values.items()} for point, values in samples.items()}


def _samples(rows, metric, key, workload) -> tuple[list[str], dict]:
    table: dict = {}
    for row in rows:
        if row.get("workload", "closed") == workload and row.get(metric) is not None and key in row:
            table.setdefault(row[key], {}).setdefault(row["label"], []).append(float(row[metric]))
    seen = {label for values in table.values() for label in values}
    labels = [label for label in ORDER if label in seen] + sorted(seen - set(ORDER))
    return labels, dict(sorted(table.items()))


def spread_table(rows: list[dict], metric: str = "output_tok_per_s", key: str = "concurrency",
                 workload: str = "closed") -> str:
    """Per configuration and load point measured more than once: the largest value over
    the smallest, less 1. A ratio between two configurations means little where it is
    not well above this."""
    labels, samples = _samples(rows, metric, key, workload)
    if not any(len(v) > 1 for values in samples.values() for v in values.values()):
        return ""
    lines = ["| " + " | ".join([key, *labels]) + " |", "|" + "---:|" * (len(labels) + 1)]
    for point, values in samples.items():
        cells = [f"{point:g}"]
        for label in labels:
            v = values.get(label, [])
            cells.append(f"{max(v) / min(v) - 1:.1%} ({len(v)})" if len(v) > 1 and min(v) > 0 else "-")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# Slices of one interleaved point (all rounds and runs) from which its table cell also
# gives the median's 95% bootstrap interval: fewer say little about it.
MIN_INTERVAL_SLICES = 6
BOOTSTRAP_RESAMPLES = 2000


def median_interval(values: list[float], resamples: int = BOOTSTRAP_RESAMPLES) -> tuple[float, float]:
    """The 2.5th and 97.5th percentiles of the median over ``resamples`` resamples of
    ``values`` (with replacement; a fixed seed, so a report reads the same each time)."""
    rng = random.Random(0)
    medians = sorted(median(rng.choices(values, k=len(values))) for _ in range(resamples))
    return medians[int(0.025 * resamples)], medians[int(0.975 * resamples) - 1]


def paired_slices_table(rows: list[dict]) -> str:
    """Interleaved points (``--interleave``): each non-static configuration's output tok/s
    in a slice over the better static one's in the same slice, the median over every
    slice of the point (all rounds, and all runs where rows of several results files are
    read: ``SOURCE`` tells them apart) and the range; from ``MIN_INTERVAL_SLICES`` slices
    on, the median's 95% bootstrap interval too. The servers took the slices in turn,
    seconds apart: this ratio is paired, the medians of whole points are not. On a host
    whose speed swings by more than the margin being judged, one run's median can land
    either side of a bar that the pooled runs' interval shows undecided."""
    slices: dict = {}
    for row in rows:
        if row.get("workload", "closed") == "closed" and row.get("slice_tok_per_s"):
            point = slices.setdefault(row["concurrency"], {})
            point.setdefault((row.get(SOURCE, 0), row.get("round", 1)), {})[row["label"]] = row["slice_tok_per_s"]
    others = sorted({label for point in slices.values() for by in point.values() for label in by} - set(STATIC),
                    key=lambda x: ORDER.index(x) if x in ORDER else len(ORDER))
    if not others:
        return ""
    lines = ["| concurrency | " + " | ".join(f"{label} vs better static" for label in others) + " |",
             "|" + "---:|" * (len(others) + 1)]
    for point, by_round in sorted(slices.items()):
        cells = [f"{point:g}"]
        for label in others:
            ratios = [r for by in by_round.values() for r in _slice_ratios(by, label)]
            if not ratios:
                cells.append("-")
                continue
            interval = ""
            if len(ratios) >= MIN_INTERVAL_SLICES:
                low, high = median_interval(ratios)
                interval = f"; median's 95% interval {low:.3f}-{high:.3f}"
            cells.append(f"{median(ratios):.3f} ({min(ratios):.2f}-{max(ratios):.2f}, {len(ratios)} slices{interval})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _slice_ratios(by_label: dict, label: str) -> list[float]:
    """One round of one interleaved point: ``label``'s output in each slice over the
    better static mode's in that slice."""
    statics = [by_label[x] for x in STATIC if x in by_label]
    if label not in by_label or not statics:
        return []
    best = [max(v) for v in zip(*statics)]
    return [mine / b for mine, b in zip(by_label[label], best) if b > 0]


def best_static(values: dict, lower_is_better: bool = False):
    present = [(values[label], label) for label in STATIC if label in values]
    if not present:
        return None
    value, label = (min if lower_is_better else max)(present)
    return label, value


def ratio_table(rows: list[dict], metric: str = "output_tok_per_s", key: str = "concurrency",
                workload: str = "closed", lower_is_better: bool = False, digits: int = 1,
                ratios: bool = True) -> str:
    """Values per configuration and, for non-static ones, the ratio to the best static
    configuration at that load point (higher is better in both cases: for a
    lower-is-better metric the ratio is best / value); ``ratios=False``: the values only."""
    labels, table = pivot(rows, metric, key, workload)
    if not table:
        return ""
    others = [label for label in labels if label not in STATIC] if ratios else []
    head = [key, *labels, *[f"{label} vs best static" for label in others]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for point, values in table.items():
        cells = [f"{point:g}"] + [f"{values[label]:.{digits}f}" if label in values else "-" for label in labels]
        best = best_static(values, lower_is_better)
        for label in others:
            if best is None or label not in values or not values[label]:
                cells.append("-")
            else:
                ratio = best[1] / values[label] if lower_is_better else values[label] / best[1]
                cells.append(f"{ratio:.2f} ({best[0]})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def phased_table(rows: list[dict]) -> str:
    rows = [r for r in rows if r.get("workload") == "phased"]
    if not rows:
        return ""
    lines = ["| configuration | output tok/s | TPOT p50 / p99 (ms) | TTFT p50 / p99 (ms) | plain share | switches |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        share = r.get("plain_share")
        lines.append(
            f"| {r['label']} | {r['output_tok_per_s']:.1f} | {r.get('tpot_p50_ms')} / {r.get('tpot_p99_ms')} | "
            f"{r.get('ttft_p50_ms')} / {r.get('ttft_p99_ms')} | "
            f"{'-' if share is None else f'{share:.0%}'} | {r.get('switches', '-')} |")
    lines += ["", *phase_lines(rows)]
    return "\n".join(lines).rstrip() + "\n"


def phase_lines(rows: list[dict]) -> list[str]:
    """Per phase: output tok/s and per-request tok/s of the requests sent in it; for an
    adaptive configuration, issue 13's ratios: total against no-spec, and per-request
    speed in the low phases (below the highest concurrency) against static EAGLE-3."""
    rows = [r for r in rows if r.get("phase_summary")]
    if not rows:
        return []
    phases = rows[0]["phase_summary"]
    lines = ["Per phase: output tok/s / tok/s per request (median TPOT of the requests sent in it)", "",
             "| configuration | " + " | ".join(f"{p['seconds']:g} s at {p['concurrency']}" for p in phases) + " |",
             "|---|" + "---:|" * len(phases)]
    for r in rows:
        lines.append(f"| {r['label']} | " + " | ".join(
            f"{p['output_tok_per_s']} / {p['per_request_tok_per_s']}" for p in r["phase_summary"]) + " |")
    by = {r["label"]: r for r in rows}
    plain, eagle3 = by.get("plain"), by.get("eagle3")
    top = max(p["concurrency"] for p in phases)
    for r in rows:
        if not r["label"].startswith("adaptive"):
            continue
        parts = []
        if plain and plain["output_tok_per_s"]:
            parts.append(f"total ÷ no-spec {r['output_tok_per_s'] / plain['output_tok_per_s']:.3f}")
        if eagle3:
            low = [f"{a['per_request_tok_per_s'] / b['per_request_tok_per_s']:.3f}"
                   for a, b in zip(r["phase_summary"], eagle3["phase_summary"])
                   if a["concurrency"] < top and a["per_request_tok_per_s"] and b["per_request_tok_per_s"]]
            parts.append("low phases per request ÷ static EAGLE-3 " + ", ".join(low))
        if parts:
            lines += ["", f"{r['label']}: " + "; ".join(parts)]
    return lines


def markdown(rows: list[dict]) -> str:
    parts = []
    sections = [
        ("Closed loop: output tok/s against concurrency", dict(workload="closed")),
        ("Closed loop: TPOT p50 (ms) against concurrency (ratio: best static / this)",
         dict(workload="closed", metric="tpot_p50_ms", lower_is_better=True, digits=2)),
        ("Closed loop: steady decode tok/s (decode log windows at the concurrency's batch size "
         "without a speculative batch: the plain steps themselves)",
         dict(workload="closed", metric="steady_decode_tok_per_s")),
        ("Closed loop: steady speculative decode tok/s (windows at the concurrency's batch size in "
         "which every batch speculated: an adaptive server's against static EAGLE-3's, the same "
         "steps on two servers)",
         dict(workload="closed", metric="steady_spec_decode_tok_per_s")),
        ("Closed loop: prefill batches (a wave's successors in one batch or several, a race the "
         "later waves inherit: where servers differ here, so may their output tok/s)",
         dict(workload="closed", metric="prefill_batches", digits=0, ratios=False)),
        ("Open loop: output tok/s against request rate (req/s)", dict(workload="open", key="rate")),
        ("Open loop: TPOT p50 (ms) against request rate (ratio: best static / this)",
         dict(workload="open", key="rate", metric="tpot_p50_ms", lower_is_better=True, digits=2)),
    ]
    for title, kwargs in sections:
        table = ratio_table(rows, **kwargs)
        if table:
            parts.append(f"### {title}\n\n{table}")
    paired = paired_slices_table(rows)
    if paired:
        parts.append("### Closed loop, interleaved: output tok/s over the better static mode's in the same "
                     f"slice (median over slices, range; from {MIN_INTERVAL_SLICES} slices the median's 95% "
                     f"bootstrap interval)\n\n{paired}")
    spread = spread_table(rows)
    if spread:
        parts.append("### Closed loop: spread of output tok/s over rounds (max / min - 1, rounds); "
                     f"the tables above show medians\n\n{spread}")
    phased = phased_table(rows)
    if phased:
        parts.append(f"### Time-varying load (phases of concurrency)\n\n{phased}")
    return "\n".join(parts)


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, path: Path) -> None:
    """Write the figure as a 64-colour PNG: a quarter of the bytes, and result folders
    are committed (the repository travels to the GPU host within a 64 MiB cap)."""
    fig.savefig(path)
    try:
        from PIL import Image
    except ImportError:
        return
    Image.open(path).convert("RGB").quantize(colors=64, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)


def plot_sweep(rows, metric: str, ylabel: str, path: Path, key: str = "concurrency",
               workload: str = "closed", xlabel: str = "concurrency (requests in flight)") -> bool:
    plt = _pyplot()
    labels, table = pivot(rows, metric, key, workload)
    if plt is None or not table:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=100)
    for label in labels:
        points = [(p, v[label]) for p, v in table.items() if label in v]
        xs, ys = zip(*points)
        # A configuration measured at only some points gets markers only: a line
        # would suggest values in between.
        style = "-" if len(points) == len(table) else ""
        ax.plot(xs, ys, marker="o", linestyle=style, label=label,
                linewidth=2.6 if label.startswith("adaptive") else 1.4)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(table))
    ax.set_xticklabels([f"{p:g}" for p in table])
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)
    return True


def tradeoff_points(rows, workload: str = "closed") -> dict[str, list[tuple[float, float, int]]]:
    """Per configuration, its load points as (total output tok/s, tok/s per request,
    concurrency), in concurrency order; per request from the row's own figure, else
    from its median TPOT; rounds of one point give their medians."""
    out: dict[str, dict] = {}
    for r in rows:
        if r.get("workload", "closed") != workload or not r.get("output_tok_per_s"):
            continue
        per_request = r.get("per_request_tok_per_s") or (1e3 / r["tpot_p50_ms"] if r.get("tpot_p50_ms") else None)
        if per_request:
            out.setdefault(r["label"], {}).setdefault(r["concurrency"], []).append((r["output_tok_per_s"], per_request))
    return {label: [(median(t for t, _ in pts), median(p for _, p in pts), c) for c, pts in sorted(by_c.items())]
            for label, by_c in out.items()}


def plot_tradeoff(rows, path: Path) -> bool:
    """The picture speculation is judged by (as InferenceX plots it): tokens/s per
    request (interactivity) against total output tokens/s (throughput), one curve
    per configuration across the concurrency sweep. Up and right is better; an
    adaptive curve should lie on or above both static ones."""
    plt = _pyplot()
    curves = tradeoff_points(rows)
    if plt is None or not curves:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.6), dpi=100)
    for label, points in curves.items():
        xs, ys, cs = zip(*points)
        ax.plot(xs, ys, marker="o", label=label, linewidth=2.6 if label.startswith("adaptive") else 1.4)
        for x, y, c in points:
            ax.annotate(f"{c}", (x, y), textcoords="offset points", xytext=(3, 3), fontsize=7)
    ax.set_xlabel("total output tokens / s")
    ax.set_ylabel("output tokens / s per request")
    ax.set_xscale("log")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("labels: concurrency", fontsize=8)
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)
    return True


def plot_mode_over_time(rows, path: Path) -> bool:
    """Per configuration: output tok/s over time; for adaptive ones the plain share;
    the target concurrency as a step line."""
    plt = _pyplot()
    rows = [r for r in rows if r.get("workload") == "phased" and r.get("throughput_timeline")]
    if plt is None or not rows:
        return False
    fig, (ax_c, ax_t, ax_m) = plt.subplots(3, 1, figsize=(7, 7.5), dpi=100, sharex=True)
    phases = rows[0].get("phases") or []
    t, xs, ys = 0.0, [], []
    for seconds, concurrency in phases:
        xs += [t, t + seconds]
        ys += [concurrency, concurrency]
        t += seconds
    ax_c.plot(xs, ys, color="black")
    ax_c.set_ylabel("target concurrency")
    for r in rows:
        tl = r["throughput_timeline"]
        ax_t.plot([p[0] for p in tl], [p[1] for p in tl], label=r["label"],
                  linewidth=2.2 if r["label"].startswith("adaptive") else 1.2)
        mode = r.get("mode_timeline") or []
        if any(p[1] is not None for p in mode):
            ax_m.step([p[0] for p in mode], [p[1] if p[1] is not None else float("nan") for p in mode],
                      where="post", label=r["label"])
    ax_t.set_ylabel("output tok/s")
    ax_t.legend(fontsize=8)
    ax_m.set_ylabel("plain share of decode batches")
    ax_m.set_ylim(-0.05, 1.05)
    ax_m.set_xlabel("seconds from the start of the load")
    if ax_m.get_legend_handles_labels()[0]:
        ax_m.legend(fontsize=8)
    for ax in (ax_c, ax_t, ax_m):
        ax.grid(True, alpha=0.3)
    fig.tight_layout()
    save(fig, path)
    plt.close(fig)
    return True


def write(rows: list[dict], out: Path) -> list[Path]:
    """Write report.md and every plot the rows allow; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "report.md"]
    written[0].write_text(markdown(rows))
    plots = {
        "throughput.png": lambda path: plot_sweep(rows, "output_tok_per_s", "output tokens / s", path),
        "tpot.png": lambda path: plot_sweep(rows, "tpot_p50_ms", "TPOT p50 (ms)", path),
        "per_request.png": lambda path: plot_sweep(rows, "per_request_tok_per_s",
                                                   "tokens / s per request", path),
        "open_loop_tpot.png": lambda path: plot_sweep(rows, "tpot_p50_ms", "TPOT p50 (ms)", path, "rate",
                                                      "open", "request rate (requests / s, Poisson)"),
        "mode_over_time.png": lambda path: plot_mode_over_time(rows, path),
        "tradeoff.png": lambda path: plot_tradeoff(rows, path),
    }
    written += [out / name for name, plot in plots.items() if plot(out / name)]
    return written


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+")
    p.add_argument("--out", default=None, help="default: beside the first RESULTS")
    a = p.parse_args(argv)
    out = Path(a.out) if a.out else Path(a.results[0]).parent
    rows = [{**row, SOURCE: i} for i, path in enumerate(a.results) for row in load_rows(path)]
    for path in write(rows, out):
        print(f"wrote {path}")
    print((out / "report.md").read_text())


if __name__ == "__main__":
    main()
