"""Checks: pure functions of a saved run directory -> Verdict; ``registry`` is the only importer of them all."""
