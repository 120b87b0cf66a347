"""``monsoon.options`` is the one owner of the ``--monsoon-*`` pytest options: no other module of monsoon spells
one in a string literal (it imports the constant), and the plugin adds each of them, and only them."""
from __future__ import annotations

from pathlib import Path

import pytest

from monsoon import options
from monsoon.paths import REPO
from tests.unit.helpers import code_strings

# the files ``monsoon init`` writes into a user's project: text for people, which names the options as they type them
ELSEWHERE = {"monsoon/scaffold.py"}


def spelled(path: Path) -> set[str]:
    """String constants of a module that name a ``--monsoon-`` option (docstrings are not code)."""
    return {s for s in code_strings(path) if "--monsoon-" in s}


def test_no_module_but_options_spells_an_option_name():
    found = {rel: sorted(names) for p in sorted((REPO / "monsoon").rglob("*.py"))
             if (rel := str(p.relative_to(REPO))) not in {"monsoon/options.py", *ELSEWHERE} and "/_shipped/" not in rel
             and (names := spelled(p))}
    assert found == {}, f"import these from monsoon.options: {found}"


def test_a_spelled_option_is_found_in_a_message_too(tmp_path):
    p = tmp_path / "m.py"
    p.write_text('"""Reads --monsoon-force."""\nA = "--monsoon-force"\nB = "run with --monsoon-force"\n')
    assert spelled(p) == {"--monsoon-force", "run with --monsoon-force"}


def test_the_plugin_adds_every_option_and_only_those(pytestconfig: pytest.Config):
    group = pytestconfig._parser.getgroup("monsoon")
    names = {n for o in group.options for n in o.names() if n.startswith("--monsoon-")}
    assert names == set(options.OPTIONS)
