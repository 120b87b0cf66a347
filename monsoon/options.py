"""Every ``--monsoon-*`` pytest option, spelled once.

The plugin adds and reads them (:mod:`monsoon.plugin`), the ``monsoon`` command builds pytest's arguments with
them (:mod:`monsoon.cli`), and every message, help text and ini key that names one takes it from here
(``tests/unit/test_option_names.py`` fails on a module that spells one itself). Imports nothing: any layer may
use it, the specs included.
"""
from __future__ import annotations

PROFILE = "--monsoon-profile"            # durations profile of every experiment
RUNS_DIR = "--monsoon-runs-dir"          # where run directories go
SPECS = "--monsoon-specs"                # folders to look specs up in first (repeatable)
RUN_ID = "--monsoon-run-id"              # this run id instead of a timestamped one
DRY_RUN = "--monsoon-dry-run"            # validate and say what would run; start nothing
FORCE = "--monsoon-force"                # past monsoon's sanity ceilings; compare across host classes
COMPARE = "--monsoon-compare"            # compare each result with a baseline from the history
COMPARE_FAIL = "--monsoon-compare-fail"  # fail on these regressions (with COMPARE)
NO_HISTORY = "--monsoon-no-history"      # do not record the session's results in the history

OPTIONS = (PROFILE, RUNS_DIR, SPECS, RUN_ID, DRY_RUN, FORCE, COMPARE, COMPARE_FAIL, NO_HISTORY)
