#!/usr/bin/env bash
# Load benchmark: the webhook against the bare hyper+rustls baseline (benches/tls_baseline.rs),
# alternated ROUNDS times under the same load. Servers are pinned to core 0, the load generator
# to core 1. HTTP/1.1 keep-alive over TLS, CONNS connections, the review of
# tests/data/review.json (a Nextflow pod that asks for two volumes). The webhook runs as the
# chart runs it: JSON logs at info, one decision line per request.
#
#   bash benches/load.sh            # ROUNDS=6 DURATION=10 CONNS=25 RATE=1000
#   bash benches/load.sh --guard    # CI's short form: wrk only, ROUNDS=4 DURATION=3
#   BEFORE=path/to/older/binary bash benches/load.sh   # a third server alternated: before/after
#   BASE2=path/to/other/baseline bash benches/load.sh  # a second bare server alternated (e.g. one
#                                                      # built with a profile: release/pgo.py --baseline)
#
# --guard is CI's regression guard (make release, on the binaries that stage built: the static
# musl ones at CI's optimisation level, BIN and BASE): it prints the ratios and fails only when
# the CPU ratio is more than 1.5x the figure benches/README.md records for this method (its
# "guard:" line), so that a noisy shared machine never turns CI red.
#
# Needs wrk (and hey, except with --guard): apt-get install wrk hey. Prints medians, ratios and
# a Markdown table.
set -euo pipefail
cd "$(dirname "$0")/.."
GUARD=false
[ "${1:-}" = "--guard" ] && GUARD=true
if $GUARD; then
  ROUNDS="${ROUNDS:-4}"; DURATION="${DURATION:-3}"
fi
ROUNDS="${ROUNDS:-6}"; DURATION="${DURATION:-10}"; CONNS="${CONNS:-25}"; RATE="${RATE:-1000}"
# hey 0.1.4 (Debian) sends the port inside SNI ("localhost:8443"), which rustls rightly refuses;
# on 443 there is no port in the URL. Both servers take turns on it (run as root). The guard
# runs no hey: any free port will do.
if $GUARD; then PORT="${PORT:-18443}"; else PORT="${PORT:-443}"; fi
ADMIN_PORT=18080
# As deployed (Dockerfile, chart): mimalloc commits memory on demand instead of a whole arena.
export MIMALLOC_ARENA_EAGER_COMMIT="${MIMALLOC_ARENA_EAGER_COMMIT:-0}"
work="$(mktemp -d)"; trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
if [ -z "${BIN:-}" ]; then
  cargo build --release --quiet --bin ephemeral-volume-injector --bin tls-baseline
  BIN=target/release/ephemeral-volume-injector
  BASE=target/release/tls-baseline
fi
: "${BASE:?BASE (the baseline server) is needed with BIN}"
. benches/common.sh
write_wrk_script "$work/post.lua"
clk=$(getconf CLK_TCK)

cpu_ticks() { awk '{print $14 + $15}' "/proc/$1/stat"; }
rss_kib() { awk -v k="$2" '$1 == k":" {print $2}' "/proc/$1/status"; }

start_server() { # name -> sets PID, URL, STARTUP_MS
  local t0; t0=$(date +%s%N)
  if [ "$1" = webhook ] || [ "$1" = before ]; then
    local bin="$BIN"
    [ "$1" = webhook ] || bin="$BEFORE"
    taskset -c 0 "$bin" serve --listen "127.0.0.1:$PORT" --admin-listen "127.0.0.1:$ADMIN_PORT" \
      --ca-out "$work/ca.crt" --log-format json --log-level info 2>"$work/$1.log" &
    URL=https://localhost$( [ "$PORT" = 443 ] || echo ":$PORT")/mutate
  else
    local base="$BASE"
    [ "$1" = baseline ] || base="${BASE2:?}"
    taskset -c 0 "$base" "127.0.0.1:$PORT" "$work/ca.crt" 2>"$work/$1.log" &
    URL=https://localhost$( [ "$PORT" = 443 ] || echo ":$PORT")/mutate
  fi
  PID=$!
  until curl -sk -o /dev/null -X POST --data-binary @"$BODY" "$URL" 2>/dev/null; do sleep 0.002; done
  STARTUP_MS=$(( ($(date +%s%N) - t0) / 1000000 ))
}

