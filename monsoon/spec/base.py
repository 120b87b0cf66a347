"""What every spec shares: the frozen pydantic base, per-profile values, and finding a spec file by name.

Every spec (stack, experiment, fault profile) is a frozen pydantic model that forbids unknown keys; an error
names the file, the line and the dotted key (:mod:`monsoon.spec.yamlio`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any
from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticCustomError

from monsoon.paths import REPO
from monsoon.spec.yamlio import LocatedDoc, SpecError





PROFILES = ("quick", "nightly", "full")


class _Frozen(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _invalid(message: str) -> PydanticCustomError:
    """A validation error whose message is shown as is (no "Value error, " prefix; braces are literal)."""
    return PydanticCustomError("value_error", message)


def _per_profile(value: Any, profile: str, key: str) -> Any:
    """``{quick: 30, full: 3600}`` -> the profile's value; anything else as is."""
    if isinstance(value, dict) and value and set(value) <= set(PROFILES) | {"default"}:
        if profile in value:
            return value[profile]
        if "default" in value:
            return value["default"]
        raise SpecError("", None, key, f"no value for profile {profile!r}")
    return value


FOLDERS = {"stack": REPO / "stacks", "experiment": REPO / "experiments", "fault profile": REPO / "fault-profiles"}


def _resolve(kind: str, name_or_path: str | Path, folder: Path | None = None) -> Path:
    """A spec file: a path as given, else ``<folder>/<name>.yaml`` (the kind's folder by default); a missing
    name is a SpecError listing the names there are."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    folder = FOLDERS[kind] if folder is None else folder
    cand = folder / f"{name_or_path}.yaml"
    if not cand.exists():
        avail = sorted(x.stem for x in folder.glob("*.yaml"))
        raise SpecError(cand, None, "", f"no {kind} named {name_or_path!r} (available: {', '.join(avail) or 'none'})")
    return cand


def _fail(doc: LocatedDoc, path: tuple, msg: str) -> SpecError:
    return SpecError(doc.path, doc.line_of(path), ".".join(map(str, path)), msg)


#: The top-level key that tells each kind of spec file from the others.
MARKERS = {"services": "stack", "load": "experiment", "kind": "fault profile"}


# each kind's top-level keys besides its marker (a test keeps them equal to the models' fields)
TOP_KEYS = {"stack": {"ports", "devices", "provisioning", "storage", "observe", "chaos"},
            "experiment": {"marks", "profiles", "checks", "faults", "env"},
            "fault profile": {"target", "backend", "params", "schedule"}}


def kind_of(doc: LocatedDoc) -> str:
    """What a spec file is, read from its content, never from its folder: a stack has ``services:``, an
    experiment ``load:``, a fault profile ``kind:``. A SpecError says so when it cannot tell."""
    how = "a stack has services:, an experiment load:, a fault profile kind:"
    if doc.data in ({}, None):
        raise SpecError(doc.path, 1, "<top>", f"the file is empty: nothing to validate ({how})")
    if not isinstance(doc.data, dict):
        raise SpecError(doc.path, 1, "<top>", f"cannot tell what this file is: it holds a "
                        f"{type(doc.data).__name__}, not a mapping ({how})")
    found = [m for m in MARKERS if m in doc.data]
    if len(found) == 1:
        return MARKERS[found[0]]
    if not found:   # its marker is missing or misspelt: the kind whose other top-level keys it has, if only one
        overlap = {k: len(TOP_KEYS[k] & set(doc.data)) for k in TOP_KEYS}
        best = max(overlap.values())
        if best and list(overlap.values()).count(best) == 1:
            return next(k for k, n in overlap.items() if n == best)
        where = next((k for k, f in FOLDERS.items() if f == Path(doc.path).resolve().parent), None)
        hint = ""
        if where is not None:
            marker = next(m for m, k in MARKERS.items() if k == where)
            hint = f"; it is in {FOLDERS[where].name}/: is {marker}: missing?"
        raise SpecError(doc.path, 1, "<top>", f"cannot tell what this file is: {how}, and it has none of them{hint}")
    kinds = " and ".join(f"{m}: ({'an' if MARKERS[m][0] in 'aeiou' else 'a'} {MARKERS[m]})" for m in found)
    raise SpecError(doc.path, doc.line_of((found[1],)), found[1],
                    f"cannot tell what this file is: it has {kinds}; a spec file is one of them")
