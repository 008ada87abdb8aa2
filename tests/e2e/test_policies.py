"""The admission policies `ephemeral-volume-injector policies` compiles, against the webhook, in
the real API server (1.37): every case is created twice — in a namespace the webhook serves
and in one only the policies serve — and the pods the API server stores must be identical
(names, uids and the ServiceAccount token's generated volume name aside), or both must be
refused naming the same annotations. A case where they disagree fails.

The corpus is generated: every profile (each volume kind, a read-only mount, a variable) alone
and together, in five pod shapes (one container, two, a container that already sets the
variable or has mounts, an init container, a volume of its own), the whole value padded with
spaces; every refusal (an unknown profile, the inline forms the configuration does not allow,
a volume name that is not a DNS label, a profile without a mount path, too many volumes) alone
and mixed with good annotations; a Job's pod (generateName, from the job controller); and
reinvocation after a later policy adds a container."""

from __future__ import annotations

import contextlib
import copy
import difflib
import itertools
import json
import re
import subprocess

import pytest
import yaml
from conftest import BINARY, nextflow_job, pod, release_fixture, wait_for

P = "ephemeral-volumes.io"
WEBHOOK_NS = "parity-webhook"
POLICIES_NS = "parity-policies"
BOTH_NS = "parity-both"

CONFIG = {
    "profiles": {
        "scratch": {"mountPath": "/scratch", "env": ["TMPDIR"], "ephemeral": {"volumeClaimTemplate": {"spec": {
            "accessModes": ["ReadWriteOnce"], "storageClassName": "gp3",
            "resources": {"requests": {"storage": "200Gi"}}}}}},
        "shm": {"mountPath": "/dev/shm", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}},
        "secrets": {"mountPath": "/mnt/secrets", "readOnly": True,
                    "csi": {"driver": "secrets-store.csi.k8s.io", "readOnly": True,
                            "volumeAttributes": {"secretProviderClass": "vault-db"}}},
        "bare": {"emptyDir": {"sizeLimit": "2Gi"}},
        "nosize": {"mountPath": "/n", "emptyDir": {}},
        # Nextflow's disk directive: the size is the containers' ephemeral-storage request.
        "disk": {"mountPath": "/disk", "size": "request", "ephemeral": {"volumeClaimTemplate": {"spec": {
            "accessModes": ["ReadWriteOnce"], "storageClassName": "gp3"}}}},
        "side": {"mountPath": "/side", "containers": ["side"], "initContainers": True, "env": ["SIDE"],
                 "emptyDir": {"sizeLimit": "1Gi"}},
    },
    "policy": {"maxVolumesPerPod": 4, "types": ["emptyDir", "csi", "ephemeral"],
               "storageClasses": ["gp3", "standard"], "csiDrivers": ["secrets-store.csi.k8s.io"],
               "maxSize": {"emptyDir": "100Gi", "memory": "8Gi", "ephemeral": "1Ti"},
               "requireSizeLimit": True, "defaultSizeLimit": "4Gi"},
    # Matched by labels no other case's pod has (parity/*): by namespace and matchLabels, by
    # each operator of matchExpressions; a profile, key=value strings and a JSON source.
    "rules": [
        {"name": "nf-scratch", "namespaces": [WEBHOOK_NS, POLICIES_NS, BOTH_NS],
         "podSelector": {"matchLabels": {"parity/rule": "scratch"}}, "volumes": {"scratch": {"profile": "scratch"}}},
        {"name": "elsewhere", "namespaces": ["parity-elsewhere"],
         "podSelector": {"matchLabels": {"parity/rule": "scratch"}}, "volumes": {"never": {"profile": "shm"}}},
        {"name": "nf-shm", "podSelector": {"matchExpressions": [
            {"key": "parity/shm", "operator": "In", "values": ["yes", "on"]},
            {"key": "parity/off", "operator": "DoesNotExist"}]},
         "volumes": {"shm": "profile=shm,size=2Gi,env=SHM", "work": "type=emptyDir,mountPath=/work"}},
        {"name": "later", "podSelector": {"matchExpressions": [
            {"key": "parity/later", "operator": "Exists"}, {"key": "tier", "operator": "NotIn", "values": ["gold"]}]},
         "volumes": {"shm": {"profile": "shm"}, "cache": {"mountPath": "/cache", "emptyDir": {"sizeLimit": "3Gi"}}}},
        # A rule's volume into named containers: its own lists, and a profile's.
        {"name": "sidecar-only", "podSelector": {"matchLabels": {"parity/rule": "sidecar"}},
         "volumes": {"logs": "type=emptyDir,size=1Gi,mountPath=/logs,containers=side,initContainers=native,env=LOGS"}},
        {"name": "side-profile", "podSelector": {"matchLabels": {"parity/rule": "side"}},
         "volumes": {"sp": {"profile": "side"}}},
        # Sized by the containers' requests (Nextflow's disk directive), inline and by a profile.
        {"name": "nf-disk", "podSelector": {"matchLabels": {"parity/rule": "disk"}},
         "volumes": {"work": "type=emptyDir,mountPath=/work2,size=request", "big": {"profile": "disk"}}},
    ],
}
BOUNDS_NS = "parity-bounds"
VALUES = {"config": CONFIG, "webhook": {"excludeNamespaces": [POLICIES_NS, BOUNDS_NS]}}

release = release_fixture("evi-parity", VALUES)

GOOD = ["scratch", "shm", "secrets", " shm ", "nosize", "type=emptyDir,size=10Gi,mountPath=/scratch//a/./,env=TMPDIR;SCRATCH",
        "type=csi,driver=secrets-store.csi.k8s.io,attr.secretProviderClass=vault-db,mountPath=/mnt/secrets,readOnly=true"]
