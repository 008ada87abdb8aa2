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
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

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


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _die_with_parent():
    os.setsid()
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def start_process(cmd: list[str], log: Path, env: dict | None = None) -> subprocess.Popen:
    """A child in its own process group that is killed if the test process dies."""
    out = open(log, "ab")
    return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                            env=env, preexec_fn=_die_with_parent)


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


def wait_until_answers(proc: subprocess.Popen, url: str, what: str, log=None, timeout: float = 30,
                       context=None) -> None:
    """Polls `url` until it answers 200, while `proc` runs; else fails naming `what`, with the
    tail of its log (a path, or a function returning the text)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with urllib.request.urlopen(url, timeout=2, context=context) as r:
                if r.status == 200:
                    return
        except OSError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            text = log() if callable(log) else Path(log).read_text(errors="replace") if log else ""
            state = f"exited with {proc.returncode}" if proc.poll() is not None else f"not answering after {timeout} s"
            raise RuntimeError(f"{what} {state}:\n{text[-3000:]}")
        time.sleep(0.1)


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


class PKI:
    """A CA, a serving certificate for kube-apiserver, an admin client certificate
    (system:masters) and the service-account signing key."""

    def __init__(self, d: Path):
        self.dir = d
        self.ca_crt, self.ca_key = d / "ca.crt", d / "ca.key"
        self.server_crt, self.server_key = d / "apiserver.crt", d / "apiserver.key"
        self.admin_crt, self.admin_key = d / "admin.crt", d / "admin.key"
        self.sa_key, self.sa_pub = d / "sa.key", d / "sa.pub"
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=evi-test-ca",
                "-keyout", str(self.ca_key), "-out", str(self.ca_crt))
        self._sign("apiserver", "/CN=kube-apiserver",
                   "subjectAltName=IP:127.0.0.1,IP:10.0.0.1,DNS:localhost,DNS:kubernetes,"
                   "DNS:kubernetes.default,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth")
        self._sign("admin", "/O=system:masters/CN=evi-test-admin", "extendedKeyUsage=clientAuth")
        openssl("genrsa", "-out", str(self.sa_key), "2048")
        openssl("rsa", "-in", str(self.sa_key), "-pubout", "-out", str(self.sa_pub))

    def _sign(self, name: str, subject: str, ext: str) -> None:
        key, csr, crt = self.dir / f"{name}.key", self.dir / f"{name}.csr", self.dir / f"{name}.crt"
        extfile = self.dir / f"{name}.ext"
        extfile.write_text(ext + "\n")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", str(key), "-out", str(csr))
        openssl("x509", "-req", "-in", str(csr), "-CA", str(self.ca_crt), "-CAkey", str(self.ca_key),
                "-CAcreateserial", "-days", "2", "-extfile", str(extfile), "-out", str(crt))


class ControlPlane:
    """etcd + kube-apiserver + kube-controller-manager on loopback, and a kubeconfig."""

    def __init__(self, workdir: Path | None = None, bindir: Path | None = None,
                 apiserver: str = "kube-apiserver", controllers: bool = True, node_ip: str | None = None):
        self.dir = Path(workdir or tempfile.mkdtemp(prefix="evi-controlplane-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.bin = bindir or binaries_dir()
        # Another kube-apiserver (a path: an older release, older_apiserver()), and whether to
        # run kube-controller-manager beside it.
        self.apiserver = apiserver
        self.controllers = controllers
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
        ], self.dir / "kube-controller-manager.log")

    def _wait_ready(self, deadline: float) -> None:
        ctx = self.ssl_context()
        last = ""
        while time.monotonic() < deadline:
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {proc.returncode}:\n{self.log(name)[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/readyz", context=ctx, timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception as e:  # noqa: BLE001 - not up yet
                last = str(e)
            time.sleep(0.2)
        raise TimeoutError(f"kube-apiserver not ready: {last}\n{self.log('kube-apiserver')[-3000:]}")

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

    stop = lambda *_: (stop_all(), sys.exit(130))  # noqa: E731
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
