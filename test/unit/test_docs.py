"""The documents a reviewer and an operator read agree with the code and the results.

- docs/upstream-pr.md: every table marked with a ``<!-- source: PATH kind: K -->``
  line matches the committed result file it names, cell by cell; every hook in
  ``hooks.HOOKS`` has its line under Modifications.
- docs/operators-guide.md: every start-up refusal of ``args.py`` is listed, and
  nothing else is listed as one.
"""

from __future__ import annotations

import ast
import json
import math
import re
from pathlib import Path

import pytest

from sglang_adaptive.hooks import HOOKS

REPO = Path(__file__).resolve().parents[2]
PR = REPO / "docs" / "upstream-pr.md"
GUIDE = REPO / "docs" / "operators-guide.md"
SOURCE_RE = re.compile(r"<!-- source: (\S+) kind: (\S+) -->")


def tables(text: str):
    """(source path, kind, header cells, rows of cells) for each marked table."""
    lines = text.splitlines()
    out = []
    for i, line in enumerate(lines):
        m = SOURCE_RE.match(line.strip())
        if not m:
            continue
        block = []
        for row in lines[i + 1:]:
            if not row.startswith("|"):
                break
            block.append([c.strip() for c in row.strip().strip("|").split("|")])
        header, body = block[0], [r for r in block[2:]]
        out.append((m.group(1), m.group(2), header, body))
    return out


def fmt(value) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    return str(value)


def bench_cell(rows, label: str, concurrency: int) -> str:
    hits = [r for r in rows if r["label"] == label and r.get("workload", "closed") == "closed"
            and r["concurrency"] == concurrency]
    assert len(hits) == 1, f"{len(hits)} rows for {label} at concurrency {concurrency}"
    return f"{hits[0]['output_tok_per_s']:.1f}"


def gpu_suite_cell(configs: dict, config: str, column: str) -> str:
    entry = configs[config]
    if column == "tokens_per_verify":
        return fmt(entry.get("spec_accept_length", entry.get("accept_length")))
    return fmt(entry.get(column))


PR_TABLES = tables(PR.read_text())


def test_the_pr_has_marked_tables():
    assert {kind for _, kind, _, _ in PR_TABLES} == {"bench", "gpu-suite"} and len(PR_TABLES) >= 4


@pytest.mark.parametrize("source, kind, header, body", PR_TABLES, ids=[t[0] for t in PR_TABLES])
def test_pr_table_matches_its_result_file(source, kind, header, body):
    path = REPO / source
    assert path.is_file(), f"{source} is not committed"
    if kind == "bench":
        rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        assert header[0] == "concurrency"
        for row in body:
            for label, cell in zip(header[1:], row[1:]):
                assert cell == bench_cell(rows, label, int(row[0])), (source, label, row[0])
    else:
        configs = json.loads(path.read_text())["configs"]
        assert header[0] == "config"
        for row in body:
            for column, cell in zip(header[1:], row[1:]):
                assert cell == gpu_suite_cell(configs, row[0], column), (source, row[0], column)


def test_table_checker_notices_a_wrong_number():
    source, kind, header, body = next(t for t in PR_TABLES if t[1] == "bench")
    rows = [json.loads(line) for line in (REPO / source).read_text().splitlines() if line.strip()]
    assert bench_cell(rows, header[1], int(body[0][0])) != f"{float(body[0][1]) + 0.1:.1f}"


def test_every_hook_has_its_in_tree_edit_in_the_pr():
    modifications = PR.read_text().split("## Modifications", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"^\| `([\w.]+)` \|", modifications, flags=re.M)
    assert sorted(listed) == sorted(h.target for h in HOOKS)


def refusal_templates() -> list[str]:
    """The sentence of every ``_fail(...)`` call in args.py, with each placeholder as {}."""
    tree = ast.parse((REPO / "python" / "sglang_adaptive" / "args.py").read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "_fail":
            arg = node.args[0]
            if isinstance(arg, ast.Constant):
                out.append(arg.value)
            else:
                out.append("".join(v.value if isinstance(v, ast.Constant) else "{}" for v in arg.values))
    return out


def guide_refusals() -> list[str]:
    section = GUIDE.read_text().split("## Start-up refusals", 1)[1].split("\n## ", 1)[0]
    table = section.split("| message (`args.py`) | meaning |", 1)[1].split("\n\n", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", table, flags=re.M)


def test_operators_guide_lists_every_start_up_refusal_of_args():
    templates, listed = refusal_templates(), guide_refusals()
    assert len(templates) == len(listed) >= 10
    for template in templates:
        # The guide writes placeholders as one capital letter (N, K, P, A) and the
        # policy flag in full: every literal piece of the code's sentence must be there.
        pattern = "^" + r"\S+".join(re.escape(piece) for piece in template.split("{}")) + "$"
        pattern = pattern.replace(r"\S+", r"(?:--speculative-switch-policy )?\S+")
        assert any(re.match(pattern, line) for line in listed), f"not in the operator's guide: {template}"


def test_readme_links_the_documents():
    readme = (REPO / "README.md").read_text()
    for doc in ("docs/operators-guide.md", "docs/design.md", "docs/upstream-pr.md"):
        assert f"]({doc})" in readme, doc


def test_every_gpu_host_run_step_is_handled_once_and_named_in_its_header():
    """A step named twice in gpu-host-run.sh's case runs the first body only: the
    second is dead and its lease spends device time on a run nobody asked for."""
    text = (Path(__file__).resolve().parents[2] / "scripts" / "gpu-host-run.sh").read_text()
    steps = re.findall(r"^ {12}([a-z0-9]+)\)", text, re.M)
    twice = sorted({s for s in steps if steps.count(s) > 1})
    assert not twice, f"gpu-host-run.sh handles these steps more than once: {twice}"
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    unnamed = [s for s in steps if not re.search(rf"(^#\s+(Steps: )?|; ){s}[\s:]", header, re.M)]
    assert not unnamed, f"steps without a line in gpu-host-run.sh's header: {unnamed}"
