"""A real Kubernetes control plane on loopback: etcd, kube-apiserver, kube-controller-manager;
with `--node` (or the tests' `node` fixture), a real node beside it (tests/e2e/node.py).

Without the node, pods are created, mutated, validated and stored, never run: the way
controller-runtime's envtest and Kubernetes' own integration tests judge webhooks.

By hand (the binaries come from tests/controlplane/build.sh):

    python3 tests/e2e/controlplane.py up            # start, print KUBECONFIG, stop on Ctrl-C
    python3 tests/e2e/controlplane.py run -- CMD    # start, run CMD with KUBECONFIG set, stop
    bash tests/e2e/in-netns.sh python3 tests/e2e/controlplane.py run --node -- CMD   # with a node

Every process is started in its own process group, dies with this one (PR_SET_PDEATHSIG) and is
stopped on exit, on success or failure.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import certs

ROOT = Path(__file__).resolve().parents[2]
TOOLS_DIR = Path(os.environ.get("EVI_TOOLS_DIR", Path.home() / ".cache/evi-tools"))
PR_SET_PDEATHSIG = 1


def binaries_dir() -> Path:
    """The directory with etcd, kube-apiserver and kube-controller-manager (built if missing)."""
    if os.environ.get("EVI_CONTROLPLANE_BIN"):
        return Path(os.environ["EVI_CONTROLPLANE_BIN"])
    out = subprocess.run(["bash", str(ROOT / "tests/controlplane/build.sh")], check=True,
                         capture_output=True, text=True)
    return Path(out.stdout.strip().splitlines()[-1])


def older_apiserver() -> Path:
    """The older kube-apiserver (tests/controlplane/build.sh --old): built if missing, or
    waited for while CI's background build makes it (.ci/go-tools.sh)."""
    out = subprocess.run(["bash", str(ROOT / "tests/controlplane/build.sh"), "--old"], check=True,
                         capture_output=True, text=True)
    directory = Path(out.stdout.strip().splitlines()[-1])
    (binary,) = directory.glob("kube-apiserver-v*")
    return binary


# Ports handed to servers are taken below the kernel's ephemeral range (32768-60999 by default),
# so no outgoing connection's local port can take one between the check and the server's bind,
# and in increasing order, so no port is handed out twice in one run: two servers of one test
# never get the same port. (A port from bind(("127.0.0.1", 0)) is neither: a CI run lost a
# replica to that race.)
def _ports():
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    yield from range(max(1024, low - 12768) + os.getpid() % 32 * 100, low)


_PORTS = _ports()


def free_port() -> int:
    """A loopback port nothing listens on, below the ephemeral range, never returned before."""
    for port in _PORTS:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
        return port
    raise RuntimeError("no free loopback port left below the ephemeral range")


def _die_with_parent():
    os.setsid()
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def start_process(cmd: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """A child in its own process group that is killed if the test process dies."""
    out = open(log, "ab")
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, preexec_fn=_die_with_parent)


def start_scheduler(cp: "ControlPlane", log: Path, *extra: str) -> subprocess.Popen:
    """kube-scheduler against the control plane, on a free loopback port, no leader election."""
    kc = str(cp.kubeconfig)
    return start_process([
        str(cp.bin / "kube-scheduler"), "--kubeconfig", kc,
        "--authentication-kubeconfig", kc, "--authorization-kubeconfig", kc,
        "--bind-address", "127.0.0.1", "--secure-port", str(free_port()), "--leader-elect=false", *extra,
    ], log)


async def pipe(reader, writer) -> None:
    """Copies one direction of a TCP proxy until either side ends, then closes the writer."""
    import asyncio
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


