"""YAML loading that remembers where every key came from.

Specs are validated by pydantic; when validation fails we want the error to
name the file, the line and the dotted key, not just the key.  PyYAML's
composer gives nodes with positions, so we construct plain Python data from
the node tree ourselves and keep a ``{key path: line}`` map beside it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError


class SpecError(ValueError):
    """An invalid spec file: the message names the file, the line and the key."""

    def __init__(self, path: Path | str, line: int | None, key: str, message: str):
        self.path, self.line, self.key = str(path), line, key
        where = f"{path}:{line}" if line else f"{path}"
        super().__init__(f"{where}: {key or '<top>'}: {message}" if key else f"{where}: {message}")


@dataclass
class LocatedDoc:
    path: Path
    data: Any
    lines: dict[tuple, int] = field(default_factory=dict)

    def line_of(self, loc: tuple) -> int | None:
        """Line of the deepest known prefix of ``loc`` (1-based)."""
        loc = tuple(loc)
        while loc:
            if loc in self.lines:
                return self.lines[loc]
            loc = loc[:-1]
        return self.lines.get((), 1)


def _construct(node: yaml.Node, path: tuple, lines: dict, loader: yaml.SafeLoader) -> Any:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        out: dict = {}
        for knode, vnode in node.value:
            key = loader.construct_object(knode, deep=True)
            if key in out:
                raise SpecError(loader.name, knode.start_mark.line + 1, ".".join(map(str, path + (key,))),
                                "duplicate key")
            lines[path + (key,)] = knode.start_mark.line + 1
            out[key] = _construct(vnode, path + (key,), lines, loader)
            lines[path + (key,)] = knode.start_mark.line + 1
        return out
    if isinstance(node, yaml.SequenceNode):
        return [_construct(v, path + (i,), lines, loader) for i, v in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def load_located(path: Path | str) -> LocatedDoc:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SpecError(path, None, "", "file not found") from None
    loader = yaml.SafeLoader(text)
    loader.name = str(path)
    try:
        node = loader.get_single_node()
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        raise SpecError(path, mark.line + 1 if mark else None, "", f"invalid YAML: {e.problem or e}") from None
    finally:
        loader.dispose()
    lines: dict[tuple, int] = {}
    data = {} if node is None else _construct(node, (), lines, loader)
    return LocatedDoc(path, data, lines)


def validate(doc: LocatedDoc, model: type[BaseModel], **context: Any) -> Any:
    """Validate ``doc.data`` against ``model``; the first error becomes a SpecError."""
    if not isinstance(doc.data, dict):
        raise SpecError(doc.path, 1, "", f"expected a mapping at the top, got {type(doc.data).__name__}")
    try:
        return model.model_validate(doc.data, context={"path": doc.path, **context})
    except ValidationError as e:
        err = e.errors()[0]
        loc = tuple(x for x in err["loc"] if not (isinstance(x, str) and x.startswith("function-")))
        key = ".".join(str(x) for x in loc)
        msg = err["msg"]
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        more = f" (and {e.error_count() - 1} more error(s))" if e.error_count() > 1 else ""
        raise SpecError(doc.path, doc.line_of(loc), key, msg + more) from None
