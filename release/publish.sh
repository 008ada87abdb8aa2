#!/usr/bin/env bash
# Publishes what `make release` built: the image index (target/oci) and the chart, to an OCI
# registry, both signed with cosign, and the SBOM (target/sbom) attached to the image as a
# signed CycloneDX attestation. The end-to-end tests run this very script against the run's own
# registry; .github/workflows/release.yml runs it against the project's.
#
#   release/publish.sh --registry HOST[/PREFIX] [--key cosign.key] [--plain-http] [--no-tlog]
#
#   --registry    where to push: <registry>/ephemeral-volume-injector:<version> (the image
#                 index) and oci://<registry>/charts/ephemeral-volume-injector (the chart)
#   --key         sign with this key (COSIGN_PASSWORD in the environment); without it cosign
#                 signs keyless (Sigstore's Fulcio certificate from the CI's OIDC identity)
#   --plain-http  a registry without TLS (tests only)
#   --no-tlog     no transparency log upload (tests only: no Rekor is reachable there)
#
# Prints one JSON line: {"image": "<registry>/ephemeral-volume-injector@sha256:…",
# "chart": "oci://…/charts/ephemeral-volume-injector", "chartDigest": "sha256:…", "version": …}.
# Needs crane, cosign and helm on PATH (make tools builds the first two).
set -euo pipefail
cd "$(dirname "$0")/.."

registry="" key="" plain_http=false tlog=true
while [ $# -gt 0 ]; do
  case "$1" in
    --registry) registry="${2:?--registry needs a value}"; shift 2 ;;
    --key) key="${2:?--key needs a value}"; shift 2 ;;
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
crane push "${crane_flags[@]}" --index target/oci "$image:$version" >&2
digest="$(crane digest "${crane_flags[@]}" "$image:$version")"

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
helm package charts/ephemeral-volume-injector -d "$tmp" >&2
push_out="$(helm push "$tmp/ephemeral-volume-injector-$chart_version.tgz" "oci://$registry/charts" "${helm_flags[@]}" 2>&1)"
echo "$push_out" >&2
chart_digest="$(sed -n 's/^Digest: *\(sha256:[0-9a-f]\{64\}\).*/\1/p' <<<"$push_out")"
[ -n "$chart_digest" ] || { echo "publish.sh: helm push printed no digest" >&2; exit 1; }

# Signed by digest, never by tag: a tag can move, a digest names these bytes.
cosign sign "${sign_flags[@]}" "$image@$digest" >&2
cosign attest "${sign_flags[@]}" --type cyclonedx --predicate target/sbom/ephemeral-volume-injector.cdx.json \
  "$image@$digest" >&2
cosign sign "${sign_flags[@]}" "$registry/charts/ephemeral-volume-injector@$chart_digest" >&2
if [ -n "$key" ]; then
  # What every user runs first (README): the signature and the attestation verify.
  cosign verify "${verify_flags[@]}" "$image@$digest" >/dev/null
  cosign verify-attestation "${verify_flags[@]}" --type cyclonedx "$image@$digest" >/dev/null
  cosign verify "${verify_flags[@]}" "$registry/charts/ephemeral-volume-injector@$chart_digest" >/dev/null
fi
printf '{"image": "%s@%s", "digest": "%s", "chart": "oci://%s/charts/ephemeral-volume-injector", "chartDigest": "%s", "version": "%s", "chartVersion": "%s"}\n' \
  "$image" "$digest" "$digest" "$registry" "$chart_digest" "$version" "$chart_version"
