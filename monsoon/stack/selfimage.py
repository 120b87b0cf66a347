"""monsoon's own container image, made from this machine's Python and this checkout, no registry and no Docker
daemon: what a scheduled run's CronJob pod (:mod:`monsoon.history.schedule`) runs in monsoon's cluster.

One layer (:func:`monsoon.stack.imagetar.write_image_archive`) holding:

* the interpreter monsoon runs under, at its own prefix (``sys.base_prefix``: its RUNPATH and its landmarks stay
  true), with its standard library minus the parts nothing imports at run time (tests, IDLE, Tk, lib2to3,
  ensurepip);
* in that prefix's ``site-packages``, the distributions monsoon needs to run (``pyproject.toml``'s
  ``dependencies``, followed through their own requirements; no extras, no dev tools), minus their test suites,
  headers and pyarrow's Flight/S3/Gandiva libraries (monsoon reads Parquet, CSV and compute only);
* the checkout's ``monsoon/`` package, ``stacks/``, ``experiments/``, ``fault-profiles/``, ``pytest/``,
  ``conftest.py`` and ``pyproject.toml`` under ``/monsoon`` (no build output: ``target/``, ``__pycache__``), found
  through a ``.pth`` and a small ``monsoon`` dist-info (its ``pytest11`` entry point: the plugin loads);
* the system libraries all of that links (``ldd``), the dynamic loader, busybox for ``sh``, and
  ``/usr/local/bin/monsoon``;
* every ``.py``'s bytecode, compiled here with checked-hash invalidation (:func:`compiled`).

The tag is ``monsoon.local/monsoon:<digest of every file's name, size and mtime>``; the archive is cached under
``<cache>/k8s/images/`` (older ones removed) and imported into the cluster's containerd unless it is there.
"""
from __future__ import annotations

import hashlib
import importlib.metadata as md
import os
import py_compile
import re
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Callable

from packaging.requirements import Requirement   # pytest's own dependency: there wherever monsoon runs

from monsoon.paths import REPO
from monsoon.stack import cluster
from monsoon.stack.imagetar import File, busybox_files, write_image_archive

