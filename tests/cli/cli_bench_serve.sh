#!/usr/bin/env bash
# cli_bench_serve.sh - `rebound bench-serve` against a real `rebound serve`
# on loopback: the JSON has its fields and every request's restore kind;
# a pool budget that holds about two of four conversations makes returns
# find their KV on storage; after a restart the same workload finds its
# conversations in their files; the recompute baseline computes every
# return again (no cached tokens); the kinds agree with the server's
# /metrics; a refused connection, a wrong path, a bad URL and a bad --pid
# are clear errors with a non-zero exit.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

if ! "$REBOUND" --help | grep -q '^  bench-serve '; then
    echo "SKIP: this rebound was built without bench-serve (libcurl4-openssl-dev and libjansson-dev: scripts/deps.sh)"
    exit 77
fi
. "$CLI_DIR/serve_lib.sh"

# check_json FILE KINDS_OF_OPENINGS KINDS_OF_RETURNS: the report's fields,
# and every turn's kind among those given (comma-separated); prints the
# returns' kinds, counted, as "kind=n ..."
check_json() {
    python3 - "$@" <<'EOF'
import collections, json, sys
d = json.load(open(sys.argv[1]))
want_open, want_ret = set(sys.argv[2].split(",")), set(sys.argv[3].split(","))
for k in ("endpoint", "conversations", "context_tokens", "rounds", "order", "turn_tokens",
          "gen_tokens", "concurrency", "seed", "cpu", "load_start", "wall_s",
          "decode_tok_s_median", "decode_tok_s_all", "ttft", "turns", "server"):
    assert k in d, "no '%s' in the report" % k
K, R, G = d["conversations"], d["rounds"], d["gen_tokens"]
assert len(d["turns"]) == K * (1 + R), "%d turns, expected %d" % (len(d["turns"]), K * (1 + R))
for t in d["turns"]:
    for k in ("conversation", "round", "kv_was", "ttft_ms", "prompt_tokens", "cached_tokens",
              "completion_tokens", "decode_tok_s"):
        assert k in t, "no '%s' in a turn" % k
    assert t["ttft_ms"] > 0, "TTFT %r" % t["ttft_ms"]
    assert t["prompt_tokens"] > 0, "the server reported no prompt tokens: %r" % t
    assert t["completion_tokens"] == G, "completion tokens %r, expected %d" % (t["completion_tokens"], G)
    kinds = want_ret if t["round"] else want_open
    assert t["kv_was"] in kinds, "turn %r: kv_was '%s' not in %s" % (t, t["kv_was"], kinds)
    if t["round"] and t["kv_was"] != "recomputed":
        assert t["cached_tokens"] > 0, "a return reused no tokens: %r" % t
    if t["kv_was"] == "recomputed":
        assert t["cached_tokens"] == 0, "a recomputed return reused tokens: %r" % t
rows = {(g["turn"], g["kv_was"]): g for g in d["ttft"]}
for g in d["ttft"]:
    for k in ("n", "prompt_tokens_mean", "ttft_p50_ms", "ttft_p95_ms", "ttft_max_ms"):
        assert k in g, "no '%s' in a ttft row" % k
    assert 0 < g["ttft_p50_ms"] <= g["ttft_p95_ms"] <= g["ttft_max_ms"], "percentiles %r" % g
assert rows[("return", "all")]["n"] == K * R, "the returns' row counts %r" % rows[("return", "all")]
assert d["server"] and d["server"]["max_rss_bytes"] > 0 and d["server"]["vm_hwm_bytes"] > 0, \
    "no server RSS with --pid: %r" % d["server"]
assert d["decode_tok_s_median"] > 0
c = collections.Counter(t["kv_was"] for t in d["turns"] if t["round"])
print(" ".join("%s=%d" % kv for kv in sorted(c.items())))
EOF
}

# metric_restores FILE KIND: rebound_conversation_restores_total of KIND
metric_restores() {
    sed -n 's/^rebound_conversation_restores_total{path="'"$2"'"} \([0-9]*\)$/\1/p' "$1"
}

# a model whose KV outweighs its run state, so that the pool's budget
# trims KV rather than closing sessions: 4 KiB of KV a token (and the run
# state of -b 128)
run_ok mk "$REBOUND" make-model --arch qwen3 --vocab-style bpe --dim 256 --layers 4 --heads 8 \
    --kv-heads 8 --ffn 256 --vocab 1024 --ctx 1024 --type q8_0 -o kv.gguf