BAD = ["nope", "bare", "Scratch"]
# The key=value form: every field of each type, the policy's limits met.
KEY_VALUE = [
    "type=emptyDir,mountPath=/scratch",  # requireSizeLimit: the default size
    "type=emptyDir,medium=Memory,size=2Gi,mountPath=/dev/shm",
    "type=emptyDir,medium=Memory,mountPath=/dev/shm",  # in RAM, the default size too
    "type=emptyDir,size=1024Mi,mountPath=/s,readOnly=true,subPath=sub/dir",
    " type = emptyDir , size = 5Gi ,, mountPath = /s , ",
    "type=emptyDir,size=100Gi,mountPath=/s,readOnly=false",
    "type=ephemeral,size=100Gi,storageClass=gp3,accessMode=ReadWriteOncePod,mountPath=/scratch",
    "type=ephemeral,size=1Ti,storageClass=standard,mountPath=/scratch,env=TMPDIR",
    "type=csi,driver=secrets-store.csi.k8s.io,fsType=ext4,attr.a=1,attr.b.c=x=y,mountPath=/mnt/s",
    "type=csi,driver=secrets-store.csi.k8s.io,mountPath=/mnt/s,readOnly=false",
    # A profile with the fields an annotation may change.
    "profile=shm,size=2Gi",
    "profile=shm,mountPath=/x/,readOnly=true,subPath=a,env=A;B",
    "profile=scratch,size=300Gi",
    "profile=scratch,env=SCRATCH",
    "profile=bare,mountPath=/bare",
    "profile=nosize,size=3Gi",
    "profile=nosize",
    "profile=secrets,readOnly=false",
    "profile=secrets,mountPath=/s2",
]
# Refused either way, each naming the field (or the value) that is wrong.
KEY_VALUE_BAD = {
    "type=emptyDir,sizee=10Gi,mountPath=/s": "sizee",
    "type=emptyDir,size=10GB,mountPath=/s": "10GB",
    "type=emptyDir,size=0,mountPath=/s": "size",
    "type=emptyDir,size=-1Gi,mountPath=/s": "-1Gi",
    "type=emptyDir,size=200Gi,mountPath=/s": "maxSize.emptyDir",
    "type=emptyDir,medium=Memory,size=9Gi,mountPath=/s": "maxSize.memory",
    "type=emptyDir,medium=memory,mountPath=/s": '"memory"',
    "type=emptyDir,mountPath=scratch": '"scratch"',
    "type=emptyDir,mountPath=/": "mountPath",
    "type=emptyDir,mountPath=/a/../b": "..",
    "type=emptyDir,mountPath=/a:b": "/a:b",
    "type=emptyDir": "mountPath",
    "type=emptyDir,mountPath=": "mountPath",
    "type=emptyDir,size=1Gi,size=2Gi,mountPath=/s": "size is given twice",
    "type=emptyDir,storageClass=gp3,mountPath=/s": "storageClass does not apply",
    "type=emptyDir,mountPath=/s,readOnly=yes": "readOnly",
    "type=emptyDir,mountPath=/s,subPath=/abs": "/abs",
    "type=emptyDir,mountPath=/s,subPath=a/../../b": "subPath",
    "type=emptyDir,mountPath=/s,env=1BAD": "1BAD",
    "type=emptyDir,mountPath=/s,junk": "junk",
    "type=disk,mountPath=/s": '"disk"',
    "size=1Gi,mountPath=/s": "no volume source",
    "type=ephemeral,storageClass=gp3,mountPath=/s": "size",
    "type=ephemeral,size=10Gi,mountPath=/s": "storageClass",
    "type=ephemeral,size=10Gi,storageClass=io2,mountPath=/s": '"io2"',
    "type=ephemeral,size=2Ti,storageClass=gp3,mountPath=/s": "maxSize.ephemeral",
    "type=ephemeral,size=10Gi,storageClass=gp3,accessMode=RWO,mountPath=/s": '"RWO"',
    "type=ephemeral,size=10Gi,storageClass=Gp_3,mountPath=/s": '"Gp_3"',
    "type=csi,mountPath=/s": "driver",
    "type=csi,driver=ebs.csi.aws.com,mountPath=/s": "ebs.csi.aws.com",
    "type=csi,driver=secrets-store.csi.k8s.io,size=1Gi,mountPath=/s": "size does not apply",
    "type=csi,driver=secrets-store.csi.k8s.io,attr.=x,mountPath=/s": "attr.",
    "profile=secrets,size=1Gi": "size",
    "profile=shm,medium=Memory": "medium",
    "profile=shm,size=9Gi": "maxSize.memory",
    "profile=shm,size=0": "size",
    "profile=scratch,size=2Ti": "maxSize.ephemeral",
    "profile=bare": "mountPath",
    "profile=nope,mountPath=/x": '"nope"',
    "profile=shm,storageClass=gp3": "storageClass",
    "profile=shm,mountPath=relative": '"relative"',
}
# Served by the webhook only: the policies refuse them, naming the annotation (docs/policies.md).
WEBHOOK_ONLY = ['{"mountPath": "/x", "emptyDir": {}}']
SHAPES = {
    "one container": {},
    "two containers, the second already with the variable and a mount": {"containers": [
        {"name": "main", "image": "busybox"},
        {"name": "side", "image": "busybox", "env": [{"name": "TMPDIR", "value": "/mine"}],
         "volumeMounts": [{"name": "own", "mountPath": "/own"}]}],
        "volumes": [{"name": "own", "emptyDir": {}}]},
    "an init container": {"initContainers": [{"name": "init", "image": "busybox"}]},
    "no volumes of its own, no service account token": {"automountServiceAccountToken": False},
}