def stop_process(p: subprocess.Popen, timeout: float = 10) -> None:
    if p.poll() is not None:
        return
    try:
        os.killpg(p.pid, signal.SIGTERM)
        p.wait(timeout)
    except (ProcessLookupError, subprocess.TimeoutExpired):
        try:
            os.killpg(p.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        p.wait()


class WaitError(AssertionError):
    """What was awaited did not happen: at the deadline, or a process it needed exited."""


def _tail(log) -> str:
    if log is None:
        return ""
    text = log() if callable(log) else Path(log).read_text(errors="replace") if Path(log).exists() else ""
    return text[-3000:]


def wait_for(what: str, fn, timeout: float = 30, interval: float = 0.2, procs=None, log=None):
    """Polls `fn` until it returns a truthy value, and returns that; an exception counts as not
    yet (raise one to say why). Fails with WaitError naming what was awaited and the last
    result or exception: at the deadline, or at once when one of `procs` (a Popen, or a dict
    of name to Popen) has exited; with the tail of `log` (a path, or a function returning the
    text) when given. The one wait of the end-to-end tests and their harness."""
    watched = procs if isinstance(procs, dict) else {"the process": procs} if procs is not None else {}
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            last = fn()
            if last:
                return last
        except Exception as e:  # any failure: retried until the deadline
            last = e
        dead = [(name, p.returncode) for name, p in watched.items() if p.poll() is not None]
        if dead or time.monotonic() >= deadline:
            state = f"{dead[0][0]} exited with {dead[0][1]}" if dead else f"timed out after {timeout} s"
            tail = _tail(log)
            raise WaitError(f"{state} waiting for {what} (last: {last!r})" + (f"\n{tail}" if tail else ""))
        time.sleep(interval)


def answers(url: str, context=None) -> bool:
    """Whether `url` answers 200 now (raises why not)."""
    with urllib.request.urlopen(url, timeout=2, context=context) as r:
        return r.status == 200


def wait_until_answers(proc: subprocess.Popen, url: str, what: str, log=None, timeout: float = 30,
                       context=None) -> None:
    """Polls `url` until it answers 200, while `proc` runs (see wait_for)."""
    wait_for(f"{what} to answer at {url}", lambda: answers(url, context), timeout=timeout, interval=0.1,
             procs={what: proc}, log=log)


class PKI:
    """A CA, a serving certificate for kube-apiserver, an admin client certificate
    (system:masters) and the service-account signing key."""

    def __init__(self, d: Path):
        self.dir = d
        self.ca_crt, self.ca_key = d / "ca.crt", d / "ca.key"
        self.server_crt, self.server_key = d / "apiserver.crt", d / "apiserver.key"
        self.admin_crt, self.admin_key = d / "admin.crt", d / "admin.key"
        self.sa_key, self.sa_pub = d / "sa.key", d / "sa.pub"
        ca = certs.ca(d, "ca", "evi-test-ca", key="rsa")
        certs.issue(d, "apiserver", ca, subject="/CN=kube-apiserver", key="rsa",
                    names=["127.0.0.1", "10.0.0.1", "localhost", "kubernetes", "kubernetes.default",
                           "kubernetes.default.svc"])
        certs.issue(d, "admin", ca, subject="/O=system:masters/CN=evi-test-admin", usage="clientAuth", key="rsa")
        certs.openssl("genrsa", "-out", str(self.sa_key), "2048")
        certs.openssl("rsa", "-in", str(self.sa_key), "-pubout", "-out", str(self.sa_pub))


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager on loopback, and a kubeconfig."""

    def __init__(self, workdir: Path | None = None, bindir: Path | None = None,
                 apiserver: str = "kube-apiserver", controllers: bool = True, node_ip: str | None = None,
                 controller_args: tuple[str, ...] = ()):
        # A directory of its own when none is given, removed at stop (give one to keep the logs).
        self._own_dir = workdir is None
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="evi-controlplane-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.bin = bindir or binaries_dir()
        # Another kube-apiserver (a path: an older release, older_apiserver()), and whether to
        # run kube-controller-manager beside it.
        self.apiserver = apiserver
        self.controllers = controllers
        # More kube-controller-manager flags (benches/scale.py: its client's rate limits).
        self.controller_args = controller_args
        # With a node (tests/e2e/node.py, inside the test's network namespace): the API server
        # also listens on the node's address, for pods, and calls webhooks on their Service's
        # endpoints (there is no kube-proxy).
        self.node_ip = node_ip
        self.procs: dict[str, subprocess.Popen] = {}
        self.kubeconfig = self.dir / "kubeconfig"
        self.api_port = free_port()
        self.url = f"https://127.0.0.1:{self.api_port}"
        # etcd's ports, kept when it is stopped and started again.
        self.etcd_ports = (free_port(), free_port())

    def start(self, timeout: float = 60) -> "ControlPlane":
        started = time.monotonic()
        try:
            self.pki = PKI(self.dir)
            self._write_kubeconfig()
            self._start_etcd()
            self._start_apiserver()
            self._wait_ready(started + timeout)
            if self.controllers:
                self._start_controller_manager()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def stop(self) -> None:
        for name in ("kube-controller-manager", "kube-apiserver", "etcd"):
            if name in self.procs:
                stop_process(self.procs.pop(name))
        if self._own_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    # === faults (tests/e2e/test_node_faults.py): a component stopped and started again, with
    # the same ports, data and certificates ===

    def stop_component(self, name: str) -> None:
        """Stops etcd or kube-apiserver as a crash would leave it (SIGKILL: no graceful
        shutdown, no goodbye to its clients)."""
        proc = self.procs.pop(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()

    def start_component(self, name: str, timeout: float = 60) -> float:
        """Starts etcd or kube-apiserver again; returns the seconds until the API server's
        /readyz answered 200 (every post-start hook and informer synced)."""
        started = time.monotonic()
        {"etcd": self._start_etcd, "kube-apiserver": self._start_apiserver}[name]()
        self._wait_ready(started + timeout)
        return time.monotonic() - started

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    def log(self, name: str) -> str:
        path = self.dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # === the components ===

    def _start_etcd(self) -> None:
        client, peer = self.etcd_ports
        self.etcd_url = f"http://127.0.0.1:{client}"
        self.procs["etcd"] = start_process([
            str(self.bin / "etcd"), "--data-dir", str(self.dir / "etcd"),
            "--listen-client-urls", self.etcd_url, "--advertise-client-urls", self.etcd_url,
            "--listen-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
            "--initial-cluster", f"default=http://127.0.0.1:{peer}",
            # A test store: losing it on a crash is fine, and fsync is most of etcd's latency.
            "--unsafe-no-fsync", "--log-level", "warn",
        ], self.dir / "etcd.log")

    def _start_apiserver(self) -> None:
        p = self.pki
        if self.node_ip:
            # kubectl logs and exec: the API server reaches the kubelet at the node's address
            # (the test kubelet takes any client: anonymous, AlwaysAllow).
            where = ["--bind-address", "0.0.0.0", "--advertise-address", self.node_ip,
                     "--enable-aggregator-routing=true",
                     "--kubelet-client-certificate", str(p.admin_crt), "--kubelet-client-key", str(p.admin_key),
                     "--kubelet-preferred-address-types", "InternalIP"]
        else:
            where = ["--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1"]
        self.procs["kube-apiserver"] = start_process([
            str(self.bin / self.apiserver),
            "--etcd-servers", self.etcd_url,
            *where,
            "--secure-port", str(self.api_port),
            "--tls-cert-file", str(p.server_crt), "--tls-private-key-file", str(p.server_key),
            "--client-ca-file", str(p.ca_crt),
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-key-file", str(p.sa_pub),
            "--service-account-signing-key-file", str(p.sa_key),
            "--service-cluster-ip-range", "10.0.0.0/24",
            # No kubelet, no kube-proxy: the kubernetes Service needs no endpoints (as in envtest).
            "--endpoint-reconciler-type", "none",
            "--authorization-mode", "Node,RBAC",
            # The default admission plugins are on; MutatingAdmissionWebhook is one of them.
            "--enable-admission-plugins", "MutatingAdmissionWebhook,ValidatingAdmissionWebhook",
            "--disable-admission-plugins", "",
            "--allow-privileged=true",
            "--profiling=false",
            "--v", os.environ.get("EVI_APISERVER_V", "1"),
        ], self.dir / "kube-apiserver.log")

    def _start_controller_manager(self) -> None:
        p = self.pki
        self.procs["kube-controller-manager"] = start_process([
            str(self.bin / "kube-controller-manager"),
            "--kubeconfig", str(self.kubeconfig),
            "--authentication-kubeconfig", str(self.kubeconfig),
            "--authorization-kubeconfig", str(self.kubeconfig),
            "--bind-address", "127.0.0.1", "--secure-port", str(free_port()),
            "--leader-elect=false",
            # job, ephemeral-volume, namespace, garbage-collector, service-account(-token),
            # replicaset and the rest of the defaults.
            "--controllers", "*",
            "--service-account-private-key-file", str(p.sa_key),
            "--root-ca-file", str(p.ca_crt),
            "--use-service-account-credentials=false",
            "--concurrent-gc-syncs", "5",
            "--v", "1",
            *self.controller_args,
        ], self.dir / "kube-controller-manager.log")

    def _wait_ready(self, deadline: float) -> None:
        ctx = self.ssl_context()
        wait_for("kube-apiserver ready", lambda: answers(f"{self.url}/readyz", ctx),
                 timeout=max(0.0, deadline - time.monotonic()), procs=self.procs,
                 log=lambda: self.log("kube-apiserver"))

    def ssl_context(self) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(self.pki.ca_crt))
        ctx.load_cert_chain(str(self.pki.admin_crt), str(self.pki.admin_key))
        return ctx

    def _write_kubeconfig(self) -> None:
        p = self.pki
        self.kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: evi-test
  cluster:
    server: {self.url}
    certificate-authority: {p.ca_crt}
users:
- name: admin
  user:
    client-certificate: {p.admin_crt}
    client-key: {p.admin_key}
contexts:
- name: evi-test
  context: {{cluster: evi-test, user: admin}}
current-context: evi-test
""")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["up", "run"])
    ap.add_argument("--dir", type=Path, help="work directory (default: a new temporary one)")
    ap.add_argument("--node", action="store_true",
                    help="also a node (kubelet, containerd, kube-scheduler); only inside tests/e2e/in-netns.sh")
    ap.add_argument("argv", nargs="*", help="with run: the command to run")
    args = ap.parse_args()
    cp = ControlPlane(args.dir, node_ip=os.environ.get("EVI_NODE_IP"))
    node = None

    def stop_all() -> None:
        if node:
            node.stop(check=False)
        cp.stop()

    def stop(*_) -> None:
        stop_all()
        sys.exit(130)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    cp.start()
    print(f"control plane up in {cp.startup_seconds:.1f} s; logs in {cp.dir}", file=sys.stderr)
    if args.node:
        from node import Node
        node = Node(cp, cp.dir / "node")
        try:
            node.start()
        except BaseException:
            node = None
            cp.stop()
            raise
        print(f"node Ready in {node.startup_seconds:.1f} s; logs in {node.dir}", file=sys.stderr)
    try:
        if args.command == "run":
            env = dict(os.environ, KUBECONFIG=str(cp.kubeconfig))
            return subprocess.run(args.argv, env=env).returncode
        print(f"export KUBECONFIG={cp.kubeconfig}")
        sys.stdout.flush()
        signal.pause()
        return 0
    finally:
        stop_all()


if __name__ == "__main__":
    sys.exit(main())
