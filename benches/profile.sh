#!/usr/bin/env bash
# Where the webhook's CPU goes under benches/load.sh's load: perf samples (DWARF call graphs) of
# the webhook — and of the bare TLS server, for comparison — while wrk runs, summed by
# benches/profile_summary.py into the categories benches/README.md reports (the engine's
# decode, decision and encoding, the decision log line, the handler around them, TLS and the
# kernel's write and read paths) and the top frames of each.
#
#   bash benches/profile.sh            # DURATION=8; needs perf and wrk (Debian: linux-perf wrk)
#
# Builds a release binary with line tables and symbols, without LTO (target/profile-build).
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION="${DURATION:-8}"; PORT="${PORT:-18443}"
export MIMALLOC_ARENA_EAGER_COMMIT=0
work="$(mktemp -d)"; trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$work"' EXIT
CARGO_PROFILE_RELEASE_STRIP=false CARGO_PROFILE_RELEASE_DEBUG=line-tables-only CARGO_PROFILE_RELEASE_LTO=off \
  CARGO_PROFILE_RELEASE_CODEGEN_UNITS=16 CARGO_TARGET_DIR=target/profile-build \
  cargo build --release --quiet --bin ephemeral-volume-injector --bin tls-baseline
. benches/common.sh
write_wrk_script "$work/post.lua"
for name in baseline webhook; do
  if [ "$name" = webhook ]; then
    taskset -c 0 target/profile-build/release/ephemeral-volume-injector serve --listen "127.0.0.1:$PORT" \
      --admin-listen 127.0.0.1:18080 --ca-out "$work/ca.crt" --log-format json --log-level info 2>/dev/null &
  else
    taskset -c 0 target/profile-build/release/tls-baseline "127.0.0.1:$PORT" "$work/ca.crt" 2>/dev/null &
  fi
  pid=$!
  until curl -sk -o /dev/null -X POST --data-binary @"$BODY" "https://localhost:$PORT/mutate" 2>/dev/null; do sleep 0.01; done
  perf record -q -e cpu-clock -F 2000 --call-graph dwarf,16384 -p "$pid" -o "$work/$name.data" -- sleep "$DURATION" \
    >/dev/null 2>&1 &
  rec=$!
  sleep 0.3
  taskset -c 1 wrk -t1 -c25 -d"$((DURATION - 1))s" -s "$work/post.lua" "https://localhost:$PORT/mutate" | grep Requests/sec
  wait "$rec"
  kill "$pid"; wait "$pid" 2>/dev/null || true
  perf script -i "$work/$name.data" -F ip,sym --no-inline 2>/dev/null > "$work/$name.txt"
  echo "== $name"
  python3 benches/profile_summary.py "$work/$name.txt"
done
