"""Collectors: each samples one signal of a live stack into the timeline at 1 Hz.

A collector's ``sample()`` returns a dict of values or raises; the
``Sampler`` runs each collector in its own thread (so a slow one can't delay
the others), writes a ``sample`` event per call (``error`` on failure) and
keeps the latest values for the runner (drain detection, progress).
"""
from __future__ import annotations

import fnmatch
import functools
import logging
import os
import time
from pathlib import Path
from typing import Any, Callable

import requests
from prometheus_client.parser import text_string_to_metric_families

from confluent_kafka import Consumer
from confluent_kafka import TopicPartition
from confluent_kafka.admin import AdminClient
import psycopg
import json
import subprocess

from monsoon.observe.parsers import parse_docker_inspect, parse_pods
from monsoon.stack.cgroupfs import CgroupDir, CgroupFS, CgroupUnavailable, limit_bytes
from monsoon.stack.dockerd import docker_host
from monsoon.stack.kubeapi import cluster_configured, kube_client
from monsoon.spec.stack import is_pattern, metric_terms


log = logging.getLogger(__name__)


class Collector:
    name = "collector"

    def sample(self) -> dict[str, Any] | None:
        """The values of this second (None: nothing sampled this second)."""
        raise NotImplementedError

    def drain_begins(self) -> None:
        """The load is over: from now on report exact values (the drain judges the stack settled on them)."""

    def close(self) -> None:
        pass


class ProcessCollector(Collector):
    """RSS, thread count and CPU (``cpu_pct``: % of one core since the previous sample, utime + stime) of one
    stack service's current process (follows restarts)."""

    name = "process"

    def __init__(self, pid_of: Callable[[], int | None]):
        self.pid_of = pid_of
        self._cpu_prev: tuple[int, float, float] | None = None   # (pid, cpu seconds, monotonic time)

    def sample(self) -> dict[str, Any]:
        pid = self.pid_of()
        if pid is None:
            return {"up": 0}
        out: dict[str, Any] = {"up": 1, "pid": pid}
        try:
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    out["rss_mb"] = round(int(line.split()[1]) / 1024, 1)
                elif line.startswith("Threads:"):
                    out["threads"] = int(line.split()[1])
        except (FileNotFoundError, ProcessLookupError):
            return {"up": 0}
        cpu = _cpu_seconds(pid)
        if cpu is not None:
            now, prev = time.monotonic(), self._cpu_prev
            if prev is not None and prev[0] == pid and now > prev[2]:
                out["cpu_pct"] = round(100.0 * max(0.0, cpu - prev[1]) / (now - prev[2]), 1)
            self._cpu_prev = (pid, cpu, now)
        return out


class ServicesCollector(Collector):
    """The RSS of every running service of a stack of local processes, each summed over its process group (a
    service leads its own: a launcher's JVM, postgres's backends), from one pass over /proc every ``every``
    samples: ``rss_mb`` and ``procs`` by service. ``observe.service`` alone gets the 1 Hz detail
    (:class:`ProcessCollector`); this one answers "what does each component cost" at rest and under load."""

    name = "services"

    def __init__(self, pids: Callable[[], dict[str, int | None]], every: int = 5, proc: Path = Path("/proc")):
        self.pids, self.every, self.proc = pids, max(1, int(every)), Path(proc)
        self._tick = 0

    def sample(self) -> dict[str, Any] | None:
        tick, self._tick = self._tick, self._tick + 1
        if tick % self.every:
            return None
        leaders = {pid: svc for svc, pid in self.pids().items() if pid is not None}
        rss = dict.fromkeys(leaders.values(), 0)
        procs = dict.fromkeys(leaders.values(), 0)
        for d in self.proc.iterdir() if leaders else ():
            if not d.name.isdigit():
                continue
            try:
                stat = (d / "stat").read_text()
                fields = stat[stat.rindex(")") + 2:].split()   # state ppid pgrp ... (the 22nd: rss in pages)
                svc = leaders.get(int(fields[2]))
                if svc is not None:
                    rss[svc] += int(fields[21]) * _PAGE
                    procs[svc] += 1
            except (OSError, ValueError, IndexError):   # gone since the listing
                continue
        return {"rss_mb": {s: round(b / 1048576, 1) for s, b in rss.items()}, "procs": procs}


