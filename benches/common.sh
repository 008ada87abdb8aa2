# Shared by load.sh and faults.sh (sourced): the request body and wrk's script to POST it.
BODY=tests/data/review.json

# write_wrk_script FILE: a wrk Lua script that POSTs $BODY as JSON.
write_wrk_script() {
  cat > "$1" <<LUA
wrk.method = "POST"
wrk.headers["Content-Type"] = "application/json"
local f = io.open("$BODY", "rb"); wrk.body = f:read("*a"); f:close()
LUA
}
