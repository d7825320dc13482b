"""The documentation's examples as code to run: the first ```python block under a heading."""

from __future__ import annotations

import pathlib

ROOT = pathlib.Path(__file__).resolve().parent.parent.parent


def example(path: pathlib.Path, heading: str) -> str:
    """The first ```python block under ``heading`` in ``path``."""
    text = path.read_text()
    section = text[text.index(heading):]
    start = section.index("```python\n") + len("```python\n")
    return section[start:section.index("```", start)]
