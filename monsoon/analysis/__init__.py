"""What ``monsoon analyze`` does, for every caller: read a saved run, account for its messages, judge its
checks, write its results (``result.json`` per experiment; ``summary.json``, ``checklist.md``, ``report.html``
per run) and record them in the run history.

The CLI (``monsoon analyze``, ``monsoon export``), the pytest session (:func:`write_results`) and
``monsoon.selftest.analyze_bench`` all come here; like the checks and the report, nothing here starts or
touches a live part."""
from monsoon.analysis.offline import analyze, export_csv, salvaged, write_result, write_results

__all__ = ["analyze", "export_csv", "salvaged", "write_result", "write_results"]
