# shellcheck shell=bash
# Shared by load.sh and faults.sh (sourced): the request body and wrk's script to POST it.
# The review as the API server sends it: compact JSON, as Go's encoding/json writes it (the
# fixture in tests/data/review.json is pretty-printed for people: 11.6 KB instead of 4.3 KB).
BODY="${TMPDIR:-/tmp}/evi-bench-review.json"
python3 -c 'import json, sys; json.dump(json.load(open(sys.argv[1])), open(sys.argv[2], "w"), separators=(",", ":"))' \
  tests/data/review.json "$BODY"

# write_wrk_script FILE: a wrk Lua script that POSTs $BODY as JSON.
write_wrk_script() {
  cat > "$1" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("$BODY", "rb"); wrk.body = f:read("*a"); f:close()
LUA
}
