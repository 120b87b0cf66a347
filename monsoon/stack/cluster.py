"""A real single-node Kubernetes cluster that monsoon starts here (``monsoon cluster up|down|status``).

The reasoning, sources and measurements behind it: docs/design.md, "monsoon/stack/cluster.py"."""
from __future__ import annotations

import fcntl
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import yaml

from monsoon.paths import CACHE
from monsoon.settings import env as setting
from monsoon.stack import dockerd
from monsoon.stack.nsforward import UDP, enter_netns, format_target

NETNS = "monsoon-k8s"
NODE = "monsoon-k8s"
NODE_IP = "10.200.0.1"
SERVICE_IP = "10.96.0.1"
SERVICE_CIDR = "10.96.0.0/24"
POD_CIDR = "10.244.0.0/24"
DNS_IP = "10.96.0.10"       # the kube-dns Service's ClusterIP (kubelet's clusterDNS): kube-proxy -> CoreDNS on NODE_IP:53
CLUSTER_DOMAIN = "cluster.local"
K8S_VERSION = "v1.33.13"
COREDNS_VERSION = "v1.15.0"
PAUSE_IMAGE = "registry.k8s.io/pause:3.6"
BUSYBOX_IMAGE = "monsoon.local/busybox:1"
CHAOS_NAMESPACE = "chaos-mesh"
TAG_ENV = "MONSOON_K8S_CLUSTER"
API_PORT = 16443            # the host forwarder's port for the API server; any free port when it is taken
# kubelet sets these VM-wide (it "protects kernel defaults" by changing them): recorded at up, restored at down
SYSCTLS = ("vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops")
# kubelet writes these whatever its --root-dir; removed at down when they were not there before up
HOST_PATHS = ("/var/lib/kubelet/device-plugins", "/var/lib/kubelet", "/var/log/containers", "/var/lib/cni")
KUBE_BINARIES = ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kube-proxy", "coredns")
SUN_PATH_MAX = 107
# stop order: kubelet first (it would restart containers), the API server and etcd last
DAEMONS = ("kubelet", "containerd", "coredns", "kube-proxy", "chaos-controller-manager", "chaos-daemon",
           "chaos-operator", "kube-controller-manager", "kube-scheduler", "kube-apiserver", "etcd")
# kube-proxy (iptables mode) and CoreDNS run as daemons in the namespace, like the control plane
KUBE_PROXY_HEALTHZ = 10256  # kube-proxy's healthz and metrics, on the namespace's 127.0.0.1
KUBE_PROXY_METRICS = 10249
COREDNS_HEALTH = 10054      # CoreDNS's health and ready plugins, on the namespace's 127.0.0.1 (not :8080/:8181,
COREDNS_READY = 10055       # which a hostNetwork pod may want)
BRIDGE_NF = "/proc/sys/net/bridge/bridge-nf-call-iptables"   # br_netfilter's switch, per network namespace
# chaos-operator: Litmus's (monsoon.stack.litmus starts it); chaos-daemon: Chaos Mesh's (ensure_chaos_daemon)
CHAOS_DAEMON_PORT = 31767   # its gRPC port (the controller's CHAOS_DAEMON_SERVICE_PORT default), in the namespace
CHAOS_DAEMON_SLICE = "chaos-daemon-monsoon"   # the controller finds the daemon by this EndpointSlice's node name
HOST_SYS = "/host-sys"      # where chaos-daemon reads the host's cgroups (a fixed path in its code)

T = TypeVar("T")


class ClusterError(RuntimeError):
    """One line: which piece is missing or did not start, and what to do."""


def home() -> Path:
    """``<cache>/k8s``: what ``make k8s`` built."""
    return Path(setting("MONSOON_K8S_DIR") or CACHE / "k8s")


def state_dir() -> Path:
    return home() / "cluster"


def netns_path(name: str = NETNS) -> str:
    return f"/run/netns/{name}"


# --------------------------------------------------------------------------------------------- rendering (pure)

def containerd_config(d: Path) -> str:
    """containerd's config (version 2): its own root, state, socket, runc root and CNI conf dir."""
    c = d / "containerd"
    return f"""version = 2
root = "{c / 'root'}"
state = "{c / 'state'}"
disabled_plugins = ["io.containerd.internal.v1.opt"]

[grpc]
  address = "{c / 'c.sock'}"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  disable_hugetlb_controller = true
  tolerate_missing_hugetlb_controller = true
  netns_mounts_under_state_dir = true
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{c / 'runc'}"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d / 'cni' / 'net.d'}"
"""


def cni_config(d: Path) -> dict:
    """A bridge (cni0, the pods' gateway, no masquerading) with host-local addresses, plus loopback."""
    return {"cniVersion": "0.4.0", "name": "monsoon-k8s", "plugins": [
        {"type": "bridge", "bridge": "cni0", "isGateway": True, "ipMasq": False, "hairpinMode": True,
         "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_CIDR}]], "routes": [{"dst": "0.0.0.0/0"}],
                  "dataDir": str(d / "cni" / "ipam")}},
        {"type": "loopback"}]}


# The containerd label on an imported image: the ID of the Docker image it came from, so an image rebuilt under
# the same tag (make images after its scripts changed) is imported again instead of kept stale.
IMAGE_ID_LABEL = "monsoon.docker-image-id"


def image_ref(image: str) -> str:
    """The reference containerd lists for an image name: ``monsoon/platform`` -> ``docker.io/monsoon/platform:latest``."""
    name, tag = (image.rsplit(":", 1) + ["latest"])[:2] if ":" in image.rsplit("/", 1)[-1] else (image, "latest")
    first = name.split("/", 1)[0]
    if "/" not in name:
        name = f"docker.io/library/{name}"
    elif "." not in first and ":" not in first and first != "localhost":
        name = f"docker.io/{name}"
    return f"{name}:{tag}"


def parse_image_ids(table: str) -> dict[str, str]:
    """``ctr images ls`` (REF TYPE DIGEST SIZE PLATFORMS LABELS) -> {ref: the Docker image ID label, or ''}."""
    out = {}
    for line in table.splitlines()[1:]:
        parts = line.split()
        if not parts:
            continue
        labels = dict(kv.split("=", 1) for kv in parts[-1].split(",") if "=" in kv) if len(parts) > 1 else {}
        out[parts[0]] = labels.get(IMAGE_ID_LABEL, "")
    return out


def _docker_env() -> dict[str, str]:
    """The environment for the docker CLI: monsoon's private dockerd (or DOCKER_HOST) when one answers."""
    env = dict(os.environ)
    host = dockerd.docker_host()
    if host:
        env["DOCKER_HOST"] = host
    return env


