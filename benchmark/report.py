"""Turn benchmark JSON lines into a Markdown table and PNG plots.

Input: one JSON object per line with at least ``label``, ``concurrency`` and
``output_tok_per_s`` (``loadgen.py``'s format; ``per_request_tok_per_s`` is plotted
when present). Static configurations (``plain``, ``eagle3``) set the bar: each row
shows every configuration's throughput and, for the others, the ratio to the best
static configuration at that concurrency.

usage: python benchmark/report.py RESULTS.jsonl [--out DIR]
writes DIR/report.md, DIR/throughput.png, DIR/per_request.png (DIR: beside the input)
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

STATIC = ("plain", "eagle3")
ORDER = ("plain", "eagle3", "upstream-adaptive", "adaptive-threshold")


def load_rows(path: str | Path) -> list[dict]:
    rows = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line.startswith("{"):
            row = json.loads(line)
            if {"label", "concurrency", "output_tok_per_s"} <= row.keys():
                rows.append(row)
    return rows


def pivot(rows: list[dict], metric: str = "output_tok_per_s") -> tuple[list[str], dict]:
    """labels in display order, {concurrency: {label: value}}."""
    table: dict[int, dict[str, float]] = {}
    for row in rows:
        if row.get(metric) is not None:
            table.setdefault(int(row["concurrency"]), {})[row["label"]] = float(row[metric])
    seen = {label for values in table.values() for label in values}
    labels = [label for label in ORDER if label in seen] + sorted(seen - set(ORDER))
    return labels, dict(sorted(table.items()))


def best_static(values: dict[str, float]) -> tuple[str, float] | None:
    present = [(values[label], label) for label in STATIC if label in values]
    if not present:
        return None
    value, label = max(present)
    return label, value


def ratio_table(rows: list[dict]) -> str:
    labels, table = pivot(rows)
    others = [label for label in labels if label not in STATIC]
    head = ["concurrency", *labels, *[f"{label} / best static" for label in others]]
    lines = ["| " + " | ".join(head) + " |", "|" + "---:|" * len(head)]
    for conc, values in table.items():
        cells = [str(conc)] + [f"{values[label]:.1f}" if label in values else "-" for label in labels]
        best = best_static(values)
        for label in others:
            if best is None or label not in values:
                cells.append("-")
            else:
                cells.append(f"{values[label] / best[1]:.2f} ({best[0]})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[dict], metric: str, ylabel: str, path: Path) -> bool:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels, table = pivot(rows, metric)
    if not table:
        return False
    fig, ax = plt.subplots(figsize=(6.4, 4.2), dpi=110)
    for label in labels:
        points = [(c, v[label]) for c, v in table.items() if label in v]
        xs, ys = zip(*points)
        # A configuration measured at only some load points (an overhead check,
        # say) gets markers only: a line would suggest values in between.
        style = "-" if len(points) == len(table) else ""
        ax.plot(xs, ys, marker="o", linestyle=style, label=label,
                linewidth=2.6 if label.startswith("adaptive") else 1.4)
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(table))
    ax.set_xticklabels([str(c) for c in table])
    ax.set_xlabel("concurrency (requests in flight)")
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return True


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    out = Path(a.out) if a.out else Path(a.results).parent
    out.mkdir(parents=True, exist_ok=True)
    rows = load_rows(a.results)
    (out / "report.md").write_text(ratio_table(rows))
    plot(rows, "output_tok_per_s", "output tokens / s (server)", out / "throughput.png")
    plot(rows, "per_request_tok_per_s", "tokens / s per request", out / "per_request.png")
    print((out / "report.md").read_text())


if __name__ == "__main__":
    main()
