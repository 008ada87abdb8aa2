"""The Helm chart, rendered by the real helm binary and judged by the Kubernetes schema.

Run from the repository root: python3 -m pytest -q tests/chart
Needs helm (on PATH or $HELM), kubernetes-validate and PyYAML; the webhook binary is built
by `cargo build` first (target/debug/ephemeral-volume-injector).
"""

import base64
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "e2e"))
import certs  # noqa: E402 - the tests' one certificate helper, after the path above

CHART = ROOT / "charts" / "ephemeral-volume-injector"
BINARY = ROOT / "target" / "debug" / "ephemeral-volume-injector"
HELM = os.environ.get("HELM") or shutil.which("helm") or str(Path.home() / ".cache/evi-tools/bin/helm")
BUILTIN_KINDS = {
    "ClusterRole", "ClusterRoleBinding", "ConfigMap", "Deployment", "Job", "MutatingWebhookConfiguration", "Pod",
    "Role", "RoleBinding",
    "NetworkPolicy", "PodDisruptionBudget", "Secret", "Service", "ServiceAccount", "ValidatingWebhookConfiguration",
}

# The Nextflow installation the end-to-end tests install too.
NEXTFLOW_VALUES = yaml.safe_load((ROOT / "tests" / "data" / "nextflow-values.yaml").read_text())


def render(*args, values=None, kube_version="1.33.0", ns="evi-system", check=True):
    cmd = [HELM, "template", "evi", str(CHART), "-n", ns, "--kube-version", kube_version, *args]
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", prefix="values-") as file:
        if values is not None:
            file.write(yaml.safe_dump(values))
            file.flush()
            cmd += ["-f", file.name]
        p = subprocess.run(cmd, capture_output=True, text=True)
    if check:
        assert p.returncode == 0, p.stderr
        return [d for d in yaml.safe_load_all(p.stdout) if d]
    return p


def not_hooks(docs):
    return [d for d in docs if "helm.sh/hook" not in d["metadata"].get("annotations", {})]


def hooks(docs):
    return {(d["kind"], d["metadata"]["annotations"]["helm.sh/hook"]): d for d in docs
            if "helm.sh/hook" in d["metadata"].get("annotations", {})}


def by_kind(docs, kind):
    found = [d for d in docs if d["kind"] == kind]
    assert found, f"no {kind} rendered"
    return found


def webhook(docs):
    return by_kind(docs, "MutatingWebhookConfiguration")[0]["webhooks"][0]


def deployment(docs):
    return by_kind(docs, "Deployment")[0]


MODES = [
    ([], "helm"),
    (["--set", "tls.mode=selfManaged"], "selfManaged"),
    (["--set", "tls.mode=certManager"], "certManager"),
    (["--set", "tls.mode=existingSecret", "--set", "tls.existingSecret=my-tls",
      "--set", "tls.caBundle=" + base64.b64encode(b"-----BEGIN CERTIFICATE-----\n").decode()], "existingSecret"),
]


def test_app_version_is_the_crate_version_and_the_binary_reports_it():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    crate = re.search(r'^version = "([^"]+)"', (ROOT / "Cargo.toml").read_text(), re.M).group(1)
    assert chart["appVersion"] == crate
    out = subprocess.run([str(BINARY), "--version"], capture_output=True, text=True, check=True).stdout
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short=12", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    assert out.strip() == f"ephemeral-volume-injector {crate} (commit {commit or 'unknown'})"


def test_image_by_tag_or_pinned_by_digest():
    def image(docs):
        return deployment(docs)["spec"]["template"]["spec"]["containers"][0]["image"]

    repo = "ghcr.io/ephemeral-volume-injector/ephemeral-volume-injector"
    version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    assert image(render()) == f"{repo}:{version}"
    assert image(render("--set", "image.tag=dev")) == f"{repo}:dev"
    digest = "sha256:" + "0123456789abcdef" * 4
    assert image(render("--set", f"image.digest={digest}", "--set", "image.tag=dev")) == f"{repo}@{digest}"


def test_the_install_check_runs_after_install_and_upgrade_and_as_helm_test_with_dry_run_rights_only():
    docs = render("--set", "checkInstall.namespace=nf", "--set", "checkInstall.timeoutSeconds=20",
                  "--set", "image.digest=sha256:" + "ab" * 32)
    h = hooks(docs)
    job = h[("Job", "post-install,post-upgrade")]
    assert job["metadata"]["annotations"]["helm.sh/hook-delete-policy"] == "before-hook-creation,hook-succeeded"
    test_pod = h[("Pod", "test")]
    for spec in (job["spec"]["template"]["spec"], test_pod["spec"]):
        (c,) = spec["containers"]
        assert c["image"] == deployment(docs)["spec"]["template"]["spec"]["containers"][0]["image"]
        assert c["args"] == ["check-install", "--namespace=nf", "--prefix=ephemeral-volumes.io",
                             "--request=type=emptyDir,mountPath=/evi-install-check,size=1Mi", "--timeout-seconds=20"]
        assert c["terminationMessagePolicy"] == "FallbackToLogsOnError"
        assert c["securityContext"]["readOnlyRootFilesystem"] and spec["securityContext"]["runAsNonRoot"]
        assert spec["restartPolicy"] == "Never"
        assert spec["serviceAccountName"] == "evi-ephemeral-volume-injector-check-install"
    assert job["spec"]["backoffLimit"] == 0
    # No selector of the webhook's (Service, PDB, NetworkPolicy) picks a check pod.
    selector = by_kind(docs, "Service")[0]["spec"]["selector"]
    for labels in (job["spec"]["template"]["metadata"]["labels"], test_pod["metadata"]["labels"]):
        assert not selector.items() <= labels.items(), labels
    role = h[("Role", "post-install,post-upgrade,test")]
    assert role["metadata"]["namespace"] == "nf"
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["create"]},
                             {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": ["create"]}]
    binding = h[("RoleBinding", "post-install,post-upgrade,test")]
    assert binding["metadata"]["namespace"] == "nf"
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "evi-ephemeral-volume-injector-check-install",
                                    "namespace": "evi-system"}]
    # The workload webhook off (or a cluster before 1.28): the Job check is skipped.
    (c,) = hooks(render("--set", "webhook.workloads.enabled=false"))[("Job", "post-install,post-upgrade")][
        "spec"]["template"]["spec"]["containers"]
    assert c["args"][-1] == "--skip-workloads"
    assert not hooks(render("--set", "checkInstall.enabled=false"))
    assert ("Role", "post-install,post-upgrade,test") not in hooks(render("--set", "rbac.create=false"))