def docker_image_id(image: str) -> str | None:
    """The Docker image ID of ``image`` on monsoon's dockerd (or DOCKER_HOST), None when it cannot be read."""
    env = _docker_env()
    try:
        r = subprocess.run(["docker", "image", "inspect", "-f", "{{.Id}}", image], capture_output=True, text=True,
                           env=env, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return r.stdout.strip() or None if r.returncode == 0 else None


# kubelet marks the node DiskPressure below this much free disk (a taint: no pod is placed, running ones are
# evicted). An absolute floor, not kubelet's 10 % or a percentage: 1 % of a 250 GB disk is 2.5 GB, which a suite
# that writes a few GB of run directories crosses while a test cluster needs only megabytes more.
EVICTION_DISK = "512Mi"
# A start is refused below this much free disk on the cluster's directory: the eviction floor, and room for the
# images, pod logs and the runs' own directories.
DISK_HEADROOM = 2 << 30


def _gib(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def disk_refusal(d: Path | None = None, headroom: int = DISK_HEADROOM) -> str | None:
    """One line when the disk under the cluster's directory has less than ``headroom`` free (kubelet would soon
    taint the node DiskPressure and every pod would stay Pending), else None."""
    d = d or state_dir()
    p = d
    while not p.exists() and p != p.parent:
        p = p.parent
    try:
        st = os.statvfs(p)
    except OSError:
        return None
    free, total = st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize
    if free >= headroom:
        return None
    return (f"the disk under {d} has {_gib(free)} free of {_gib(total)}: kubelet taints the node DiskPressure "
            f"below {EVICTION_DISK} and pods stay Pending; free at least {_gib(headroom - free)} (old runs/, "
            "pytest's temporary directories), or set MONSOON_K8S_DIR to a roomier disk")


def node_pressure(node: dict | None) -> list[str]:
    """The node's conditions that keep pods off it, one phrase each: NotReady, DiskPressure, MemoryPressure,
    PIDPressure (with kubelet's message)."""
    out = []
    for c in ((node or {}).get("status") or {}).get("conditions") or []:
        bad = c.get("status") == "True" if c.get("type") != "Ready" else c.get("status") != "True"
        if bad:
            name = c.get("type") if c.get("type") != "Ready" else "NotReady"
            out.append(f"{name} ({c.get('message') or c.get('reason') or '?'})")
    return out


def kubelet_config(d: Path) -> dict:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": NODE_IP, "port": 10250, "readOnlyPort": 0, "healthzBindAddress": "127.0.0.1",
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": str(d / "pki" / "ca.crt")}},
        "authorization": {"mode": "Webhook"},
        "cgroupDriver": "cgroupfs", "failSwapOn": False, "failCgroupV1": False,
        "containerRuntimeEndpoint": f"unix://{d / 'containerd' / 'c.sock'}",
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "podLogsDir": str(d / "pod-logs"),
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": EVICTION_DISK,
                         "imagefs.available": EVICTION_DISK, "nodefs.inodesFree": "1%"},
        "clusterDomain": CLUSTER_DOMAIN, "clusterDNS": [DNS_IP], "resolvConf": "/etc/resolv.conf",
        "serializeImagePulls": False, "registerNode": True,
    }


def corefile(kubeconfig_path: Path) -> str:
    """CoreDNS's config: the cluster's zone (Services, pods, reverse) from the API on NODE_IP:53; every other name
    NXDOMAIN (no upstream: nothing is forwarded outside the namespace)."""
    return f"""{CLUSTER_DOMAIN}:53 in-addr.arpa:53 ip6.arpa:53 {{
    bind {NODE_IP}
    errors
    health 127.0.0.1:{COREDNS_HEALTH}
    ready 127.0.0.1:{COREDNS_READY}
    kubernetes {CLUSTER_DOMAIN} in-addr.arpa ip6.arpa {{
        kubeconfig {kubeconfig_path} monsoon-k8s
        pods insecure
        ttl 5
    }}
    cache 5
    loadbalance
}}
.:53 {{
    bind {NODE_IP}
    errors
    template ANY ANY {{
        rcode NXDOMAIN
    }}
}}
"""


def dns_objects() -> list[tuple[str, dict]]:
    """(API path, object): the ``kube-dns`` Service in kube-system on DNS_IP (no selector: CoreDNS is no pod) and
    its EndpointSlice, CoreDNS on the node's IP."""
    labels = {"k8s-app": "kube-dns", "app.kubernetes.io/managed-by": "monsoon"}
    ports = [{"name": "dns", "port": 53, "protocol": "UDP"}, {"name": "dns-tcp", "port": 53, "protocol": "TCP"}]
    svc = {"apiVersion": "v1", "kind": "Service",
           "metadata": {"name": "kube-dns", "namespace": "kube-system", "labels": labels},
           "spec": {"clusterIP": DNS_IP, "ports": [{**p, "targetPort": 53} for p in ports]}}
    eps = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
           "metadata": {"name": "kube-dns-monsoon", "namespace": "kube-system",
                        "labels": {**labels, "kubernetes.io/service-name": "kube-dns"}},
           "addressType": "IPv4", "ports": ports,
           "endpoints": [{"addresses": [NODE_IP], "nodeName": NODE, "conditions": {"ready": True}}]}
    return [("/api/v1/namespaces/kube-system/services", svc),
            ("/apis/discovery.k8s.io/v1/namespaces/kube-system/endpointslices", eps)]


def kubeconfig(server: str, d: Path, user: str) -> dict:
    """A kubeconfig for ``server`` with the client certificate ``pki/<user>.crt``."""
    pki = d / "pki"
    return {"apiVersion": "v1", "kind": "Config", "current-context": "monsoon-k8s",
            "clusters": [{"name": "monsoon-k8s", "cluster": {"server": server,
                                                           "certificate-authority": str(pki / "ca.crt")}}],
            "users": [{"name": user, "user": {"client-certificate": str(pki / f"{user}.crt"),
                                              "client-key": str(pki / f"{user}.key")}}],
            "contexts": [{"name": "monsoon-k8s", "context": {"cluster": "monsoon-k8s", "user": user}}]}


# client certificates: file stem -> (CN, O)
CLIENTS = {"admin": ("monsoon-admin", "system:masters"),
           "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", "system:masters"),
           "controller-manager": ("system:kube-controller-manager", ""),
           "scheduler": ("system:kube-scheduler", ""),
           "kubelet": (f"system:node:{NODE}", "system:nodes")}
APISERVER_SANS = (f"IP:{SERVICE_IP}", f"IP:{NODE_IP}", "IP:127.0.0.1", "DNS:kubernetes", "DNS:kubernetes.default",
                  "DNS:kubernetes.default.svc", "DNS:kubernetes.default.svc.cluster.local", "DNS:localhost")


