#!/usr/bin/env bash
# Faults under load: certificate rotation (kubelet Secret layout), configuration reload and
# SIGTERM while wrk runs, then slow and hostile clients while a normal client measures latency.
# Then the connection-exhaustion attacks at full scale: 4,096 holders of each shape against the
# default flags (cap 4096), with the normal client's latency, readiness and the peak RSS.
# Prints failed-request counts and latencies. Needs wrk, hey, curl, openssl, python3 (and the
# h2 package for the idle HTTP/2 shape: pip install h2).
#
#   bash benches/faults.sh      # DURATION=10 CONNS=25
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION="${DURATION:-10}"; CONNS="${CONNS:-25}"
export MIMALLOC_ARENA_EAGER_COMMIT=0
work="$(mktemp -d)"; trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
cargo build --release --quiet --bin ephemeral-volume-injector
BIN=target/release/ephemeral-volume-injector
. benches/common.sh
write_wrk_script "$work/post.lua"
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

# --- certificates in the kubelet layout ------------------------------------------------
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$work/ca.key" \
  -out "$work/ca.crt" -days 2 -subj /CN=faults-ca 2>/dev/null
leaf() { # n
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$work/l$1.key" \
    -out "$work/l$1.csr" -subj "/CN=gen-$1" 2>/dev/null
  printf 'subjectAltName=DNS:localhost,IP:127.0.0.1\n' > "$work/ext"
  openssl x509 -req -in "$work/l$1.csr" -CA "$work/ca.crt" -CAkey "$work/ca.key" -CAcreateserial \
    -out "$work/l$1.crt" -days 2 -extfile "$work/ext" 2>/dev/null
}
secret="$work/secret"; mkdir -p "$secret"
kubelet_write() { # n
  local ts="..2026_11_30_00_00_00.$1"
  mkdir "$secret/$ts"; cp "$work/l$1.crt" "$secret/$ts/tls.crt"; cp "$work/l$1.key" "$secret/$ts/tls.key"
  ln -sfn "$ts" "$secret/..data_tmp"; mv -T "$secret/..data_tmp" "$secret/..data"
  [ -L "$secret/tls.crt" ] || { ln -s ..data/tls.crt "$secret/tls.crt"; ln -s ..data/tls.key "$secret/tls.key"; }
}
for n in 1 2 3 4 5; do leaf $n; done
kubelet_write 1
printf 'profiles:\n  tmp: {mountPath: /a, emptyDir: {sizeLimit: 1Gi}}\n' > "$work/config.yaml"

