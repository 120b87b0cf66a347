"""The run history: one row per run x stack x experiment x check in a database, and what is read from it.

``store`` (SQLite under the runs directory, or the Postgres of ``MONSOON_HISTORY_URL``), ``record`` (rows from a
run's results), ``views`` (verdict strips, figure trends, flaky checks, the first failing run), ``html`` (the
history page), ``compare`` (regressions against a baseline run), ``signoff`` (the expiring sign-off),
``schedule`` (scheduled runs: systemd, cron, a Kubernetes CronJob, and the local concurrency lock).

Like the report, the history reads results and run directories, never a live part.
"""