def daemon_argv(name: str, d: Path, bindir: Path, masquerade_all: bool = False) -> tuple[list[str], dict[str, str]]:
    """argv and extra environment of one daemon (all of them run inside the namespace). ``masquerade_all``: kube-proxy
    SNATs all Service traffic (used where br_netfilter is not in the namespace)."""
    pki, kc = d / "pki", d / "kubeconfigs"
    if name == "etcd":
        return [shutil.which("etcd") or "/usr/bin/etcd", "--name", NODE, "--data-dir", str(d / "etcd"),
                "--listen-client-urls", "http://127.0.0.1:2379", "--advertise-client-urls", "http://127.0.0.1:2379",
                "--listen-peer-urls", "http://127.0.0.1:2380", "--initial-advertise-peer-urls",
                "http://127.0.0.1:2380", "--initial-cluster", f"{NODE}=http://127.0.0.1:2380",
                "--listen-metrics-urls", "http://127.0.0.1:2381", "--quota-backend-bytes", str(1 << 30)], {}
    if name == "kube-apiserver":
        return [str(bindir / name), "--etcd-servers=http://127.0.0.1:2379", "--secure-port=443",
                "--bind-address=0.0.0.0", f"--advertise-address={NODE_IP}",
                f"--client-ca-file={pki / 'ca.crt'}", f"--tls-cert-file={pki / 'apiserver.crt'}",
                f"--tls-private-key-file={pki / 'apiserver.key'}", "--authorization-mode=Node,RBAC",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--service-account-key-file={pki / 'sa.pub'}",
                f"--service-account-signing-key-file={pki / 'sa.key'}",
                f"--kubelet-client-certificate={pki / 'apiserver-kubelet-client.crt'}",
                f"--kubelet-client-key={pki / 'apiserver-kubelet-client.key'}",
                "--kubelet-preferred-address-types=InternalIP", "--allow-privileged=true",
                "--profiling=false", "--event-ttl=10m"], {}
    if name == "kube-controller-manager":
        return [str(bindir / name), f"--kubeconfig={kc / 'controller-manager'}",
                f"--authentication-kubeconfig={kc / 'controller-manager'}",
                f"--authorization-kubeconfig={kc / 'controller-manager'}",
                f"--root-ca-file={pki / 'ca.crt'}", f"--service-account-private-key-file={pki / 'sa.key'}",
                f"--cluster-signing-cert-file={pki / 'ca.crt'}", f"--cluster-signing-key-file={pki / 'ca.key'}",
                "--use-service-account-credentials", "--leader-elect=false", "--bind-address=127.0.0.1",
                f"--service-cluster-ip-range={SERVICE_CIDR}", "--profiling=false"], {}
    if name == "kube-scheduler":
        return [str(bindir / name), f"--kubeconfig={kc / 'scheduler'}",
                f"--authentication-kubeconfig={kc / 'scheduler'}", f"--authorization-kubeconfig={kc / 'scheduler'}",
                "--leader-elect=false", "--bind-address=127.0.0.1", "--profiling=false"], {}
    if name == "containerd":
        return [shutil.which("containerd") or "/usr/bin/containerd", "--config", str(d / "containerd.toml")], {}
    if name == "kube-proxy":
        # iptables mode in the namespace. It writes no sysctl and no /sys file: conntrack limits and timeouts left
        # as they are (0), no route_localnet (no NodePorts on 127.0.0.1). Pod -> Service -> pod on the one bridge
        # is un-NATed by br_netfilter (bridge-nf-call-iptables, per namespace); without it, --masquerade-all
        masq = ["--masquerade-all"] if masquerade_all else []
        return [str(bindir / name), f"--kubeconfig={d / 'kubeconfig.inside'}", f"--hostname-override={NODE}",
                "--proxy-mode=iptables", f"--cluster-cidr={POD_CIDR}", f"--bind-address={NODE_IP}",
                f"--healthz-bind-address=127.0.0.1:{KUBE_PROXY_HEALTHZ}",
                f"--metrics-bind-address=127.0.0.1:{KUBE_PROXY_METRICS}",
                "--conntrack-max-per-core=0", "--conntrack-min=0", "--conntrack-tcp-timeout-established=0",
                "--conntrack-tcp-timeout-close-wait=0", "--iptables-localhost-nodeports=false",
                f"--nodeport-addresses={NODE_IP}/32", *masq], {}
    if name == "coredns":
        return [str(bindir / name), "-conf", str(d / "Corefile")], {}
    if name == "kubelet":
        return [str(bindir / name), f"--config={d / 'kubelet.yaml'}", f"--kubeconfig={kc / 'kubelet'}",
                f"--hostname-override={NODE}", f"--node-ip={NODE_IP}", f"--root-dir={d / 'kubelet'}",
                f"--cert-dir={d / 'kubelet' / 'pki'}"], {}
    if name == "chaos-daemon":
        # its own mount namespace: /sys at /host-sys and monsoon's helpers at /usr/local/bin (fixed paths in its
        # code) are bound there only, so the host's mounts never change; then it becomes the daemon (same pid)
        script = ('set -e; mount --rbind /sys "$4"; mount --bind "$2" /usr/local/bin; '
                  'exec "$1" --runtime containerd --runtime-socket-path "$3" --grpc-port "$5" --http-port "$6"')
        return ["unshare", "--mount", "--propagation", "private", "--", "/bin/sh", "-c", script, name,
                str(bindir / name), str(bindir.parent / "chaos-daemon"), str(d / "containerd" / "c.sock"),
                HOST_SYS, str(CHAOS_DAEMON_PORT), str(CHAOS_DAEMON_PORT - 1)], {
            "PATH": "/usr/local/bin:/usr/local/sbin:/usr/sbin:/usr/bin:/sbin:/bin"}
    if name == "chaos-controller-manager":
        return [str(bindir / name), f"-kubeconfig={d / 'kubeconfig.inside'}"], {
            "ENABLE_LEADER_ELECTION": "false", "CERTS_DIR": str(d / "chaos-certs"), "NAMESPACE": CHAOS_NAMESPACE,
            "METRICS_HOST": "127.0.0.1", "WEBHOOK_HOST": "127.0.0.1", "PPROF_ADDR": "0",
            "POD_FAILURE_PAUSE_IMAGE": PAUSE_IMAGE, "ALLOW_HOST_NETWORK_TESTING": "true",
            "KUBECONFIG": str(d / "kubeconfig.inside")}
    raise ValueError(f"unknown daemon {name!r}")


# --------------------------------------------------------------------------------------------- processes

def _alive(pid: int) -> bool:
    try:
        s = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return s[s.rindex(")") + 2:].split()[0] not in ("Z", "X")


def _tagged(d: Path) -> list[int]:
    """Live processes carrying ``MONSOON_K8S_CLUSTER=<d>`` (daemons, forwarders, containerd's shims)."""
    tag = f"{TAG_ENV}={d}".encode()
    out = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit() or int(p.name) == os.getpid():
            continue
        try:
            if tag in (p / "environ").read_bytes().split(b"\0") and _alive(int(p.name)):
                out.append(int(p.name))
        except OSError:
            continue
    return out