_CLK_TCK = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _cpu_seconds(pid: int) -> float | None:
    """utime + stime of a process, in seconds (/proc/<pid>/stat; the command may hold spaces and parentheses)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / _CLK_TCK
    except (OSError, IndexError, ValueError):
        return None


def parse_selector(sel: str) -> tuple[str, dict[str, str]]:
    """``name{a="b",c="d"}`` -> (name, {a: b, c: d})."""
    if "{" not in sel:
        return sel.strip(), {}
    name, rest = sel.split("{", 1)
    labels = {}
    for part in rest.rstrip("}").split(","):
        if part.strip():
            k, v = part.split("=", 1)
            labels[k.strip()] = v.strip().strip('"')
    return name.strip(), labels


def select_metrics(text: str, selectors: dict[str, str]) -> dict[str, float]:
    """Each signal from a Prometheus text exposition: the sum of the samples matching its selector, or, for a
    derived signal (``'put_total - done_total'``, :func:`~monsoon.spec.stack.metric_terms`), the signed sum of
    its series; a signal is left out while any of its series has no sample (missing data, never a zero)."""
    terms = {sig: [(sign, parse_selector(sel)) for sign, sel in metric_terms(expr)] for sig, expr in selectors.items()}
    sums: dict[tuple[str, int], float] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            for sig, parts in terms.items():
                for i, (_, (name, labels)) in enumerate(parts):
                    if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                        sums[(sig, i)] = sums.get((sig, i), 0.0) + float(s.value)
    out: dict[str, float] = {}
    for sig, parts in terms.items():
        if all((sig, i) in sums for i in range(len(parts))):
            out[sig] = sum(sign * sums[(sig, i)] for i, (sign, _) in enumerate(parts))
    return out


class MetricsCollector(Collector):
    """Scrapes a Prometheus endpoint and keeps the configured signals."""

    name = "metrics"

    def __init__(self, url: str, selectors: dict[str, str], timeout: float = 0.8):
        self.url, self.selectors, self.timeout = url, selectors, timeout
        self.session = requests.Session()

    def sample(self) -> dict[str, Any]:
        r = self.session.get(self.url, timeout=self.timeout)
        r.raise_for_status()
        return select_metrics(r.text, self.selectors)

    def close(self) -> None:
        self.session.close()


class KafkaLagCollector(Collector):
    """Consumer-group lag: log-end offset minus committed offset, per partition.

    Reads through a confluent-kafka *Consumer* that carries the group id but never
    subscribes (so it never joins the group): ``committed()`` for the group's offsets,
    ``get_watermark_offsets()`` for the log ends.  Not the AdminClient's offsets: its
    ListConsumerGroupOffsets aborts the whole process when the coordinator's
    connection drops mid-request (librdkafka issue #4605 / PR #5397, unfixed in
    2.16) -- exactly what a broker-restart fault does.

    ``group`` and ``topic`` may be shell-style patterns (``re-Main-consumer-*``, ``tb_rule_engine.main.*``):
    the groups are listed (AdminClient ListGroups, every ``GROUPS_EVERY`` samples) and each matching group
    gets its own never-subscribing Consumer; a partition's lag is that of the slowest matching group that
    has committed on it, or its whole log when none has.  No matching topic: ``topic_missing``, no lag.
    """

    name = "kafka"
    GROUPS_EVERY = 5

    def __init__(self, bootstrap: str, group: str, topic: str | None, timeout: float = 0.9):
        self.bootstrap, self.group, self.topic, self.timeout = bootstrap, group, topic, timeout
        self.consumers: dict[str, Consumer] = {}
        self._admin: AdminClient | None = None
        self._meta: Consumer | None = None
        self._samples = 0
        if not is_pattern(group):
            self._consumer(group)

    def _consumer(self, group: str) -> Consumer:
        if group not in self.consumers:
            self.consumers[group] = Consumer({
                "bootstrap.servers": self.bootstrap, "group.id": group, "enable.auto.commit": False,
                "socket.timeout.ms": 2000, "log_level": 0, "logger": logging.getLogger("monsoon.kafka-lag")})
        return self.consumers[group]

    @property
    def consumer(self) -> Consumer:
        """For metadata and log ends: the group's own Consumer, or (a pattern) one of a group id that matches
        nothing it reads (it never subscribes, so no group is joined or made)."""
        if self._meta is None:
            self._meta = self.consumers[self.group] if not is_pattern(self.group) else Consumer({
                "bootstrap.servers": self.bootstrap, "group.id": "monsoon-lag-metadata", "enable.auto.commit": False,
                "socket.timeout.ms": 2000, "log_level": 0, "logger": logging.getLogger("monsoon.kafka-lag")})
        return self._meta

    def _groups(self) -> list[str]:
        if not is_pattern(self.group):
            return [self.group]
        if self._samples % self.GROUPS_EVERY == 0 or not self.consumers:   # TB makes its groups as it starts
            if self._admin is None:
                conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap, "socket.timeout.ms": 2000,
                                        "log_level": 0, "logger": logging.getLogger("monsoon.kafka-lag")}
                self._admin = AdminClient(conf)
            listed = self._admin.list_consumer_groups(request_timeout=self.timeout).result(timeout=self.timeout + 1)
            for g in listed.valid:
                if fnmatch.fnmatchcase(g.group_id, self.group):
                    self._consumer(g.group_id)
        return sorted(self.consumers)

    def _topics(self, md) -> list[str]:
        names = [t for t in md.topics if not md.topics[t].error]
        if self.topic and is_pattern(self.topic):
            return sorted(t for t in names if fnmatch.fnmatchcase(t, self.topic))
        if self.topic:
            return [self.topic] if self.topic in names else []
        return [t for t in names if not t.startswith("__")]

    def sample(self) -> dict[str, Any]:
        groups = self._groups()
        self._samples += 1
        md = self.consumer.list_topics(topic=self.topic, timeout=self.timeout) \
            if self.topic and not is_pattern(self.topic) else self.consumer.list_topics(timeout=self.timeout)
        tps = [TopicPartition(t, p) for t in self._topics(md) for p in md.topics[t].partitions]
        if not tps:
            return {"topic_missing": 1}   # no lag measured: missing data, never a zero
        committed: dict[tuple[str, int], list[int]] = {}
        for g in groups:
            got = self.consumers[g].committed(tps, timeout=self.timeout)
            bad = [tp for tp in got if tp.error is not None]
            if bad:   # the group's offsets could not be read: no lag, never "everything is lag" nor a zero
                raise RuntimeError(f"committed offsets of group {g!r} unreadable for {len(bad)} partition(s), "
                                   f"e.g. {bad[0].topic}-{bad[0].partition}: {bad[0].error}")
            for tp in got:
                if tp.offset >= 0:
                    committed.setdefault((tp.topic, tp.partition), []).append(tp.offset)
        if not self.topic:   # without a topic: the topics the group(s) have committed on
            tps = [tp for tp in tps if (tp.topic, tp.partition) in committed]
            if not tps:
                return {"group_missing": 1}   # the group(s) committed nothing anywhere: no lag measured
        parts, total = {}, 0
        for tp in tps:
            _, end = self.consumer.get_watermark_offsets(tp, timeout=self.timeout, cached=False)
            if end < 0:       # the log end is unknown (librdkafka's OFFSET_INVALID): missing, not lag 0
                raise RuntimeError(f"no log-end offset for {tp.topic}-{tp.partition}")
            offs = committed.get((tp.topic, tp.partition))
            c = min(offs) if offs else -1     # the slowest group; nothing committed yet: everything is lag
            lag = max(end - c if c >= 0 else end, 0)
            total += lag
            parts[f"{tp.topic}-{tp.partition}"] = {"end": end, "committed": c, "lag": lag}
        out: dict[str, Any] = {"lag": total, "partitions": parts}
        if is_pattern(self.group):
            out["groups"] = len(groups)
        return out

    def close(self) -> None:
        if self._meta is not None and self._meta not in self.consumers.values():
            self._meta.close()
        for c in self.consumers.values():
            c.close()
        self.consumers.clear()


class ProbeFailed(Exception):
    """A query that did not answer in preflight: ``key`` names it in the stack file, ``cause`` is the driver's error."""

    def __init__(self, key: str, cause: Exception):
        super().__init__(str(cause))
        self.key, self.cause = key, cause


