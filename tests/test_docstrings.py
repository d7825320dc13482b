"""The runnable examples in the docstrings of every raystream module run and show what
they say (examples marked ``# doctest: +SKIP`` need a cluster, Spark or files)."""

from __future__ import annotations

import doctest
import importlib
import re
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def modules() -> list[str]:
    """Every module of the package, as pyproject.toml maps the folders into ``raystream``."""
    package_dirs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-dir"]
    names = []
    for package, folder in sorted(package_dirs.items()):
        for path in sorted((ROOT / folder).glob("*.py")):
            names.append(package if path.name == "__init__.py" else f"{package}.{path.stem}")
    return names


@pytest.mark.parametrize("name", modules())
def test_docstring_examples(ray_session, name):  # an example may start a job: Ray is up first
    result = doctest.testmod(importlib.import_module(name),
                             optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples failed in {name}"


# modules examples commonly name by a short alias: each docstring imports what it uses, so
# an example copied from it runs as it is
ALIASES = ("pa", "pc", "pq", "pafs", "np", "pd", "rs", "ray")
_STRINGS = re.compile(r"\"[^\"\n]*\"|'[^'\n]*'")


def test_every_example_imports_the_modules_it_names():
    missing = []
    for name in modules():
        module = importlib.import_module(name)
        for test in doctest.DocTestFinder(exclude_empty=True).find(module):
            source = _STRINGS.sub('""', "".join(example.source for example in test.examples))
            for alias in ALIASES:
                if (re.search(rf"(?<![\w.]){alias}\.", source)
                        and not re.search(rf"\bas {alias}\b|\bimport {alias}\b|, {alias}\b",
                                          source)):
                    missing.append(f"{test.name} uses {alias}. without importing it")
    assert not missing, "\n".join(missing)
