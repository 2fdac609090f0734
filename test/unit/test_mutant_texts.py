"""Every planted bug still fits the code it edits, the GPU ones included: their runner
only finds out on the GPU host, after the servers are built."""

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "test"))
import mutants  # noqa: E402


def test_every_mutant_edits_text_found_exactly_once():
    misfits = [(m.name, m.path, (mutants.PACKAGE / m.path).read_text().count(m.old)) for m in mutants.MUTANTS]
    assert [m for m in misfits if m[2] != 1] == []
    assert len({m.name for m in mutants.MUTANTS}) == len(mutants.MUTANTS)


def test_a_deleted_line_starts_its_line():
    """A mutant that deletes indented lines must match from a line's start: found inside a
    deeper-indented line, it would leave stray spaces behind (an IndentationError, which
    the runner counts as an error, not a kill)."""
    misplaced = []
    for m in mutants.MUTANTS:
        if m.old[:1] in (" ", "\t") and m.old.endswith("\n") and not m.new:
            text = (mutants.PACKAGE / m.path).read_text()
            at = text.find(m.old)
            if at > 0 and text[at - 1] != "\n":
                misplaced.append(m.name)
    assert misplaced == []