def _pid(d: Path, name: str) -> int | None:
    try:
        pid = int((d / "pids" / f"{name}.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if _alive(pid) and pid in _tagged_one(d, pid) else None


def daemon_pid(name: str) -> int | None:
    """The PID of one of the cluster's daemons (e.g. ``chaos-controller-manager``), None when it does not run."""
    return _pid(Cluster().dir, name)


def _tagged_one(d: Path, pid: int) -> list[int]:
    try:
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return []
    return [pid] if f"{TAG_ENV}={d}".encode() in env else []


def _env(d: Path, extra: dict[str, str] | None = None, keep_run: bool = False) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not (k.startswith("MONSOON_") and not keep_run) and k not in ("KUBECONFIG", "NOTIFY_SOCKET")}
    env["PATH"] = env.get("PATH", "/usr/bin:/bin") + ":/usr/sbin:/sbin"
    env[TAG_ENV] = str(d)
    env.update(extra or {})
    return env


def _spawn(d: Path, name: str, argv: list[str], extra: dict[str, str] | None = None) -> int:
    """Start one daemon inside the namespace: own session, no inherited fds (no CPU lock held), own log."""
    (d / "pids").mkdir(parents=True, exist_ok=True)
    (d / "logs").mkdir(parents=True, exist_ok=True)
    with open(d / "logs" / f"{name}.log", "ab") as log:
        log.write(f"\n==== {time.strftime('%Y-%m-%dT%H:%M:%S')} {' '.join(argv)}\n".encode())
        log.flush()
        p = subprocess.Popen(["nsenter", f"--net={netns_path()}", *argv], stdout=log, stderr=subprocess.STDOUT,
                             stdin=subprocess.DEVNULL, start_new_session=True, close_fds=True, env=_env(d, extra))
    (d / "pids" / f"{name}.pid").write_text(str(p.pid))
    return p.pid


def _kill(pid: int, timeout: float, signals: tuple[int, ...] = (signal.SIGTERM,)) -> None:
    """Send ``signals`` (one every ``timeout/len`` s) and SIGKILL at the end; wait until it is gone."""
    step = timeout / max(1, len(signals))
    for sig in (*signals, signal.SIGKILL):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        t0 = time.monotonic()
        while time.monotonic() - t0 < (step if sig != signal.SIGKILL else 5.0):
            if not _alive(pid):
                return
            time.sleep(0.05)


def _tail(path: Path, n: int = 3) -> str:
    try:
        lines = [ln for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return "(no log)"
    return " | ".join(ln.strip()[:200] for ln in lines[-n:])


# --------------------------------------------------------------------------------------------- the namespace

def _run(*argv: str, check: bool = True, input: bytes | None = None, timeout: float = 60) -> subprocess.CompletedProcess:
    r = subprocess.run(list(argv), capture_output=True, input=input, timeout=timeout)
    if check and r.returncode != 0:
        raise ClusterError(f"{' '.join(argv[:4])}: {r.stderr.decode(errors='replace').strip()[:300]}")
    return r


def _in_netns(fn: Callable[[], T], name: str = NETNS) -> T:
    """Run ``fn`` in a new thread that first enters the namespace (setns is per thread for network namespaces)."""
    box: dict[str, Any] = {}

    def body() -> None:
        try:
            enter_netns(netns_path(name))
            box["v"] = fn()
        except BaseException as e:  # handed back to the caller's thread
            box["e"] = e
    t = threading.Thread(target=body, daemon=True)
    t.start()
    t.join()
    if "e" in box:
        raise box["e"]
    return box["v"]


def _netns_up() -> None:
    if not Path(netns_path()).exists():
        _run("ip", "netns", "add", NETNS)
    ns = ("ip", "-n", NETNS)
    links = _run(*ns, "-o", "link", "show").stdout.decode()
    if "k8s0@" not in links:
        _run(*ns, "link", "add", "k8s0", "type", "veth", "peer", "name", "k8s1")
    addrs = _run(*ns, "-o", "addr", "show").stdout.decode()
    if f"{NODE_IP}/24" not in addrs:
        _run(*ns, "addr", "add", f"{NODE_IP}/24", "dev", "k8s0")
    if f"{SERVICE_IP}/32" not in addrs:
        _run(*ns, "addr", "add", f"{SERVICE_IP}/32", "dev", "lo")
    for link in ("lo", "k8s0", "k8s1"):
        _run(*ns, "link", "set", link, "up")
    if "default" not in _run(*ns, "route", "show").stdout.decode():
        _run(*ns, "route", "add", "default", "dev", "k8s0")


def _netns_down() -> bool:
    had = Path(netns_path()).exists()
    if had:
        _run("ip", "netns", "del", NETNS, check=False)
        if Path(netns_path()).exists():           # a busy bind mount: lazily detach it
            _run("umount", "-l", netns_path(), check=False)
            try:
                Path(netns_path()).unlink()
            except OSError:
                pass
    # `ip netns add` mounted /run/netns (a shared tmpfs bind); leave it when another namespace lives there
    try:
        if not any(Path("/run/netns").iterdir()) and "/run/netns" in _mounts_at_or_under(Path("/run/netns")):
            _run("umount", "/run/netns", check=False)
    except OSError:
        pass
    return had


# --------------------------------------------------------------------------------------------- certificates

def _openssl(*args: str) -> None:
    _run("openssl", *args)


def _key(path: Path) -> None:
    _openssl("genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256", "-out", str(path))


def _cert(pki: Path, stem: str, cn: str, org: str, ext: str) -> None:
    _key(pki / f"{stem}.key")
    subj = f"/CN={cn}" + (f"/O={org}" if org else "")
    _openssl("req", "-new", "-key", str(pki / f"{stem}.key"), "-subj", subj, "-out", str(pki / f"{stem}.csr"))
    (pki / f"{stem}.ext").write_text(ext)
    _openssl("x509", "-req", "-in", str(pki / f"{stem}.csr"), "-CA", str(pki / "ca.crt"), "-CAkey",
             str(pki / "ca.key"), "-CAcreateserial", "-days", "3650", "-out", str(pki / f"{stem}.crt"),
             "-extfile", str(pki / f"{stem}.ext"))


def ensure_pki(d: Path) -> None:
    """CA, API server, clients, service-account keys and the Chaos Mesh webhook's self-signed pair (made once)."""
    pki = d / "pki"
    if (pki / ".complete").exists():
        return
    shutil.rmtree(pki, ignore_errors=True)
    pki.mkdir(parents=True)
    _key(pki / "ca.key")
    _openssl("req", "-x509", "-new", "-key", str(pki / "ca.key"), "-subj", "/CN=monsoon-k8s-ca", "-days", "3650",
             "-out", str(pki / "ca.crt"))
    _cert(pki, "apiserver", "kube-apiserver", "",
          "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n"
          f"subjectAltName={','.join(APISERVER_SANS)}\n")
    for stem, (cn, org) in CLIENTS.items():
        _cert(pki, stem, cn, org, "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=clientAuth\n")
    _key(pki / "sa.key")
    _openssl("pkey", "-in", str(pki / "sa.key"), "-pubout", "-out", str(pki / "sa.pub"))
    certs = d / "chaos-certs"
    certs.mkdir(exist_ok=True)
    _key(certs / "tls.key")
    _openssl("req", "-x509", "-new", "-key", str(certs / "tls.key"), "-subj", "/CN=chaos-mesh-webhook", "-days",
             "3650", "-addext", "subjectAltName=DNS:localhost,IP:127.0.0.1", "-out", str(certs / "tls.crt"))
    for f in pki.glob("*.csr"):
        f.unlink()
    (pki / ".complete").write_text("")


# --------------------------------------------------------------------------------------------- the API

class Api:
    """A tiny HTTPS client for the API server (admin certificate), through the host forwarder."""

    def __init__(self, d: Path, port: int):
        self.port = port
        self.ctx = ssl.create_default_context(cafile=str(d / "pki" / "ca.crt"))
        self.ctx.load_cert_chain(str(d / "pki" / "admin.crt"), str(d / "pki" / "admin.key"))

    def call(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> tuple[int, Any]:
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.ctx, timeout=timeout)
        try:
            data = json.dumps(body).encode() if body is not None else None
            conn.request(method, path, body=data, headers={"Content-Type": "application/json"} if data else {})
            r = conn.getresponse()
            raw = r.read()
            try:
                return r.status, json.loads(raw) if raw else None
            except ValueError:
                return r.status, raw.decode(errors="replace")
        finally:
            conn.close()

    def get(self, path: str) -> Any:
        code, body = self.call("GET", path)
        return body if code == 200 else None

    def ok(self, path: str) -> bool:
        try:
            return self.call("GET", path, timeout=2.0)[0] == 200
        except (OSError, http.client.HTTPException):
            return False


# --------------------------------------------------------------------------------------------- the cluster

#: one mirrored port: (host port, 0 = any free one; target host; target port; "tcp" or "udp")
Mirror = tuple[int, str, int, str]


class Forward:
    """A running forwarder (host 127.0.0.1:P -> target inside the namespace); ``stop()`` ends it. ``ports``: each
    bound port -> its target."""

    def __init__(self, pid: int, ports: dict[int, tuple[str, int]], pidfile: Path | None):
        self.pid, self.ports, self.pidfile = pid, ports, pidfile
        self.also: Forward | None = None      # a second forwarder stopped with this one (the node's side)

    def alive(self) -> bool:
        return _alive(self.pid) and (self.also is None or self.also.alive())

    def stop(self) -> None:
        if self.also is not None:
            self.also.stop()
        _kill(self.pid, 3.0)
        if self.pidfile is not None:
            try:
                self.pidfile.unlink()
            except FileNotFoundError:
                pass

    def __enter__(self) -> Forward:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _listeners(mapping: list[Mirror], where: str) -> list[socket.socket]:
    """A listening TCP socket, or a bound UDP one, on 127.0.0.1 per entry (UDP without SO_REUSEADDR: on Linux that
    would let a second socket bind a port already taken, and split its datagrams)."""
    socks: list[socket.socket] = []
    for hport, _thost, _tport, proto in mapping:
        s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM if proto == UDP else socket.SOCK_STREAM)
        if proto != UDP:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", hport))
        except OSError as e:
            s.close()
            for x in socks:
                x.close()
            raise ClusterError(f"cluster forwarder: cannot bind 127.0.0.1:{hport}/{proto}{where}: {e.strerror}") \
                from None
        if proto != UDP:
            s.listen(128)
        socks.append(s)
    return socks


def start_forwarder(d: Path, mapping: list[Mirror], name: str, keep_run: bool = False,
                    inside: bool = False) -> Forward:
    """Bind each host port on 127.0.0.1 here (0 = any free port), then hand the sockets to a forwarder process that
    enters the namespace and relays to (host, port) there. The bound ports are known before it runs. ``inside``:
    the ports are bound on the namespace's own 127.0.0.1 instead (for what runs on the node's network)."""
    socks: list[socket.socket] = []
    args: list[str] = []
    ports: dict[int, tuple[str, int]] = {}
    try:
        socks = _in_netns(lambda: _listeners(mapping, " in the node's namespace")) if inside else _listeners(mapping, "")
        for s, (_hport, thost, tport, proto) in zip(socks, mapping):
            args.append(format_target(s.fileno(), thost, tport, proto))
            ports[s.getsockname()[1]] = (thost, tport)
        (d / "pids").mkdir(parents=True, exist_ok=True)
        (d / "logs").mkdir(parents=True, exist_ok=True)
        with open(d / "logs" / f"{name}.log", "ab") as log:
            p = subprocess.Popen([sys.executable, "-m", "monsoon.stack.nsforward", netns_path(), *args],
                                 stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 start_new_session=True, pass_fds=[s.fileno() for s in socks],
                                 env=_env(d, keep_run=keep_run), cwd="/")
    finally:
        for s in socks:
            s.close()
    pidfile = d / "pids" / f"{name}.pid"
    pidfile.write_text(str(p.pid))
    return Forward(p.pid, ports, pidfile)


class Cluster:
    """Names and paths of the cluster (starts nothing)."""

    def __init__(self, d: Path | None = None):
        self.dir = d or state_dir()
        self.bindir = (d.parent if d else home()) / "bin"
        self.netns = NETNS
        self.kubeconfig = self.dir / "kubeconfig"
        self.kubeconfig_inside = self.dir / "kubeconfig.inside"
        self.node = NODE
        self.node_ip = NODE_IP
        self.socket = self.dir / "containerd" / "c.sock"

    def nsenter_prefix(self) -> list[str]:
        return ["nsenter", f"--net={netns_path(self.netns)}"]

    def api_port(self) -> int | None:
        try:
            return int((self.dir / "api-port").read_text())
        except (OSError, ValueError):
            return None

    def api(self) -> Api:
        port = self.api_port()
        if port is None:
            raise ClusterError("the cluster is not running: monsoon cluster up")
        return Api(self.dir, port)

    def forward(self, ports: list[int], targets: dict[int, str] | None = None,
                udp: dict[int, str] | None = None) -> Forward:
        """Mirror each port over TCP: host 127.0.0.1:P -> the namespace's 127.0.0.1:P (where hostNetwork pods
        listen), or ``targets[P]``:P (a Service's ClusterIP: kube-proxy's OUTPUT rules there take it to the pod,
        whichever it is now); and over UDP each port in ``udp``, host 127.0.0.1:P -> ``udp[P]``:P (a UDP Service
        port). With ``targets`` or ``udp``, only the ports in them. The forwarder keeps the caller's MONSOON_RUN_ID
        label (a run's reaper ends it) and ``down`` ends it too."""
        if not Path(netns_path(self.netns)).exists():
            raise ClusterError("the cluster is not running: monsoon cluster up")
        if not targets and not udp:
            return start_forwarder(self.dir, [(p, "127.0.0.1", p, "tcp") for p in ports],
                                   f"forward-{os.getpid()}-{'-'.join(map(str, ports))}", keep_run=True)
        # Services: the same ports on the node's own 127.0.0.1 too, for what runs on the node's network (the load as
        # a Job, hostNetwork pods), as with hostNetwork services
        mapping = [(p, ip, p, proto) for proto, to in (("tcp", targets or {}), (UDP, udp or {}))
                   for p in ports if (ip := to.get(p))]
        tag = f"{os.getpid()}-{'-'.join(str(p) + ('u' if proto == UDP else '') for p, _, _, proto in mapping)}"
        host = start_forwarder(self.dir, mapping, f"forward-{tag}", keep_run=True)
        try:
            host.also = start_forwarder(self.dir, mapping, f"forward-node-{tag}", keep_run=True, inside=True)
        except BaseException:
            host.stop()
            raise
        return host

    def answers_inside(self, host: str, port: int, timeout: float = 2.0) -> bool:
        """True when a TCP connection to ``host:port`` as the namespace sees it is accepted (a hostNetwork pod's
        port, or the API server's)."""
        def probe() -> bool:
            try:
                with socket.create_connection((host, port), timeout=timeout):
                    return True
            except OSError:
                return False
        return bool(_in_netns(probe, self.netns))

    def ctr(self, *args: str) -> list[str]:
        return ["ctr", "-a", str(self.socket), "-n", "k8s.io", *args]

    def import_archive(self, tar: Path) -> None:
        r = subprocess.run(self.ctr("images", "import", str(tar)), capture_output=True, timeout=300)
        if r.returncode != 0:
            raise ClusterError(f"ctr images import {tar}: {r.stderr.decode(errors='replace').strip()[:300]}")

    def import_image(self, image: str) -> None:
        """``docker save IMAGE | ctr -n k8s.io images import -`` against monsoon's private dockerd (or DOCKER_HOST).
        Pods then use ``image: IMAGE`` with ``imagePullPolicy: Never`` (and a tag other than latest)."""
        env = _docker_env()
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
        imp = subprocess.run(self.ctr("images", "import", "-"), stdin=save.stdout, capture_output=True,
                             timeout=600)
        assert save.stdout is not None
        save.stdout.close()
        err = save.stderr.read().decode(errors="replace").strip() if save.stderr else ""
        if save.wait() != 0:
            raise ClusterError(f"docker save {image}: {err[:300]}")
        if imp.returncode != 0:
            raise ClusterError(f"ctr images import of {image}: {imp.stderr.decode(errors='replace').strip()[:300]}")
        iid = docker_image_id(image)
        if iid:     # what import_images compares next time; unlabelled, the image is imported again then
            subprocess.run(self.ctr("images", "label", image_ref(image), f"{IMAGE_ID_LABEL}={iid}"),
                           capture_output=True, timeout=30)

    def image_ids(self) -> dict[str, str]:
        """Each image the cluster holds -> the Docker image ID it was imported from ('' when not recorded)."""
        r = subprocess.run(self.ctr("images", "ls"), capture_output=True, timeout=30)
        return parse_image_ids(r.stdout.decode(errors="replace")) if r.returncode == 0 else {}

    def images(self) -> list[str]:
        r = subprocess.run(self.ctr("images", "ls", "-q"), capture_output=True, timeout=30)
        return r.stdout.decode().split() if r.returncode == 0 else []


def missing_pieces(c: Cluster | None = None, chaos_mesh: bool = False) -> list[str]:
    """One line per piece that is not there (binary not built, package not installed)."""
    c = c or Cluster()
    out = []
    for b in KUBE_BINARIES + (("chaos-controller-manager",) if chaos_mesh else ()):
        if not os.access(c.bindir / b, os.X_OK):
            out.append(f"{b}: not built ({c.bindir / b}): run make k8s")
    if chaos_mesh and not (c.bindir.parent / "crds" / "chaos-mesh.yaml").is_file():
        out.append(f"Chaos Mesh CRDs: not found ({c.bindir.parent / 'crds' / 'chaos-mesh.yaml'}): run make k8s")
    for img in ("pause.tar", "busybox.tar"):
        if not (c.bindir.parent / "images" / img).is_file():
            out.append(f"image {img}: not built ({c.bindir.parent / 'images' / img}): run make k8s")
    for exe, pkg in (("etcd", "etcd-server"), ("containerd", "docker.io"), ("runc", "docker.io"),
                     ("ctr", "docker.io"), ("nsenter", "util-linux"), ("openssl", "openssl")):
        if shutil.which(exe) is None and not Path(f"/usr/sbin/{exe}").exists():
            out.append(f"{exe}: not installed (apt-get install {pkg}): run make k8s")
    if not Path("/usr/lib/cni/bridge").exists():
        out.append("CNI plugins: not installed (/usr/lib/cni/bridge): run make k8s")
    return out


CHAOS_DAEMON_HELPERS = ("pause", "nsexec", "memStress")


def chaos_daemon_missing(c: Cluster | None = None) -> str | None:
    """Why chaos-daemon cannot start here (one line), or None: its binary and monsoon's helpers are built."""
    c = c or Cluster()
    if not os.access(c.bindir / "chaos-daemon", os.X_OK):
        return (f"chaos-daemon: not built ({c.bindir / 'chaos-daemon'}): run tools/build-chaos-daemon "
                "(after make k8s; ~3 min, cgo)")
    helpers = c.bindir.parent / "chaos-daemon"
    miss = [h for h in CHAOS_DAEMON_HELPERS if not os.access(helpers / h, os.X_OK)]
    if miss:
        return f"chaos-daemon's helpers {', '.join(miss)}: not built ({helpers}): run tools/build-chaos-daemon"
    for exe in ("unshare", "mount", "choom"):
        if shutil.which(exe) is None and not Path(f"/usr/bin/{exe}").exists():
            return f"{exe}: not installed (apt-get install util-linux): chaos-daemon needs it"
    return None


def skip_reason(chaos_mesh: bool = False) -> str | None:
    """Why a scenario that needs the cluster cannot run here (one line), or None."""
    if os.geteuid() != 0:
        return "the monsoon cluster needs root (network namespace, cgroups, mounts)"
    miss = missing_pieces(chaos_mesh=chaos_mesh)
    return f"the monsoon cluster is not built: {miss[0]}" if miss else None


@contextmanager
def _locked(d: Path) -> Iterator[None]:
    d.mkdir(parents=True, exist_ok=True)
    with open(d / ".lock", "w") as f:         # O_CLOEXEC: daemons never inherit it
        fcntl.flock(f, fcntl.LOCK_EX)
        yield


def _wait(what: str, probe: Callable[[], bool], timeout: float, d: Path, log: str | None,
          pid: int | None = None) -> None:
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if probe():
            return
        if pid is not None and not _alive(pid):
            raise ClusterError(f"{what} exited at start; its log {d / 'logs' / f'{log}.log'}: "
                               f"{_tail(d / 'logs' / f'{log}.log')}")
        time.sleep(0.1)
    tail = f"; its log {d / 'logs' / f'{log}.log'}: {_tail(d / 'logs' / f'{log}.log')}" if log else ""
    raise ClusterError(f"{what} not ready within {timeout:.0f}s{tail}")


def _http_inside(port: int, path: str, expect: bytes) -> bool:
    """True when plain HTTP GET ``path`` on the namespace's 127.0.0.1:``port`` answers with ``expect`` in it."""
    def probe() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
                return expect in s.recv(4096)
        except OSError:
            return False
    return bool(_in_netns(probe))


def _etcd_ok() -> bool:
    return _http_inside(2379, "/health", b'"health":"true"')


def node_ready(api: Api) -> bool:
    try:
        node = api.get(f"/api/v1/nodes/{NODE}")
    except (OSError, http.client.HTTPException):
        return False
    conds = (node or {}).get("status", {}).get("conditions", []) if isinstance(node, dict) else []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conds)