class SqlCountCollector(Collector):
    """Stored messages so far, cheaply while the load runs and exactly once the drain begins.

    During the load a sample runs ``running_query`` when the stack has one: a statistics estimate or the
    platform's own counter (one number, ``counted: estimate``), or an incremental count (``counted:
    incremental``) when it holds ``%(since)s``: it returns ``(rows, watermark)`` for the rows past the last
    watermark (NULL at first) and the collector adds them up.  Without one, the exact ``count_query`` runs,
    but rests between runs so that it takes at most :attr:`MAX_SHARE` of the wall time (a full count that
    takes 0.5 s runs every 5 s; a sample skipped is not written).  From :meth:`drain_begins` on, every
    sample is the exact ``count_query`` (``counted: exact``): the drain judges "stored count steady" on it."""

    name = "storage"
    MAX_SHARE = 0.1

    def __init__(self, dsn: str, query: str, running_query: str | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self.dsn, self.query, self.running_query = dsn, query, running_query
        self.incremental = running_query is not None and "%(since)s" in running_query
        self.exact = False
        self.total, self.since = 0, None      # incremental: rows counted so far, the last watermark
        self.rest_until = 0.0                 # no exact count before this (clock), while the load runs
        self.clock = clock
        self.conn = None

    def drain_begins(self) -> None:
        self.exact = True

    def plan(self) -> str | None:
        """How the next sample counts: ``exact``, ``estimate``, ``incremental``, or None (skip: resting)."""
        if self.exact:
            return "exact"
        if self.running_query:
            return "incremental" if self.incremental else "estimate"
        return "exact" if self.clock() >= self.rest_until else None

    def took(self, how: str, started: float) -> None:
        """A count that began at ``started`` (clock) is done: an exact one during the load then rests long
        enough that counting takes at most MAX_SHARE of the time."""
        if how == "exact" and not self.exact:
            self.rest_until = started + (self.clock() - started) / self.MAX_SHARE

    def add(self, row) -> int:
        """An incremental sample's ``(rows, watermark)``: the running total (a NULL watermark keeps the last)."""
        n, mark = row[0], row[1]
        self.total += int(n or 0)
        if mark is not None:
            self.since = mark
        return self.total

    def _conn(self):
        if self.conn is None or self.conn.closed:
            self.conn = psycopg.connect(self.dsn, autocommit=True, connect_timeout=2,
                                        options="-c statement_timeout=2000")
        return self.conn

    def _drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.conn = None

    def sample(self) -> dict[str, Any] | None:
        how = self.plan()
        if how is None:
            return None
        try:
            t = self.clock()
            conn = self._conn()
            if how == "incremental":
                n = self.add(conn.execute(self.running_query, {"since": self.since}).fetchone())
            else:
                n = conn.execute(self.query if how == "exact" else self.running_query).fetchone()[0]
            self.took(how, t)
            return {"stored": int(n or 0), "counted": how}
        except Exception:
            self._drop()
            raise

    def probe(self) -> None:
        """Preflight: both queries answer; a failure is a :class:`ProbeFailed` naming the query's key."""
        for key, q in (("storage.count_query", self.query), ("storage.running_count_query", self.running_query)):
            if not q:
                continue
            try:
                self._conn().execute(q, {"since": None} if "%(since)s" in q else None).fetchone()
            except Exception as e:
                self._drop()
                raise ProbeFailed(key, e) from e

    def close(self) -> None:
        self._drop()


class _Counter:
    """Increase of one kernel counter of one cgroup since monsoon first saw it (a re-created cgroup counts anew)."""

    def __init__(self, value: int, fresh: bool):
        self.base = 0 if fresh else value
        self.last = value
        self.banked = 0

    def update(self, value: int) -> None:
        if value < self.last:                  # the cgroup was removed and created again between two samples
            self.banked += self.last - self.base
            self.base = 0
        self.last = value

    def restart(self, value: int) -> None:
        """The cgroup directory came back after it was gone."""
        self.banked += self.last - self.base
        self.base, self.last = 0, value

    @property
    def increase(self) -> int:
        return self.banked + max(0, self.last - self.base)


def _cgroup_counts(cg) -> tuple[int | None, int | None]:
    """(oom_kill, limit hits) of one memory cgroup, counted in that cgroup only.

    v1: ``memory.oom_control`` oom_kill (``CgroupDir.oom_kills``) and ``memory.failcnt``.
    v2: ``memory.events.local`` (``memory.events`` counts the whole subtree, which would count a child's
    kill twice) ``oom_kill`` and ``max``; ``memory.events`` on kernels without the local file.
    """
    if cg.version == 1:
        try:
            hits = int((cg.path / "memory.failcnt").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            hits = None
        return cg.oom_kills(), hits
    for fname in ("memory.events.local", "memory.events"):
        try:
            kv = dict(line.split(" ", 1) for line in (cg.path / fname).read_text().splitlines() if " " in line)
        except OSError:
            continue
        try:
            return int(kv["oom_kill"]), int(kv.get("max", 0))
        except (KeyError, ValueError):
            return cg.oom_kills(), None
    return None, None


# memory.stat keys, first found wins: v1 (hierarchical totals first), then v2
_ANON_KEYS = ("total_rss", "rss", "anon")
_REFAULT_KEYS = ("total_workingset_refault_file", "workingset_refault_file", "total_workingset_refault",
                 "workingset_refault")


def _memory_stat(cg) -> dict[str, Any]:
    """From ``memory.stat``: ``anon_mb`` (what the kernel cannot reclaim without swap) and ``refaults`` (file
    pages read back after eviction, cumulative: a fast rise at the limit is thrashing). Empty when unreadable."""
    try:
        kv = dict(line.split(" ", 1) for line in (cg.path / "memory.stat").read_text().splitlines() if " " in line)
    except OSError:
        return {}
    out: dict[str, Any] = {}
    anon = next((kv[k] for k in _ANON_KEYS if k in kv), None)
    refault = next((kv[k] for k in _REFAULT_KEYS if k in kv), None)
    try:
        if anon is not None:
            out["anon_mb"] = round(int(anon) / 1048576, 1)
        if refault is not None:
            out["refaults"] = int(refault)
    except ValueError:
        pass
    return out


def _pgrp(pid: int, proc: Path = Path("/proc")) -> int | None:
    try:
        stat = (Path(proc) / str(pid) / "stat").read_text()
        return int(stat[stat.rindex(")") + 2:].split()[2])
    except (OSError, ValueError, IndexError):
        return None


class CgroupOomCollector(Collector):
    """The kernel OOM killer's count in the observed service's memory cgroup(s), v1 and v2.

    Follows the service's *current* cgroup (``/proc/<pid>/cgroup`` every sample, through
    :class:`~monsoon.stack.cgroupfs.CgroupFS`), keeps watching every cgroup it has seen (a killed
    service has no pid to look up), and watches the child ``m_<run-id>__<service>`` that the
    memory-pressure fault creates as soon as it exists (a kill right after the move would otherwise
    be missed).  Counters are written as increases since the collector started: ``oom_kills`` and
    ``limit_hits`` (v1 ``memory.failcnt`` / v2 ``max`` events), plus each cgroup's raw counters,
    usage and limit, and ``shared`` when processes other than the service's process group are in it.
    """

    name = "cgroup"
    MAX_PROCS_CHECKED = 64

    def __init__(self, service: str, pid_of: Callable[[], int | None], run_id: str | None = None, fs=None):
        self.service, self.pid_of = service, pid_of
        self.fs = fs or CgroupFS()
        self.child_name = f"m_{run_id}__{service}" if run_id else None
        self.watched: dict[str, dict] = {}     # path -> {"cg", "oom", "hits", "gone"}
        self.pgid: int | None = None

    def _watch(self, cg, fresh: bool) -> None:
        key = str(cg.path)
        if key in self.watched:
            return
        oom, hits = _cgroup_counts(cg)
        self.watched[key] = {"cg": cg, "oom": _Counter(oom or 0, fresh), "hits": _Counter(hits or 0, fresh),
                             "gone": False}

    def _shared(self, cg) -> int:
        procs = cg.procs()
        if len(procs) > self.MAX_PROCS_CHECKED:
            return 1
        return int(any(_pgrp(p, self.fs.proc) != self.pgid for p in procs)) if self.pgid is not None else int(bool(procs))

    def sample(self) -> dict[str, Any]:
        pid = self.pid_of()
        current = None
        if pid is not None:
            self.pgid = pid                    # stack services lead their own process group
            try:
                current = self.fs.memory_cgroup(pid)
            except (CgroupUnavailable, OSError) as e:
                if not self.watched:
                    return {"service": self.service, "available": 0, "pid": pid, "reason": str(e)[:300]}
        if current is not None:
            self._watch(current, fresh=current.path.name == self.child_name)
        if self.child_name:
            for w in list(self.watched.values()):
                child = CgroupDir(w["cg"].version, w["cg"].path / self.child_name)
                if child.path.is_dir():
                    self._watch(child, fresh=True)   # made by this run: everything it counted is ours
        if not self.watched:
            return {"service": self.service, "available": 0, "pid": pid, "reason": "service not running"}
        groups: dict[str, dict] = {}
        for key, w in self.watched.items():
            cg = w["cg"]
            if not cg.path.is_dir():
                w["gone"] = True
                continue
            oom, hits = _cgroup_counts(cg)
            if w["gone"]:                      # removed and made again (a repeated memory-pressure window)
                w["oom"].restart(oom or 0)
                w["hits"].restart(hits or 0)
                w["gone"] = False
            else:
                w["oom"].update(oom or 0)
                w["hits"].update(hits or 0)
            g: dict[str, Any] = {"version": cg.version, "oom_kill": oom, "limit_hits": hits, "shared": self._shared(cg)}
            try:
                g["usage_mb"] = round(int(cg.usage_file.read_text()) / 1048576, 1)
                lim = limit_bytes(cg.read_limit())
                g["limit_mb"] = None if lim is None else round(lim / 1048576, 1)
            except (OSError, ValueError):
                pass
            g.update(_memory_stat(cg))
            groups[key] = g
        return {"service": self.service, "available": 1, "pid": pid,
                "cgroup": str(current.path) if current is not None else None,
                "oom_kills": sum(w["oom"].increase for w in self.watched.values()),
                "limit_hits": sum(w["hits"].increase for w in self.watched.values()),
                "cgroups": groups}


class KubePodsCollector(Collector):
    """Restarts and OOMKilled terminations of the pods matching ``observe.kubernetes`` (the kubernetes client)."""

    name = "kube"

    def __init__(self, namespace: str, label_selector: str, api=None, timeout: float = 2.0):
        self.namespace, self.selector, self.timeout = namespace, label_selector, timeout
        self.api = api

    def _core(self):
        if self.api is None:
            self.api = kube_client().CoreV1Api()
        return self.api

    def sample(self) -> dict[str, Any]:
        api = self._core()
        pods = api.list_namespaced_pod(self.namespace, label_selector=self.selector, _request_timeout=self.timeout)
        items = [api.api_client.sanitize_for_serialization(p) for p in pods.items]
        return {"namespace": self.namespace, "selector": self.selector, **parse_pods(items)}


class DockerCollector(Collector):
    """``docker inspect`` of the ``observe.docker`` containers: State.OOMKilled, exit code, RestartCount."""

    name = "docker"

    def __init__(self, containers: list[str] | tuple[str, ...], docker: str = "docker", timeout: float = 3.0,
                 services: dict[str, str] | None = None, history: Callable[[], dict[str, dict]] | None = None):
        """``services``: container name -> the stack service it runs (a container stack's samples are keyed by
        service); ``history``: service -> {terminations, restarts} that monsoon's supervisor inspected at each
        exit of a container it then restarted (``docker start`` resets State.OOMKilled)."""
        self.containers, self.docker, self.timeout = list(containers), docker, timeout
        self.services, self.history = services or {}, history
        host = docker_host()
        self.env = {**os.environ, "DOCKER_HOST": host} if host else None

    def sample(self) -> dict[str, Any]:
        p = subprocess.run([self.docker, "inspect", *self.containers], capture_output=True, text=True,
                           timeout=self.timeout, env=self.env)
        try:
            items = json.loads(p.stdout or "[]")
        except ValueError:
            items = None
        if not items and p.returncode != 0:   # no engine, or none of the containers exists
            raise RuntimeError(f"docker inspect exited {p.returncode}: {p.stderr.strip()[:200]}")
        out = parse_docker_inspect(items or [], self.containers)
        return by_service(out, self.services, self.history() if self.history else {}) if self.services else out


def by_service(sample: dict[str, Any], services: dict[str, str], history: dict[str, dict]) -> dict[str, Any]:
    """A ``docker`` sample keyed by service, with the exits the supervisor inspected merged in."""
    containers: dict[str, dict] = {}
    for name, c in sample["containers"].items():
        svc = services.get(name, name)
        h = history.get(svc) or {}
        past = list(h.get("terminations") or [])
        seen = {t.get("finished_at") for t in past}
        c = dict(c, container=name, terminations=past + [t for t in c["terminations"]
                                                         if t.get("finished_at") not in seen])
        c["oom_killed"] = max(c["oom_killed"], sum(1 for t in past if t.get("oom_killed")))
        c["restarts"] = max(c["restarts"], int(h.get("restarts") or 0))
        containers[svc] = c
    out = dict(sample, containers=containers, restarts=sum(c["restarts"] for c in containers.values()),
               oom_killed=sum(c["oom_killed"] for c in containers.values()))
    if sample.get("missing"):
        out["missing"] = [services.get(m, m) for m in sample["missing"]]
    return out


def collectors_for(stack) -> list[Collector]:
    """The collectors a running :class:`~monsoon.stack.supervisor.Stack` supports, from its ``observe`` section."""
    spec = stack.spec
    out: list[Collector] = []
    obs = spec.observe
    if obs.service:
        out.append(ProcessCollector(lambda: stack.pid(obs.service)))
    if not (spec.containers() or spec.pods() or obs.docker or obs.kubernetes):   # local processes: RSS each 5 s
        out.append(ServicesCollector(lambda: {s: stack.pid(s) for s in spec.services}))
    for svc in spec.services:   # OOM-kill evidence for every service: a dependency the kernel kills is an OOM too
        out.append(CgroupOomCollector(svc, functools.partial(stack.pid, svc), run_id=stack.run_id))
    if obs.metrics_url and obs.metrics:
        out.append(MetricsCollector(stack.endpoint(obs.metrics_url), dict(obs.metrics)))
    if obs.kafka:
        out.append(KafkaLagCollector(stack.endpoint(obs.kafka.bootstrap), obs.kafka.group, obs.kafka.topic))
    if obs.kubernetes:
        if cluster_configured():
            out.append(KubePodsCollector(obs.kubernetes.namespace, obs.kubernetes.selector_string()))
        else:
            log.warning("observe.kubernetes is set but no cluster is configured (KUBECONFIG, ~/.kube/config or "
                        "in-cluster): pod OOMKilled/restarts are not watched")
    if obs.docker:
        out.append(DockerCollector(obs.docker))
    elif spec.containers():     # a container stack is watched by Docker's word on each container, by service
        names = stack.container_names()
        out.append(DockerCollector(list(names.values()), services={c: s for s, c in names.items()},
                                   history=stack.container_history))
    if spec.storage.count_query:
        out.append(SqlCountCollector(stack.endpoint(spec.storage.dsn), spec.storage.count_query,
                                     spec.storage.running_count_query))
    return out
