#!/usr/bin/env python3
"""Seeds fuzz/corpus/{annotation,config,review} from the test fixtures (run from the repo root)."""
import glob
import hashlib
import json
import os
import re

import yaml


def put(kind, content):
    data = content if isinstance(content, bytes) else content.encode()
    os.makedirs(f"fuzz/corpus/{kind}", exist_ok=True)
    with open(f"fuzz/corpus/{kind}/{hashlib.sha1(data).hexdigest()[:16]}", "wb") as f:
        f.write(data)


for path in glob.glob("tests/golden/*/input.*"):
    obj = yaml.safe_load(open(path))
    if obj.get("kind") != "Pod":
        template = obj["spec"].get("template") or obj["spec"]["jobTemplate"]["spec"]["template"]
        obj = {"apiVersion": "v1", "kind": "Pod", "metadata": template.get("metadata", {}), "spec": template["spec"]}
    for value in (obj.get("metadata", {}).get("annotations") or {}).values():
        put("annotation", value)
    put("review", json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u", "kind": {"group": "", "version": "v1", "kind": "Pod"},
                    "operation": "CREATE", "namespace": "nf", "object": obj}}))
put("review", open("tests/data/review.json").read())
for path in ["tests/data/config.yaml", "tests/data/config-warn.yaml"]:
    put("config", open(path).read())
for literal in re.findall(r'\("((?:type|profile|\{)[^"\\]*(?:\\.[^"\\]*)*)", "', open("src/annotation/mod.rs").read()):
    put("annotation", literal.encode().decode("unicode_escape"))
print({k: len(os.listdir(f"fuzz/corpus/{k}")) for k in ["annotation", "config", "review"]})