def running(c: Cluster | None = None) -> bool:
    """True when the node answers Ready through the host forwarder."""
    c = c or Cluster()
    port = c.api_port()
    if port is None or not Path(netns_path()).exists() or _pid(c.dir, "kubelet") is None:
        return False
    return node_ready(Api(c.dir, port))


def _write_yaml(path: Path, obj: dict) -> None:
    path.write_text(yaml.safe_dump(obj, sort_keys=False))


def up(chaos_mesh: bool = False, timeout: float = 90.0, say: Callable[[str], None] = lambda s: None,
       chaos_daemon: bool = False) -> float:
    """Start the cluster (a no-op when it runs; Chaos Mesh, and its chaos-daemon, added when asked). Returns
    seconds to node Ready. On failure everything started is stopped again and ClusterError says which piece
    failed."""
    c = Cluster()
    d = c.dir
    chaos_mesh = chaos_mesh or chaos_daemon
    miss = missing_pieces(c, chaos_mesh)
    if chaos_daemon and (why := chaos_daemon_missing(c)):
        miss.append(why)
    if miss:
        raise ClusterError(miss[0])
    if why := disk_refusal(d):
        raise ClusterError(why)
    if os.geteuid() != 0:
        raise ClusterError("the monsoon cluster needs root (network namespace, cgroups, mounts)")
    if len(str(c.socket.resolve()) + ".ttrpc") > SUN_PATH_MAX:
        raise ClusterError(f"{d} is too deep for containerd's socket {c.socket} (over {SUN_PATH_MAX} bytes): "
                           "set MONSOON_K8S_DIR or MONSOON_CACHE to a shorter directory")
    t0 = time.monotonic()
    with _locked(d):
        if running(c):
            if _pid(d, "kube-proxy") is None or _pid(d, "coredns") is None:   # a cluster started before they were
                _start_service_network(c, c.api(), lambda n: _spawn(d, n, *daemon_argv(n, d, c.bindir)), say)
            if chaos_mesh and _pid(d, "chaos-controller-manager") is None:
                _start_chaos_mesh(c, say)
            if chaos_daemon and _pid(d, "chaos-daemon") is None:
                _start_chaos_daemon(c, say)
            return 0.0
        _down_locked(d, quiet=True)           # a half-started or killed cluster's leftovers
        try:
            _up_locked(c, say)
            if chaos_mesh:
                _start_chaos_mesh(c, say)
            if chaos_daemon:
                _start_chaos_daemon(c, say)
        except BaseException:
            _down_locked(d, quiet=True)
            raise
    return time.monotonic() - t0


