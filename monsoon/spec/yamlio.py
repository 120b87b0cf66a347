"""YAML loading that remembers where every key came from.

Specs are validated by pydantic; when validation fails we want the error to
name the file, the line and the dotted key, not just the key.  PyYAML's
composer gives nodes with positions, so we construct plain Python data from
the node tree ourselves and keep a ``{key path: line}`` map beside it.
"""
from __future__ import annotations

import codecs
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError


class SpecError(ValueError):
    """An invalid spec file: the message names the file, the line and the key."""

    def __init__(self, path: Path | str, line: int | None, key: str, message: str):
        self.path, self.line, self.key, self.message = str(path), line, key, message
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
            if not isinstance(key, Hashable):   # a list or a mapping as a key
                raise SpecError(loader.name, knode.start_mark.line + 1, ".".join(map(str, path)),
                                "a key must be a plain value (a name or a number), not a list or a mapping")
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


_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
         (codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def read_text(path: Path) -> str:
    """A spec file's text: UTF-8 (a byte-order mark, UTF-16 or UTF-32 with one, as YAML allows, is fine too).

    Anything else is one SpecError naming the file, the line and the byte offset of the first bad byte;
    a file that cannot be read at all (missing, a directory, no permission) is one too."""
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise SpecError(path, None, "", "file not found") from None
    except IsADirectoryError:
        raise SpecError(path, None, "", "is a directory, not a YAML file") from None
    except OSError as e:
        raise SpecError(path, None, "", f"cannot read: {e.strerror or e}") from None
    encoding = next((enc for bom, enc in _BOMS if raw.startswith(bom)), "utf-8")
    try:
        return raw.decode(encoding)
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        bad = raw[e.start:e.start + 1]
        what = f"byte 0x{bad[0]:02x}" if bad else "a truncated character"
        raise SpecError(path, line, "", f"not {encoding.upper().replace('-SIG', '')} text: {what} at byte offset "
                        f"{e.start} cannot be decoded (save the file as UTF-8)") from None


def _line_of_char(text: str, index: int) -> int:
    return text.count("\n", 0, max(0, index)) + 1


def load_located(path: Path | str) -> LocatedDoc:
    """Parse one YAML file, remembering the line of every key. Every problem (unreadable, not UTF-8, not
    YAML, more than one document, a tag or key PyYAML's safe loader refuses) is a SpecError naming the file
    and, where there is one, the line."""
    path = Path(path)
    text = read_text(path)
    lines: dict[tuple, int] = {}
    loader = None
    try:
        loader = yaml.SafeLoader(text)   # checks every character already
        loader.name = str(path)
        node = loader.get_single_node()
        data = {} if node is None else _construct(node, (), lines, loader)
    except yaml.MarkedYAMLError as e:
        mark = e.problem_mark or e.context_mark
        problem = " ".join(", ".join(str(x) for x in (e.context, e.problem) if x).split()) or " ".join(str(e).split())
        opened = e.context_mark if "flow" in str(e.context or "") else None
        if opened is not None and mark is not None and opened.line != mark.line:   # an unclosed [ or {: its line
            bracket = text.splitlines()[opened.line][opened.column:opened.column + 1] if opened.line < len(
                text.splitlines()) else ""
            raise SpecError(path, opened.line + 1, "", f"invalid YAML: {bracket or 'a bracket'} opened here is not "
                            f"closed ({problem} on line {mark.line + 1})") from None
        raise SpecError(path, mark.line + 1 if mark else None, "", f"invalid YAML: {problem}") from None
    except yaml.reader.ReaderError as e:   # a character YAML does not allow (control characters, ...)
        char = f"#x{e.character:04x}" if isinstance(e.character, int) else repr(e.character)
        raise SpecError(path, _line_of_char(text, e.position), "",
                        f"invalid YAML: character {char} is not allowed (at character {e.position})") from None
    except yaml.YAMLError as e:
        raise SpecError(path, None, "", "invalid YAML: " + " ".join(str(e).split())) from None
    except RecursionError:
        raise SpecError(path, None, "", "invalid YAML: nested too deeply (an alias that contains itself?)") from None
    finally:
        if loader is not None:
            loader.dispose()
    return LocatedDoc(path, data, lines)


def validate(doc: LocatedDoc, model: type[BaseModel], **context: Any) -> Any:
    """Validate ``doc.data`` against ``model``; the first error becomes a SpecError."""
    if not isinstance(doc.data, dict):
        raise SpecError(doc.path, 1, "<top>", f"expected a mapping at the top, got {type(doc.data).__name__}")
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
