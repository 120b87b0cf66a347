"""``ensure_loadgen``: the ``monsoon-loadgen`` binary (the native engine's Rust core, ``monsoon/load/loadgen``):
the one monsoon's wheel brought (``setup.py``, issue 41), or built with cargo on first use; apart from the engine
so that ``monsoon setup`` does not import it."""
from __future__ import annotations

import base64
import fcntl
import functools
import hashlib
import os
import shutil
import subprocess
from importlib import metadata
from pathlib import Path

from monsoon import settings


__all__ = ["BINARY_NAME", "CRATE_DIR", "LoadgenBuildError", "ensure_loadgen", "packaged_loadgen"]

CRATE_DIR = Path(__file__).resolve().parent / "loadgen"
BINARY_NAME = "monsoon-loadgen"


class LoadgenBuildError(RuntimeError):
    """The native generator could not be built (names what to install)."""


def _sources_newer_than(binary: Path) -> bool:
    mtime = binary.stat().st_mtime
    files = [CRATE_DIR / "Cargo.toml", CRATE_DIR / "Cargo.lock", *(CRATE_DIR / "src").rglob("*.rs")]
    return any(f.exists() and f.stat().st_mtime > mtime for f in files)


def _find_cargo() -> str | None:
    c = shutil.which("cargo")
    if c:
        return c
    home = Path(os.environ.get("CARGO_HOME", Path.home() / ".cargo")) / "bin" / "cargo"
    return str(home) if home.exists() else None


def _record_hash(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return "sha256=" + base64.urlsafe_b64encode(h.digest()).rstrip(b"=").decode()


@functools.cache
def packaged_loadgen() -> Path | None:
    """The ``monsoon-loadgen`` that monsoon's wheel installed (the environment's ``bin/``, found through the
    distribution's RECORD, so ``--user``/``--prefix``/``--target`` installs too), if it is the very file that
    wheel built from the sources beside this module (its RECORD hash); ``None`` for an editable install, a pure
    wheel, another monsoon than the one imported, or a binary replaced since.
    """
    try:
        dist = metadata.distribution("monsoon")
    except metadata.PackageNotFoundError:
        return None
    if Path(str(dist.locate_file("monsoon"))).resolve() != CRATE_DIR.parent.parent:
        return None                      # another monsoon than the one imported (e.g. a checkout on sys.path)
    for f in dist.files or ():
        if f.name != BINARY_NAME or f.hash is None:
            continue
        p = Path(str(dist.locate_file(f))).resolve()
        if os.access(p, os.X_OK) and _record_hash(p) == f"{f.hash.mode}={f.hash.value}":
            return p
    return None


def static_openssl_env(mk: Path = CRATE_DIR / "static-openssl.mk") -> dict[str, str]:
    """The variables that make openssl-sys link OpenSSL (the engine's DTLS) statically from libssl-dev's archives
    (``mk``'s ``KEY = VALUE`` lines, which the Makefile includes and setup.py reads), when their LIB_DIR has
    libssl.a and libcrypto.a: the binary then needs no libssl where it runs (a pod's image, a wheel). Empty
    elsewhere (dynamic linking)."""
    try:
        lines = [ln.strip() for ln in mk.read_text().splitlines()]
    except OSError:
        return {}
    env = dict(ln.split(" = ", 1) for ln in lines if ln and not ln.startswith("#"))
    lib = next((v for k, v in env.items() if k.endswith("_LIB_DIR")), "")
    if not (lib and os.path.exists(f"{lib}/libssl.a") and os.path.exists(f"{lib}/libcrypto.a")):
        return {}
    return env


def ensure_loadgen() -> Path:
    """Path of the ``monsoon-loadgen`` binary.

    ``MONSOON_LOADGEN=/path/to/binary`` uses a prebuilt binary (e.g. in a container); else the one monsoon's wheel
    installed (:func:`packaged_loadgen`: no Rust needed); else it is built (``cargo build --release --locked``)
    into the crate's ``target/`` (a checkout) or the cache (an install without it) on first use or when its
    sources changed.
    """
    env = settings.env("MONSOON_LOADGEN")
    if env:
        p = Path(env)
        if not os.access(p, os.X_OK):
            raise LoadgenBuildError(f"MONSOON_LOADGEN={env} is not an executable file")
        return p
    packaged = packaged_loadgen()
    if packaged is not None:
        return packaged
    # the build: next to the crate in a checkout (make loadgen), in the cache when installed (never site-packages)
    target = CRATE_DIR / "target" if settings.CHECKOUT is not None else settings.cache_dir() / "loadgen"
    binary = target / "release" / BINARY_NAME
    if binary.exists() and not _sources_newer_than(binary):
        return binary
    cargo = _find_cargo()
    if cargo is None:
        raise LoadgenBuildError(
            "monsoon's native load generator (monsoon/load/loadgen) is built with Rust's cargo, "
            "which is not installed: install Rust (https://rustup.rs, or `apt-get install cargo`), "
            "or point MONSOON_LOADGEN at a prebuilt monsoon-loadgen binary"
        )
    target.mkdir(parents=True, exist_ok=True)
    with open(target / ".build.lock", "w") as lock:  # parallel test workers build once
        fcntl.flock(lock, fcntl.LOCK_EX)
        if binary.exists() and not _sources_newer_than(binary):
            return binary
        r = subprocess.run(
            [cargo, "build", "--release", "--locked", "--target-dir", str(target)], cwd=CRATE_DIR,
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, **static_openssl_env()},
        )
        if r.returncode != 0 or not binary.exists():
            raise LoadgenBuildError(
                f"`cargo build --release --locked` in {CRATE_DIR} failed (exit {r.returncode}):\n"
                + r.stdout[-4000:]
            )
        os.utime(binary)   # up to date even when cargo had nothing to relink (a touched source)
    return binary
