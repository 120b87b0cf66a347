"""YAML loading that remembers where every key came from, and refuses hostile input in one line.

Specs are validated by pydantic; when validation fails we want the error to
name the file, the line and the dotted key, not just the key.  PyYAML's
composer gives nodes with positions, so we construct plain Python data from
the node tree ourselves and keep a ``{key path: line}`` map beside it.

A spec file is small, hand-written data: plain values, lists and mappings. Whatever is not is one SpecError
naming the file and the line, in bounded time and memory: a file past :data:`MAX_BYTES` is not read further,
nesting past :data:`MAX_DEPTH` and more than :data:`MAX_VALUES` values (an alias counted each time it is
expanded: a "billion laughs" file stops at the limit) are refused where they happen, and so are tags (``!!python/...``,
``!!set``, ``!local``: anything but the plain types), NaN and infinity, and numbers Python will not convert.
"""
from __future__ import annotations

import codecs
import math
import os
from collections.abc import Hashable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

MAX_BYTES = 256 << 10
"""A spec file's size limit (256 KiB; monsoon's largest is 10 KB): a larger file is refused, never read whole.
Within it the pure-Python parser takes at most about 0.2 s (a file of blank lines), past it seconds per MiB."""
MAX_DEPTH = 64
"""Lists and mappings nested deeper than this (through aliases too) are refused (monsoon's own: 9 at most)."""
MAX_VALUES = 20_000
"""Values (scalars, lists, mappings) a spec file may hold, an alias counted each time it is expanded (monsoon's
own: 500 at most)."""

_CORE = "tag:yaml.org,2002:"
#: The tags a spec file's values may have: the plain types, as YAML resolves them without a tag.
PLAIN_TAGS = frozenset(_CORE + t for t in ("str", "int", "float", "bool", "null", "timestamp", "seq", "map"))


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


def _dotted(path: tuple) -> str:
    return ".".join(map(str, path))


def _short(text: str, n: int = 40) -> str:
    return text if len(text) <= n else text[:n] + "..."


def _shown_tag(tag: str) -> str:
    return "!!" + tag[len(_CORE):] if tag.startswith(_CORE) else tag