results="$work/results.jsonl"
# Each round starts one server further along the list, so that over the rounds every server
# takes every place in the order: with a fixed order the same binary read 3 % dearer in the
# webhook's place (right after the bare server) than in the before's (an A/A run, BEFORE=a copy
# of BIN; why the place matters was not found).
# With ROUNDS a multiple of the number of servers every place is taken equally often.
servers=(baseline webhook ${BEFORE:+before} ${BASE2:+base2})
for round in $(seq 1 "$ROUNDS"); do
  for i in "${!servers[@]}"; do
    name="${servers[$(( (i + round - 1) % ${#servers[@]} ))]}"
    start_server "$name"
    sleep 1
    idle=$(rss_kib "$PID" VmRSS)
    # RSS is the process's own memory (anonymous) plus the pages of its executable mapped from
    # the page cache (file): the second is mostly how much of the binary is cached and mapped.
    idle_anon=$(rss_kib "$PID" RssAnon)
    c0=$(cpu_ticks "$PID")
    taskset -c 1 wrk -t1 -c"$CONNS" -d"${DURATION}s" -s "$work/post.lua" --latency "$URL" > "$work/wrk.txt"
    c1=$(cpu_ticks "$PID")
    reqs=$(awk '/requests in/ {print $1}' "$work/wrk.txt")
    rps=$(awk '/Requests\/sec/ {print $2}' "$work/wrk.txt")
    errors=$(awk '/Non-2xx|Socket errors/ {print}' "$work/wrk.txt" | tr '\n' ' ')
    if $GUARD; then
      p50=0; p99=0; hey_rps=0; hey_errors=""; fixed_cpu=0; fixed_reqs=0
    else
      h0=$(cpu_ticks "$PID")
      taskset -c 1 hey -z "${DURATION}s" -c "$CONNS" -q $(( RATE / CONNS )) -m POST -T application/json \
        -D "$BODY" "$URL" > "$work/hey.txt"
      h1=$(cpu_ticks "$PID")
      # CPU per request at the fixed rate too: below saturation both servers pay the same
      # per-request wake-ups (their own, and the client's on the other core).
      fixed_cpu=$(awk -v a="$h0" -v b="$h1" -v c="$clk" 'BEGIN { printf "%.4f", (b - a) / c }')
      fixed_reqs=$(awk '/\[200\]/ {print $2}' "$work/hey.txt")
      p50=$(awk '/ 50% in/ {print $3}' "$work/hey.txt"); p99=$(awk '/ 99% in/ {print $3}' "$work/hey.txt")
      hey_rps=$(awk '/Requests\/sec/ {print $2}' "$work/hey.txt")
      hey_errors=$(awk '/Error distribution/,0' "$work/hey.txt" | tail -n +2 | tr '\n' ' ')
    fi
    peak=$(rss_kib "$PID" VmHWM)
    kill -TERM "$PID"; wait "$PID" 2>/dev/null || true
    printf '{"round":%d,"name":"%s","rps":%s,"reqs":%s,"cpu_s":%s,"idle_kib":%s,"idle_anon_kib":%s,"peak_kib":%s,"p50_s":%s,"p99_s":%s,"fixed_rps":%s,"fixed_cpu_s":%s,"fixed_reqs":%s,"startup_ms":%s,"errors":"%s"}\n' \
      "$round" "$name" "$rps" "$reqs" "$(awk -v a="$c0" -v b="$c1" -v c="$clk" 'BEGIN { printf "%.4f", (b - a) / c }')" "$idle" "$idle_anon" "$peak" "$p50" "$p99" "$hey_rps" "$fixed_cpu" "${fixed_reqs:-0}" "$STARTUP_MS" "$errors$hey_errors" >> "$results"
    echo "round $round $name: $rps req/s, p99 at ${RATE}/s ${p99}s, peak RSS ${peak} KiB ${errors}${hey_errors}" >&2
  done
done

size=$(stat -c %s "$BIN")
python3 - "$results" "$size" "$ROUNDS" "$DURATION" "$CONNS" "$RATE" "$GUARD" <<'PY'
import json, re, statistics as st, sys
path, size, rounds, duration, conns, rate, guard = sys.argv[1:]
rows = [json.loads(l) for l in open(path)]
if guard == "true":
    # CI's guard: the ratios, and a failure only for a gross regression or failed requests.
    def per_req(name): return st.median(r["cpu_s"] / r["reqs"] for r in rows if r["name"] == name)
    def rps(name): return st.median(r["rps"] for r in rows if r["name"] == name)
    cpu = per_req("webhook") / per_req("baseline")
    tp = rps("webhook") / rps("baseline")
    m = re.search(r"Guard figure[^\n]*?CPU ratio \*\*([\d.]+)\*\*", open("benches/README.md").read())
    if not m:
        sys.exit("load guard: benches/README.md records no 'Guard figure ... CPU ratio **N**' line")
    recorded = float(m.group(1))
    print(f"load guard: {rounds} rounds x {duration}s; CPU per request: webhook {per_req('webhook')*1e6:.1f} us, "
          f"baseline {per_req('baseline')*1e6:.1f} us, ratio {cpu:.2f} (recorded {recorded:.2f}, fails above {1.5*recorded:.2f}); "
          f"throughput ratio {tp:.2f}")
    errs = [(r["name"], r["errors"]) for r in rows if r["errors"].strip()]
    if errs:
        sys.exit(f"load guard: failed requests: {errs[:3]}")
    if cpu > 1.5 * recorded:
        sys.exit(f"load guard: the webhook's CPU per request is {cpu:.2f}x the bare TLS server's, more than 1.5x "
                 f"the {recorded:.2f}x benches/README.md records: a gross regression (profile it: benches/README.md)")
    sys.exit(0)