IMAGE = "monsoon.local/monsoon"
WORKDIR = "/monsoon"
ENTRY = "/usr/local/bin/monsoon"
PROJECT = ("monsoon", "stacks", "experiments", "fault-profiles", "pytest", "conftest.py", "pyproject.toml")
STDLIB_SKIP = {"test", "idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "site-packages", "pydoc_data"}
# what no run of monsoon loads: test suites, C headers and sources, stubs, pyarrow's RPC/cloud/JIT modules
_PRUNE = re.compile(r"(^|/)(tests?|__pycache__|include|src)(/|$)|\.(pyi|pxd|pyx|h|hpp)$|"
                    r"^pyarrow/(lib)?_?(arrow_)?(python_)?(flight|s3|s3fs|gandiva|azurefs|gcsfs|hdfs)[^/]*$")


def runtime_distributions(root: str = "monsoon") -> list[str]:
    """``root``'s requirements and theirs, transitively (markers evaluated without extras, except the extras a
    requirement asks for: ``psycopg[binary]`` brings psycopg-binary): distribution names."""
    seen: dict[str, None] = {}
    done: set[tuple[str, frozenset[str]]] = set()
    todo: list[tuple[str, frozenset[str]]] = [(root, frozenset())]
    while todo:
        name, extras = todo.pop()
        for spec in md.requires(name) or []:
            req = Requirement(spec)
            if req.marker is not None and not any(req.marker.evaluate({"extra": x}) for x in ("", *extras)):
                continue
            key = req.name.lower().replace("_", "-")
            try:
                md.distribution(req.name)
            except md.PackageNotFoundError:
                continue
            seen[key] = None
            if (key, frozenset(req.extras)) not in done:
                done.add((key, frozenset(req.extras)))
                todo.append((req.name, frozenset(req.extras)))
    return sorted(seen)


def _site_files(dists: list[str], site: Path, dest: str) -> list[File]:
    out: list[File] = []
    for name in dists:
        for f in md.distribution(name).files or []:
            rel = str(f)
            if rel.startswith("..") or _PRUNE.search(rel):
                continue
            p = Path(f.locate())
            if p.is_file() and not p.is_symlink():
                out.append((f"{dest}/{rel}", str(p), None))
    return out


def _stdlib_files(stdlib: Path, dest: str) -> list[File]:
    out: list[File] = []
    for root, dirs, files in os.walk(stdlib):
        rel = os.path.relpath(root, stdlib)
        top = rel.split(os.sep)[0]
        if top in STDLIB_SKIP or top.startswith("config-") or os.path.basename(root) == "__pycache__":
            dirs[:] = []
            continue
        for fname in files:
            if fname.startswith("_tkinter"):
                continue
            p = os.path.join(root, fname)
            if os.path.isfile(p):
                out.append((os.path.normpath(f"{dest}/{rel}/{fname}"), p, None))
    return out


def _project_files(repo: Path) -> list[File]:
    out: list[File] = []
    for top in PROJECT:
        src = repo / top
        if src.is_file():
            out.append((f"{WORKDIR.lstrip('/')}/{top}", str(src), None))
            continue
        for root, dirs, _files in os.walk(src):
            dirs[:] = [d for d in dirs if d not in ("target", "__pycache__", ".pytest_cache")
                       and not os.path.islink(os.path.join(root, d))]
            for entry in os.scandir(root):
                name = f"{WORKDIR.lstrip('/')}/{os.path.relpath(entry.path, repo)}"
                if entry.is_symlink():
                    out.append((name, None, os.readlink(entry.path)))
                elif entry.is_file() and not entry.name.endswith(".pyc"):
                    out.append((name, entry.path, None))
    return out


def compiled(files: list[File], pyc: Path) -> list[File]:
    """A ``__pycache__`` entry beside each ``.py`` of the image, compiled once under ``pyc`` (again when its source
    is newer) with *checked-hash* invalidation: the image's files carry mtime 0, so the usual timestamp check
    would fail and every pod would compile everything again at each start."""
    tag = sys.implementation.cache_tag
    out: list[File] = []
    for name, host, _ in files:
        if not host or not name.endswith(".py"):
            continue
        head, base = os.path.split(name)
        cname = f"{head}/__pycache__/{base[:-3]}.{tag}.pyc"
        staged = pyc / cname
        if not staged.is_file() or staged.stat().st_mtime < os.stat(host).st_mtime:
            staged.parent.mkdir(parents=True, exist_ok=True)
            try:
                py_compile.compile(host, cfile=str(staged), dfile="/" + name, doraise=True,
                                   invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH)
            except py_compile.PyCompileError:
                continue               # a file no import reaches (a template, a Python 2 leftover): left as source
        out.append((cname, str(staged), None))
    return out


def _elf(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def system_libraries(binaries: list[str], inside: set[str], skip: tuple[str, ...] = ()) -> list[File]:
    """The shared objects ``binaries`` link that are not among ``inside`` (host paths already in the image) nor
    under ``skip`` (site-packages: a wheel's own libraries come with it or were pruned), each at the path ldd
    names (its content the resolved file), the loader included."""
    wanted: dict[str, None] = {}
    for i in range(0, len(binaries), 200):
        r = subprocess.run(["ldd", *binaries[i:i + 200]], capture_output=True, text=True)
        for ln in r.stdout.splitlines():
            for word in ln.split():
                if word.startswith("/") and not word.endswith(":"):
                    wanted[word] = None
                    break
    return [(lib.lstrip("/"), os.path.realpath(lib), None) for lib in wanted
            if os.path.realpath(lib) not in inside and lib not in inside and not lib.startswith(skip)]


def _generated(d: Path, prefix: str) -> list[File]:
    """The small files of monsoon's own the image needs: dist-info, .pth, passwd/group, the entry script."""
    d.mkdir(parents=True, exist_ok=True)
    site = f"{prefix}/lib/python{sys.version_info.major}.{sys.version_info.minor}/site-packages".lstrip("/")
    version = md.version("monsoon")
    texts = {
        "METADATA": f"Metadata-Version: 2.1\nName: monsoon\nVersion: {version}\n",
        "entry_points.txt": "[console_scripts]\nmonsoon = monsoon.cli:main\n\n[pytest11]\nmonsoon = monsoon.plugin\n",
        "top_level.txt": "monsoon\n",
        "monsoon.pth": f"{WORKDIR}\n",
        "passwd": "root:x:0:0:root:/tmp:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
        "group": "root:x:0:\nnogroup:x:65534:\n",
        "monsoon": f"#!/bin/sh\nexec {prefix}/bin/python{sys.version_info.major}.{sys.version_info.minor} "
                   "-m monsoon.cli \"$@\"\n",
        "keep": "",
    }
    for name, text in texts.items():
        p = d / name
        if not p.is_file() or p.read_text() != text:
            p.write_text(text)
    (d / "monsoon").chmod(0o755)
    info = f"{site}/monsoon-{version}.dist-info"
    return [(f"{info}/METADATA", str(d / "METADATA"), None), (f"{info}/entry_points.txt", str(d / "entry_points.txt"),
            None), (f"{info}/top_level.txt", str(d / "top_level.txt"), None),
            (f"{site}/monsoon.pth", str(d / "monsoon.pth"), None), ("etc/passwd", str(d / "passwd"), None),
            ("etc/group", str(d / "group"), None), (ENTRY.lstrip("/"), str(d / "monsoon"), None),
            ("tmp/.keep", str(d / "keep"), None)]


def image_files(work: Path, repo: Path = REPO) -> list[File]:
    """Every file of the image (name inside, host path or None, symlink target or None)."""
    prefix = os.path.realpath(sys.base_prefix)
    pyver = f"python{sys.version_info.major}.{sys.version_info.minor}"
    exe = os.path.realpath(os.path.join(prefix, "bin", pyver))
    stdlib = Path(sysconfig.get_paths()["stdlib"]).resolve()
    site = Path(sysconfig.get_paths()["purelib"])
    dest_site = f"{prefix}/lib/{pyver}/site-packages".lstrip("/")
    files: list[File] = [(exe.lstrip("/"), exe, None), (f"{prefix}/bin/python3".lstrip("/"), None, pyver),
                         ("usr/local/bin/python3", None, exe)]
    libdir = Path(prefix) / "lib"
    for lib in sorted(libdir.glob(f"lib{pyver}.so.*")):
        files.append((str(lib).lstrip("/"), os.path.realpath(lib), None))
    files += _stdlib_files(stdlib, str(stdlib).lstrip("/"))
    dists = [d for d in runtime_distributions() if d != "monsoon"]
    files += _site_files(dists, site, dest_site)
    files += _project_files(repo)
    files += _generated(work, prefix)
    files += compiled(files, work / "pyc")
    inside = {h for _, h, _ in files if h}
    elves = [h for n, h, _ in files if h and (".so" in n or h == exe) and _elf(h)]
    files += system_libraries(elves, inside, (str(site), str(site.resolve())))
    files += busybox_files()
    names: dict[str, File] = {}
    for f in files:
        names.setdefault(f[0], f)
    return list(names.values())


def digest(files: list[File]) -> str:
    h = hashlib.sha256()
    for name, host, link in sorted(files, key=lambda f: f[0]):
        st = os.stat(host) if host else None
        h.update(f"{name}\0{link or ''}\0{st.st_size if st else ''}\0{st.st_mtime_ns if st else ''}\n".encode())
    return h.hexdigest()[:12]


def build(images: Path, say: Callable[[str], None] = lambda s: None) -> tuple[str, Path]:
    """Write the image's archive under ``images`` unless the same one is there: (tag, archive)."""
    files = image_files(images / "monsoon-image")
    dig = digest(files)
    tag = f"{IMAGE}:{dig}"
    tar = images / f"monsoon-{dig}.tar"
    for old in images.glob("monsoon-*.tar*"):
        if not old.name.startswith(f"monsoon-{dig}.tar"):
            old.unlink(missing_ok=True)
    if write_image_archive(str(tar), tag, files, [ENTRY]):
        say(f"monsoon image {tag}: {len(files)} files, {tar.stat().st_size / 2**20:.0f} MiB ({tar})")
    return tag, tar


def ensure(c: cluster.Cluster | None = None, say: Callable[[str], None] = lambda s: None) -> str:
    """The image's tag in the running cluster's containerd (built and imported unless it is there)."""
    c = c or cluster.Cluster()
    if not cluster.running(c):
        raise cluster.ClusterError("the monsoon cluster is not running (monsoon cluster up)")
    images = c.bindir.parent / "images"
    images.mkdir(parents=True, exist_ok=True)
    tag, tar = build(images, say)
    have = c.images()
    if not any(i.endswith(tag) for i in have):
        c.import_archive(tar)
        say(f"monsoon image {tag} imported into the cluster")
    old = [i for i in have if f"{IMAGE}:" in i and not i.endswith(tag)]
    if old:   # the images of earlier checkouts: ~400 MB each in containerd's content store and snapshots
        subprocess.run(c.ctr("images", "rm", *old), capture_output=True, timeout=60)
    return tag


def main(argv: list[str]) -> int:
    """``python -m monsoon.stack.selfimage [DIR]``: write the archive under DIR (default the cluster's images)."""
    images = Path(argv[0]) if argv else cluster.Cluster().bindir.parent / "images"
    images.mkdir(parents=True, exist_ok=True)
    tag, tar = build(images, print)
    print(f"{tag} {tar} {tar.stat().st_size} bytes")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