def test_host_network_serves_on_the_nodes_address_at_the_ports_given():
    spec = deployment(render())["spec"]["template"]["spec"]
    assert "hostNetwork" not in spec
    docs = render("--set", "hostNetwork=true", "--set", "server.port=10260", "--set", "server.adminPort=10261")
    spec = deployment(docs)["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True and spec["dnsPolicy"] == "ClusterFirstWithHostNet"
    (c,) = spec["containers"]
    assert {"--listen=0.0.0.0:10260", "--admin-listen=0.0.0.0:10261"} <= set(c["args"])
    assert [p["containerPort"] for p in c["ports"]] == [10260, 10261]
    assert by_kind(docs, "Service")[0]["spec"]["ports"][0]["targetPort"] == "https"


def test_helm_lint_strict():
    p = subprocess.run([HELM, "lint", "--strict", str(CHART)], capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    for mode in ("certManager", "selfManaged"):
        p = subprocess.run([HELM, "lint", "--strict", str(CHART), "--set", f"tls.mode={mode}"],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stdout + p.stderr


@pytest.mark.parametrize("kube_version", ["1.27.0", "1.29.0", "1.33.0", "1.37.0"])
@pytest.mark.parametrize("args,mode", MODES)
def test_every_rendered_manifest_is_valid_kubernetes(args, mode, kube_version):
    docs = render(*args, values=NEXTFLOW_VALUES, kube_version=kube_version)
    docs += render(*args, "--set", "metrics.serviceMonitor.enabled=true", "--set", "networkPolicy.enabled=true",
                   kube_version=kube_version)
    validated = 0
    for d in docs:
        if d["kind"] in BUILTIN_KINDS:
            kubernetes_validate.validate(d, kube_version, strict=True)
            validated += 1
    assert validated >= 7


def test_webhook_configuration_fields():
    w = webhook(render())
    assert w["admissionReviewVersions"] == ["v1"]
    assert w["sideEffects"] == "None"
    assert w["reinvocationPolicy"] == "IfNeeded"
    assert w["failurePolicy"] == "Fail"
    assert 1 <= w["timeoutSeconds"] <= 10
    assert w["rules"] == [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"],
                           "resources": ["pods"], "scope": "Namespaced"}]
    assert w["clientConfig"]["service"] == {"name": "evi-ephemeral-volume-injector", "namespace": "evi-system",
                                            "path": "/mutate", "port": 443}
    w = webhook(render("--set", "webhook.failurePolicy=Ignore", "--set", "webhook.timeoutSeconds=3"))
    assert (w["failurePolicy"], w["timeoutSeconds"]) == ("Ignore", 3)


def test_namespace_exclusions_cover_kube_system_and_the_release_namespace():
    w = webhook(render("--set", "webhook.excludeNamespaces={monitoring}", ns="platform"))
    exprs = w["namespaceSelector"]["matchExpressions"]
    assert exprs[0] == {"key": "kubernetes.io/metadata.name", "operator": "NotIn",
                        "values": ["kube-system", "platform", "monitoring"]}
    w = webhook(render(values={"webhook": {"namespaceSelector": {
        "matchLabels": {"team": "genomics"},
        "matchExpressions": [{"key": "env", "operator": "In", "values": ["prod"]}]}}}))
    assert w["namespaceSelector"]["matchLabels"] == {"team": "genomics"}
    assert len(w["namespaceSelector"]["matchExpressions"]) == 2


def test_match_conditions_send_only_pods_that_ask():
    w = webhook(render(values=NEXTFLOW_VALUES, kube_version="1.30.0"))
    assert "objectSelector" not in w
    (cond,) = w["matchConditions"]
    expr = cond["expression"]
    assert "object.metadata.annotations.exists(k, k.startsWith('ephemeral-volumes.io/'))" in expr
    # A map of more annotations than the API server iterates cheaply is sent without looking.
    assert "(size(object.metadata.annotations) > 4096 || object.metadata.annotations.exists(" in expr
    assert "request.namespace in ['nf-rules', 'nf-dev']" in expr
    assert "object.metadata.labels['nextflow.io/app'] == 'nextflow'" in expr
    assert "!(object.metadata.labels['tier'] in ['x'])" in expr
    assert expr.count("(") == expr.count(")")
    # The prefix follows the configuration.
    w = webhook(render("--set", "config.annotationPrefix=volumes.example.com"))
    assert "k.startsWith('volumes.example.com/')" in w["matchConditions"][0]["expression"]
    assert w["name"] == "volumes.volumes.example.com"


def test_old_clusters_fall_back_to_the_documented_object_selector():
    w = webhook(render(kube_version="1.27.0"))
    assert "matchConditions" not in w
    assert w["objectSelector"] == {"matchLabels": {"ephemeral-volumes.io/inject": "true"}}


def workload_webhooks(docs):
    return {w["name"].split(".")[0]: w for w in by_kind(docs, "ValidatingWebhookConfiguration")[0]["webhooks"]}


def test_the_workload_webhooks_cover_exactly_the_kinds_the_binary_checks_at_their_template():
    """The binary's table of pod controllers (`print-workloads`, from k8s-openapi's types) is
    the one source: every kind's (group, resource) is in exactly one workload webhook's rules,
    that webhook's CEL reads the template where the table says the kind keeps it, and no rule
    sends a resource the binary would not decide on (it would admit it unread)."""
    table = json.loads(subprocess.run([str(BINARY), "print-workloads"], capture_output=True, text=True,
                                      check=True).stdout)
    assert {w["kind"] for w in table} >= {"Job", "CronJob", "Deployment"}
    hooks = workload_webhooks(render())
    sent = {}
    for name, w in hooks.items():
        for rule in w["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    assert (group, resource) not in sent, f"{group}/{resource} in {sent[(group, resource)]} and {name}"
                    sent[(group, resource)] = name
    assert set(sent) == {(w["group"], w["resource"]) for w in table}
    for w in table:
        hook = hooks[sent[(w["group"], w["resource"])]]
        conditions = {c["name"]: c["expression"] for c in hook["matchConditions"]}
        cel = w["templateCel"]
        assert f"has({cel}.metadata)" in conditions["template-asks-for-volumes"], (w["kind"], cel)
        assert f"{cel}.metadata.annotations.exists(" in conditions["template-asks-for-volumes"], (w["kind"], cel)
        # The UPDATE condition compares the template's parent, at or above the template.
        changed = conditions["creates-or-changes-the-template"]
        parent = changed.rsplit(" != ", 1)[0].rsplit(" || ", 1)[1]
        assert cel.startswith(parent), (w["kind"], parent, cel)


def test_the_workload_webhook_is_scoped_like_the_pod_webhook():
    docs = render("--set", "webhook.excludeNamespaces={monitoring}", "--set", "webhook.failurePolicy=Ignore",
                  values=NEXTFLOW_VALUES, ns="platform")
    pods = webhook(docs)
    hooks = workload_webhooks(docs)
    assert set(hooks) == {"workloads", "cronjobs"}
    for w in hooks.values():
        assert w["namespaceSelector"] == pods["namespaceSelector"]
        assert (w["failurePolicy"], w["timeoutSeconds"]) == (pods["failurePolicy"], pods["timeoutSeconds"])
        assert w["clientConfig"]["service"]["path"] == "/validate"
        assert w["clientConfig"]["caBundle"] == pods["clientConfig"]["caBundle"]
        assert all(set(r["operations"]) == {"CREATE", "UPDATE"} for r in w["rules"])
        assert "reinvocationPolicy" not in w and "patchType" not in json.dumps(w)
    # The template's metadata, guarded so that the expression never fails to evaluate.
    expr = hooks["cronjobs"]["matchConditions"][1]["expression"]
    assert "object.spec.jobTemplate.spec.template.metadata.annotations.exists(k, k.startsWith('ephemeral-volumes.io/'))" in expr
    assert "object.spec.jobTemplate.spec.template.metadata.labels['nextflow.io/app'] == 'nextflow'" in expr
    assert "has(object.spec.jobTemplate.spec.template.metadata)" in expr
    # With webhook.url, the same address with /validate; or its own.
    docs = render("--set", "webhook.url=https://10.0.0.1:8443/mutate")
    assert {w["clientConfig"]["url"] for w in workload_webhooks(docs).values()} == {"https://10.0.0.1:8443/validate"}
    docs = render("--set", "webhook.url=https://10.0.0.1:8443/mutate", "--set", "webhook.workloads.url=https://h/v")
    assert {w["clientConfig"]["url"] for w in workload_webhooks(docs).values()} == {"https://h/v"}
    # A URL whose path cannot be turned into the workload webhook's is refused, not guessed:
    # the pod webhook's path would admit every workload without deciding.
    failed = render("--set", "webhook.url=https://10.0.0.1:8443/hook", check=False)
    assert failed.returncode != 0 and "webhook.workloads.url" in failed.stderr, failed.stderr
    assert render("--set", "webhook.url=https://10.0.0.1:8443/hook", "--set", "webhook.workloads.enabled=false")


def test_custom_workloads_are_sent_to_the_spec_template_webhook():
    """webhook.workloads.customResources adds rules to the webhook whose CEL reads
    spec.template (the binary decides a custom resource from there, as a Deployment); the
    schema takes only custom resources' groups."""
    rollouts = {"apiGroups": ["argoproj.io"], "resources": ["rollouts"]}
    docs = render(values={"webhook": {"workloads": {"customResources": [rollouts]}}})
    hooks = workload_webhooks(docs)
    rules = hooks["workloads"]["rules"]
    assert rules[-1] == {"apiGroups": ["argoproj.io"], "apiVersions": ["*"], "operations": ["CREATE", "UPDATE"],
                         "resources": ["rollouts"], "scope": "Namespaced"}
    assert rules[:-1] == workload_webhooks(render())["workloads"]["rules"]
    assert "argoproj.io" not in json.dumps(hooks["cronjobs"])
    for bad in [{"apiGroups": ["apps"], "resources": ["deployments"]},
                {"apiGroups": ["storage.k8s.io"], "resources": ["csidrivers"]},
                {"apiGroups": ["argoproj.io"]},
                {"apiGroups": ["argoproj.io"], "resources": ["Rollouts"]}]:
        failed = render(values={"webhook": {"workloads": {"customResources": [bad]}}}, check=False)
        assert failed.returncode != 0 and "customResources" in failed.stderr, (bad, failed.stderr)


def test_the_workload_webhook_needs_match_conditions_and_can_be_turned_off():
    # Without matchConditions (before 1.28) every workload would be sent: none is rendered.
    assert not [d for d in render(kube_version="1.27.0") if d["kind"] == "ValidatingWebhookConfiguration"]
    assert not [d for d in render("--set", "webhook.workloads.enabled=false")
                if d["kind"] == "ValidatingWebhookConfiguration"]


def test_workload_match_conditions_evaluate_as_the_api_server_would():
    """The workload webhook's CEL on Jobs, CronJobs and Deployments, CREATE and UPDATE."""
    import celpy

    hooks = workload_webhooks(render(values=NEXTFLOW_VALUES))

    def sent(hook, obj, old=None, namespace="nf-rules"):
        activation = {"object": celpy.json_to_cel(obj), "oldObject": celpy.json_to_cel(old),
                      "request": celpy.json_to_cel({"namespace": namespace,
                                                    "operation": "UPDATE" if old else "CREATE"})}
        return all(bool(cel_program(c["expression"]).evaluate(activation)) for c in hooks[hook]["matchConditions"])

    def job(meta):
        return {"spec": {"template": {"metadata": meta, "spec": {}}}}

    def cron(meta):
        return {"spec": {"jobTemplate": {"spec": {"template": {"metadata": meta, "spec": {}}}}}}

    asks = {"annotations": {"ephemeral-volumes.io/scratch": "ebs-200g"}}
    nextflow = {"labels": {"nextflow.io/app": "nextflow"}}
    for hook, shape in (("workloads", job), ("cronjobs", cron)):
        assert sent(hook, shape(asks), namespace="anywhere")
        assert sent(hook, shape(nextflow))
        assert not sent(hook, shape(nextflow), namespace="default")
        assert not sent(hook, shape({}))
        assert not sent(hook, shape({"annotations": {"other/x": "y"}}))
        # More annotations than the API server iterates cheaply: sent, the webhook decides.
        many = {f"other/x{i}": "" for i in range(4097)}
        assert sent(hook, shape({"annotations": many}), namespace="anywhere")
        assert not sent(hook, shape({"annotations": dict(list(many.items())[:4096])}), namespace="anywhere")
        # A template without metadata, or no template: not sent, and no evaluation error.
        assert not sent(hook, {"spec": {}})
        # UPDATE: sent only when the template changes.
        assert not sent(hook, shape(asks), old=shape(asks))
        assert sent(hook, shape(asks), old=shape({}))
        assert not sent(hook, shape({}), old=shape(asks))


def test_pod_security():
    d = deployment(render())
    spec = d["spec"]["template"]["spec"]
    assert d["spec"]["replicas"] >= 2
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert spec["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    # The token is there for the cluster checks only.
    assert spec["automountServiceAccountToken"] is True
    off = deployment(render("--set", "config.clusterChecks=off"))["spec"]["template"]["spec"]
    assert off["automountServiceAccountToken"] is False
    assert by_kind(render("--set", "config.clusterChecks=off"), "ServiceAccount")[0]["automountServiceAccountToken"] is False
    assert spec["nodeSelector"] == {"kubernetes.io/os": "linux"}
    assert spec["affinity"]["podAntiAffinity"]
    (c,) = spec["containers"]
    sc = c["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True
    assert sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]}
    assert "cpu" not in c["resources"].get("limits", {})
    assert c["resources"]["requests"]["cpu"]
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "admin"}
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "admin"}
    d = deployment(render("--set", "priorityClassName=system-cluster-critical"))
    assert d["spec"]["template"]["spec"]["priorityClassName"] == "system-cluster-critical"


def test_pod_disruption_budget():
    pdb = by_kind(render(), "PodDisruptionBudget")[0]
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == deployment(render())["spec"]["selector"]["matchLabels"]
    pdb = by_kind(render("--set", "podDisruptionBudget.maxUnavailable=1"), "PodDisruptionBudget")[0]
    assert pdb["spec"] == {"maxUnavailable": 1, "selector": pdb["spec"]["selector"]}
    assert not [d for d in render("--set", "podDisruptionBudget.enabled=false") if d["kind"] == "PodDisruptionBudget"]


def serve_flags():
    out = subprocess.run([str(BINARY), "serve", "--help"], capture_output=True, text=True, check=True).stdout
    return set(re.findall(r"--([a-z0-9-]+)", out))


def test_deployment_args_are_real_serve_flags():
    flags = serve_flags()
    (c,) = deployment(render())["spec"]["template"]["spec"]["containers"]
    assert c["args"][0] == "serve"
    for arg in c["args"][1:]:
        m = re.fullmatch(r"--([a-z0-9-]+)=(.*)", arg)
        assert m, f"{arg} is not --flag=value"
        assert m.group(1) in flags, f"{arg}: serve has no flag --{m.group(1)}"
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert f"--listen=0.0.0.0:{ports['https']}" in c["args"]
    assert f"--admin-listen=0.0.0.0:{ports['admin']}" in c["args"]
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    assert f"--tls-cert={mounts['tls']}/tls.crt" in c["args"]
    assert f"--config={mounts['config']}/config.yaml" in c["args"]
    # Every connection bound is a chart value.
    bounds = {"header-timeout-seconds", "body-timeout-seconds", "idle-timeout-seconds", "h2-idle-timeout-seconds",
              "max-connections", "max-connections-per-peer", "admin-max-connections", "admin-max-connections-per-peer",
              "admin-header-timeout-seconds", "admin-idle-timeout-seconds"}
    assert bounds <= flags
    set_by_chart = {re.fullmatch(r"--([a-z0-9-]+)=.*", a).group(1) for a in c["args"][1:]}
    assert bounds <= set_by_chart, bounds - set_by_chart


def test_configmap_passes_check_config(tmp_path):
    for values in (None, NEXTFLOW_VALUES):
        cm = by_kind(render(values=values), "ConfigMap")[0]
        path = tmp_path / "config.yaml"
        path.write_text(cm["data"]["config.yaml"])
        p = subprocess.run([str(BINARY), "check-config", str(path)], capture_output=True, text=True)
        assert p.returncode == 0, p.stderr
    parsed = yaml.safe_load(by_kind(render(values=NEXTFLOW_VALUES), "ConfigMap")[0]["data"]["config.yaml"])
    assert parsed["profiles"]["ebs-200g"]["mountPath"] == "/scratch"


def test_a_bad_configuration_in_values_is_caught_by_check_config(tmp_path):
    cm = by_kind(render(values={"config": {"profiles": {"x": {"mountPath": "/x", "emptyDir": {"sizeLimt": "1Gi"}}}}}),
                 "ConfigMap")[0]
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    p = subprocess.run([str(BINARY), "check-config", str(path)], capture_output=True, text=True)
    assert p.returncode == 1
    assert "profiles.x: unknown field emptyDir.sizeLimt" in p.stderr


@pytest.mark.parametrize("config,want", [
    ({"rules": [{"name": "r", "volumes": {"s": "type=emptyDir,size=1Gi"}}]},
     "rules[0] (r).volumes.s: no mountPath; every pod the rule matches would be denied"),
    ({"profiles": {"p": {"emptyDir": {}}}, "rules": [{"name": "r", "volumes": {"s": {"profile": "p"}}}]},
     "no mountPath: profile \"p\" does not set one"),
    ({"policy": {"requireSizeLimit": True, "maxSize": {"memory": "1Gi"}}},
     "policy.defaultSizeLimit 10Gi exceeds policy.maxSize.memory 1Gi"),
])
def test_configurations_that_would_deny_every_matching_pod_are_refused(tmp_path, config, want):
    cm = by_kind(render(values={"config": config}), "ConfigMap")[0]
    path = tmp_path / "config.yaml"
    path.write_text(cm["data"]["config.yaml"])
    p = subprocess.run([str(BINARY), "check-config", str(path)], capture_output=True, text=True)
    assert p.returncode == 1, p.stdout
    assert want in p.stderr, p.stderr


@pytest.mark.parametrize("config", [
    {"rules": [{"name": "r", "namespaces": [], "volumes": {"s": "type=emptyDir,mountPath=/s"}}]},
    {"rules": [{"name": "r", "volumes": {}}]},
])
def test_rules_that_match_or_inject_nothing_fail_the_schema(config):
    p = render(values={"config": config}, check=False)
    assert p.returncode != 0 and "schema" in p.stderr.lower(), p.stderr


def test_config_checksum_rolls_pods_only_without_hot_reload():
    annotations = deployment(render())["spec"]["template"]["metadata"].get("annotations") or {}
    assert "checksum/config" not in annotations
    a = deployment(render("--set", "hotReload=false"))["spec"]["template"]["metadata"]["annotations"]
    b = deployment(render("--set", "hotReload=false", values=NEXTFLOW_VALUES))["spec"]["template"]["metadata"]["annotations"]
    assert a["checksum/config"] != b["checksum/config"]


def test_tls_modes():
    docs = render()
    secret = by_kind(docs, "Secret")[0]
    assert secret["type"] == "kubernetes.io/tls"
    ca = secret["data"]["ca.crt"]
    assert webhook(docs)["clientConfig"]["caBundle"] == ca
    sans = certs.sans(base64.b64decode(secret["data"]["tls.crt"]))
    assert "evi-ephemeral-volume-injector.evi-system.svc" in sans
    assert "evi-ephemeral-volume-injector.evi-system.svc.cluster.local" in sans
    assert secret["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"

    docs = render("--set", "tls.mode=certManager")
    assert not [d for d in docs if d["kind"] == "Secret"]
    mwc = by_kind(docs, "MutatingWebhookConfiguration")[0]
    assert mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"] == "evi-system/evi-ephemeral-volume-injector-serving"
    serving = [d for d in docs if d["kind"] == "Certificate" and d["metadata"]["name"].endswith("-serving")][0]
    assert "evi-ephemeral-volume-injector.evi-system.svc.cluster.local" in serving["spec"]["dnsNames"]
    assert serving["spec"]["secretName"] == "evi-ephemeral-volume-injector-tls"

    (args,) = [a for a, mode in MODES if mode == "existingSecret"]
    docs = render(*args)
    assert not [d for d in docs if d["kind"] == "Secret"]
    assert webhook(docs)["clientConfig"]["caBundle"] == base64.b64encode(b"-----BEGIN CERTIFICATE-----\n").decode()
    vol = [v for v in deployment(docs)["spec"]["template"]["spec"]["volumes"] if v["name"] == "tls"][0]
    assert vol["secret"]["secretName"] == "my-tls"
    p = render("--set", "tls.mode=existingSecret", "--set", "tls.existingSecret=my-tls", check=False)
    assert p.returncode != 0 and "tls.caBundle" in p.stderr


def certificate_names(docs, mode):
    """The names the serving certificate of this render is for, in the chart's order."""
    if mode == "helm":
        (secret,) = [d for d in docs if d["kind"] == "Secret"]
        return certs.sans(base64.b64decode(secret["data"]["tls.crt"]))
    if mode == "certManager":
        (serving,) = [d for d in docs if d["kind"] == "Certificate" and d["metadata"]["name"].endswith("-serving")]
        return serving["spec"]["dnsNames"] + serving["spec"].get("ipAddresses", [])
    (arg,) = [a for a in deployment(docs)["spec"]["template"]["spec"]["containers"][0]["args"]
              if a.startswith("--tls-name=")]
    return arg.split("=", 1)[1].split(",")


@pytest.mark.parametrize("mode", ["helm", "certManager", "selfManaged"])
@pytest.mark.parametrize("url,host", [(None, None), ("https://10.0.0.7:8443/mutate", "10.0.0.7"),
                                      ("https://evi.example.org:8443/mutate", "evi.example.org")])
def test_every_tls_mode_issues_the_same_names_the_service_first_and_webhook_urls_host(mode, url, host):
    """One list of names (the evi.tlsNames helper) for the three modes whose certificate the
    chart shapes: the Service's name the API server checks first, then its other forms, then
    webhook.url's host. certManager used to leave the URL's host out: a webhook reached by
    URL then failed its TLS handshake."""
    docs = render("--set", f"tls.mode={mode}", *(["--set", f"webhook.url={url}"] if url else []))
    svc = "evi-ephemeral-volume-injector.evi-system.svc"
    expected = [svc, f"{svc}.cluster.local", "evi-ephemeral-volume-injector", "evi-ephemeral-volume-injector.evi-system"]
    assert certificate_names(docs, mode) == expected + ([host] if host else [])


def test_self_managed_tls_renders_the_same_bytes_every_time_with_no_key_and_no_ca_bundle():
    """Argo CD renders with `helm template` at every sync: nothing in the render may change
    between two runs, and nothing the webhook writes (keys, certificates, caBundle) is in it."""
    args = ["template", "evi", str(CHART), "-n", "evi-system", "--set", "tls.mode=selfManaged"]
    one, two = (subprocess.run([HELM, *args], capture_output=True, text=True, check=True).stdout for _ in range(2))
    assert one == two
    # The helm mode, for contrast, makes a new CA at every render (the problem this mode solves).
    helm_one, helm_two = (subprocess.run([HELM, *args[:-2]], capture_output=True, text=True, check=True).stdout
                          for _ in range(2))
    assert helm_one != helm_two
    assert "-----BEGIN" not in one and "caBundle:" not in one and "tls.key" not in one
    docs = [d for d in yaml.safe_load_all(one) if d]
    (secret,) = by_kind(docs, "Secret")
    assert secret["metadata"]["name"] == "evi-ephemeral-volume-injector-certs"
    assert secret["type"] == "Opaque" and "data" not in secret and "stringData" not in secret
    (c,) = deployment(docs)["spec"]["template"]["spec"]["containers"]
    assert "--tls-secret=evi-system/evi-ephemeral-volume-injector-certs" in c["args"]
    names = next(a for a in c["args"] if a.startswith("--tls-name="))
    assert names.split("=", 1)[1].split(",")[0] == "evi-ephemeral-volume-injector.evi-system.svc"
    assert "--mutating-webhook-configuration=evi-ephemeral-volume-injector" in c["args"]
    assert "--validating-webhook-configuration=evi-ephemeral-volume-injector" in c["args"]
    assert "--ca-lifetime=8760h" in c["args"] and "--ca-overlap=1h" in c["args"]
    assert not any(a.startswith("--tls-cert") for a in c["args"])
    assert "tls" not in {v["name"] for v in deployment(docs)["spec"]["template"]["spec"]["volumes"]}
    flags = serve_flags()
    for arg in c["args"][1:]:
        assert arg.split("=", 1)[0][2:] in flags, arg
    # Without the workload webhook, no validating configuration to manage.
    docs = render("--set", "tls.mode=selfManaged", "--set", "webhook.workloads.enabled=false")
    (c,) = deployment(docs)["spec"]["template"]["spec"]["containers"]
    assert not any(a.startswith("--validating-webhook-configuration") for a in c["args"])
    # webhook.url's host is a name of the certificate too.
    docs = render("--set", "tls.mode=selfManaged", "--set", "webhook.url=https://127.0.0.1:9443/mutate")
    (c,) = deployment(docs)["spec"]["template"]["spec"]["containers"]
    assert next(a for a in c["args"] if a.startswith("--tls-name=")).endswith(",127.0.0.1")


def test_self_managed_tls_rbac_names_its_own_secret_and_configurations_only():
    docs = render("--set", "tls.mode=selfManaged")
    roles = {d["metadata"]["name"]: d for d in docs if d["kind"] in ("Role", "ClusterRole")}
    role = roles["evi-ephemeral-volume-injector-certificates"]
    assert role["kind"] == "Role" and role["metadata"]["namespace"] == "evi-system"
    (rule,) = role["rules"]
    assert rule["resources"] == ["secrets"] and rule["resourceNames"] == ["evi-ephemeral-volume-injector-certs"]
    # Exactly the verbs the code uses: the Secret is watched and replaced, never patched.
    assert rule["verbs"] == ["get", "list", "watch", "update"]
    cluster = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-certificates")]
    (rule,) = cluster[0]["rules"]
    assert rule["resources"] == ["mutatingwebhookconfigurations", "validatingwebhookconfigurations"]
    assert rule["resourceNames"] == ["evi-ephemeral-volume-injector"]
    # The configurations are watched and JSON-patched, never replaced.
    assert rule["verbs"] == ["get", "list", "watch", "patch"]
    bindings = {d["roleRef"]["name"] for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")}
    assert "evi-ephemeral-volume-injector-certificates" in bindings
    assert not [d for d in render("--set", "tls.mode=selfManaged", "--set", "rbac.create=false")
                if d["kind"] in ("Role", "ClusterRole")]
    assert not [d for d in not_hooks(render()) if d["kind"] == "Role"], "other modes need no Secret access"


def test_webhook_url_points_the_api_server_outside_the_cluster():
    docs = render("--set", "webhook.url=https://127.0.0.1:9443/mutate")
    client = webhook(docs)["clientConfig"]
    assert client["url"] == "https://127.0.0.1:9443/mutate"
    assert "service" not in client
    # tls.mode=helm: the URL's host is in the generated certificate, IP or name.
    secret = by_kind(docs, "Secret")[0]
    for url, san in [("https://127.0.0.1:9443/mutate", "127.0.0.1"),
                     ("https://evi.dev.example.com/mutate", "evi.dev.example.com")]:
        docs = render("--set", f"webhook.url={url}")
        secret = by_kind(docs, "Secret")[0]
        sans = certs.sans(base64.b64decode(secret["data"]["tls.crt"]))
        assert san in sans, sans
        assert "evi-ephemeral-volume-injector.evi-system.svc" in sans
    assert "url" not in webhook(render())["clientConfig"]


@pytest.mark.parametrize("bad", [
    ["--set", "webhook.url=http://127.0.0.1:9443/mutate"],
    ["--set", "webhook.url=https://127.0.0.1:9443/mutate?x=1"],
    ["--set", "webhook.url=https://user@127.0.0.1/mutate"],
    ["--set", "replicaCount=0"],
    ["--set", "tls.mode=vault"],
    ["--set", "webhook.failurePolicy=Sometimes"],
    ["--set", "config.onError=ignore"],
    ["--set", "config.policy.maxSize.memory=lots"],
    ["--set", "config.policy.types={hostPath}"],
    ["--set", "resources.limits.cpu=1"],
    ["--set", "config.colour=red"],
    ["--set", "server.logFormat=xml"],
    ["--set", "config.clusterChecks=sometimes"],
    ["--set", "image.digest=sha256:abc"],
    ["--set", "image.digest=latest"],
])
def test_values_schema_rejects_wrong_values(bad):
    p = render(*bad, check=False)
    assert p.returncode != 0, f"{bad} was accepted"
    assert "values don't meet the specifications of the schema" in p.stderr or "schema" in p.stderr.lower(), p.stderr


def test_rbac_reads_csidrivers_and_storageclasses_only():
    docs = render()
    assert not [d for d in not_hooks(docs) if d["kind"] == "Role"]
    (role,) = by_kind(docs, "ClusterRole")
    assert role["rules"] == [{"apiGroups": ["storage.k8s.io"], "resources": ["csidrivers", "storageclasses"],
                              "verbs": ["get", "list", "watch"]}]
    (binding,) = by_kind(docs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "evi-ephemeral-volume-injector",
                                    "namespace": "evi-system"}]
    for args in (["--set", "config.clusterChecks=off"], ["--set", "rbac.create=false"]):
        assert not [d for d in render(*args) if d["kind"].startswith("ClusterRole")], args
    args = [a for a in deployment(docs)["spec"]["template"]["spec"]["containers"][0]["args"]]
    assert "--cluster-sync-timeout-seconds=30" in args


def test_service_monitor_and_network_policy():
    docs = render("--set", "metrics.serviceMonitor.enabled=true", "--set", "networkPolicy.enabled=true")
    sm = by_kind(docs, "ServiceMonitor")[0]
    assert sm["spec"]["endpoints"][0]["port"] == "metrics"
    np = by_kind(docs, "NetworkPolicy")[0]
    assert {p["port"] for rule in np["spec"]["ingress"] for p in rule["ports"]} == {8443, 8080}
    # Egress: the API server only, for the cluster checks; none at all without them.
    assert {p["port"] for rule in np["spec"]["egress"] for p in rule["ports"]} == {443, 6443}
    off = by_kind(render("--set", "networkPolicy.enabled=true", "--set", "config.clusterChecks=off"), "NetworkPolicy")[0]
    assert off["spec"]["egress"] == []
    svc = by_kind(docs, "Service")[0]
    assert {p["name"] for p in svc["spec"]["ports"]} == {"https", "metrics"}


def cel_program(expression):
    import celpy

    env = celpy.Environment()
    return env.program(env.compile(expression))


def admits(program, obj, namespace):
    import celpy

    result = program.evaluate({"object": celpy.json_to_cel(obj), "request": celpy.json_to_cel({"namespace": namespace})})
    return bool(result)


def test_match_conditions_evaluate_as_the_api_server_would():
    """The generated CEL, evaluated by a CEL implementation, on the pods that matter."""
    program = cel_program(webhook(render(values=NEXTFLOW_VALUES))["matchConditions"][0]["expression"])
    asks = {"metadata": {"annotations": {"ephemeral-volumes.io/scratch": "ebs-200g"}}}
    nextflow = {"metadata": {"labels": {"nextflow.io/app": "nextflow"}}}
    cases = [
        (asks, "anywhere", True),
        ({"metadata": {"annotations": {"example.com/other": "x", "injector.ephemeral-volumes.io/injected": "a"}}},
         "nf-rules", False),
        ({"metadata": {}}, "nf-rules", False),
        ({"metadata": {"annotations": {}}}, "anywhere", False),
        (nextflow, "nf-rules", True),
        (nextflow, "nf-dev", True),
        (nextflow, "default", False),
        ({"metadata": {"labels": {"nextflow.io/app": "nextflow", "tier": "x"}}}, "nf-rules", False),
        ({"metadata": {"labels": {"nextflow.io/app": "nextflow", "tier": "y"}}}, "nf-rules", True),
        ({"metadata": {"labels": {"nextflow.io/app": "other"}}}, "nf-rules", False),
    ]
    for obj, ns, want in cases:
        assert admits(program, obj, ns) is want, (obj, ns, want)


def test_a_rule_without_namespaces_or_selector_sends_every_pod():
    values = {"config": {"rules": [{"name": "all", "volumes": {"tmp": "type=emptyDir,mountPath=/tmp/x"}}]}}
    program = cel_program(webhook(render(values=values))["matchConditions"][0]["expression"])
    assert admits(program, {"metadata": {}}, "any")


def test_match_expressions_operators_evaluate_like_label_selectors():
    values = {"config": {"rules": [{"name": "r", "podSelector": {"matchExpressions": [
        {"key": "a", "operator": "In", "values": ["1", "2"]},
        {"key": "b", "operator": "Exists"},
        {"key": "c", "operator": "DoesNotExist"},
    ]}, "volumes": {"tmp": "type=emptyDir,mountPath=/tmp/x"}}]}}
    program = cel_program(webhook(render(values=values))["matchConditions"][0]["expression"])

    def labels(**kv):
        return {"metadata": {"labels": kv}}

    assert admits(program, labels(a="1", b=""), "x")
    assert not admits(program, labels(a="3", b=""), "x")
    assert not admits(program, labels(a="1"), "x")
    assert not admits(program, labels(a="1", b="", c="z"), "x")
    assert not admits(program, {"metadata": {}}, "x")


def test_the_notes_examples_work_when_copied(tmp_path):
    """Every annotation NOTES.txt shows, copied onto a pod as shown, is injected by the
    installation's own configuration (the profiles' examples, one at a time, as they say)."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(NEXTFLOW_VALUES))
    p = subprocess.run([HELM, "install", "evi", str(CHART), "-n", "evi-system", "--dry-run=client", "-f", str(values)],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    notes = p.stdout.split("NOTES:", 1)[1]
    # An example is a block of annotation lines, copied together.
    blocks = [re.findall(r'^\s+(ephemeral-volumes\.io/[a-z0-9-]+): "([^"]*)"$', block, re.M)
              for block in re.split(r"\n\s*\n", notes)]
    blocks = [b for b in blocks if b]
    assert [[k for k, _ in b] for b in blocks] == [["ephemeral-volumes.io/scratch"], ["ephemeral-volumes.io/ebs-200g"],
                                                   ["ephemeral-volumes.io/shm"],
                                                   ["ephemeral-volumes.io/vault-db"]], notes
    config = next(d for d in yaml.safe_load_all(p.stdout.split("NOTES:", 1)[0].split("MANIFEST:", 1)[1])
                  if d and d["kind"] == "ConfigMap" and d["metadata"]["name"].endswith("-config"))
    (tmp_path / "config.yaml").write_text(config["data"]["config.yaml"])
    for block in blocks:
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "t", "annotations": dict(block)},
               "spec": {"containers": [{"name": "main", "image": "busybox"}]}}
        out = subprocess.run([str(BINARY), "mutate", "--config", str(tmp_path / "config.yaml"), "-n", "default",
                              "-o", "json", "-"], input=json.dumps(pod), capture_output=True, text=True)
        assert out.returncode == 0, (block, out.stderr)
        assert [k.split("/")[1] for k, _ in block] == [v["name"] for v in json.loads(out.stdout)["spec"]["volumes"]]


@pytest.mark.parametrize("level,ok", [("info", True), ("info,evi=debug", True), ("evi::server=trace", True),
                                      ("verbose", False), ("info,", False), ("evi=loud", False)])
def test_the_schema_refuses_a_log_level_the_webhook_would_refuse(level, ok):
    """The same rule as `serve --log-level`: a bare word would be a tracing target and log nothing."""
    p = render("--set-string", f"server.logLevel={level.replace(',', chr(92) + ',')}", check=False)
    assert (p.returncode == 0) == ok, p.stderr
    if ok:
        (c,) = deployment([d for d in yaml.safe_load_all(p.stdout) if d])["spec"]["template"]["spec"]["containers"]
        assert f"--log-level={level}" in c["args"], c["args"]
    else:
        assert "/server/logLevel" in p.stderr, p.stderr


def test_an_inflight_body_budget_below_the_body_limit_is_refused_as_the_webhook_refuses_it():
    """`serve` exits 2 on it (tests/cli.rs): the chart fails the render instead of a crash loop."""
    p = render("--set", "server.maxInflightBodyBytes=1048576", check=False)
    assert p.returncode != 0
    assert "server.maxInflightBodyBytes (1048576) must be at least server.maxBodyBytes (4194304)" in p.stderr, p.stderr
    (c,) = deployment(render())["spec"]["template"]["spec"]["containers"]
    assert "--max-inflight-body-bytes=8388608" in c["args"], c["args"]


def test_policy_overrides_by_label_grant_the_namespace_watch_and_nothing_else():
    """An override with a namespaceSelector makes the webhook read Namespaces: the chart grants
    list and watch on them (and the token, with the cluster checks off); by name only, nothing."""
    by_label = [{"name": "team-a", "namespaceSelector": {"matchLabels": {"team": "a"}},
                 "policy": {"maxSize": {"emptyDir": "10Gi"}}}]
    by_name = [{"name": "team-b", "namespaces": ["b"], "policy": {"maxVolumesPerPod": 2}}]
    docs = render(values={"config": {"clusterChecks": "off", "policyOverrides": by_label + by_name}})
    (role,) = by_kind(docs, "ClusterRole")
    assert role["rules"][1:] == [{"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]}]
    assert deployment(docs)["spec"]["template"]["spec"]["automountServiceAccountToken"] is True
    config = yaml.safe_load(by_kind(docs, "ConfigMap")[0]["data"]["config.yaml"])
    assert config["policyOverrides"] == by_label + by_name
    docs = render(values={"config": {"policyOverrides": by_name}})
    (role,) = by_kind(docs, "ClusterRole")
    assert len(role["rules"]) == 1, role["rules"]
    assert not [d for d in render(values={"config": {"clusterChecks": "off", "policyOverrides": by_name}})
                if d["kind"].startswith("ClusterRole")]


@pytest.mark.parametrize("override", [
    {"name": "a", "policy": {}},                                                   # neither
    {"name": "a", "namespaces": ["x"], "namespaceSelector": {}, "policy": {}},     # both
    {"name": "a", "namespaces": ["x"]},                                            # no policy
    {"name": "A_b", "namespaces": ["x"], "policy": {}},                            # not a DNS label
    {"name": "a", "namespaces": ["x"], "policy": {"maxSize": {"disk": "1Gi"}}},    # unknown field
])
def test_the_schema_refuses_an_override_the_webhook_would_refuse(override):
    p = render("--set-json", f"config.policyOverrides=[{json.dumps(override)}]", check=False)
    assert p.returncode != 0 and "policyOverrides" in p.stderr, p.stderr


def policy_jobs(docs):
    return {d["metadata"]["name"].rsplit("-", 1)[1]: d for d in docs
            if d["kind"] == "Job" and "-policies-" in d["metadata"]["name"]}


def test_policies_mode_installs_the_policies_hook_instead_of_the_webhook():
    """policies.mode=policies: no Deployment, Service, certificate or webhook configuration; the
    configuration's ConfigMap, and hook Jobs that apply the compiled policies after install and
    upgrade and delete them before uninstall, with RBAC on those names only."""
    docs = render("--set", "policies.mode=policies", "--set", "tls.mode=certManager",
                  values={"webhook": {"excludeNamespaces": ["platform"]}}, kube_version="1.36.0")
    kinds = {d["kind"] for d in docs}
    assert not kinds & {"Deployment", "Service", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration",
                        "Certificate", "Issuer", "Secret", "PodDisruptionBudget", "Pod"}, kinds
    assert "ConfigMap" in kinds
    jobs = policy_jobs(docs)
    assert set(jobs) == {"apply", "delete"}
    apply, delete = (j["spec"]["template"]["spec"]["containers"][0] for j in (jobs["apply"], jobs["delete"]))
    assert apply["args"] == ["policies", "--name=evi-ephemeral-volume-injector",
                             "--config=/etc/evi/config/config.yaml", "--apply",
                             "--exclude-namespace=kube-system", "--exclude-namespace=evi-system",
                             "--exclude-namespace=platform"]
    assert delete["args"] == ["policies", "--name=evi-ephemeral-volume-injector", "--delete"]
    # Before the upgrade is applied: the policies serve before the webhook's objects go.
    assert jobs["apply"]["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert jobs["delete"]["metadata"]["annotations"]["helm.sh/hook"] == "pre-delete"
    # The new configuration, in a hook ConfigMap of its own (the release's is the old one then).
    config = jobs["apply"]["spec"]["template"]["spec"]["volumes"][0]["configMap"]["name"]
    hook_config, release_config = sorted(by_kind(docs, "ConfigMap"), key=lambda d: "helm.sh/hook" not in
                                         d["metadata"].get("annotations", {}))
    assert config == hook_config["metadata"]["name"] == "evi-ephemeral-volume-injector-policies-config"
    assert hook_config["metadata"]["annotations"]["helm.sh/hook"] == "pre-install,pre-upgrade"
    assert hook_config["data"] == release_config["data"]
    (role,) = [d for d in docs if d["kind"] == "ClusterRole" and d["metadata"]["name"].endswith("-policies")]
    named = [r for r in role["rules"] if "resourceNames" in r]
    assert named[0]["resourceNames"] == [f"evi-ephemeral-volume-injector{s}"
                                         for s in ("", "-workloads", "-cronjobs", "-bounds")]
    assert set(named[0]["verbs"]) == {"get", "patch", "delete"}
    assert [r["verbs"] for r in role["rules"] if "resourceNames" not in r] == [["create"]]


def test_both_mode_keeps_the_webhook_and_applies_the_policies_in_audit():
    docs = render("--set", "policies.mode=both", kube_version="1.37.2")
    assert by_kind(docs, "Deployment") and by_kind(docs, "MutatingWebhookConfiguration")
    assert "--audit" in policy_jobs(docs)["apply"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert policy_jobs(render()) == {}


def test_the_policies_hook_jobs_are_scheduled_as_the_webhooks_pods_are():
    """A hook Job that cannot be scheduled holds `helm install` until it times out: the hook
    pods take the chart's nodeSelector and tolerations, as the webhook's and the install
    check's do."""
    taint = {"key": "dedicated", "operator": "Equal", "value": "platform", "effect": "NoSchedule"}
    docs = render("--set", "policies.mode=policies", values={"nodeSelector": {"pool": "platform"},
                                                               "tolerations": [taint]}, kube_version="1.37.0")
    jobs = policy_jobs(docs)
    assert set(jobs) == {"apply", "delete"}
    for job in jobs.values():
        spec = job["spec"]["template"]["spec"]
        assert spec["nodeSelector"].get("pool") == "platform" and spec["tolerations"] == [taint], spec
    plain = policy_jobs(render("--set", "policies.mode=policies", kube_version="1.37.0"))
    assert all("tolerations" not in j["spec"]["template"]["spec"] for j in plain.values())


def test_the_policies_modes_are_refused_on_a_cluster_older_than_1_36():
    for mode in ("policies", "both"):
        failed = render("--set", f"policies.mode={mode}", kube_version="1.35.4", check=False)
        assert failed.returncode != 0
        assert f"policies.mode={mode} needs Kubernetes 1.36 or later" in failed.stderr, failed.stderr
    assert render("--set", "policies.mode=webhook", kube_version="1.35.4")
    bad = render("--set", "policies.mode=policy", kube_version="1.37.0", check=False)
    assert bad.returncode != 0 and "/policies/mode" in bad.stderr, bad.stderr


def test_the_policies_rendered_command_compiles_the_rendered_configuration(tmp_path):
    """The apply Job's command, run with the binary on the ConfigMap the chart renders (without
    --apply), prints the policies of the release's name."""
    assert NEXTFLOW_VALUES["config"]["rules"]  # the rules compiled too
    docs = render("--set", "policies.mode=policies", values={"config": NEXTFLOW_VALUES["config"]}, kube_version="1.37.0")
    configmap = next(d for d in by_kind(docs, "ConfigMap") if d["metadata"]["name"].endswith("-policies-config"))
    path = tmp_path / "configmap.yaml"
    path.write_text(yaml.safe_dump(configmap))
    args = policy_jobs(docs)["apply"]["spec"]["template"]["spec"]["containers"][0]["args"]
    args = [f"--config={path}" if a.startswith("--config=") else a for a in args if a != "--apply"]
    out = subprocess.run([str(BINARY), *args], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    names = {d["metadata"]["name"] for d in yaml.safe_load_all(out.stdout) if d}
    assert names == {"evi-ephemeral-volume-injector", "evi-ephemeral-volume-injector-workloads",
                     "evi-ephemeral-volume-injector-cronjobs", "evi-ephemeral-volume-injector-bounds"}
