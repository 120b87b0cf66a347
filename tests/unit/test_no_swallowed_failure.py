"""No swallowed failure (issue 40): a broad handler (``except Exception``, ``except BaseException`` or a bare
``except``) whose body is only ``pass`` must say, in a comment on its ``except`` line or its ``pass`` line, why
the failure is safe to ignore; otherwise it re-raises or records what failed (timeline, census, log line)."""
from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

import monsoon

ROOT = Path(monsoon.__file__).parent
BROAD = {"Exception", "BaseException"}


def _comment_lines(src: str) -> set[int]:
    return {t.start[0] for t in tokenize.generate_tokens(io.StringIO(src).readline) if t.type == tokenize.COMMENT}


def _is_broad(h: ast.ExceptHandler) -> bool:
    if h.type is None:
        return True
    names = h.type.elts if isinstance(h.type, ast.Tuple) else [h.type]
    return any(isinstance(n, ast.Name) and n.id in BROAD for n in names)


def silent_passes(src: str, path: str = "<src>") -> list[str]:
    """``path:line`` of every broad handler whose body is only ``pass``, with no reason comment."""
    comments = _comment_lines(src)
    out = []
    for node in ast.walk(ast.parse(src)):
        if isinstance(node, ast.ExceptHandler) and _is_broad(node) and \
                len(node.body) == 1 and isinstance(node.body[0], ast.Pass):
            if not {node.lineno, node.body[0].lineno} & comments:
                out.append(f"{path}:{node.lineno}")
    return out


def test_every_silent_broad_handler_in_monsoon_says_why():
    found = [x for p in sorted(ROOT.rglob("*.py"))
             for x in silent_passes(p.read_text(), str(p.relative_to(ROOT.parent)))]
    assert found == [], ("broad handlers that swallow a failure without a reason; re-raise, record what failed "
                         "(timeline, census, log line), or give the reason in a comment: " + ", ".join(found))


@pytest.mark.parametrize("src, silent", [
    ("try:\n    f()\nexcept Exception:\n    pass\n", True),
    ("try:\n    f()\nexcept:\n    pass\n", True),
    ("try:\n    f()\nexcept (OSError, BaseException):\n    pass\n", True),
    ("try:\n    f()\nexcept Exception:   # best effort: the process is already gone\n    pass\n", False),
    ("try:\n    f()\nexcept Exception:\n    pass   # the check writes its own event\n", False),
    ("try:\n    f()\nexcept OSError:\n    pass\n", False),                     # narrow: not this rule
    ("try:\n    f()\nexcept Exception as e:\n    log(e)\n", False),
    ("try:\n    f()\nexcept Exception:\n    raise\n", False),
])
def test_the_scan_tells_a_silent_handler_from_one_that_says_why(src, silent):
    assert bool(silent_passes(src)) is silent
