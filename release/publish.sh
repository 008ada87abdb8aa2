#!/usr/bin/env bash
# Publishes what `make release` built: the image index (target/oci) and the chart, to an OCI
# registry, both signed with cosign, and the SBOM (target/sbom) attached to the image as a
# signed CycloneDX attestation. The end-to-end tests run this very script against the run's own
# registry; .github/workflows/release.yml runs it against the project's.
#
#   release/publish.sh --registry HOST[/PREFIX] [--chart-package FILE] [--key cosign.key]
#                      [--plain-http] [--no-tlog]
#
#   --registry       where to push: <registry>/ephemeral-volume-injector:<version> (the image
#                    index) and oci://<registry>/charts/ephemeral-volume-injector (the chart)
#   --chart-package  the chart as `helm package` made it (the release workflow's build job);
#                    without it, packaged here
#   --key            sign with this key (COSIGN_PASSWORD in the environment); without it cosign
#                    signs keyless (Sigstore's Fulcio certificate from the CI's OIDC identity)
#   --plain-http     a registry without TLS (tests only)
#   --no-tlog        no transparency log upload (tests only: no Rekor is reachable there)
#
# What it signs is what was built: the index's digest is computed here from the OCI layout
# (target/oci/index.json's own), and after the push the registry must serve exactly that
# digest under the tag — else it stops before signing anything (a registry, or a push racing
# on the tag, could otherwise have it sign someone else's index). Likewise the chart: the
# registry must serve the digest `helm push` computed. Signed and attested: the index (the
# SBOM as CycloneDX, the build as SLSA provenance v1) and the chart.
#
# Prints one JSON line: {"image": "<registry>/ephemeral-volume-injector@sha256:…",
# "chart": "oci://…/charts/ephemeral-volume-injector", "chartRef": "…@sha256:…",
# "chartDigest": "sha256:…", "version": …}.
# Needs crane, cosign, helm and python3 on PATH (make tools builds the first two).
set -euo pipefail
cd "$(dirname "$0")/.."

registry="" key="" chart_package="" plain_http=false tlog=true
while [ $# -gt 0 ]; do
  case "$1" in
    --registry) registry="${2:?--registry needs a value}"; shift 2 ;;
    --key) key="${2:?--key needs a value}"; shift 2 ;;
    --chart-package) chart_package="${2:?--chart-package needs a value}"; shift 2 ;;
    --plain-http) plain_http=true; shift ;;
    --no-tlog) tlog=false; shift ;;
    *) echo "publish.sh: unknown argument $1" >&2; exit 2 ;;
  esac
done
[ -n "$registry" ] || { echo "publish.sh: --registry is required" >&2; exit 2; }
version="$(awk -F'"' '/^version = / { print $2; exit }' Cargo.toml)"
chart_version="$(awk '$1 == "version:" { print $2; exit }' charts/ephemeral-volume-injector/Chart.yaml)"
[ -f target/oci/index.json ] || { echo "publish.sh: target/oci is missing (make images)" >&2; exit 2; }
[ -f target/sbom/ephemeral-volume-injector.cdx.json ] || { echo "publish.sh: the SBOM is missing (make sbom)" >&2; exit 2; }

crane_flags=() helm_flags=() cosign_flags=()
if $plain_http; then
  crane_flags+=(--insecure); helm_flags+=(--plain-http); cosign_flags+=(--allow-http-registry)
fi
sign_flags=("${cosign_flags[@]}" --yes)
verify_flags=("${cosign_flags[@]}")
if [ -n "$key" ]; then
  sign_flags+=(--key "$key"); verify_flags+=(--key "${key%.key}.pub")
fi
if ! $tlog; then
  # No transparency log: the signing config's Rekor is turned off, and so is its check.
  sign_flags+=(--tlog-upload=false --use-signing-config=false); verify_flags+=(--insecure-ignore-tlog)
fi

image="$registry/ephemeral-volume-injector"
chart_repo="$registry/charts/ephemeral-volume-injector"
# The index built here: an OCI layout's index.json is the index crane pushes, byte for byte.
digest="sha256:$(sha256sum target/oci/index.json | cut -d' ' -f1)"
crane push "${crane_flags[@]}" --index target/oci "$image:$version" >&2
served="$(crane digest "${crane_flags[@]}" "$image:$version")"
if [ "$served" != "$digest" ]; then
  echo "publish.sh: the registry serves $served under $image:$version, not the index built here ($digest): not signing" >&2
  exit 1
fi

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
if [ -z "$chart_package" ]; then
  helm package charts/ephemeral-volume-injector -d "$tmp" >&2
  chart_package="$tmp/ephemeral-volume-injector-$chart_version.tgz"
