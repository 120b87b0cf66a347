"""Container images without a registry or a Docker daemon: a docker-archive tar (``manifest.json``, a config, one
``layer.tar``) that ``ctr -n k8s.io images import`` takes. Standard library only: ``tools/build-k8s`` runs it with
the system's python3 (``python3 -m monsoon.stack.imagetar OUT TAG ENTRYPOINT NAME=HOSTPATH|NAME->LINK ...``) for
the pause and busybox images, and the load's Indexed Job (:mod:`monsoon.load.kube_job`) for monsoon-loadgen's.
"""
from __future__ import annotations

import hashlib
import io
import json
import os
import subprocess
import sys
import tarfile
from collections.abc import Sequence

# (name in the image, host file or None, symlink target or None)
File = tuple[str, "str | None", "str | None"]


def write_image_archive(path: str, tag: str, files: Sequence[File], entrypoint: list[str]) -> bool:
    """Write ``path`` (a docker-archive of one layer holding ``files``) unless the same one is there already
    (a ``.src`` stamp of the tag, entrypoint and each file's mtime). True when written."""
    stamp = path + ".src"
    key = json.dumps([tag, entrypoint, [(n, os.path.getmtime(h) if h else ln) for n, h, ln in files]])
    if os.path.exists(path) and os.path.exists(stamp) and open(stamp).read() == key:
        return False
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w", format=tarfile.GNU_FORMAT) as t:
        dirs: set[str] = set()
        for n, _, _ in files:
            d = os.path.dirname(n)
            while d:
                dirs.add(d)
                d = os.path.dirname(d)
        for d in sorted(dirs):
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            t.addfile(info)
        for name, host, link in files:
            if host:
                info = t.gettarinfo(host, arcname=name)
                info.uid = info.gid = 0
                info.uname = info.gname = ""
                info.mtime = 0
                with open(host, "rb") as f:
                    t.addfile(info, f)
            else:
                info = tarfile.TarInfo(name)
                info.type, info.linkname = tarfile.SYMTYPE, link or ""
                t.addfile(info)
    data = layer.getvalue()
    diff = "sha256:" + hashlib.sha256(data).hexdigest()
    config = json.dumps({"architecture": "amd64", "os": "linux",
                         "config": {"Entrypoint": entrypoint, "Env": ["PATH=/bin:/usr/bin:/sbin:/usr/sbin:/usr/local/bin"]},
                         "rootfs": {"type": "layers", "diff_ids": [diff]},
                         "history": [{"created_by": "monsoon.stack.imagetar"}]}, sort_keys=True).encode()
    cname = hashlib.sha256(config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": cname, "RepoTags": [tag], "Layers": ["layer.tar"]}]).encode()
    tmp = path + ".tmp"
    with tarfile.open(tmp, "w") as t:
        for name, blob in (("layer.tar", data), (cname, config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(blob), 0o644
            t.addfile(info, io.BytesIO(blob))
    os.replace(tmp, path)
    with open(stamp, "w") as f:
        f.write(key)
    return True


def busybox_files(busybox: str = "/bin/busybox") -> list[File]:
    """busybox-static at /bin/busybox and one /bin/<applet> link per applet it lists."""
    applets = subprocess.run([busybox, "--list"], capture_output=True, text=True, check=True).stdout.split()
    return [("bin/busybox", busybox, None)] + [(f"bin/{a}", None, "busybox") for a in applets if a != "busybox"]


def main(argv: list[str]) -> int:
    """``OUT TAG ENTRYPOINT [NAME=HOSTPATH | NAME->LINK | busybox=HOSTPATH] ...`` (ENTRYPOINT split on commas)."""
    if len(argv) < 4:
        print(main.__doc__, file=sys.stderr)
        return 2
    out, tag, entry, specs = argv[0], argv[1], argv[2].split(","), argv[3:]
    files: list[File] = []
    for s in specs:
        if s.startswith("busybox="):
            files += busybox_files(s.split("=", 1)[1])
        elif "->" in s:
            n, ln = s.split("->", 1)
            files.append((n, None, ln))
        else:
            n, h = s.split("=", 1)
            files.append((n, h, None))
    if write_image_archive(out, tag, files, entry):
        print(f"monsoon: wrote {out} ({tag}, {os.path.getsize(out) // 1024} KiB)", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
