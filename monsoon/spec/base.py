"""What every spec shares: the frozen pydantic base, per-profile values, and finding a spec file by name.

Every spec (stack, experiment, fault profile) is a frozen pydantic model that forbids unknown keys; an error
names the file, the line and the dotted key (:mod:`monsoon.spec.yamlio`)."""
from __future__ import annotations

from pathlib import Path
from typing import Any
from pydantic import BaseModel, ConfigDict
from pydantic_core import PydanticCustomError

from monsoon import settings
from monsoon.settings import PROFILES
from monsoon.spec.yamlio import LocatedDoc, SpecError


class _Frozen(BaseModel):
    # NaN and infinity are no number a spec means (the YAML loader refuses .nan and .inf already; this catches
    # "nan" as text and specs built in code)
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


def label_selector(labels: dict[str, str]) -> str:
    """Labels as a Kubernetes label selector (and as ``helm install --labels`` takes them): ``k=v,...``, sorted."""
    return ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


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


def _resolve(kind: str, name_or_path: str | Path, folder: Path | None = None) -> Path:
    """A spec file: a path as given, else ``<folder>/<name>.yaml`` (``folder`` given), else the first
    ``<dir>/<name>.yaml`` of the settings' search path (the user's project first, then monsoon's own); a missing
    name is a SpecError listing the folders searched and the names there are."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        return p
    folders = [folder] if folder is not None else settings.current().spec_dirs(kind)
    for d in folders:
        cand = d / f"{name_or_path}.yaml"
        if cand.is_file():
            return cand
    avail = sorted({x.stem for d in folders for x in d.glob("*.yaml")})
    searched = "" if len(folders) == 1 else f"; searched {', '.join(str(d) for d in folders)}"
    raise SpecError(folders[0] / f"{name_or_path}.yaml", None, "",
                    f"no {kind} named {name_or_path!r} (available: {', '.join(avail) or 'none'}{searched})")


FOLDERS = {kind: settings.ROOT / sub for kind, sub in settings.FOLDERS.items()}
"""The folders of the specs monsoon ships (``monsoon validate`` with no argument checks every file in them)."""


def _fail(doc: LocatedDoc, path: tuple, msg: str) -> SpecError:
    return SpecError(doc.path, doc.line_of(path), ".".join(map(str, path)), msg)