WORKLOAD=(-k 4 -c 200 -r 2 -n 8 -s 3)

check "bench-serve against serve: four conversations under a budget of about two; the JSON"
mkdir -p spill
start_server s1.log -m kv.gguf -t 1 -c 1024 -np 1 -b 128 --max-open 4 --device phone --sessions convs \
    --spill-dir spill --mem-budget 12M
run_ok b1 "$REBOUND" bench-serve "$URL" "${WORKLOAD[@]}" --pid "$SERVER_PID" --rate 1000 --resident-ms 5 -o json
KINDS=$(check_json b1.out new resident,compressed,stored,file) && ok || { cat b1.out >&2; fail "bench-serve's JSON"; }
# every turn carries the server's timings; a return restored from storage
# says what it read
python3 - b1.out <<'EOF' && ok || fail "bench-serve's server_timings"
import json, sys
r = json.load(open(sys.argv[1]))
ts = r["turns"]
assert all(t["server_timings"] is not None for t in ts), "a turn without server_timings"
assert all(t["server_timings"]["prompt_ms"] > 0 for t in ts), "a turn with no prefill time"
back = [t for t in ts if t["kv_was"] == "stored"]
assert not back or any(t["server_timings"]["restore_read_bytes"] > 0 for t in back), \
    "returns from storage read nothing"
# --pid: the server's page faults by each first token, counted
f = [t["server_page_faults"] for t in ts]
assert all(isinstance(x, int) and x >= 0 for x in f), "a turn without its page faults: %r" % f
assert any(x > 0 for x in f), "no turn took a page fault: %r" % f
# --rate 1000 --resident-ms 5: each return's TTFT over 5 ms + its MiB read / 1000 MiB/s
fl = r["floor"]
rets = [t for t in ts if t["round"]]
ratios = [t["ttft_ms"] / (5 + t["server_timings"]["restore_read_bytes"] / 1048576 / 1000 * 1e3)
          for t in rets]
assert fl["returns"] == len(rets) and fl["resident_ms"] == 5, fl
assert abs(fl["ratio_max"] - max(ratios)) < 1e-6 * max(ratios), (fl, ratios)
assert fl["above_1_25x"] == sum(x > 1.25 for x in ratios), (fl, ratios)
p95 = [g for g in r["ttft"] if g["turn"] == "return" and g["kv_was"] == "all"][0]["ttft_p95_ms"]
assert abs(fl["p95_over_resident"] - p95 / 5) < 1e-6 * p95, (fl, p95)
EOF
echo "   returns: $KINDS"
case " $KINDS " in *" stored="*) ;; *) fail "no return found its KV on storage under the budget: $KINDS" ;; esac