start() {
  "$BIN" serve --drain-delay-seconds "$DURATION" --listen 127.0.0.1:443 --admin-listen 127.0.0.1:18080 \
    --tls-cert "$secret/tls.crt" --tls-key "$secret/tls.key" --config "$work/config.yaml" \
    --log-format json --log-level info 2>>"$work/server.log" &
  PID=$!
  until curl -s -o /dev/null --cacert "$work/ca.crt" -X POST --data-binary @"$BODY" https://localhost/mutate; do sleep 0.01; done
}
wrk_errors() { local e; e=$(awk '/Socket errors|Non-2xx/ {print}' "$1" | tr '\n' ' '); echo "${e:-0}"; }
# hey: a new TLS connection for every request, so handshakes happen throughout the fault.
hey_new_conns() { hey -z "${DURATION}s" -c 5 -disable-keepalive -m POST -T application/json -D "$BODY" https://localhost/mutate > "$1"; }
hey_total() { awk '/\[200\]/ {print $2}' "$1"; }
hey_errors() { local e; e=$(awk '/Error distribution/,0' "$1" | tail -n +2 | tr -s ' \n' ' '); echo "${e:-0}"; }
wrk_total() { awk '/requests in/ {print $1}' "$1"; }
metric() { curl -s localhost:18080/metrics | awk -v m="$1" '$1 == m {print $2}'; }

if [ -z "${ONLY_HOLDERS:-}" ]; then
echo "| fault during load | wrk keep-alive ($CONNS conns): requests | failed | hey new connection per request (5): requests | failed |"
echo "|---|---|---|---|---|"

# 1. Certificate rotation, four times during the run.
start
wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$work/post.lua" https://localhost/mutate > "$work/wrk1.txt" &
W=$!
hey_new_conns "$work/hey1.txt" &
H=$!
for n in 2 3 4 5; do sleep $(( DURATION / 5 )); kubelet_write $n; done
wait $W $H
served=$(echo | openssl s_client -connect 127.0.0.1:443 -servername localhost 2>/dev/null | openssl x509 -noout -subject)
echo "| certificate rotation x4 (now serving: ${served#subject=}; reloads ok: $(metric 'evi_certificate_reloads_total{outcome="success",reason=""}')) | $(wrk_total "$work/wrk1.txt") | $(wrk_errors "$work/wrk1.txt") | $(hey_total "$work/hey1.txt") | $(hey_errors "$work/hey1.txt") |"

# 2. Configuration reload: good, bad, good.
wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$work/post.lua" https://localhost/mutate > "$work/wrk2.txt" &
W=$!
hey_new_conns "$work/hey2.txt" &
H=$!
sleep $(( DURATION / 4 )); printf 'profiles:\n  tmp: {mountPath: /b, emptyDir: {sizeLimit: 1Gi}}\n' > "$work/config.yaml"
sleep $(( DURATION / 4 )); printf 'profiles: [this is not a map\n' > "$work/config.yaml"
sleep $(( DURATION / 4 )); printf 'profiles:\n  tmp: {mountPath: /c, emptyDir: {sizeLimit: 1Gi}}\n' > "$work/config.yaml"
wait $W $H
echo "| configuration reload good/bad/good (ok: $(metric 'evi_config_reloads_total{outcome="success",reason=""}'), refused: $(metric 'evi_config_reloads_total{outcome="failure",reason="invalid"}')) | $(wrk_total "$work/wrk2.txt") | $(wrk_errors "$work/wrk2.txt") | $(hey_total "$work/hey2.txt") | $(hey_errors "$work/hey2.txt") |"

# 3. SIGTERM mid-run; the drain delay outlasts the load, as endpoint removal would.
wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$work/post.lua" https://localhost/mutate > "$work/wrk3.txt" &
W=$!
hey_new_conns "$work/hey3.txt" &
H=$!
sleep $(( DURATION / 2 ))
kill -TERM "$PID"
t0=$(date +%s%N)
ready=$(curl -s -o /dev/null -w '%{http_code}' localhost:18080/readyz || true)
wait $W $H
status=0; wait "$PID" || status=$?
echo "| SIGTERM at ${DURATION}/2 s (readyz right after: $ready; exit status $status after $(( ($(date +%s%N) - t0) / 1000000 )) ms) | $(wrk_total "$work/wrk3.txt") | $(wrk_errors "$work/wrk3.txt") | $(hey_total "$work/hey3.txt") | $(hey_errors "$work/hey3.txt") |"

# 4. Slow and hostile clients while a normal client sends 200 requests/s.
start
normal() { hey -z "${DURATION}s" -c 4 -q 50 -m POST -T application/json -D "$BODY" https://localhost/mutate > "$1"; }
lat() { awk '/ 50% in/ {p50=$3} / 99% in/ {p99=$3} END {printf "p50 %.1f ms, p99 %.1f ms", p50*1000, p99*1000}' "$1"; }
normal "$work/quiet.txt"
python3 - "$DURATION" > "$work/attack.txt" 2>&1 <<'PY' &
import asyncio, ssl, sys, time
duration = float(sys.argv[1]); end = time.monotonic() + duration
ctx = ssl.create_default_context(); ctx.check_hostname = False; ctx.verify_mode = ssl.CERT_NONE
stats = {"idle": 0, "trickle": 0, "oversize_413": 0, "closed_by_server": 0}
async def idle():       # TCP connections that never send a byte
    while time.monotonic() < end:
        try:
            r, w = await asyncio.open_connection("127.0.0.1", 443); stats["idle"] += 1
            await asyncio.wait_for(r.read(1), end - time.monotonic()); stats["closed_by_server"] += 1
        except Exception: pass
async def trickle():    # TLS, then the request headers one byte every 300 ms
    while time.monotonic() < end:
        try:
            r, w = await asyncio.open_connection("127.0.0.1", 443, ssl=ctx, server_hostname="localhost"); stats["trickle"] += 1
            for b in b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n":
                w.write(bytes([b])); await w.drain(); await asyncio.sleep(0.3)
                if time.monotonic() > end: break
        except Exception: stats["closed_by_server"] += 1
async def oversize():   # 8 MiB bodies, as fast as possible
    body = b" " * (8 << 20)
    while time.monotonic() < end:
        try:
            r, w = await asyncio.open_connection("127.0.0.1", 443, ssl=ctx, server_hostname="localhost")
            w.write(b"POST /mutate HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body))
            w.write(body); await w.drain()
            if b" 413 " in await asyncio.wait_for(r.readline(), 5): stats["oversize_413"] += 1
            w.close()
        except Exception: pass
async def main():
    await asyncio.gather(*[idle() for _ in range(3000)], *[trickle() for _ in range(200)], *[oversize() for _ in range(4)])
asyncio.run(main()); print(stats)
PY
A=$!
sleep 1
normal "$work/attack-normal.txt"
wait $A || true
echo
echo "| normal client, 200 req/s | latency | errors |"
echo "|---|---|---|"
echo "| quiet | $(lat "$work/quiet.txt") | $(hey_errors "$work/quiet.txt") |"
echo "| with 3,000 idle TCP connections, 200 TLS clients trickling headers, 4 clients sending 8 MiB bodies | $(lat "$work/attack-normal.txt") | $(hey_errors "$work/attack-normal.txt") |"
echo "attackers: $(tail -1 "$work/attack.txt"); server peak RSS $(awk '/VmHWM/ {print $2}' /proc/$PID/status) KiB"
kill -TERM "$PID"; wait "$PID" || true

fi
normal() { hey -z "${DURATION}s" -c 4 -q 50 -m POST -T application/json -D "$BODY" https://localhost/mutate > "$1"; }
lat() { awk '/ 50% in/ {p50=$3} / 99% in/ {p99=$3} END {printf "p50 %.1f ms, p99 %.1f ms", p50*1000, p99*1000}' "$1"; }

# 5. Connection exhaustion at full scale: 4,096 holders of one shape (the default cap) while the
#    normal client sends 200 requests/s. With every slot held the webhook waits for one to free
#    and reports not ready; the bounds free them (header 5 s, body 10 s, HTTP/2 idle 60 s).
HOLD="${HOLD:-4096}"
echo
echo "| $HOLD holders (default flags) | normal client latency | errors | /readyz during | cut by the server |"
echo "|---|---|---|---|---|"
for shape in ${SHAPES:-h2-no-preface h1-no-body h1-trickle h2-idle}; do
  start
  python3 benches/holders.py "$shape" "$HOLD" "$(( DURATION + 4 ))" > "$work/hold-$shape.txt" 2>&1 &
  A=$!
  sleep 4
  ( for _ in 1 2 3; do sleep $(( DURATION / 3 )); curl -s -o /dev/null -w '%{http_code} ' localhost:18080/readyz; done ) > "$work/ready-$shape.txt" &
  R=$!
  normal "$work/hold-normal-$shape.txt"
  wait $A $R || true
  echo "| $shape | $(lat "$work/hold-normal-$shape.txt") | $(hey_errors "$work/hold-normal-$shape.txt") | $(cat "$work/ready-$shape.txt") | $(tail -1 "$work/hold-$shape.txt"); at cap $(metric 'evi_connections_at_capacity_total{port="webhook"}') times; RSS peak $(awk '/VmHWM/ {print $2}' /proc/$PID/status) KiB |"
  kill -TERM "$PID"; wait "$PID" || true
done
