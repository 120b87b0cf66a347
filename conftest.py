# Root conftest: marks the repository root for pytest. The monsoon plugin itself is
# registered through the `pytest11` entry point in pyproject.toml (installed by
# `make venv`), so scenarios in pytest/ and self-tests in tests/ both get it.
collect_ignore = ["stacks", "experiments", "fault-profiles", "runs", ".cache"]

# pytester drives monsoon's plugin in its own tests (tests/unit/test_plugin.py, tests/integration/).
pytest_plugins = ["pytester"]