def cases():
    for (shape, spec), value in itertools.product(SHAPES.items(), GOOD):
        yield f"{value.strip()!r}, {shape}", {f"{P}/vol": value}, spec
    for value in KEY_VALUE:
        yield f"{value!r}", {f"{P}/vol": value}, {}
    for value, field in KEY_VALUE_BAD.items():
        yield f"refused: {value!r}", {f"{P}/vol": value}, {"field": field}
    yield "two profiles", {f"{P}/a": "scratch", f"{P}/b": "shm"}, {}
    yield "a profile and the key=value form", {f"{P}/a": "scratch", f"{P}/b": KEY_VALUE[1].replace("/dev/shm", "/b")}, {}
    yield "refused: the key=value form at a profile's mount path, spelt otherwise", \
        {f"{P}/a": "shm", f"{P}/b": "type=emptyDir,mountPath=/dev//shm/"}, {}
    yield "a volume of the pod's own by the name, the same settings in another spelling", \
        {f"{P}/own": "type=emptyDir,size=1Gi,mountPath=/o"}, {"volumes": [{"name": "own", "emptyDir": {"sizeLimit": "1024Mi"}}]}
    yield "refused: a volume of the pod's own by the name, another size", \
        {f"{P}/own": "type=emptyDir,size=2Gi,mountPath=/o"}, {"volumes": [{"name": "own", "emptyDir": {"sizeLimit": "1Gi"}}]}
    yield "three profiles", {f"{P}/tmp": "scratch", f"{P}/shm": "shm", f"{P}/db": "secrets"}, {}
    for value in BAD:
        yield f"refused: {value!r}", {f"{P}/vol": value}, {}
        yield f"refused: {value!r} beside a good one", {f"{P}/vol": value, f"{P}/ok": "shm"}, {}
    yield "refused: a volume name that is not a DNS label", {f"{P}/Bad": "shm"}, {}
    yield "refused: every mistake at once", {f"{P}/Bad": "shm", f"{P}/x": "nope", f"{P}/y": "bare"}, {}
    yield "refused: too many volumes", {f"{P}/v{i}": "shm" for i in range(5)}, {}
    yield "refused: more annotations than any pod may have", {f"{P}/v{i}": "shm" for i in range(65)}, {}
    yield "refused: one profile twice, at one mount path", {f"{P}/a": "shm", f"{P}/b": "shm"}, {}
    own_mount = {"containers": [{"name": "main", "image": "busybox",
                                 "volumeMounts": [{"name": "own", "mountPath": "/dev/shm"}]}],
                 "volumes": [{"name": "own", "emptyDir": {}}]}
    yield "refused: a mount of the pod's own at the mount path", {f"{P}/a": "shm"}, own_mount
    own_mount_spelt = copy.deepcopy(own_mount)
    own_mount_spelt["containers"][0]["volumeMounts"][0]["mountPath"] = "/dev//shm/./"
    yield "refused: a mount of the pod's own at the mount path, spelt otherwise", {f"{P}/a": "shm"}, own_mount_spelt
    yield "refused: a volume of the pod's own by the name, other settings", {f"{P}/own": "shm"}, \
        {"volumes": [{"name": "own", "emptyDir": {}}]}
    yield "a volume of the pod's own by the name, the same settings", {f"{P}/own": "shm"}, \
        {"volumes": [{"name": "own", "emptyDir": {"medium": "Memory", "sizeLimit": "1Gi"}}]}
    yield "no annotation of the prefix", {"other.example.com/x": "y"}, {}
    yield from rule_cases(own_mount)
    yield from container_cases()


# Two containers (the second with TMPDIR set and a mount of its own at /own), an init container
# and a native sidecar (an init container that keeps running).
CONTAINERS = {
    "containers": [{"name": "main", "image": "busybox"},
                   {"name": "side", "image": "busybox", "env": [{"name": "TMPDIR", "value": "/mine"}],
                    "volumeMounts": [{"name": "own", "mountPath": "/own"}]}],
    "initContainers": [{"name": "init", "image": "busybox"},
                       {"name": "native", "image": "busybox", "restartPolicy": "Always"}],
    "volumes": [{"name": "own", "emptyDir": {}}],
}


def with_requests(main: str, side: str | None, init: str) -> dict:
    """CONTAINERS with ephemeral-storage requests (what Nextflow's disk directive sets)."""
    spec = copy.deepcopy(CONTAINERS)
    for c, request in zip(spec["containers"] + spec["initContainers"][:1], (main, side, init), strict=True):
        if request:
            c["resources"] = {"requests": {"ephemeral-storage": request}}
    return spec


def request_cases():
    """size=request in the key=value form: the largest request of the targeted containers (init
    containers when named), spelt as the container spells it; none, over the cap, or on a CSI
    volume refused."""
    spec = with_requests("10G", "20Gi", "50Gi")
    for value in ["type=emptyDir,size=request,mountPath=/s",
                  "type=ephemeral,storageClass=gp3,size=request,mountPath=/s,containers=main",
                  "type=emptyDir,size=request,mountPath=/s,containers=main,initContainers=init"]:
        yield f"size=request: {value!r}", {f"{P}/vol": value}, spec
    yield "size=request: in memory", {f"{P}/vol": "type=emptyDir,medium=Memory,size=request,mountPath=/m,containers=side"}, \
        with_requests("10G", "2Gi", "")
    for value in ["disk", "profile=disk,containers=main", "profile=disk,size=5Gi", "profile=scratch,size=request",
                  "profile=shm,size=request,containers=side"]:
        yield f"size=request: {value!r}", {f"{P}/vol": value}, with_requests("10G", "2Gi", "")
    # CONTAINERS' containers have no request (the default pod's has one, as Nextflow's do).
    yield "refused: size=request: a profile's, no request", {f"{P}/vol": "disk"}, {
        **CONTAINERS, "field": "ephemeral-storage request"}
    yield "size=request: a rule's", {}, {**with_requests("10G", "2Gi", ""), "labels": {"parity/rule": "disk"}}
    yield "refused: size=request: a rule's, no request", {}, {**CONTAINERS, "labels": {"parity/rule": "disk"},
                                                             "field": "ephemeral-storage request"}
    yield "refused: size=request: a rule's, over the cap", {}, {**with_requests("200Gi", None, ""),
                                                               "labels": {"parity/rule": "disk"}, "field": "maxSize.emptyDir"}
    yield "refused: size=request: a profile's, over the cap", {f"{P}/vol": "disk"}, {
        **with_requests("2Ti", None, ""), "field": "maxSize.ephemeral"}
    yield "refused: size=request: a profile's with fields, over the cap", {f"{P}/vol": "profile=shm,size=request"}, {
        **with_requests("9Gi", None, ""), "field": "maxSize.memory"}
    yield "size=request: equal requests, the first one's spelling", {f"{P}/vol": "type=emptyDir,size=request,mountPath=/s"}, \
        with_requests("20480Mi", "20Gi", "")
    for value, spec, field in [
        ("type=emptyDir,size=request,mountPath=/s,containers=main", CONTAINERS, "container main has no"),
        ("type=emptyDir,size=request,mountPath=/s", CONTAINERS, "none of the containers"),
        ("type=emptyDir,size=request,mountPath=/s,containers=side", with_requests("10G", None, ""),
         "container side has no ephemeral-storage request"),
        ("type=emptyDir,size=request,mountPath=/s", with_requests("200Gi", None, ""), "maxSize.emptyDir"),
        ("type=emptyDir,medium=Memory,size=request,mountPath=/s", with_requests("9Gi", None, ""), "maxSize.memory"),
        ("type=csi,driver=secrets-store.csi.k8s.io,size=request,mountPath=/s", {}, "size"),
    ]:
        yield f"refused: size=request: {value!r}, {field}", {f"{P}/vol": value}, {**spec, "field": field}


