"""On real Kafka, Postgres and the reference platform (``kafka`` stack), quick profile: ``monsoon sweep
size-sweep-story`` finds the platform's capacity at 100 B and at 10 KB and measures the stack's Kafka alone
at both; as in Spring XD's message-size benchmark, msg/s falls and MB/s rises with the size, on both."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
REPO = Path(__file__).resolve().parents[2]


def test_size_sweep_on_kafka(tmp_path):
    runs = tmp_path / "runs"
    p = subprocess.run([sys.executable, "-m", "monsoon.cli", "sweep", "size-sweep-story", "--stack", "kafka",
                        "--runs-dir", str(runs)], cwd=REPO, capture_output=True, text=True, timeout=400)
    print(p.stdout[-8000:], p.stderr[-3000:])
    (run_dir,) = [d for d in runs.glob("*/kafka--size-sweep-story") if d.parent.name != "latest"]
    rec = json.loads((run_dir / "sweep.json").read_text())
    assert not rec.get("error"), rec.get("error")
    assert [e["size"] for e in rec["sizes"]] == [100, 10000]
    for e in rec["sizes"]:
        assert e["capacity_msg_s"], e["result"]
        assert e["steps"] and all(s["ok"] for s in e["steps"][:-1])
        assert e["transport"]["consumed"] == e["transport"]["produced"] > 0, e["transport"]
    assert rec["trends"] == {"msg_s": "falls", "mb_s": "rises", "transport_msg_s": "falls",
                             "transport_mb_s": "rises"}, rec["rows"]
    assert p.returncode == 0
    # the report: the table in the checklist and the page, the plot, the GC verdict from the JVM's own counter
    md = (run_dir / "checklist.md").read_text()
    assert "| 100 B |" in md and "| 10 KB |" in md and "platform: msg/s **falls** and MB/s **rises**" in md
    assert "sweep.png" in (run_dir / "report.html").read_text() and (run_dir / "sweep.png").stat().st_size > 1000
    (gc,) = [v for v in rec["checks"] if v["name"] == "gc_time_below"]
    assert gc["verdict"] in ("pass", "fail") and gc["figures"]["worst_gc_fraction"] > 0, gc
