"""The wheel's one build step beyond pyproject.toml: the native load engine, ``monsoon-loadgen`` (issue 41).

``pip wheel .`` / ``python -m build --wheel`` compile ``monsoon/load/loadgen`` with setuptools-rust's ``RustBin``
(``cargo build --release --locked``, the same profile and flags as ``make loadgen``, so in a checkout the two share
``monsoon/load/loadgen/target``) and ship the binary as a script of the wheel: ``pip install`` puts it in the
environment's ``bin/`` beside ``monsoon``, where ``ensure_loadgen()`` finds it through the distribution's RECORD.
The wheel is then tagged ``py3-none-<platform>``: no Python extension, one executable for the platform.

An editable install (``pip install -e .``, the Makefile's ``venv``) builds no Rust: a checkout builds the engine
on first use (``make loadgen`` / ``monsoon setup loadgen``) into ``target/``. ``MONSOON_WHEEL_LOADGEN=0`` leaves it
out of a wheel too (a pure wheel, the Python fleet's fallback, ``monsoon setup loadgen`` for the native one).
"""
from __future__ import annotations

import os
import sys

from setuptools import setup
from setuptools.command.bdist_wheel import bdist_wheel


class bdist_wheel_platform(bdist_wheel):
    """One executable, no Python extension: any Python 3, this platform (``py3-none-linux_x86_64``)."""

    def get_tag(self) -> tuple[str, str, str]:
        python, abi, plat = super().get_tag()
        if self.root_is_pure:
            return python, abi, plat
        return "py3", "none", plat


def static_openssl() -> None:
    """OpenSSL (the engine's DTLS for CoAP) linked statically where libssl-dev's archives are: the variables of
    monsoon/load/loadgen/static-openssl.mk (its ``KEY = VALUE`` lines; the Makefile includes it and
    ``loadgen_build.static_openssl_env`` reads it too), applied when their LIB_DIR has libssl.a and libcrypto.a.
    Not imported from monsoon: the build runs before monsoon's dependencies are installed."""
    mk = os.path.join(os.path.dirname(os.path.abspath(__file__)), "monsoon", "load", "loadgen", "static-openssl.mk")
    if not os.path.exists(mk):
        return
    env = dict(ln.split(" = ", 1) for ln in (x.strip() for x in open(mk)) if ln and not ln.startswith("#"))
    lib = next((v for k, v in env.items() if k.endswith("_LIB_DIR")), "")
    if os.path.exists(f"{lib}/libssl.a") and os.path.exists(f"{lib}/libcrypto.a"):
        for k, v in env.items():
            os.environ.setdefault(k, v)


def rust_extensions() -> list:
    if "editable_wheel" in sys.argv or "develop" in sys.argv or os.environ.get("MONSOON_WHEEL_LOADGEN") == "0":
        return []
    from setuptools_rust import RustBin, Strip

    static_openssl()

    return [RustBin("monsoon-loadgen", path="monsoon/load/loadgen/Cargo.toml", args=["--locked"], strip=Strip.No,
                    debug=False)]


exts = rust_extensions()
setup(**({"rust_extensions": exts, "cmdclass": {"bdist_wheel": bdist_wheel_platform}} if exts else {}))