def container_cases():
    """`containers` and `initContainers`: in the key=value form, a profile's own, a profile's
    overridden; each named one required; clashes only in a container both volumes go to."""
    for value in ["type=emptyDir,size=1Gi,mountPath=/s,containers=main",
                  "type=emptyDir,size=1Gi,mountPath=/s,containers= side ; main ,env=TMPDIR;SCRATCH",
                  "type=emptyDir,size=1Gi,mountPath=/s,initContainers=true,env=SCRATCH",
                  "type=emptyDir,size=1Gi,mountPath=/s,containers=main,initContainers=native",
                  "type=emptyDir,size=1Gi,mountPath=/s,initContainers=false",
                  "side", "profile=side,containers=main,initContainers=false", "profile=shm,containers=side,initContainers=init",
                  "type=emptyDir,size=1Gi,mountPath=/own,containers=main"]:
        yield f"targets: {value!r}", {f"{P}/vol": value}, CONTAINERS
    for value, field in {"type=emptyDir,mountPath=/s,containers=nope": '"nope"',
                         "type=emptyDir,size=1Gi,mountPath=/s,containers=": "containers is empty",
                         "type=emptyDir,mountPath=/s,containers=main;nope;gone": '"gone"',
                         "type=emptyDir,mountPath=/s,initContainers=setup": '"setup"',
                         "type=emptyDir,mountPath=/s,initContainers=maybe": '"maybe"',
                         "profile=side,containers=main;x": '"x"',
                         "type=emptyDir,mountPath=/own,containers=side": "/own"}.items():
        yield f"refused: targets: {value!r}", {f"{P}/vol": value}, {**CONTAINERS, "field": field}
    yield "refused: a profile's own container the pod does not have", {f"{P}/vol": "side"}, {"field": '"side"'}
    yield "targets: a rule's volume into named containers", {}, {**CONTAINERS, "labels": {"parity/rule": "sidecar"}}
    yield "targets: a rule's volume of a profile with its own containers", {}, {
        **CONTAINERS, "labels": {"parity/rule": "side"}}
    yield "refused: targets: a rule's volume for a container the pod does not have", {}, {
        "labels": {"parity/rule": "sidecar"}, "field": '"side"'}
    yield from request_cases()
    yield "targets: two volumes at one path in different containers", \
        {f"{P}/a": "type=emptyDir,mountPath=/x,containers=main", f"{P}/b": "type=emptyDir,mountPath=/x,containers=side"}, \
        CONTAINERS
    yield "refused: targets: two volumes at one path in one container", \
        {f"{P}/a": "type=emptyDir,mountPath=/x,containers=main", f"{P}/b": "type=emptyDir,mountPath=/x,containers=side;main"}, \
        CONTAINERS


def rule_cases(own_mount: dict):
    """The rules: which match (namespace, each selector operator), which gives a name (an
    annotation before a rule, the first rule before later ones), and their refusals."""
    scratch = {"parity/rule": "scratch"}
    yield "rule: by namespace and label, no annotation", {}, {"labels": scratch}
    yield "rule: beside an annotation", {f"{P}/vol": "shm"}, {"labels": scratch}
    yield "rule: an annotation of the rule's volume name wins", {f"{P}/scratch": "shm"}, {"labels": scratch}
    yield "refused: an annotation of a rule's volume name that is refused; the rule does not fill in", \
        {f"{P}/scratch": "nope"}, {"labels": scratch}
    yield "rule: matchExpressions In, a key=value profile and an inline volume", {}, {"labels": {"parity/shm": "on"}}
    yield "rule: matchExpressions DoesNotExist fails", {}, {"labels": {"parity/shm": "yes", "parity/off": ""}}
    yield "rule: the first matching rule gives a name", {}, {"labels": {"parity/shm": "yes", "parity/later": ""}}
    yield "rule: matchExpressions NotIn fails", {}, {"labels": {"parity/later": "", "tier": "gold"}}
    yield "rule: matchExpressions NotIn holds, a JSON source", {}, {"labels": {"parity/later": "x", "tier": "silver"}}
    yield "rule: in a pod with two containers and an init container", {f"{P}/vol": "secrets"}, {
        "labels": {"parity/shm": "yes"}, "initContainers": [{"name": "init", "image": "busybox"}],
        **SHAPES["two containers, the second already with the variable and a mount"]}
    yield "refused: an annotation at a rule volume's mount path", \
        {f"{P}/vol": "type=emptyDir,mountPath=/scratch/"}, {"labels": scratch}
    yield "refused: a rule volume at a mount of the pod's own", {}, {"labels": {"parity/shm": "yes"}, **own_mount}
    yield "refused: a rule volume and the pod's own volume of its name, other settings", {}, {
        "labels": scratch, "volumes": [{"name": "scratch", "emptyDir": {}}]}
    yield "refused: more volumes than the policy allows, the rules' counted", \
        {f"{P}/a": "type=emptyDir,mountPath=/a", f"{P}/b": "type=emptyDir,mountPath=/b",
         f"{P}/c": "type=emptyDir,mountPath=/c"}, {"labels": {"parity/shm": "yes"}}


