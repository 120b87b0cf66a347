"""A monsoon session: one run id, one run directory, many experiment results."""
from __future__ import annotations

import os
import secrets
import threading
import time
from pathlib import Path
from typing import Callable, TextIO

from . import report
from .runner import ExperimentResult, run_experiment
from .specs import REPO, load_experiment, load_stack


def new_run_id() -> str:
    return time.strftime("%Y%m%d-%H%M%S") + "-" + secrets.token_hex(2)


class MonsoonSession:
    def __init__(self, *, profile: str = "quick", runs_dir: Path | None = None, run_id: str | None = None,
                 progress: Callable[[str], None] = print, dry_run: bool = False, live: TextIO | None = None):
        self.profile = profile
        self.runs_dir = Path(runs_dir or os.environ.get("MONSOON_RUNS_DIR") or REPO / "runs")
        self.run_id = run_id or new_run_id()
        self.progress = progress
        self.results: list[ExperimentResult] = []
        self.stop = threading.Event()
        self.dry_run = dry_run
        self.live = live      # a terminal for the live load panel (None: plain progress lines)

    @property
    def run_dir(self) -> Path:
        return self.runs_dir / self.run_id

    def run(self, stack: str, experiment: str) -> ExperimentResult:
        """Validate both specs, then run the experiment against a fresh stack."""
        stack_spec = load_stack(stack)
        exp = load_experiment(experiment)
        exp.durations(self.profile)  # fail before starting anything
        if self.dry_run:
            return run_experiment(stack_spec, exp, self.profile, self.run_dir / f"{stack_spec.name}--{exp.name}",
                                  run_id=self.run_id, progress=self.progress, dry_run=True)
        out = self.run_dir / f"{stack_spec.name}--{exp.name}"
        n = 2
        while out.exists():
            out = self.run_dir / f"{stack_spec.name}--{exp.name}-{n}"
            n += 1
        self.run_dir.mkdir(parents=True, exist_ok=True)
        report.point_latest(self.run_dir)
        try:
            result = run_experiment(stack_spec, exp, self.profile, out, run_id=self.run_id,
                                    progress=self.progress, stop=self.stop, live=self.live)
            self.results.append(result)
            return result
        finally:  # an interrupted run still leaves a report of what finished
            self.write_report()

    def write_report(self) -> tuple[dict, str] | None:
        if not self.run_dir.exists():
            return None
        return report.write(self.run_dir, self.run_id, self.profile, [r.to_dict() for r in self.results])
