"""monsoon's own pytest hooks (``pytest_monsoon_*``), declared here as pytest's own plugins do.

Implement them in a ``conftest.py`` or a plugin::

    def pytest_monsoon_add_checks(register):
        register("stored_within", my_check)   # my_check(run: RunData, ...) -> Verdict

    def pytest_monsoon_result(result, session):
        print(result.stack, result.experiment, result.verdict)
"""
from __future__ import annotations

import pluggy

hookspec = pluggy.HookspecMarker("pytest")


@hookspec
def pytest_monsoon_add_checks(register) -> None:
    """Add checks of your own, once per session, when a test first asks for the ``monsoon`` fixture.

    ``register(name, fn)``: ``fn(run: monsoon.checks.base.RunData, **params) -> monsoon.checks.base.Verdict``,
    a pure function of the saved run directory like every built-in check. Experiments then name it under
    ``checks:``; its parameters are validated from ``fn``'s signature. A name that is already taken is an
    error. The check lives in the session's registry (``session.checks``), not in the process: two sessions
    do not see each other's. (``monsoon analyze`` outside pytest knows only the built-in checks.)"""


@hookspec
def pytest_monsoon_result(result, session) -> None:
    """Called with each experiment's :class:`~monsoon.report.result.ExperimentResult` as soon as its checks
    are judged, before the session's report (summary.json, checklist) is written: a place to export or
    post the numbers. ``session`` is the :class:`~monsoon.session.MonsoonSession`."""
