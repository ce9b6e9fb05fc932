# serve_lib.sh - what the end-to-end tests of `rebound serve` share: the
# skip when serve (or curl, python3) is missing, a server in the
# background killed at exit, start_server and stop_server. Sourced after
# lib.sh by tests/cli/cli_serve.sh and cli_bench_serve.sh.

if ! "$REBOUND" --help | grep -q '^  serve '; then
    echo "SKIP: this rebound was built without serve (libmicrohttpd-dev and libjansson-dev: scripts/deps.sh)"
    exit 77
fi
for tool in curl python3; do
    command -v $tool >/dev/null 2>&1 || { echo "SKIP: $tool is not installed (scripts/deps.sh installs it)"; exit 77; }
done

SERVER_PID=""
cleanup() {
    if [ -n "$SERVER_PID" ] && kill -0 "$SERVER_PID" 2>/dev/null; then
        kill -KILL "$SERVER_PID" 2>/dev/null || true
    fi
}
trap cleanup EXIT

# start_server LOG ARGS...: starts serve in the background, waits for its
# "listening" line; sets SERVER_PID and URL.
start_server() {
    local log=$1
    shift
    "$REBOUND" serve --port 0 "$@" >"$log" 2>&1 &
    SERVER_PID=$!
    for _ in $(seq 1 300); do
        if grep -q 'listening on' "$log"; then
            local port
            port=$(sed -n 's/.*listening on http:\/\/127\.0\.0\.1:\([0-9]*\).*/\1/p' "$log")
            URL=http://127.0.0.1:$port
            return 0
        fi
        kill -0 "$SERVER_PID" 2>/dev/null || { cat "$log" >&2; fail "serve exited at start"; }
        sleep 0.1
    done
    cat "$log" >&2
    fail "serve did not start listening within 30 s"
}

# stop_server: SIGTERM; the server must exit 0
stop_server() {
    kill -TERM "$SERVER_PID"
    local rc=0
    wait "$SERVER_PID" || rc=$?
    SERVER_PID=""
    [ $rc -eq 0 ] || fail "serve exited with status $rc after SIGTERM"
}