def _up_locked(c: Cluster, say: Callable[[str], None]) -> None:
    d = c.dir
    for sub in ("etcd", "kubelet", "pod-logs", "containerd/state", "cni/ipam"):
        shutil.rmtree(d / sub, ignore_errors=True)
    for sub in ("logs", "pids", "kubeconfigs", "cni/net.d", "containerd/root", "etcd"):
        (d / sub).mkdir(parents=True, exist_ok=True)
    os.chmod(d / "etcd", 0o700)
    if not (d / "sysctls.json").exists():     # the values before any cluster of ours touched them
        (d / "sysctls.json").write_text(json.dumps(
            {k: Path(f"/proc/sys/{k}").read_text().strip() for k in SYSCTLS if Path(f"/proc/sys/{k}").exists()}))
    if not (d / "hostpaths.json").exists():
        (d / "hostpaths.json").write_text(json.dumps([p for p in HOST_PATHS if not Path(p).exists()]))
    ensure_pki(d)
    _netns_up()
    try:
        fwd = start_forwarder(d, [(API_PORT, NODE_IP, 443, "tcp")], "forward-api")
    except ClusterError:
        fwd = start_forwarder(d, [(0, NODE_IP, 443, "tcp")], "forward-api")   # the default port is taken: any port
    port = next(iter(fwd.ports))
    (d / "api-port").write_text(str(port))
    _write_yaml(c.kubeconfig, kubeconfig(f"https://127.0.0.1:{port}", d, "admin"))
    _write_yaml(c.kubeconfig_inside, kubeconfig(f"https://{NODE_IP}:443", d, "admin"))
    for who in ("controller-manager", "scheduler", "kubelet"):
        _write_yaml(d / "kubeconfigs" / who, kubeconfig(f"https://{NODE_IP}:443", d, who))
    (d / "containerd.toml").write_text(containerd_config(d))
    (d / "cni" / "net.d" / "10-monsoon.conflist").write_text(json.dumps(cni_config(d), indent=1))
    _write_yaml(d / "kubelet.yaml", kubelet_config(d))
    api = Api(d, port)

    def start(name: str) -> int:
        argv, extra = daemon_argv(name, d, c.bindir)
        return _spawn(d, name, argv, extra)

    pid = start("etcd")
    cpid = start("containerd")               # independent of the API: starts meanwhile
    _wait("etcd", _etcd_ok, 20, d, "etcd", pid)
    pid = start("kube-apiserver")
    _wait("containerd", lambda: c.socket.exists() and subprocess.run(
        c.ctr("version"), capture_output=True).returncode == 0, 20, d, "containerd", cpid)
    for tar in ("pause.tar", "busybox.tar"):
        c.import_archive(c.bindir.parent / "images" / tar)
    _wait("kube-apiserver", lambda: api.ok("/readyz"), 60, d, "kube-apiserver", pid)
    say(f"API server ready: https://127.0.0.1:{port} (kubeconfig {c.kubeconfig})")
    start("kube-controller-manager")
    start("kube-scheduler")
    pid = start("kubelet")
    _wait(f"kubelet (node {NODE} Ready)", lambda: node_ready(api), 60, d, "kubelet", pid)
    _wait("kube-controller-manager (the default service account)",
          lambda: api.get("/api/v1/namespaces/default/serviceaccounts/default") is not None, 30, d,
          "kube-controller-manager", _pid(d, "kube-controller-manager"))
    _start_service_network(c, api, start, say)


