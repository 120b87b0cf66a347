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
    """OpenSSL (the engine's DTLS for CoAP) linked statically where libssl-dev's archives are (Debian/Ubuntu
    x86_64): the wheel's binary then needs no libssl, and auditwheel grafts nothing. openssl-sys reads these
    target-prefixed variables (pkg-config never links a library of /usr statically); elsewhere OpenSSL is linked
    dynamically. The same as ``loadgen_build.static_openssl_env`` and the Makefile."""
    lib = "/usr/lib/x86_64-linux-gnu"
    if os.path.exists(f"{lib}/libssl.a") and os.path.exists(f"{lib}/libcrypto.a"):
        for k, v in (("STATIC", "1"), ("LIB_DIR", lib), ("INCLUDE_DIR", "/usr/include")):
            os.environ.setdefault(f"X86_64_UNKNOWN_LINUX_GNU_OPENSSL_{k}", v)


def rust_extensions() -> list:
    if "editable_wheel" in sys.argv or "develop" in sys.argv or os.environ.get("MONSOON_WHEEL_LOADGEN") == "0":
        return []
    from setuptools_rust import RustBin, Strip

    static_openssl()

    return [RustBin("monsoon-loadgen", path="monsoon/load/loadgen/Cargo.toml", args=["--locked"], strip=Strip.No,
                    debug=False)]


exts = rust_extensions()
setup(**({"rust_extensions": exts, "cmdclass": {"bdist_wheel": bdist_wheel_platform}} if exts else {}))
