#!/usr/bin/env bash
# Makes a CA and a serving certificate for the webhook Service, for tls.mode=existingSecret
# or for running the webhook locally with real files.
#
#   certs/gen-certs.sh [SERVICE] [NAMESPACE] [OUTDIR]
#
# Writes OUTDIR/ca.crt, ca.key, tls.crt, tls.key (keys are never committed: see .gitignore)
# and prints the kubectl and helm commands that use them.
set -euo pipefail
svc="${1:-ephemeral-volume-injector}"
ns="${2:-ephemeral-volume-injector}"
out="${3:-certs/out}"
days="${DAYS:-825}"
mkdir -p "$out"
umask 077

openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -sha256 \
  -keyout "$out/ca.key" -out "$out/ca.crt" -days 3650 \
  -subj "/CN=${svc}-ca" \
  -addext "basicConstraints=critical,CA:TRUE" \
  -addext "keyUsage=critical,keyCertSign,cRLSign" 2>/dev/null

openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -sha256 \
  -keyout "$out/tls.key" -out "$out/tls.csr" \
  -subj "/CN=${svc}.${ns}.svc" 2>/dev/null

cat > "$out/tls.ext" <<EXT
basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=DNS:${svc},DNS:${svc}.${ns},DNS:${svc}.${ns}.svc,DNS:${svc}.${ns}.svc.cluster.local,DNS:localhost,IP:127.0.0.1
EXT
openssl x509 -req -in "$out/tls.csr" -CA "$out/ca.crt" -CAkey "$out/ca.key" -CAcreateserial \
  -out "$out/tls.crt" -days "$days" -sha256 -extfile "$out/tls.ext" 2>/dev/null
rm -f "$out/tls.csr" "$out/tls.ext" "$out/ca.srl"

echo "wrote $out/{ca.crt,ca.key,tls.crt,tls.key} for ${svc}.${ns}.svc"
echo
echo "kubectl -n ${ns} create secret tls ${svc}-tls --cert=$out/tls.crt --key=$out/tls.key"
echo "helm install ${svc} charts/ephemeral-volume-injector -n ${ns} \\"
echo "  --set tls.mode=existingSecret --set tls.existingSecret=${svc}-tls \\"
echo "  --set tls.caBundle=\$(base64 -w0 < $out/ca.crt)"
