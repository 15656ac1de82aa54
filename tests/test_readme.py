"""The README's tour prints what the README says it prints.

Every ```python block of README.md that is followed directly by a plain ``` block (its
output) is run, in order, in one namespace (later blocks use names of earlier ones, as a
reader running the tour would), and its standard output must equal that block verbatim.
Blocks without an output block (Spark, MLflow, sketches with placeholders) are not run.
"""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)


def tour_blocks(text: str) -> list[tuple[int, str, str]]:
    """(line, code, printed output) of every python block followed by an output block."""
    fences = list(FENCE.finditer(text))
    blocks = []
    for code, output in zip(fences, fences[1:], strict=False):
        between = text[code.end() : output.start()]
        if code.group(1) == "python" and output.group(1) == "" and not between.strip():
            line = text.count("\n", 0, code.start()) + 1
            blocks.append((line, code.group(2), output.group(2)))
    return blocks


def test_the_readme_tour_prints_what_it_shows():
    blocks = tour_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) >= 3  # the engine tour, result deltas, SQL views
    namespace: dict = {}
    for line, code, expected in blocks:
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(code, f"README.md:{line}", "exec"), namespace)
        assert printed.getvalue() == expected, f"README.md block at line {line}"
