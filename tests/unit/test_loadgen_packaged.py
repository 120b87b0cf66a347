"""``ensure_loadgen()`` prefers the ``monsoon-loadgen`` that monsoon's wheel installed (issue 41): found through the
distribution's RECORD, and only the very file the wheel recorded; else the cargo build of a checkout."""
from __future__ import annotations

import base64
import hashlib
import os
from importlib import metadata
from pathlib import Path

import pytest

import monsoon.load.loadgen_build as lb


class FakeDist:
    """A distribution installed into ``root`` (site-packages) with a RECORD naming ``bin/monsoon-loadgen``."""

    def __init__(self, root: Path, binary: Path, record_hash: str) -> None:
        self.root = root
        f = metadata.PackagePath(os.path.relpath(binary, root))
        f.hash = metadata.FileHash(record_hash)
        f.dist = self
        other = metadata.PackagePath("monsoon/__init__.py")
        self.files = [other, f]

    def locate_file(self, path) -> Path:
        return self.root / path


def _hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """An installed layout: site-packages/monsoon/load/loadgen (the crate's sources), bin/monsoon-loadgen."""
    site = tmp_path / "lib" / "site-packages"
    crate = site / "monsoon" / "load" / "loadgen"
    (crate / "src").mkdir(parents=True)
    binary = tmp_path / "bin" / lb.BINARY_NAME
    binary.parent.mkdir()
    binary.write_bytes(b"#!/bin/sh\necho packaged\n")
    binary.chmod(0o755)
    monkeypatch.setattr(lb, "CRATE_DIR", crate)
    monkeypatch.delenv("MONSOON_LOADGEN", raising=False)
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))          # no cargo anywhere
    monkeypatch.setenv("CARGO_HOME", str(tmp_path / "no-cargo-home"))
    lb.packaged_loadgen.cache_clear()
    yield site, binary
    lb.packaged_loadgen.cache_clear()


def test_the_wheels_binary_is_used_without_cargo(installed, monkeypatch):
    site, binary = installed
    monkeypatch.setattr(lb.metadata, "distribution", lambda name: FakeDist(site, binary, _hash(binary.read_bytes())))
    assert lb.packaged_loadgen() == binary.resolve()
    assert lb.ensure_loadgen() == binary.resolve()


def test_a_binary_other_than_the_one_the_wheel_recorded_is_not_used(installed, monkeypatch):
    site, binary = installed
    monkeypatch.setattr(lb.metadata, "distribution", lambda name: FakeDist(site, binary, _hash(b"another build")))
    assert lb.packaged_loadgen() is None
    with pytest.raises(lb.LoadgenBuildError, match="cargo"):      # falls back to building, and says what to install
        lb.ensure_loadgen()


def test_another_monsoons_record_is_not_used(installed, tmp_path, monkeypatch):
    """The distribution's files live elsewhere than the imported monsoon (a checkout on sys.path beside an install)."""
    _, binary = installed
    monkeypatch.setattr(lb.metadata, "distribution",
                        lambda name: FakeDist(tmp_path / "elsewhere", binary, _hash(binary.read_bytes())))
    assert lb.packaged_loadgen() is None


def test_monsoon_loadgen_env_still_wins(installed, tmp_path, monkeypatch):
    site, binary = installed
    monkeypatch.setattr(lb.metadata, "distribution", lambda name: FakeDist(site, binary, _hash(binary.read_bytes())))
    other = tmp_path / "mine"
    other.write_bytes(b"#!/bin/sh\n")
    other.chmod(0o755)
    monkeypatch.setenv("MONSOON_LOADGEN", str(other))
    assert lb.ensure_loadgen() == other


def test_this_checkouts_editable_install_has_no_packaged_binary():
    """The Makefile's ``pip install -e .`` builds no Rust: the checkout's cargo build is the one used."""
    lb.packaged_loadgen.cache_clear()
    try:
        assert lb.packaged_loadgen() is None
    finally:
        lb.packaged_loadgen.cache_clear()


def test_static_openssl_variables_come_from_the_one_file_and_apply_only_where_the_archives_are(tmp_path):
    """static-openssl.mk is the one place the variables are written (the Makefile includes it, setup.py reads it):
    with libssl.a and libcrypto.a in its LIB_DIR they apply, without them OpenSSL links dynamically."""
    from monsoon.load.loadgen_build import CRATE_DIR, static_openssl_env
    shipped = (CRATE_DIR / "static-openssl.mk").read_text()
    assert "X86_64_UNKNOWN_LINUX_GNU_OPENSSL_STATIC = 1" in shipped
    lib = tmp_path / "lib"
    lib.mkdir()
    mk = tmp_path / "static-openssl.mk"
    mk.write_text(f"# a comment\nX_OPENSSL_STATIC = 1\nX_OPENSSL_LIB_DIR = {lib}\n")
    assert static_openssl_env(mk) == {}                     # no archives: dynamic
    (lib / "libssl.a").write_bytes(b"")
    assert static_openssl_env(mk) == {}                     # both are needed
    (lib / "libcrypto.a").write_bytes(b"")
    assert static_openssl_env(mk) == {"X_OPENSSL_STATIC": "1", "X_OPENSSL_LIB_DIR": str(lib)}
    assert static_openssl_env(tmp_path / "missing.mk") == {}
