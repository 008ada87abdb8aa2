"""A real node joined to the end-to-end control plane: containerd 1.6, runc and the CNI plugins
(Debian's packages), kubelet and kube-scheduler (built with the control plane), and the images
its pods run, built here since nothing can be pulled.

It runs only inside the network and mount namespaces of tests/e2e/in-netns.sh (`EVI_NETNS`):
the node's address is on that namespace's bridge link, and pods get addresses on a CNI bridge
inside it. What the kubelet changes outside those namespaces is recorded first and put back on
stop, on success and on failure: the kernel sysctls it sets (`vm.overcommit_memory`,
`kernel.panic`, `kernel.panic_on_oops`), the cgroups it makes (all under one cgroup root of
this run), and every process it or containerd started (containers' shims included).
`Node.stop` checks each and raises if anything is left.

Its volumes: the tests' CSI driver (tests/controlplane/csidriver, registered with the kubelet
through its plugin registry as node-driver-registrar would) and external-provisioner, both as
processes beside the kubelet, with their CSIDriver object and a StorageClass (`STORAGE_CLASS`).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from pathlib import Path

from controlplane import ControlPlane, free_port, start_process, start_scheduler, stop_process, wait_for

NODE_NAME = "evi-node"
# The other end-to-end tests leave pods behind that were never meant to run (images that cannot
# be pulled here, in namespaces nobody cleans): the node takes only pods that tolerate this.
TAINT = {"key": "evi.test/node", "operator": "Exists", "effect": "NoSchedule"}
POD_SUBNET = "10.214.0.0/24"
# The kubernetes Service's address (the first of --service-cluster-ip-range): with no
# kube-proxy, one DNAT rule in the test's network namespace plays its part for pods.
KUBERNETES_SERVICE = "10.0.0.1"
PAUSE_IMAGE = "registry.k8s.io/pause:3.10.2"
BUSYBOX_IMAGE = "evi.test/busybox:1"
CSI_DRIVER = "csi.evi.test"
STORAGE_CLASS = "evi-csi"
SYSCTLS = ["vm/overcommit_memory", "kernel/panic", "kernel/panic_on_oops"]
CGROUP_FS = Path("/sys/fs/cgroup")
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def in_test_namespace() -> bool:
    return bool(os.environ.get("EVI_NETNS")) and bool(os.environ.get("EVI_NODE_IP"))


def run(*cmd: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), check=True, capture_output=True, text=True, **kw)


# === the images the node needs beside the webhook's, without a registry or a Docker engine ===

def docker_archive(path: Path, tag: str, files: dict[str, tuple[bytes | str, int]], config: dict) -> Path:
    """Writes an image as `docker save` does (one layer): `files` maps a path in the image to
    its bytes and mode, or to a symlink target (a str) and 0."""
    layer = io.BytesIO()
    with tarfile.open(fileobj=layer, mode="w") as t:
        dirs = sorted({str(Path(p).parent) for p in files} - {"."})
        for d in dirs:
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            t.addfile(info)
        for name, (content, mode) in sorted(files.items()):
            info = tarfile.TarInfo(name)
            if isinstance(content, str):
                info.type, info.linkname, info.mode = tarfile.SYMTYPE, content, 0o777
                t.addfile(info)
            else:
                info.size, info.mode = len(content), mode
                t.addfile(info, io.BytesIO(content))
    layer_bytes = layer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_bytes).hexdigest()
    image_config = json.dumps({
        "architecture": "amd64", "os": "linux", "config": config,
        "rootfs": {"type": "layers", "diff_ids": [diff_id]},
    }).encode()
    config_name = hashlib.sha256(image_config).hexdigest() + ".json"
    manifest = json.dumps([{"Config": config_name, "RepoTags": [tag], "Layers": ["layer.tar"]}]).encode()
    with tarfile.open(path, "w") as out:
        for name, data in (("layer.tar", layer_bytes), (config_name, image_config), ("manifest.json", manifest)):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            out.addfile(info, io.BytesIO(data))
    return path


def pause_image(workdir: Path, bindir: Path) -> Path:
    """Kubernetes' own pause container (build/pause/linux/pause.c of the module the control
    plane is built from), compiled static."""
    binary = workdir / "pause"
    run("gcc", "-Os", "-static", "-DVERSION=v3.10.2-evi", "-o", str(binary), str(bindir / "pause.c"))
    return docker_archive(workdir / "pause.tar", PAUSE_IMAGE, {"pause": (binary.read_bytes(), 0o755)},
                          {"Entrypoint": ["/pause"], "User": "65535:65535"})


def busybox_image(workdir: Path) -> Path:
    """The tasks' image: Debian's static busybox, every applet linked in /bin, and a /tmp."""
    busybox = Path(shutil.which("busybox") or "/usr/bin/busybox")
    applets = run(str(busybox), "--list").stdout.split()
    files: dict[str, tuple[bytes | str, int]] = {"bin/busybox": (busybox.read_bytes(), 0o755)}
    for a in applets:
        if a != "busybox":
            files[f"bin/{a}"] = ("busybox", 0)
    files["tmp/.keep"] = (b"", 0o644)
    return docker_archive(workdir / "busybox.tar", BUSYBOX_IMAGE, files,
                          {"Env": ["PATH=/bin"], "Cmd": ["/bin/sh"]})


# === the node ===

class Node:
    def __init__(self, cp: ControlPlane, workdir: Path):
        self.cp = cp
        self.dir = workdir
        self.dir.mkdir(parents=True, exist_ok=True)
        self.ip = os.environ.get("EVI_NODE_IP", "")
        self.procs: dict[str, subprocess.Popen] = {}
        self.sock = self.dir / "containerd" / "containerd.sock"
        # in-netns.sh names it, so that its own cleanup can find the pods' processes if this
        # process is killed before it stops them.
        self.cgroup_root = os.environ.get("EVI_CGROUP_ROOT") or f"evi-e2e-{os.getpid()}"
        self.sysctls: dict[str, str] = {}
        self.nat_rule: list[str] | None = None

    # --- start ---

    def start(self, timeout: float = 120) -> "Node":
        if not in_test_namespace():
            raise RuntimeError("the node runs only inside tests/e2e/in-netns.sh (EVI_NETNS unset)")
        started = time.monotonic()
        self.sysctls = {k: Path("/proc/sys", k).read_text().strip() for k in SYSCTLS}
        try:
            self._make_cgroup_root()
            self._start_containerd()
            for image in (pause_image(self.dir, self.cp.bin), busybox_image(self.dir)):
                self.import_image(image)
            self._route_kubernetes_service()
            self._share_kubelet_root()
            self._start_csi_driver()
            self._start_kubelet()
            self._start_scheduler()
            self._wait_ready(started + timeout)
            self._install_storage(started + timeout)
        except BaseException:
            self.stop(check=False)
            raise
        self.startup_seconds = time.monotonic() - started
        return self

    def ctr(self, *args: str) -> subprocess.CompletedProcess:
        return run("ctr", "--address", str(self.sock), "--namespace", "k8s.io", *args)

    def import_image(self, archive: Path) -> None:
        self.ctr("images", "import", "--no-unpack=false", str(archive))

    def use_registry(self, host: str) -> None:
        """Lets the kubelet's containerd pull from the run's own registry over plain HTTP (read
        at each pull: containerd's `config_path`)."""
        d = self.dir / "containerd" / "certs.d" / host
        d.mkdir(parents=True, exist_ok=True)
        (d / "hosts.toml").write_text(f'server = "http://{host}"\n[host."http://{host}"]\n'
                                      f'  capabilities = ["pull", "resolve"]\n')

    def images(self) -> set[str]:
        """The references containerd holds (names and digests)."""
        return {line.split()[0] for line in self.ctr("images", "ls").stdout.splitlines()[1:] if line.strip()}

    def _make_cgroup_root(self) -> None:
        """One cgroup per hierarchy for everything the kubelet runs (its `cgroupRoot`), so that
        stop can remove exactly what this run made."""
        for hierarchy in CGROUP_FS.iterdir():
            d = hierarchy / self.cgroup_root
            if not (hierarchy / "cgroup.procs").exists():
                continue
            d.mkdir(exist_ok=True)
            if hierarchy.name == "cpuset":
                for f in ("cpuset.cpus", "cpuset.mems"):
                    (d / f).write_text((hierarchy / f).read_text())

    def _start_containerd(self) -> None:
        d = self.dir / "containerd"
        (d / "net.d").mkdir(parents=True, exist_ok=True)
        (d / "net.d" / "10-evi.conflist").write_text(json.dumps({
            "cniVersion": "1.0.0", "name": "evi", "plugins": [{
                "type": "bridge", "bridge": "evi-cni0", "isGateway": True, "ipMasq": False,
                "hairpinMode": True,
                "ipam": {"type": "host-local", "ranges": [[{"subnet": POD_SUBNET}]],
                         "routes": [{"dst": "0.0.0.0/0"}], "dataDir": str(d / "ipam")},
            }]}))
        (d / "config.toml").write_text(f"""version = 2
root = "{d / 'root'}"
state = "{d / 'state'}"
[grpc]
  address = "{self.sock}"
[ttrpc]
  address = "{self.sock}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "{d / 'opt'}"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  # This machine lacks CAP_SYS_RESOURCE: without it runc fails every sandbox ("can't get
  # final child's PID from pipe") raising oom_score_adj.
  restrict_oom_score_adj = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{d / 'net.d'}"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "{d / 'certs.d'}"
""")
        env = dict(os.environ, PATH=PATH)
        self.procs["containerd"] = start_process(["containerd", "--config", str(d / "config.toml")],
                                                 self.dir / "containerd.log", env=env)
        containerd = {"containerd": self.procs["containerd"]}
        wait_for("containerd's socket", self.sock.exists, timeout=30, interval=0.1, procs=containerd,
                 log=lambda: self.log("containerd"))
        wait_for("containerd to answer", lambda: subprocess.run(["ctr", "--address", str(self.sock), "version"],
                                                                capture_output=True).returncode == 0,
                 timeout=30, procs=containerd, log=lambda: self.log("containerd"))

    def _route_kubernetes_service(self) -> None:
        port = self.cp.url.rsplit(":", 1)[1]
        self.nat_rule = ["PREROUTING", "-d", KUBERNETES_SERVICE, "-p", "tcp", "--dport", "443",
                         "-j", "DNAT", "--to-destination", f"{self.ip}:{port}"]
        run("iptables", "-t", "nat", "-A", *self.nat_rule)

    @property
    def kubelet_root(self) -> Path:
        return self.dir / "kubelet" / "root"

    @property
    def csi_data(self) -> Path:
        """Where the CSI driver keeps its volumes: `volumes/<id>` (provisioned) and `inline/<id>`."""
        return self.dir / "csi"

    def _start_csi_driver(self) -> None:
        socket = self.kubelet_root / "plugins" / CSI_DRIVER / "csi.sock"
        self.procs["csi-driver"] = start_process([
            str(self.cp.bin / "evi-csi-test-driver"), "--name", CSI_DRIVER, "--node-id", NODE_NAME,
            "--data-dir", str(self.csi_data), "--csi-socket", str(socket),
            "--registration-dir", str(self.kubelet_root / "plugins_registry"),
        ], self.dir / "csi-driver.log")
        wait_for("the CSI driver's socket", socket.exists, timeout=20, interval=0.1,
                 procs={"the CSI driver": self.procs["csi-driver"]}, log=lambda: self.log("csi-driver"))
        self.procs["csi-provisioner"] = start_process([
            str(self.cp.bin / "csi-provisioner"), "--csi-address", str(socket),
            "--kubeconfig", str(self.cp.kubeconfig), "--leader-election=false", "--v", "2",
        ], self.dir / "csi-provisioner.log")

    def _install_storage(self, deadline: float) -> None:
        """The driver's CSIDriver object (inline and persistent volumes, no attach) and a
        StorageClass provisioned by it, bound where the pod is scheduled; then waits until the
        kubelet has registered the driver (its CSINode lists it)."""
        objects = [
            {"apiVersion": "storage.k8s.io/v1", "kind": "CSIDriver", "metadata": {"name": CSI_DRIVER},
             "spec": {"attachRequired": False, "podInfoOnMount": True,
                      "volumeLifecycleModes": ["Persistent", "Ephemeral"]}},
            {"apiVersion": "storage.k8s.io/v1", "kind": "StorageClass", "metadata": {"name": STORAGE_CLASS},
             "provisioner": CSI_DRIVER, "reclaimPolicy": "Delete",
             "volumeBindingMode": "WaitForFirstConsumer", "parameters": {"tier": "scratch"}},
        ]
        kubectl = ["kubectl", "--kubeconfig", str(self.cp.kubeconfig)]
        subprocess.run([*kubectl, "apply", "-f", "-"], input=json.dumps({"apiVersion": "v1", "kind": "List",
                       "items": objects}), check=True, capture_output=True, text=True)

        def registered() -> bool:
            out = subprocess.run([*kubectl, "get", "csinode", NODE_NAME, "-o", "json"], capture_output=True, text=True)
            return out.returncode == 0 and any(d["name"] == CSI_DRIVER
                                               for d in json.loads(out.stdout)["spec"].get("drivers") or [])

        wait_for(f"the kubelet to register {CSI_DRIVER}", registered, timeout=max(0.0, deadline - time.monotonic()),
                 interval=0.3, procs=self.procs, log=lambda: self.log("csi-driver")[-2000:] + "\n" + self.log("kubelet"))

    def _share_kubelet_root(self) -> None:
        """The kubelet's root directory made a shared bind mount of itself before the kubelet
        starts. The kubelet does this itself when it is not one yet (a bind mount, then
        make-rshared) — but in a goroutine that races the podresources server, which creates
        its socket under the same directory and renames it into place: a rename that straddles
        the new mount fails with EXDEV ("invalid cross-device link") and the kubelet exits
        (kubelet 1.37, CI of 2026-12-04). Already shared, the kubelet leaves it alone. The
        mount is under the node's directory, so `_unmount` takes it away with the rest."""
        root = self.kubelet_root
        root.mkdir(parents=True, exist_ok=True)
        run("mount", "--bind", str(root), str(root))
        run("mount", "--make-rshared", str(root))

    def _start_kubelet(self) -> None:
        d = self.dir / "kubelet"
        d.mkdir(exist_ok=True)
        (d / "resolv.conf").write_text("")
        self.kubelet_port = free_port()
        (d / "config.yaml").write_text(json.dumps({
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": self.ip, "port": self.kubelet_port, "readOnlyPort": 0,
            "healthzBindAddress": "127.0.0.1", "healthzPort": free_port(),
            "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
            "authorization": {"mode": "AlwaysAllow"},
            # This machine has cgroup v1 (kubelet 1.35+ refuses it unless told).
            "failCgroupV1": False, "cgroupDriver": "cgroupfs", "cgroupRoot": f"/{self.cgroup_root}",
            "failSwapOn": False,
            "containerRuntimeEndpoint": f"unix://{self.sock}",
            "podLogsDir": str(d / "pod-logs"), "resolvConf": str(d / "resolv.conf"),
            # A shared test machine's disk is never "under pressure" for these tests, but a task
            # past its own emptyDir sizeLimit is evicted (local storage isolation is on).
            "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%",
                             "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "localStorageCapacityIsolation": True,
            "serializeImagePulls": False, "maxPods": 60,
            # The kubelet refreshes Secret and ConfigMap volumes on each pod sync.
            "syncFrequency": "10s",
        }))
        self.procs["kubelet"] = start_process([
            str(self.cp.bin / "kubelet"), "--config", str(d / "config.yaml"),
            "--kubeconfig", str(self.cp.kubeconfig), "--root-dir", str(self.kubelet_root),
            "--cert-dir", str(d / "pki"), "--node-ip", self.ip, "--hostname-override", NODE_NAME,
            "--register-with-taints", f"{TAINT['key']}=true:{TAINT['effect']}",
            "--v", "2",
        ], self.dir / "kubelet.log", env=dict(os.environ, PATH=PATH))

    def _start_scheduler(self) -> None:
        self.procs["kube-scheduler"] = start_scheduler(self.cp, self.dir / "kube-scheduler.log")

    def _wait_ready(self, deadline: float) -> None:
        def ready() -> bool:
            out = subprocess.run(["kubectl", "--kubeconfig", str(self.cp.kubeconfig), "get", "node", NODE_NAME,
                                  "-o", "json"], capture_output=True, text=True, check=True)
            conditions = {c["type"]: c for c in json.loads(out.stdout)["status"].get("conditions", [])}
            condition = conditions.get("Ready", {})
            if condition.get("status") != "True":
                raise RuntimeError(f"not Ready: {condition.get('message', '')}")
            return True

        wait_for("the node Ready", ready, timeout=max(0.0, deadline - time.monotonic()), interval=0.5,
                 procs=self.procs, log=lambda: self.log("kubelet"))

    def log(self, name: str) -> str:
        path = self.dir / f"{name}.log"
        return path.read_text(errors="replace") if path.exists() else ""

    # --- stop, and put the host back ---

    def _our_processes(self) -> list[int]:
        """containerd's shims and every process in this run's cgroups."""
        pids: set[int] = set()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                if (proc / "stat").read_text().rsplit(")", 1)[1].split()[0] == "Z":
                    continue  # dead, waiting for its parent to reap it
                cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")
                cgroups = (proc / "cgroup").read_text()
            except (OSError, IndexError):
                continue
            if str(self.sock).encode() in cmdline and b"containerd-shim" in cmdline:
                pids.add(int(proc.name))
            elif f"/{self.cgroup_root}/" in cgroups or cgroups.rstrip().endswith(f"/{self.cgroup_root}"):
                pids.add(int(proc.name))
        pids.discard(os.getpid())
        return sorted(pids)

    def _mounts(self) -> list[str]:
        prefix = str(self.dir.resolve())
        out = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                out.append(point)
        return out

    def stop(self, check: bool = True) -> list[str]:
        """Stops everything and puts the host back, step by step; returns (and with `check`,
        raises on) what could not be."""
        self._stop_pod_makers()
        self._kill_pods()
        self._stop_runtime()
        self._remove_nat_rule()
        self._unmount()
        problems = self._remove_cgroups()
        problems += self._restore_sysctls()
        problems += self._leftovers()
        if check and problems:
            raise RuntimeError("the node did not put the host back: " + "; ".join(problems))
        return problems

    def _stop_pod_makers(self) -> None:
        """The scheduler and the kubelet first: nothing starts a pod after this."""
        for name in ("kube-scheduler", "kubelet"):
            if name in self.procs:
                stop_process(self.procs.pop(name))

    def _kill_pods(self) -> None:
        """Every container and shim of this run, until none is left (20 s at most)."""
        deadline = time.monotonic() + 20
        while (pids := self._our_processes()) and time.monotonic() < deadline:
            for pid in pids:
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.5)

    def _stop_runtime(self) -> None:
        for name in ("csi-provisioner", "csi-driver", "containerd"):
            if name in self.procs:
                stop_process(self.procs.pop(name))

    def _remove_nat_rule(self) -> None:
        if self.nat_rule:
            subprocess.run(["iptables", "-t", "nat", "-D", *self.nat_rule], capture_output=True)
            self.nat_rule = None

    def _unmount(self) -> None:
        """Every mount under the node's directory, deepest first."""
        for point in sorted(self._mounts(), key=len, reverse=True):
            subprocess.run(["umount", "-l", point], capture_output=True)

    def _remove_cgroups(self) -> list[str]:
        problems: list[str] = []
        for hierarchy in CGROUP_FS.iterdir() if CGROUP_FS.exists() else []:
            root = hierarchy / self.cgroup_root
            if not root.is_dir():
                continue
            for d in sorted((p for p in root.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
                try:
                    d.rmdir()
                except OSError:
                    pass
            try:
                root.rmdir()
            except OSError as e:
                problems.append(f"cgroup {root} not removed: {e}")
        return problems

    def _restore_sysctls(self) -> list[str]:
        problems: list[str] = []
        for key, value in self.sysctls.items():
            path = Path("/proc/sys", key)
            if path.read_text().strip() != value:
                path.write_text(value)
            now = path.read_text().strip()
            if now != value:
                problems.append(f"sysctl {key} is {now}, was {value}")
        return problems

    def _leftovers(self) -> list[str]:
        """Processes and mounts still there after the steps above."""
        problems: list[str] = []
        left = self._our_processes()
        if left:
            names = []
            for pid in left:
                try:
                    names.append(f"{pid} {Path(f'/proc/{pid}/cmdline').read_bytes()[:80]!r}")
                except OSError:
                    names.append(str(pid))
            problems.append(f"processes left: {names}")
        mounts = self._mounts()
        if mounts:
            problems.append(f"mounts left: {mounts[:5]}")
        return problems