class _Alias(yaml.Node):
    """Where an alias (``*name``) stands: PyYAML's composer hands back the anchored node itself, whose marks are
    the anchor's; this keeps the alias's own line, to name the line that expands it."""
    id = "alias"

    def __init__(self, target: yaml.Node, event: yaml.AliasEvent):
        super().__init__(target.tag, target, None, None)
        self.start_mark, self.end_mark = event.start_mark, event.end_mark   # the pure-Python parser's marks
        self.anchor = event.anchor


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, composing at most :data:`MAX_DEPTH` levels and :data:`MAX_VALUES` nodes, aliases
    kept as :class:`_Alias` (the SpecErrors name the line of the node that passes a limit)."""

    def __init__(self, text: str, path: Path):
        super().__init__(text)
        self.name = str(path)
        self.depth = self.composed = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            target = super().compose_node(parent, index)
            assert target is not None     # PyYAML's composer: an alias's anchored node (or a ComposerError)
            return _Alias(target, event)
        line = event.start_mark.line + 1
        self.composed += 1
        if self.composed > MAX_VALUES:
            raise SpecError(self.name, line, "", f"more than {MAX_VALUES:,} values: a spec file is small, "
                            "hand-written data (is this a data file?)")
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise SpecError(self.name, line, "", f"lists and mappings nested more than {MAX_DEPTH} deep")
        try:
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class _Builder:
    """Plain Python data from the node tree, with the line of every key path. An alias is expanded each time
    it is used, against one budget of :data:`MAX_VALUES` values and :data:`MAX_DEPTH` levels (a problem met
    inside an expansion is named at the line of the outermost alias being expanded)."""

    def __init__(self, loader: _Loader, path: Path):
        self.loader, self.path = loader, path
        self.lines: dict[tuple, int] = {}
        self.values = 0
        self.open: set[int] = set()           # the lists and mappings being built (an alias to one is a loop)
        self.alias_key: tuple = ()            # where the outermost alias being expanded stands

    def fail(self, line: int, key: tuple, message: str) -> SpecError:
        return SpecError(self.path, line, _dotted(key), message)

    def build(self, node: yaml.Node, key: tuple = (), depth: int = 0, alias: _Alias | None = None) -> Any:
        at = alias.start_mark.line + 1 if alias is not None else None   # inside an expansion: the alias's line
        line = at or node.start_mark.line + 1
        if isinstance(node, _Alias):
            if id(node.value) in self.open:
                raise self.fail(line, key, f"alias *{node.anchor} refers to the list or mapping that holds it "
                                "(a loop)")
            if alias is None:
                self.alias_key = key
            return self.build(node.value, key, depth, alias or node)
        self.lines[key] = line
        self.values += 1
        if self.values > MAX_VALUES:   # inside an expansion: named at the outermost alias, where it is used
            why = f" once alias *{alias.anchor} is expanded (nested aliases multiply)" if alias is not None else ""
            raise self.fail(line, self.alias_key if alias is not None else key,
                            f"more than {MAX_VALUES:,} values{why}: a spec file is small, hand-written data")
        if depth >= MAX_DEPTH:   # the root is depth 0
            raise self.fail(line, self.alias_key if alias is not None else key,
                            f"lists and mappings nested more than {MAX_DEPTH} deep (through aliases)")
        if node.tag == _CORE + "merge" and isinstance(node, yaml.ScalarNode):   # a plain << that is no key: text
            return node.value
        if node.tag not in PLAIN_TAGS:
            raise self.fail(line, key, f"tag {_shown_tag(node.tag)} is not allowed: a spec file holds plain "
                            "values, lists and mappings (drop the tag; quote the value if it is text)")
        if isinstance(node, yaml.ScalarNode):
            return self.scalar(node, key, line)
        self.open.add(id(node))
        try:
            if isinstance(node, yaml.SequenceNode):
                return [self.build(v, key + (i,), depth + 1, alias) for i, v in enumerate(node.value)]
            out: dict = {}
            for knode, vnode in node.value:
                kline = at or knode.start_mark.line + 1
                target = knode.value if isinstance(knode, _Alias) else knode
                if not isinstance(target, yaml.ScalarNode):   # a list or a mapping as a key
                    raise self.fail(kline, key, "a key must be a plain value (a name or a number), not a list or "
                                    "a mapping")
                if target.tag not in PLAIN_TAGS:
                    merge = target.tag == _CORE + "merge"
                    raise self.fail(kline, key, "merge keys (<<) are not supported: write the keys out" if merge
                                    else f"tag {_shown_tag(target.tag)} is not allowed on a key: a key is a name "
                                    "or a number")
                k = self.scalar(target, key, kline)
                if not isinstance(k, Hashable):
                    raise self.fail(kline, key, "a key must be a plain value (a name or a number)")
                if k in out:
                    raise self.fail(kline, key + (k,), "duplicate key")
                self.lines[key + (k,)] = kline
                out[k] = self.build(vnode, key + (k,), depth + 1, alias)
                self.lines[key + (k,)] = kline
            return out
        finally:
            self.open.discard(id(node))

    def scalar(self, node: yaml.ScalarNode, key: tuple, line: int) -> Any:
        try:
            value = self.loader.construct_object(node)
        except yaml.YAMLError:
            raise
        except (ValueError, OverflowError) as e:   # an int past Python's 4300 digits, a timestamp with month 13
            why = (f"a number of {len(node.value):,} characters, more than any setting holds"
                   if node.tag == _CORE + "int" else " ".join(str(e).split()))
            raise self.fail(line, key, f"cannot read {_short(node.value)!r}: {why}") from None
        if isinstance(value, float) and not math.isfinite(value):
            what = "not a number" if math.isnan(value) else "infinite"
            raise self.fail(line, key, f"{_short(node.value)} is {what}: a spec file's numbers are finite numbers "
                            "(quote it if it is text)")
        return value


_BOMS = ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
         (codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def _size(n: int) -> str:
    return f"{n / (1 << 20):.1f} MiB" if n >= 1 << 20 else f"{n / 1024:.0f} KiB"


def _wide(raw: bytes) -> bool:
    """ASCII text as UTF-16 (or UTF-32) without a byte-order mark: a NUL beside each of its first characters."""
    def ascii_(b: int) -> bool:
        return 0x20 <= b < 0x7f or b in (0x09, 0x0a, 0x0d)
    pairs = [raw[i:i + 2] for i in (0, 2)]
    return len(raw) >= 4 and any(all(p[side] == 0 and ascii_(p[1 - side]) for p in pairs) for side in (0, 1))


def read_text(path: Path) -> str:
    """A spec file's text: UTF-8 (a byte-order mark, UTF-16 or UTF-32 with one, as YAML allows, is fine too).

    Anything else is one SpecError naming the file, the line and the byte offset of the first bad byte;
    a file that cannot be read at all (missing, a directory, no permission) is one too, and so is one past
    :data:`MAX_BYTES` (never read whole)."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_BYTES + 1)
            if len(raw) > MAX_BYTES:   # a pipe or a device has no size to tell: "more than"
                size = os.fstat(fh.fileno()).st_size
                said = _size(size) if size > MAX_BYTES else f"more than {_size(MAX_BYTES)}"
                raise SpecError(path, 1, "", f"{said}: a spec file is at most {_size(MAX_BYTES)} (this is not a "
                                "spec file?); not read")
    except FileNotFoundError:
        raise SpecError(path, None, "", "file not found") from None
    except IsADirectoryError:
        raise SpecError(path, None, "", "is a directory, not a YAML file") from None
    except OSError as e:
        raise SpecError(path, None, "", f"cannot read: {e.strerror or e}") from None
    encoding = next((enc for bom, enc in _BOMS if raw.startswith(bom)), "utf-8")
    # ASCII text in UTF-16 or UTF-32 has a NUL beside every character: YAML wants a byte-order mark with them
    if encoding == "utf-8" and _wide(raw):
        raise SpecError(path, 1, "", f"not UTF-8 text: a NUL byte at byte offset {raw.index(0)} (UTF-16 or UTF-32 "
                        "without a byte-order mark? save the file as UTF-8)")
    try:
        text = raw.decode(encoding)
    except UnicodeDecodeError as e:
        line = raw[:e.start].count(b"\n") + 1
        bad = raw[e.start:e.start + 1]
        what = f"byte 0x{bad[0]:02x}" if bad else "a truncated character"
        raise SpecError(path, line, "", f"not {encoding.upper().replace('-SIG', '')} text: {what} at byte offset "
                        f"{e.start} cannot be decoded (save the file as UTF-8)") from None
    nul = raw.find(b"\0") if encoding == "utf-8" else -1
    if nul >= 0:   # UTF-8 that no text file holds
        raise SpecError(path, raw[:nul].count(b"\n") + 1, "", f"not UTF-8 text: a NUL byte at byte offset {nul} "
                        "(not a text file? save the file as UTF-8)")
    return text


def _line_of_char(text: str, index: int) -> int:
    return text.count("\n", 0, max(0, index)) + 1


def load_located(path: Path | str) -> LocatedDoc:
    """Parse one YAML file, remembering the line of every key. Every problem (unreadable, too large, not
    UTF-8, not YAML, more than one document, nested too deep, too many values or aliases expanding to too many,
    a tag, NaN or infinity, a key that is a list) is a SpecError naming the file and, where there is one, the
    line."""
    path = Path(path)
    text = read_text(path)
    loader = None
    try:
        loader = _Loader(text, path)   # checks every character already
        node = loader.get_single_node()
        if node is None:
            return LocatedDoc(path, {}, {})
        builder = _Builder(loader, path)
        data = builder.build(node)
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
    except RecursionError:   # the limits above keep well inside Python's; never a traceback all the same
        raise SpecError(path, None, "", "invalid YAML: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()
    return LocatedDoc(path, data, builder.lines)


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