CASES = list(cases())


@contextlib.contextmanager
def applied_policies(cluster, config: dict, name: str, namespaces, workdir):
    """The policies `policies` compiles from `config` under `name`, bound to `namespaces` only,
    applied for the block (then deleted); yields the objects. The caller waits for the API
    server to take them up: each policy in its own time, a second or two."""
    path = workdir / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    out = subprocess.run([str(BINARY), "policies", "--config", str(path), "--name", name],
                         capture_output=True, text=True, check=True)
    docs = [d for d in yaml.safe_load_all(out.stdout) if d]
    for d in docs:
        if d["kind"].endswith("Binding"):
            d["spec"]["matchResources"] = {"namespaceSelector": {"matchExpressions": [
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": list(namespaces)}]}}
    items = json.dumps({"apiVersion": "v1", "kind": "List", "items": docs})
    cluster.kubectl("apply", "-f", "-", input=items)
    try:
        yield docs
    finally:
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input=items)


def case_pod(namespace: str, annotations: dict, spec: dict) -> dict:
    """A case's pod: its annotations, its labels, the rest of `spec` over the pod's spec."""
    p = pod(namespace=namespace, annotations=annotations, labels=spec.get("labels"))
    p["spec"].update({k: v for k, v in copy.deepcopy(spec).items() if k not in ("field", "labels")})
    return p


@pytest.fixture(scope="module")
def policies(cluster, release, tmp_path_factory):
    """The compiled policies, bound to POLICIES_NS and BOTH_NS only (the webhook leaves the
    first alone)."""
    for ns in (WEBHOOK_NS, POLICIES_NS, BOTH_NS):
        cluster.namespace(ns)
    with applied_policies(cluster, CONFIG, "ephemeral-volume-injector", (POLICIES_NS, BOTH_NS),
                          tmp_path_factory.mktemp("policies")) as docs:
        probe = pod(namespace=POLICIES_NS, annotations={f"{P}/probe": "shm"})
        wait_for("the policies to take effect", lambda: "probe" in {
            v["name"] for v in json.loads(cluster.create(probe, "--dry-run=server").stdout)["spec"].get("volumes", [])},
            timeout=30, interval=0.5)
        wait_for("the policies to refuse", lambda: cluster.create(
            pod(namespace=POLICIES_NS, annotations={f"{P}/probe": "nope"}), "--dry-run=server",
            check=False).returncode != 0, timeout=30, interval=0.5)
        yield docs


def normalized(stored: dict) -> dict:
    """The pod without what differs by namespace and creation: names, uids, times, and the
    generated name of the ServiceAccount token's volume."""
    p = copy.deepcopy(stored)
    meta = p["metadata"]
    for k in ("name", "generateName", "namespace", "uid", "creationTimestamp", "resourceVersion", "managedFields",
              "ownerReferences"):
        meta.pop(k, None)
    for k in list(meta.get("labels", {})):
        if "controller-uid" in k or "job-name" in k:
            meta["labels"].pop(k)
    p.pop("status", None)
    text = json.dumps(p, sort_keys=True)
    return json.loads(re.sub(r"kube-api-access-[a-z0-9]{5}", "kube-api-access", text))


def assert_same(webhook: dict, policy: dict, label: str = "") -> None:
    """The two stored pods are one, or the failure shows where they differ (webhook → policies)."""
    a, b = (json.dumps(normalized(p), indent=1, sort_keys=True).splitlines() for p in (webhook, policy))
    diff = "\n".join(difflib.unified_diff(a, b, "webhook", "policies", lineterm="", n=2))
    assert not diff, f"{label}\n{diff}"


def without_token_mounts(stored: dict) -> dict:
    """The pod without the ServiceAccount token's mounts, whose place among the mounts is the
    API server's: it re-runs its ServiceAccount plugin when it reinvokes mutators, so where the
    mount lands depends on which mutator ran in which pass, not on what the injector did."""
    p = copy.deepcopy(stored)
    for c in p["spec"]["containers"]:
        c["volumeMounts"] = [m for m in c.get("volumeMounts", []) if not m["name"].startswith("kube-api-access")]
    return p


def named(message: str) -> set[str]:
    """The annotations and the rules' volumes a refusal names."""
    return {a or b for a, b in re.findall(
        rf"annotation ({re.escape(P)}/[A-Za-z0-9._-]+)|(rule [a-z0-9-]+, volume [a-z0-9-]+)", message)}


def both(cluster, annotations: dict, spec: dict, namespaces=(WEBHOOK_NS, POLICIES_NS)) -> tuple[
        subprocess.CompletedProcess, subprocess.CompletedProcess]:
    results = [cluster.create(case_pod(ns, annotations, spec), "--dry-run=server", check=False) for ns in namespaces]
    return results[0], results[1]


@pytest.mark.parametrize("label,annotations,spec", CASES, ids=[c[0] for c in CASES])
def test_the_policies_store_what_the_webhook_stores_or_refuse_what_it_refuses(cluster, release, policies, label,
                                                                            annotations, spec):
    webhook, policy = both(cluster, annotations, spec)
    # The corpus says what each case is: a case meant as a refusal is one.
    assert (webhook.returncode != 0) == label.startswith("refused"), (label, webhook.stderr)
    if webhook.returncode == 0:
        assert policy.returncode == 0, f"{label}: the webhook admits, the policies refuse:\n{policy.stderr}"
        assert_same(json.loads(webhook.stdout), json.loads(policy.stdout), label)
    else:
        assert policy.returncode != 0, f"{label}: the webhook refuses, the policies admit:\n{webhook.stderr}"
        assert "ValidatingAdmissionPolicy" in policy.stderr, policy.stderr
        assert named(policy.stderr) == named(webhook.stderr), (webhook.stderr, policy.stderr)
        for count in ("policy.maxVolumesPerPod allows 4", "a pod may ask for at most 64 volumes"):
            assert (count in webhook.stderr) == (count in policy.stderr), (webhook.stderr, policy.stderr)
        if "field" in spec:
            assert spec["field"] in webhook.stderr and spec["field"] in policy.stderr, (webhook.stderr, policy.stderr)


def test_the_corpus_covers_admissions_and_refusals(cluster, release, policies):
    """The corpus is not all one outcome: a parity of refusals alone would prove little."""
    outcomes = [both(cluster, a, s)[0].returncode == 0 for _, a, s in CASES]
    assert sum(outcomes) >= 30 and outcomes.count(False) >= 40, outcomes


@pytest.mark.parametrize("value", WEBHOOK_ONLY)
def test_what_only_the_webhook_serves_the_policies_refuse_naming_the_annotation_and_why(cluster, release, policies,
                                                                                      value):
    """The documented differences: a size from the containers' requests and
    the JSON form are served by the webhook and refused by the policies, naming the annotation
    and saying the webhook serves it."""
    webhook, policy = both(cluster, {f"{P}/vol": value}, {})
    assert webhook.returncode == 0, webhook.stderr
    assert policy.returncode != 0 and f"annotation {P}/vol: " in policy.stderr, policy.stderr
    assert "webhook" in policy.stderr.split(f"annotation {P}/vol: ")[1], policy.stderr


def test_a_jobs_pod_from_the_job_controller_is_the_same_either_way(cluster, release, policies):
    stored = []
    for ns in (WEBHOOK_NS, POLICIES_NS):
        cluster.create(nextflow_job("nf-parity", ns, {f"{P}/scratch": "scratch", f"{P}/shm": "shm"}))

        def job_pod(ns=ns):
            pods = cluster.get("pods", "-n", ns, "-l", "batch.kubernetes.io/job-name=nf-parity")["items"]
            return pods[0] if pods else None
        stored.append(wait_for(f"the Job's pod in {ns}", job_pod))
    webhook, policy = stored
    assert policy["metadata"]["generateName"] == "nf-parity-"
    assert policy["metadata"]["annotations"][f"injector.{P}/injected"] == "scratch,shm"
    assert_same(webhook, policy)


SIDECAR = {
    "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicy",
    "metadata": {"name": "parity-add-sidecar"},
    "spec": {
        "matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                 "operations": ["CREATE"], "resources": ["pods"]}]},
        "matchConditions": [{"name": "parity", "expression": "object.metadata.namespace.startsWith('parity-')"}],
        "failurePolicy": "Fail", "reinvocationPolicy": "IfNeeded",
        # Adds a container once the pod has been given its volumes: the injector is called
        # again (reinvocation) and must mount them into the new container too.
        "mutations": [{"patchType": "JSONPatch", "jsonPatch": {"expression":
            f"has(object.metadata.annotations) && 'injector.{P}/injected' in object.metadata.annotations"
            " && !object.spec.containers.exists(c, c.name == 'added')"
            " ? [JSONPatch{op: 'add', path: '/spec/containers/-',"
            " value: Object.spec.containers{name: 'added', image: 'busybox'}}] : []"}}],
    },
}


def test_reinvocation_after_a_later_mutator_adds_a_container_is_the_same_either_way(cluster, release, policies):
    binding = {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingAdmissionPolicyBinding",
               "metadata": {"name": "parity-add-sidecar"}, "spec": {"policyName": "parity-add-sidecar"}}
    items = json.dumps({"apiVersion": "v1", "kind": "List", "items": [SIDECAR, binding]})
    cluster.kubectl("apply", "-f", "-", input=items)
    try:
        def with_sidecar():
            webhook, policy = both(cluster, {f"{P}/tmp": "scratch"}, {})
            pods = [json.loads(r.stdout) for r in (webhook, policy)]
            return pods if all(len(p["spec"]["containers"]) == 2 for p in pods) else None
        webhook, policy = wait_for("the sidecar policy to take effect", with_sidecar, timeout=30, interval=1)
        added = policy["spec"]["containers"][1]
        assert {"name": "tmp", "mountPath": "/scratch"} in added["volumeMounts"], added
        assert {"name": "TMPDIR", "value": "/scratch"} in added["env"], added
        # The API server re-runs its ServiceAccount plugin when it reinvokes: the container the
        # sidecar policy adds in the same pass as the injector's policy gets the token's mount,
        # the one it adds after the webhook does not. That order is the API server's, not ours.
        assert_same(*map(without_token_mounts, (webhook, policy)))
    finally:
        cluster.kubectl("delete", "-f", "-", "--ignore-not-found", input=items)
        # The API server's policy informer lets go of it a moment later: the next tests must
        # not see its container.
        wait_for("the sidecar policy to be gone", lambda: all(
            len(json.loads(r.stdout)["spec"]["containers"]) == 1 for r in both(cluster, {f"{P}/tmp": "scratch"}, {})),
            timeout=30, interval=1)


@pytest.mark.parametrize("label,annotations,spec", [c for c in CASES if "container" in c[0] or "refused" in c[0]][::3])
def test_with_the_policies_and_the_webhook_both_on_a_pod_is_what_the_webhook_alone_makes(cluster, release, policies,
                                                                                      label, annotations, spec):
    """The move from one to the other (docs/policies.md): while both serve a
    namespace, the policies run first and the webhook finds everything there already."""
    webhook, together = both(cluster, annotations, spec, namespaces=(WEBHOOK_NS, BOTH_NS))
    assert (webhook.returncode == 0) == (together.returncode == 0), (webhook.stderr, together.stderr)
    if webhook.returncode == 0:
        assert_same(*(without_token_mounts(json.loads(r.stdout)) for r in (webhook, together)), label)


def workload(kind: str, namespace: str, annotations: dict, spec: dict) -> dict:
    """A Job (as Nextflow submits it), a CronJob or a Deployment whose pod template is the
    case's pod."""
    job = nextflow_job(None, namespace, annotations)
    job["spec"]["template"]["metadata"]["labels"].update(spec.get("labels", {}))
    job["spec"]["template"]["spec"].update({k: v for k, v in copy.deepcopy(spec).items() if k not in ("field", "labels")})
    if kind == "Job":
        return job
    template = job["spec"]["template"]
    if kind == "CronJob":
        return {"apiVersion": "batch/v1", "kind": "CronJob", "metadata": {"generateName": "nf-", "namespace": namespace},
                "spec": {"schedule": "0 0 * * *", "jobTemplate": {"spec": {"template": template}}}}
    template["metadata"]["labels"] = {**spec.get("labels", {}), "app": "parity"}
    template["spec"]["restartPolicy"] = "Always"
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"generateName": "nf-", "namespace": namespace},
            "spec": {"selector": {"matchLabels": {"app": "parity"}}, "template": template}}