def med(name, key): return st.median(r[key] for r in rows if r["name"] == name)
def cpu_per_req(name): return st.median(r["cpu_s"] / r["reqs"] for r in rows if r["name"] == name)
b, w = "baseline", "webhook"
tp = med(w, "rps") / med(b, "rps")
cpu = cpu_per_req(w) / cpu_per_req(b)
p99_ratio = med(w, "p99_s") / med(b, "p99_s")
def ok(cond): return "met" if cond else "MISSED"
print(f"\n{rounds} rounds x {duration}s, {conns} connections, HTTP/1.1 keep-alive over TLS, fixed rate {rate}/s")
print("| measure | baseline | webhook | ratio / goal |")
print("|---|---|---|---|")
print(f"| throughput (req/s, median) | {med(b,'rps'):,.0f} | {med(w,'rps'):,.0f} | {tp:.2f} (goal ≥ 0.6: {ok(tp >= 0.6)}, moonshot 0.8) |")
print(f"| server CPU per request at saturation (µs) | {cpu_per_req(b)*1e6:.1f} | {cpu_per_req(w)*1e6:.1f} | {cpu:.2f} (goal ≤ 2.0: {ok(cpu <= 2.0)}, moonshot 1.35) |")
def fixed_cpu(name): return st.median(r["fixed_cpu_s"] / r["fixed_reqs"] for r in rows if r["name"] == name and r["fixed_reqs"])
fcpu = fixed_cpu(w) / fixed_cpu(b)
print(f"| server CPU per request at {rate}/s (µs) | {fixed_cpu(b)*1e6:.1f} | {fixed_cpu(w)*1e6:.1f} | {fcpu:.2f} (both below saturation: the same wake-ups paid by both) |")
print(f"| p50 at {rate}/s (ms) | {med(b,'p50_s')*1e3:.3f} | {med(w,'p50_s')*1e3:.3f} | |")
print(f"| p99 at {rate}/s (ms) | {med(b,'p99_s')*1e3:.3f} | {med(w,'p99_s')*1e3:.3f} | {p99_ratio:.2f} (goals ≤ 1 ms: {ok(med(w,'p99_s') <= 0.001)}, ≤ 1.2×: {ok(p99_ratio <= 1.2)}) |")
print(f"| idle RSS (MiB) | {med(b,'idle_kib')/1024:.1f} | {med(w,'idle_kib')/1024:.1f} | goal ≤ 10: {ok(med(w,'idle_kib')/1024 <= 10)} |")
print(f"| idle RSS: anonymous, its own memory (MiB) | {med(b,'idle_anon_kib')/1024:.1f} | {med(w,'idle_anon_kib')/1024:.1f} | the rest is the executable mapped from the page cache |")
print(f"| peak RSS under load (MiB) | {med(b,'peak_kib')/1024:.1f} | {med(w,'peak_kib')/1024:.1f} | goal ≤ 20: {ok(med(w,'peak_kib')/1024 <= 20)} |")
print(f"| start to first TLS response (ms) | {med(b,'startup_ms'):.0f} | {med(w,'startup_ms'):.0f} | |")
print(f"| stripped release binary (MB) | | {int(size)/1e6:.2f} | goal ≤ 10: {ok(int(size)/1e6 <= 10)} |")
if any(r["name"] == "before" for r in rows):
    bc = cpu_per_req("before") / cpu_per_req(b)
    print(f"| before (BEFORE=): throughput, CPU per request | {med('before','rps'):,.0f} req/s | {cpu_per_req('before')*1e6:.1f} µs | {med('before','rps')/med(b,'rps'):.2f}, {bc:.2f} (after/before CPU: {cpu/bc:.2f}) |")
    fb = fixed_cpu("before") / fixed_cpu(b)
    print(f"| before (BEFORE=): CPU per request at {rate}/s | | {fixed_cpu('before')*1e6:.1f} µs | {fb:.2f} (after/before: {fcpu/fb:.2f}) |")
if any(r["name"] == "base2" for r in rows):
    b2, f2 = cpu_per_req("base2"), fixed_cpu("base2")
    print(f"| second baseline (BASE2=): throughput, CPU per request | {med('base2','rps'):,.0f} req/s | {b2*1e6:.1f} µs | "
          f"its/the baseline's CPU: {b2/cpu_per_req(b):.2f}; the webhook against it: {cpu_per_req(w)/b2:.2f}, throughput {med(w,'rps')/med('base2','rps'):.2f} |")
    print(f"| second baseline (BASE2=): CPU per request at {rate}/s | | {f2*1e6:.1f} µs | "
          f"its/the baseline's: {f2/fixed_cpu(b):.2f}; the webhook against it: {fixed_cpu(w)/f2:.2f} |")
errs = [r for r in rows if r["errors"].strip()]
print(f"| runs with errors | | | {len(errs)} {[ (r['name'], r['errors']) for r in errs][:3]} |")
PY