fi
push_out="$(helm push "$chart_package" "oci://$registry/charts" "${helm_flags[@]}" 2>&1)"
echo "$push_out" >&2
chart_digest="$(sed -n 's/^Digest: *\(sha256:[0-9a-f]\{64\}\).*/\1/p' <<<"$push_out")"
[ -n "$chart_digest" ] || { echo "publish.sh: helm push printed no digest" >&2; exit 1; }
served="$(crane digest "${crane_flags[@]}" "$chart_repo:$chart_version")"
if [ "$served" != "$chart_digest" ]; then
  echo "publish.sh: the registry serves $served under $chart_repo:$chart_version, not the chart pushed ($chart_digest): not signing" >&2
  exit 1
fi

# The build's provenance (SLSA v1): the source (repository, commit), the workflow run, and the
# digests built — each platform's image, the chart, the SBOM. In GitHub Actions from its
# variables; elsewhere from the checkout, with a local builder id.
python3 - "$tmp/provenance.json" "$digest" "$chart_digest" "$version" <<'PY'
import hashlib, json, os, pathlib, socket, subprocess, sys
out, digest, chart_digest, version = sys.argv[1:]
def git(*args):
    p = subprocess.run(["git", *args], capture_output=True, text=True)
    return p.stdout.strip() if p.returncode == 0 else ""
env = os.environ.get
server = env("GITHUB_SERVER_URL", "https://github.com")
repository = env("GITHUB_REPOSITORY")
repo_url = f"{server}/{repository}" if repository else (git("remote", "get-url", "origin") or "local")
commit = env("GITHUB_SHA") or git("rev-parse", "HEAD") or "unknown"
ref = env("GITHUB_REF") or git("symbolic-ref", "-q", "HEAD") or "HEAD"
if env("GITHUB_WORKFLOW_REF"):
    builder = f"{server}/{env('GITHUB_WORKFLOW_REF')}"
    invocation = f"{repo_url}/actions/runs/{env('GITHUB_RUN_ID')}/attempts/{env('GITHUB_RUN_ATTEMPT', '1')}"
else:
    builder, invocation = f"local:{socket.gethostname()}", ""
index = json.loads(pathlib.Path("target/oci/index.json").read_text())
byproducts = [{"name": "image " + ("{os}/{architecture}".format(**m["platform"]) if "platform" in m else m["digest"]),
               "digest": {"sha256": m["digest"].removeprefix("sha256:")}}
              for m in index["manifests"]]
byproducts.append({"name": "chart", "digest": {"sha256": chart_digest.removeprefix("sha256:")}})
sbom = pathlib.Path("target/sbom/ephemeral-volume-injector.cdx.json").read_bytes()
byproducts.append({"name": "sbom", "digest": {"sha256": hashlib.sha256(sbom).hexdigest()}})
predicate = {
    "buildDefinition": {
        "buildType": "https://github.com/ephemeral-volume-injector/ephemeral-volume-injector/release/v1",
        "externalParameters": {"repository": repo_url, "ref": ref, "version": version,
                               "workflow": ".github/workflows/release.yml", "target": "make release"},
        "resolvedDependencies": [{"uri": f"git+{repo_url}@{ref}", "digest": {"gitCommit": commit}}],
    },
    "runDetails": {
        "builder": {"id": builder},
        "metadata": {"invocationId": invocation} if invocation else {},
        "byproducts": byproducts,
    },
}
pathlib.Path(out).write_text(json.dumps(predicate, indent=2))
PY

# Signed by digest, never by tag: a tag can move, a digest names these bytes.
cosign sign "${sign_flags[@]}" "$image@$digest" >&2
cosign attest "${sign_flags[@]}" --type cyclonedx --predicate target/sbom/ephemeral-volume-injector.cdx.json \
  "$image@$digest" >&2
cosign attest "${sign_flags[@]}" --type slsaprovenance1 --predicate "$tmp/provenance.json" "$image@$digest" >&2
cosign sign "${sign_flags[@]}" "$chart_repo@$chart_digest" >&2
if [ -n "$key" ]; then
  # What every user runs first (README): the signatures and the attestations verify.
  cosign verify "${verify_flags[@]}" "$image@$digest" >/dev/null
  cosign verify-attestation "${verify_flags[@]}" --type cyclonedx "$image@$digest" >/dev/null
  cosign verify-attestation "${verify_flags[@]}" --type slsaprovenance1 "$image@$digest" >/dev/null
  cosign verify "${verify_flags[@]}" "$chart_repo@$chart_digest" >/dev/null
fi
printf '{"image": "%s@%s", "digest": "%s", "chart": "oci://%s", "chartRef": "%s@%s", "chartDigest": "%s", "version": "%s", "chartVersion": "%s"}\n' \
  "$image" "$digest" "$digest" "$chart_repo" "$chart_repo" "$chart_digest" "$chart_digest" "$version" "$chart_version"