# Every case as a Job; every other refusal as a CronJob and a Deployment too.
WORKLOAD_CASES = [("Job", *c) for c in CASES] + [
    (kind, *c) for c in [c for c in CASES if c[0].startswith("refused")][::2] for kind in ("CronJob", "Deployment")]


@pytest.mark.parametrize("kind,label,annotations,spec", WORKLOAD_CASES, ids=[f"{c[0]}: {c[1]}" for c in WORKLOAD_CASES])
def test_a_workload_whose_pods_would_be_refused_is_refused_itself_either_way(cluster, release, policies, kind, label,
                                                                          annotations, spec):
    """`/validate` and the workload policies: a Job (what Nextflow's Job mode watches), a
    CronJob or a Deployment is refused at its creation, naming the same annotations, when its
    pods would be; admitted otherwise."""
    webhook, policy = (cluster.create(workload(kind, ns, annotations, spec), "--dry-run=server", check=False)
                       for ns in (WEBHOOK_NS, POLICIES_NS))
    assert (webhook.returncode == 0) == (policy.returncode == 0), (label, webhook.stderr, policy.stderr)
    if webhook.returncode != 0:
        assert "ValidatingAdmissionPolicy 'ephemeral-volume-injector-" in policy.stderr, policy.stderr
        assert named(policy.stderr) == named(webhook.stderr), (webhook.stderr, policy.stderr)