check "the kinds it reports are the server's own count (/metrics)"
curl -s "$URL/metrics" > m1.txt
for kind in resident compressed stored file new; do
    want=$(python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(sum(t["kv_was"] == sys.argv[2] for t in d["turns"]))' b1.out $kind)
    got=$(metric_restores m1.txt $kind)
    [ "$got" = "$want" ] && ok || fail "/metrics counts $got restores of kind $kind, bench-serve $want"
done

check "the readable table: a row per kind, TTFT percentiles, the server's RSS"
run_ok b2 "$REBOUND" bench-serve "$URL" -k 1 -c 40 -r 1 -n 4 -s 9 --pid "$SERVER_PID"
grep -q 'TTFT p50' b2.out && ok || fail "no TTFT header in the table"
grep -Eq '^open +new +1 ' b2.out && ok || fail "no row for the opening"
grep -Eq '^return +all +1 ' b2.out && ok || fail "no row for all returns"
grep -q "server pid $SERVER_PID: max RSS" b2.out && ok || fail "no server RSS line"
grep -Eq '^prefill +[0-9.]+ +[0-9.]+ +[0-9.]+$' b2.out && ok || { cat b2.out >&2; fail "no phase table of the returns"; }
grep -Eq '^  conversation 0 round 1 \(.*\): [0-9]+ ms = .*; [0-9]+ page faults$' b2.out && ok || fail "no slowest-returns line (with its page faults)"
grep -Eq '^page faults +[0-9]+ +[0-9]+ +[0-9]+ ' b2.out && ok || fail "no page-fault row"
run_ok b7 "$REBOUND" bench-serve "$URL" -k 1 -c 40 -r 1 -n 4 -s 9 --rate 1000 --resident-ms 5
grep -Eq '^returns against their floor \(resident 5.0 ms from --resident-ms \+ MiB read / 1000 MiB/s\):$' b7.out \
    && grep -Eq '^  TTFT / floor p50 [0-9.]+x, max [0-9.]+x \(conversation 0 round 1: .*above 1.25x: [01] of 1$' b7.out \
    && ok || { cat b7.out >&2; fail "no floor lines with --rate"; }
stop_server

check "--system S: one system prompt opens every conversation; the later openings reuse it"
start_server s5.log -m kv.gguf -t 1 -c 1024 -np 1 --max-open 4 --sessions convs5
run_ok b5 "$REBOUND" bench-serve "$URL" -k 3 -c 20 --system 150 -r 0 -n 4 -s 5 -o json
python3 - b5.out <<'EOF' && ok || { cat b5.out >&2; fail "--system: the shared prefix"; }
import json, sys
r = json.load(open(sys.argv[1]))
assert r["system_tokens"] == 150
sp = r["shared_prefix"]
opens = sorted((t for t in r["turns"] if t["round"] == 0), key=lambda t: t["conversation"])
assert opens[0]["cached_tokens"] == 0, "the first opening found something cached"
# each later opening continues from the system prompt's tokens: at least
# the ~150 words, the synthetic vocabulary splits words into more tokens
assert all(t["cached_tokens"] >= 150 for t in opens[1:]), [t["cached_tokens"] for t in opens]
assert sp["later_openings"] == 2 and sp["later_cached_tokens_mean"] >= 150, sp
EOF
run_ok b6 "$REBOUND" bench-serve "$URL" -k 2 -c 20 --system 150 -r 0 -n 4 -s 6
grep -Eq '^shared system prompt of ~150 tokens: the first opening [0-9.]+ ms; the 1 after it' b6.out \
    && ok || { cat b6.out >&2; fail "no shared-prompt line in the table"; }
stop_server

check "after a restart the same workload finds its conversations in their files"
start_server s2.log -m kv.gguf -t 1 -c 1024 -np 1 -b 128 --max-open 4 --device phone --sessions convs \
    --spill-dir spill --mem-budget 12M
run_ok b3 "$REBOUND" bench-serve "$URL" "${WORKLOAD[@]}" --pid "$SERVER_PID" -o json
check_json b3.out file resident,compressed,stored,file > /dev/null && ok || { cat b3.out >&2; fail "openings after a restart"; }
stop_server

check "--baseline recompute: every return is computed again (no cached tokens)"
start_server s3.log -m kv.gguf -t 1 -c 1024 -np 1 --max-open 4 --baseline recompute
expect_line s3.log 'baseline: an idle conversation keeps no KV'
run_ok b4 "$REBOUND" bench-serve "$URL" "${WORKLOAD[@]}" --pid "$SERVER_PID" -o json
KINDS=$(check_json b4.out new recomputed) && ok || { cat b4.out >&2; fail "the baseline's JSON"; }
[ "$KINDS" = "recomputed=8" ] && ok || fail "baseline returns: $KINDS"

check "a closed port: a clear error, exit 1"
PORT_FREE=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()')
run_fails e1 1 "error: http://127\.0\.0\.1:$PORT_FREE/v1/chat/completions: .*(connect|refused)" \
    "$REBOUND" bench-serve "http://127.0.0.1:$PORT_FREE" -k 1 -c 20 -r 0
grep -q '^hint: is the server running' e1.err && ok || fail "no hint for a refused connection"

check "a path the server does not serve: its status and error message"
run_fails e2 1 "answered HTTP 404: no endpoint" "$REBOUND" bench-serve "$URL/nope" -k 1 -c 20 -r 0

check "usage errors: no URL, not http, a bad --order, a --pid that is no process"
run_fails e3 2 "error: no URL given" "$REBOUND" bench-serve
run_fails e4 2 "error: URL 'ftp://host' is not http:// or https://" "$REBOUND" bench-serve ftp://host
run_fails e5 2 "order" "$REBOUND" bench-serve "$URL" --order sideways
run_fails e6 1 "error: --pid 4194304: cannot read /proc/4194304/status" \
    "$REBOUND" bench-serve "$URL" --pid 4194304
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ] && ok || fail "the server is not healthy after the bad requests"
stop_server

passed
