"""The README's Python example runs as written (it once used names it never defined)."""

from __future__ import annotations

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_the_core_example_runs_as_written():
    text = README.read_text()
    section = text[text.index("## The core in a few lines") :]
    block = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    scope: dict = {}
    exec(compile(block, "README.md (The core in a few lines)", "exec"), scope)
    assert set(scope["terms"]) >= {"ce", "nce", "loss"}
    assert scope["terms"]["loss"].requires_grad