def test_an_update_that_changes_a_deployments_template_is_checked_either_way(cluster, release, policies):
    """The template of an existing Deployment changed to ask for what is refused: refused by
    both; a change that leaves the template alone is not checked by either."""
    for ns in (WEBHOOK_NS, POLICIES_NS):
        d = workload("Deployment", ns, {f"{P}/tmp": "shm"}, {})
        d["metadata"] = {"name": "parity-update", "namespace": ns}
        cluster.create(d)
    results = []
    for ns in (WEBHOOK_NS, POLICIES_NS):
        asks = {f"{P}/tmp": "type=emptyDir,size=1Ti,mountPath=/t"}
        patch = json.dumps({"spec": {"template": {"metadata": {"annotations": asks}}}})
        results.append(cluster.kubectl("patch", "deployment", "parity-update", "-n", ns, "--type=merge", "-p", patch,
                                       "--dry-run=server", check=False))
        label = cluster.kubectl("label", "deployment", "parity-update", "-n", ns, "team=a", "--dry-run=server",
                                check=False)
        assert label.returncode == 0, label.stderr
    webhook, policy = results
    assert webhook.returncode != 0 and policy.returncode != 0, (webhook.stderr, policy.stderr)
    assert named(webhook.stderr) == named(policy.stderr) == {f"{P}/tmp"}
    assert "maxSize.emptyDir" in webhook.stderr and "maxSize.emptyDir" in policy.stderr


# The API server's limit on all of a pod's annotations together (keys and values).
ANNOTATIONS_LIMIT = 256 * 1024


@pytest.fixture(scope="module")
def unbounded_policies(cluster, tmp_path_factory):
    """The configuration's policies without maxVolumesPerPod (so that 64 annotations are all
    read), named apart and bound to BOUNDS_NS only."""
    config = copy.deepcopy(CONFIG)
    del config["policy"]["maxVolumesPerPod"]
    cluster.namespace(BOUNDS_NS)
    with applied_policies(cluster, config, "evi-bounds", [BOUNDS_NS], tmp_path_factory.mktemp("unbounded")):
        wait_for("the policies to take effect", lambda: cluster.create(
            pod(namespace=BOUNDS_NS, annotations={f"{P}/probe": "nope"}), "--dry-run=server", check=False).returncode != 0,
            timeout=30, interval=0.5)
        yield


def most_annotations() -> dict:
    """As many annotations as the API server accepts on one pod (short keys, empty values)."""
    out, total, i = {}, 0, 0
    while total + len(f"a{i:x}") <= ANNOTATIONS_LIMIT - 64:
        out[f"a{i:x}"] = ""
        total += len(f"a{i:x}")
        i += 1
    return out


def test_a_pod_with_the_most_annotations_that_asks_for_nothing_is_admitted_with_a_warning(cluster, release,
                                                                                       unbounded_policies):
    """Blast radius: a pod that asks for nothing is never refused, however many annotations it
    has; past the bound the policies read (the API server iterates a map of annotations in
    quadratic time) it is not looked at, and told so."""
    many = most_annotations()
    assert len(many) > 50_000
    p = pod(namespace=BOUNDS_NS, annotations=many)
    result = cluster.create(p, "--dry-run=server", check=False)
    assert result.returncode == 0, result.stderr[:2000]
    assert f"more than the 4096 the admission policies read: no {P}/* annotation of it is served" in result.stderr
    stored = json.loads(result.stdout)
    assert [v["name"] for v in stored["spec"].get("volumes", []) if not v["name"].startswith("kube-api-access")] == []
    assert f"injector.{P}/injected" not in stored["metadata"]["annotations"]