def _bridge_nf_ok() -> bool:
    """br_netfilter is there and on in the namespace (its sysctl is per namespace; a new one starts at 1)."""
    def read() -> str:
        try:
            return Path(BRIDGE_NF).read_text().strip()
        except OSError:
            return ""
    return bool(Path(netns_path()).exists() and _in_netns(read) == "1")


def _iptables_has(chain: str, needle: str) -> bool:
    r = subprocess.run(["nsenter", f"--net={netns_path()}", "iptables", "-t", "nat", "-S", chain],
                       capture_output=True, timeout=10)
    return r.returncode == 0 and needle.encode() in r.stdout


def _start_service_network(c: Cluster, api: Api, start: Callable[[str], int], say: Callable[[str], None]) -> None:
    """kube-proxy (Services' ClusterIPs as iptables rules in the namespace) and CoreDNS (their names), with the
    kube-dns Service on DNS_IP; ready when the rules of kube-dns are in place and CoreDNS has read the API."""
    d = c.dir
    t0 = time.monotonic()
    (d / "Corefile").write_text(corefile(c.kubeconfig_inside))
    if shutil.which("iptables-restore") is None and not Path("/usr/sbin/iptables-restore").exists():
        raise ClusterError("kube-proxy: iptables-restore is not installed (apt-get install iptables)")
    for path, obj in dns_objects():
        code, body = api.call("POST", path, obj)
        if code not in (201, 409):
            raise ClusterError(f"{obj['kind']} {obj['metadata']['name']}: HTTP {code}: {str(body)[:200]}")
    bridge_nf = _bridge_nf_ok()
    argv, extra = daemon_argv("kube-proxy", d, c.bindir, masquerade_all=not bridge_nf)
    ppid = _pid(d, "kube-proxy") or _spawn(d, "kube-proxy", argv, extra)
    dpid = _pid(d, "coredns") or start("coredns")
    _wait("kube-proxy (iptables rules of kube-dns)", lambda: _iptables_has("KUBE-SERVICES", f"{DNS_IP}/32"), 60,
          d, "kube-proxy", ppid)
    _wait("coredns (ready)", lambda: _http_inside(COREDNS_READY, "/ready", b" 200 "), 60, d, "coredns", dpid)
    say(f"kube-proxy (iptables{'' if bridge_nf else ', --masquerade-all: no br_netfilter'}) and CoreDNS on {DNS_IP} "
        f"in {time.monotonic() - t0:.1f}s")


def install_crds(c: Cluster, path: Path, what: str) -> list[str]:
    """Create the CustomResourceDefinitions in the YAML file ``path`` (one already there is fine) and wait until
    each is Established; their names. ``what`` names them in errors ("Chaos Mesh", "Litmus")."""
    api = c.api()
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    names = []
    for doc in yaml.load_all(path.read_text(), Loader=loader):
        if not doc or doc.get("kind") != "CustomResourceDefinition":
            continue
        code, body = api.call("POST", "/apis/apiextensions.k8s.io/v1/customresourcedefinitions", doc, timeout=30)
        if code not in (201, 409):
            raise ClusterError(f"{what} CRD {doc['metadata']['name']}: HTTP {code}: {str(body)[:200]}")
        names.append(doc["metadata"]["name"])

    def established() -> bool:
        for n in names:
            crd = api.get(f"/apis/apiextensions.k8s.io/v1/customresourcedefinitions/{n}") or {}
            if not any(x.get("type") == "Established" and x.get("status") == "True"
                       for x in (crd.get("status") or {}).get("conditions") or []):
                return False
        return True
    _wait(f"{what} CRDs (Established)", established, 30, c.dir, None)
    return names


def _start_chaos_mesh(c: Cluster, say: Callable[[str], None]) -> None:
    d = c.dir
    api = c.api()
    t0 = time.monotonic()
    names = install_crds(c, c.bindir.parent / "crds" / "chaos-mesh.yaml", "Chaos Mesh")
    api.call("POST", "/api/v1/namespaces", {"apiVersion": "v1", "kind": "Namespace",
                                            "metadata": {"name": CHAOS_NAMESPACE}})
    argv, extra = daemon_argv("chaos-controller-manager", d, c.bindir)
    pid = _spawn(d, "chaos-controller-manager", argv, extra)

    # its metrics endpoint answers once the manager runs
    _wait("chaos-controller-manager", lambda: _http_inside(10080, "/metrics", b" 200 "), 60, d,
          "chaos-controller-manager", pid)
    say(f"Chaos Mesh: {len(names)} CRDs and chaos-controller-manager in {time.monotonic() - t0:.1f}s")


def _start_chaos_daemon(c: Cluster, say: Callable[[str], None]) -> None:
    """chaos-daemon as a process in the cluster's namespace (its own mount namespace, see daemon_argv), and the
    EndpointSlice through which the controller finds it on the node."""
    d = c.dir
    t0 = time.monotonic()
    if not Path(HOST_SYS).exists():           # an empty mount point; removed at down
        os.mkdir(HOST_SYS)
        (d / "host-sys.created").write_text(HOST_SYS)
    argv, extra = daemon_argv("chaos-daemon", d, c.bindir)
    pid = _spawn(d, "chaos-daemon", argv, extra)
    _wait("chaos-daemon", lambda: c.answers_inside("127.0.0.1", CHAOS_DAEMON_PORT, 1.0), 30, d, "chaos-daemon", pid)
    ep = {"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
          "metadata": {"name": CHAOS_DAEMON_SLICE, "namespace": CHAOS_NAMESPACE,
                       "labels": {"app.kubernetes.io/managed-by": "monsoon"}},
          "addressType": "IPv4", "ports": [{"name": "grpc", "port": CHAOS_DAEMON_PORT, "protocol": "TCP"}],
          "endpoints": [{"addresses": [NODE_IP], "nodeName": NODE, "conditions": {"ready": True}}]}
    code, body = c.api().call("POST", f"/apis/discovery.k8s.io/v1/namespaces/{CHAOS_NAMESPACE}/endpointslices", ep)
    if code not in (201, 409):
        raise ClusterError(f"chaos-daemon's EndpointSlice: HTTP {code}: {str(body)[:200]}")
    say(f"chaos-daemon (pid {pid}) in {time.monotonic() - t0:.1f}s")


def ensure_chaos_daemon() -> bool:
    """Start chaos-daemon on the running cluster unless it runs (with the controller); True when started here.
    Raises ClusterError (one line) when it is not built or does not start."""
    c = Cluster()
    if _pid(c.dir, "chaos-daemon") is not None and _pid(c.dir, "chaos-controller-manager") is not None:
        return False
    up(chaos_mesh=True, chaos_daemon=True)
    return True


def start_chaos_mesh() -> None:
    """Add Chaos Mesh to the running cluster (CRDs + chaos-controller-manager)."""
    up(chaos_mesh=True)


def ensure_up(chaos_mesh: bool = False) -> bool:
    """Start the cluster unless it runs (with Chaos Mesh when asked); True when this call started it (so a
    pytest session fixture stops what it started with ``down()``). A cluster started here records this process
    as its owner: once the owner is gone (kill -9), ``left_behind()`` says so and ``monsoon reap`` stops it."""
    c = Cluster()
    if running(c):
        if chaos_mesh and _pid(c.dir, "chaos-controller-manager") is None:
            up(chaos_mesh=True)
        return False
    up(chaos_mesh=chaos_mesh)
    (c.dir / "owner").write_text(f"{os.getpid()} {_starttime(os.getpid())}")
    return True


def _starttime(pid: int) -> int:
    try:
        s = Path(f"/proc/{pid}/stat").read_text()
        return int(s[s.rindex(")") + 2:].split()[19])
    except (OSError, ValueError, IndexError):
        return -1


def left_behind() -> str | None:
    """Why the cluster counts as left behind (one line), or None: started by a process that is gone (``ensure_up``
    from a test session killed with -9), or pieces alive with the API or the node gone. A cluster started with
    ``monsoon cluster up`` and healthy is the user's, not a leftover."""
    c = Cluster()
    pieces = census()
    if not pieces:
        return None
    try:
        pid, start = (int(x) for x in (c.dir / "owner").read_text().split())
        if not _alive(pid) or _starttime(pid) != start:
            return f"its owner (pid {pid}) is gone; {len(pieces)} pieces left"
    except (OSError, ValueError):
        pass
    if _pid(c.dir, "kube-apiserver") is None or _pid(c.dir, "kubelet") is None:
        return f"half-started or half-stopped: {len(pieces)} pieces left"
    return None


