"""Runs: validation, the runner, the drain, the teardown shield, calibration."""