WORST = {
    "32 pairs of unknown fields": "a=b," * 31 + "a=b",
    "one field given 29 times": "type=emptyDir,mountPath=/s," + "size=1Gi," * 29,
    "490 variable names": "type=emptyDir,mountPath=/s,env=" + "A;" * 490,
    "990 empty variable names": "type=emptyDir,mountPath=/s,env=" + ";" * 990,
    "a CSI volume with 29 attributes": "type=csi,driver=secrets-store.csi.k8s.io,mountPath=/s," + ",".join(
        f"attr.k{j}=" + "v" * 20 for j in range(29)),
    "a mount path of 480 parts": "type=emptyDir,mountPath=/" + "a/" * 480,
    "1,024 pairs": "a=b," * 256,
    "a value of 200 KiB": "type=emptyDir,mountPath=/s,size=" + "9" * 200_000,
}


@pytest.mark.parametrize("label", list(WORST))
def test_the_worst_values_64_times_are_refused_naming_each_annotation_within_the_cost_limits(
        cluster, release, unbounded_policies, label):
    """The most annotations a pod may ask with (64), each the worst value of its kind cut at
    the policies' bound (1,024 characters, 32 pairs) or past it, within the API server's
    limit on a pod's annotations: refused naming each annotation, never with the API server's
    `cost limit exceeded` (which would name neither annotation nor field)."""
    value = WORST[label]
    count = 64 if len(value) <= 1024 else 1
    annotations = {f"{P}/v{i}": value[:1024] if count > 1 else value for i in range(count)}
    result = cluster.create(pod(namespace=BOUNDS_NS, annotations=annotations), "--dry-run=server", check=False)
    assert result.returncode != 0
    assert "cost" not in result.stderr, result.stderr[-600:]
    assert "ValidatingAdmissionPolicy 'evi-bounds'" in result.stderr, result.stderr[:600]
    assert f"annotation {P}/v0" in result.stderr, result.stderr[:600]


def test_the_webhook_is_sent_a_pod_with_more_annotations_than_the_api_server_iterates_and_decides_it(
        cluster, release):
    """The chart's matchConditions do not iterate a map of more than 4,096 annotations (the
    API server's CEL is quadratic in it): such a pod is sent to the webhook unread. One that
    asks among ~53,000 annotations is served; one that asks for nothing is admitted as it is."""
    many = most_annotations()
    many.popitem()
    asking = pod(namespace=WEBHOOK_NS, annotations={**many, f"{P}/tmp": "shm"})
    stored = json.loads(cluster.create(asking, "--dry-run=server").stdout)
    assert "tmp" in {v["name"] for v in stored["spec"]["volumes"]}
    assert stored["metadata"]["annotations"][f"injector.{P}/injected"] == "tmp"
    quiet = json.loads(cluster.create(pod(namespace=WEBHOOK_NS, annotations=many), "--dry-run=server").stdout)
    assert f"injector.{P}/injected" not in quiet["metadata"]["annotations"]


# The compiler's limit on one CEL expression (src/policies/mod.rs MAX_EXPRESSION).
MAX_EXPRESSION = 100_000


def test_the_compilers_expression_limit_is_the_api_servers_and_a_configuration_past_it_is_refused(cluster,
                                                                                                  tmp_path):
    """Each override repeats every expression that reads a limit, and each profile adds its
    checks: past the API server's limit on one expression it refuses the whole object when it
    is applied. The compiler refuses such a configuration first, naming the expression; the
    limit is the API server's own, to the character."""
    def policy(length: int) -> dict:
        literal = "x" * (length - len("'' != ''"))
        return {"apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingAdmissionPolicy",
                "metadata": {"name": f"evi-limit-{length}"},
                "spec": {"matchConstraints": {"resourceRules": [{"apiGroups": [""], "apiVersions": ["v1"],
                                                                 "operations": ["CREATE"], "resources": ["pods"]}]},
                         "validations": [{"expression": f"'{literal}' != ''"}]}}
    at = cluster.create(policy(MAX_EXPRESSION), "--dry-run=server", check=False)
    assert at.returncode == 0, at.stderr[-500:]
    past = cluster.create(policy(MAX_EXPRESSION + 1), "--dry-run=server", check=False)
    assert past.returncode != 0
    assert f"size: {MAX_EXPRESSION + 1}, limit {MAX_EXPRESSION}" in past.stderr, past.stderr[-500:]
    # Eight overrides of a small configuration: the policies' longest expression is past it.
    from test_policies_overrides import CONFIG as TEAMS
    config = copy.deepcopy(TEAMS)
    config["policyOverrides"] = [
        {**o, "name": f"{o['name']}-{i}", "namespaceSelector": {"matchLabels": {"team": f"t{i}"}}}
        for i, o in enumerate(TEAMS["policyOverrides"] * 2)]
    for o in config["policyOverrides"]:
        o.pop("namespaces", None)
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(config))
    out = subprocess.run([str(BINARY), "policies", "--config", str(path)], capture_output=True, text=True)
    assert out.returncode == 2, out.stderr
    assert out.stdout == ""
    refused = [line for line in out.stderr.splitlines() if line.startswith("  - policyOverrides: ")]
    assert refused and all(f"past the {MAX_EXPRESSION} the API server compiles" in line for line in refused), out.stderr
    assert any(line.startswith("  - policyOverrides: ValidatingAdmissionPolicy ephemeral-volume-injector spec.variables[")
               and "(problems).expression" in line and "(9 times)" in line for line in refused), out.stderr