# --------------------------------------------------------------------------------------------- down

def _mounts_at_or_under(d: Path) -> list[str]:
    try:
        lines = Path("/proc/self/mounts").read_text().splitlines()
    except OSError:
        return []
    top = str(d.resolve()) if d.exists() else str(d)
    pts = [ln.split()[1].replace("\\040", " ") for ln in lines]
    return sorted({p for p in pts if p == top or p.startswith(top + "/")}, key=len, reverse=True)


def _cgroup_roots() -> list[Path]:
    roots = []
    try:
        for ln in Path("/proc/self/mounts").read_text().splitlines():
            f = ln.split()
            if len(f) > 2 and f[2] in ("cgroup", "cgroup2"):
                roots.append(Path(f[1]))
    except OSError:
        pass
    return roots


def kubepods_cgroups() -> list[Path]:
    """kubelet's cgroup trees (``kubepods`` in every hierarchy it uses), present now."""
    return [r / "kubepods" for r in _cgroup_roots() if (r / "kubepods").is_dir()]


def _remove_cgroups() -> int:
    n = 0
    for top in kubepods_cgroups():
        dirs = sorted((p for p in top.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True) + [top]
        for g in dirs:
            for _ in range(20):
                try:
                    procs = [int(x) for x in (g / "cgroup.procs").read_text().split()]
                except (OSError, ValueError):
                    procs = []
                for pid in procs:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                try:
                    g.rmdir()
                    n += 1
                    break
                except FileNotFoundError:
                    break
                except OSError:
                    time.sleep(0.05)
    return n


def _remove_containers(c: Cluster) -> int:
    """Kill and delete every task and container of containerd's k8s.io namespace (needs containerd alive)."""
    if not c.socket.exists():
        return 0
    def ctr(*a: str, timeout: float = 20) -> subprocess.CompletedProcess:
        return subprocess.run(c.ctr(*a), capture_output=True, timeout=timeout)
    try:
        tasks = [ln.split()[0] for ln in ctr("tasks", "ls").stdout.decode().splitlines()[1:] if ln.split()]
        for t in tasks:
            ctr("tasks", "kill", "-a", "-s", "SIGKILL", t)
        for t in tasks:
            ctr("tasks", "delete", "-f", t)
        conts = ctr("containers", "ls", "-q").stdout.decode().split()
        for cid in conts:
            ctr("containers", "delete", cid)
        return len(conts)
    except (OSError, subprocess.TimeoutExpired):
        return 0


def down(quiet: bool = False) -> list[str]:
    """Stop everything of the cluster, whatever state it is in; returns what was stopped or removed."""
    d = state_dir()
    with _locked(d):
        return _down_locked(d, quiet)


def _down_locked(d: Path, quiet: bool = False) -> list[str]:
    c = Cluster(d) if d != state_dir() else Cluster()
    done: list[str] = []
    pid = _pid(d, "kubelet")
    if pid is not None:
        _kill(pid, 10.0)
        done.append("kubelet")
    if _pid(d, "containerd") is not None:
        n = _remove_containers(c)
        if n:
            done.append(f"{n} containers")
    for name in DAEMONS[1:]:
        pid = _pid(d, name)
        if pid is None:
            continue
        # chaos-controller-manager needs two SIGTERMs (the manager stops on the first, its fx app on the second)
        _kill(pid, 6.0 if name == "chaos-controller-manager" else 10.0,
              (signal.SIGTERM, signal.SIGTERM) if name == "chaos-controller-manager" else (signal.SIGTERM,))
        done.append(name)
    for pidfile in sorted((d / "pids").glob("forward-*.pid")) if (d / "pids").exists() else []:
        try:
            fp = int(pidfile.read_text())
        except (OSError, ValueError):
            fp = -1
        if fp > 0 and _tagged_one(d, fp):
            _kill(fp, 2.0)
            done.append(pidfile.stem)
        pidfile.unlink(missing_ok=True)
    left = _tagged(d)                         # shims, orphans whose pid file was lost
    for p in left:
        _kill(p, 2.0)
    if left:
        done.append(f"{len(left)} other tagged processes")
    n = _remove_cgroups()                     # kills what is left of the pods' processes
    if n:
        done.append(f"{n} kubelet cgroups")
    for _ in range(3):
        mounts = _mounts_at_or_under(d)
        if not mounts:
            break
        for m in mounts:
            subprocess.run(["umount", "-l", m], capture_output=True)
        done.append(f"{len(mounts)} mounts")
    if _netns_down():
        done.append(f"netns {NETNS}")
    rec = d / "host-sys.created"              # chaos-daemon's mount point: bound only in its own mount namespace
    if rec.exists():
        try:
            os.rmdir(HOST_SYS)
            done.append(f"removed {HOST_SYS}")
        except FileNotFoundError:
            pass
        except OSError as e:
            done.append(f"{HOST_SYS} NOT removed: {e}")
        rec.unlink()
    rec = d / "sysctls.json"
    if rec.exists():
        try:
            for k, v in json.loads(rec.read_text()).items():
                knob = Path(f"/proc/sys/{k}")      # not p: p is a pid above
                if knob.read_text().strip() != v:
                    knob.write_text(v)
                    done.append(f"sysctl {k.replace('/', '.')}={v}")
            rec.unlink()
        except (OSError, ValueError) as e:
            done.append(f"sysctls NOT restored: {e}")
    rec = d / "hostpaths.json"
    if rec.exists():
        try:
            absent = json.loads(rec.read_text())
        except ValueError:
            absent = []
        for p in absent:                      # the deepest first (the list is ordered that way)
            if Path(p).exists():
                shutil.rmtree(p, ignore_errors=True)
                done.append(f"removed {p}")
        rec.unlink()
    for f in ("api-port", "owner"):
        (d / f).unlink(missing_ok=True)
    for pidfile in (d / "pids").glob("*.pid") if (d / "pids").exists() else []:
        pidfile.unlink(missing_ok=True)
    return done


# --------------------------------------------------------------------------------------------- status

def status() -> list[tuple[str, bool, str]]:
    """(piece, ok, one line) for each piece of the cluster."""
    c = Cluster()
    d = c.dir
    out = [("netns", Path(netns_path()).exists(), netns_path() if Path(netns_path()).exists() else "absent")]
    for name in reversed(DAEMONS):
        pid = _pid(d, name)
        what = {"kube-proxy": " (iptables, Services' ClusterIPs)", "coredns": f" (DNS on {DNS_IP})"}.get(name, "")
        out.append((name, pid is not None, f"pid {pid}{what}" if pid else "not running"))
    fpid = _pid(d, "forward-api")
    port = c.api_port()
    out.append(("api forwarder", fpid is not None,
                f"pid {fpid}: 127.0.0.1:{port} -> {NODE_IP}:443" if fpid else "not running"))
    ready = fpid is not None and port is not None and node_ready(Api(d, port))
    out.append((f"node {NODE}", ready, f"Ready (KUBECONFIG={c.kubeconfig})" if ready else "not Ready"))
    leftovers = [str(p) for p in kubepods_cgroups()] + _mounts_at_or_under(d)
    if leftovers and not ready:
        out.append(("leftovers", False, f"{len(leftovers)} cgroups/mounts (monsoon cluster down removes them)"))
    return out


def census() -> list[str]:
    """What a stopped run might find left of the cluster: one line per live piece (empty when none)."""
    d = state_dir()
    lines = [f"k8s cluster process {p} ({_comm(p)})" for p in _tagged(d)]
    if Path(netns_path()).exists():
        lines.append(f"k8s cluster netns {NETNS}")
    if (d / "host-sys.created").exists():
        lines.append(f"k8s chaos-daemon mount point {HOST_SYS}")
    return lines


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"
