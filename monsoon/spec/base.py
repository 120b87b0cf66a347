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
