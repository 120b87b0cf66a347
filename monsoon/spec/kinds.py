"""What kind of spec file a YAML file is (stack, experiment, fault profile), read from its content."""
from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel

from monsoon.settings import FOLDERS
from monsoon.spec.experiment import ExperimentSpec
from monsoon.spec.fault import FaultSpec
from monsoon.spec.stack import StackSpec
from monsoon.spec.yamlio import LocatedDoc, SpecError

#: The top-level key that tells each kind of spec file from the others.
MARKERS = {"services": "stack", "load": "experiment", "kind": "fault profile"}


MODELS: dict[str, type[BaseModel]] = {"stack": StackSpec, "experiment": ExperimentSpec, "fault profile": FaultSpec}
# each kind's top-level keys besides its marker and the ones every spec has: read from the models themselves
TOP_KEYS = {kind: set(model.model_fields) - set(MARKERS) - {"name", "description", "source"}
            for kind, model in MODELS.items()}


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
        folder = Path(doc.path).resolve().parent.name
        where = next((k for k, sub in FOLDERS.items() if sub == folder), None)
        hint = ""
        if where is not None:
            marker = next(m for m, k in MARKERS.items() if k == where)
            hint = f"; it is in {folder}/: is {marker}: missing?"
        raise SpecError(doc.path, 1, "<top>", f"cannot tell what this file is: {how}, and it has none of them{hint}")
    kinds = " and ".join(f"{m}: ({'an' if MARKERS[m][0] in 'aeiou' else 'a'} {MARKERS[m]})" for m in found)
    raise SpecError(doc.path, doc.line_of((found[1],)), found[1],
                    f"cannot tell what this file is: it has {kinds}; a spec file is one of them")
