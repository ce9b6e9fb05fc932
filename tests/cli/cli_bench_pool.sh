#!/usr/bin/env bash
# cli_bench_pool.sh - `rebound bench-pool` end to end on a small model: K
# conversations under a budget of about one, returns restored layer by
# layer; the table and the JSON say where each return's time went (the
# pass's waits for restored layers, bytes and busy times of the storage
# and RAM-tier restores), and every turn's logits equal a never-trimmed
# session's.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

# KV outweighs the run state: the budget trims KV, not sessions
run_ok mk "$REBOUND" make-model --arch qwen3 --vocab-style bpe --dim 256 --layers 4 --heads 8 \
    --kv-heads 8 --ffn 256 --vocab 1024 --ctx 1024 --type q8_0 -o kv.gguf

check "three conversations under a budget of about one: every return restored, logits exact"
run_ok bp "$REBOUND" bench-pool -m kv.gguf -k 3 -c 512 --turn 4 --rounds 2 -t 1 --device phone \
    --json bp.json
grep -q '| every turn.s logits = a never-trimmed session.s | yes (bit for bit) |' bp.out \
    && ok || { cat bp.out >&2; fail "the logits were not checked equal"; }
grep -q '| return | conversation | TTFT ms | vs warm | waited for the restore ms |' bp.out \
    && ok || { cat bp.out >&2; fail "no per-return table with the restore's waits"; }
python3 - bp.json <<'PY' && ok || fail "bench-pool's JSON"
import json, sys
r = json.load(open(sys.argv[1]))
rets = r["returns"]
assert len(rets) == 6, len(rets)
assert r["lossless"] is True
for x in rets:
    for k in ("restore_io_s", "restore_decode_s", "restore_wait_s"):
        assert x[k] >= 0, (k, x)
    # the pass waits only inside the return
    assert x["restore_wait_s"] <= x["ttft_s"] + 1e-6, x
# under a budget of about one conversation, the returns bring KV back
assert sum(x["restored_io_bytes"] + x["decoded_bytes"] for x in rets) > 0
assert any(x["restore_io_s"] + x["restore_decode_s"] > 0 for x in rets)
PY

check "think time with prefetch alternate: the returns that prefetched read (almost) nothing at the feed"
run_ok bpp "$REBOUND" bench-pool -m kv.gguf -k 3 -c 512 --turn 4 --rounds 2 -t 1 --device phone \
    --think-ms 200 --prefetch alternate --json bpp.json
grep -q '| returns with prefetch on (3): TTFT median / p95 |' bpp.out \
    && ok || { cat bpp.out >&2; fail "no per-mode figures"; }
python3 - bpp.json <<'PY' && ok || fail "bench-pool's JSON with prefetch"
import json, sys
r = json.load(open(sys.argv[1]))
assert r["prefetch"] == "alternate" and r["think_ms"] == 200 and r["lossless"] is True
rets = r["returns"]
on = [x for x in rets if x["prefetch"]]
off = [x for x in rets if not x["prefetch"]]
assert len(on) == 3 and len(off) == 3, (len(on), len(off))
assert all(x["prefetched_bytes"] == 0 for x in off), off
assert sum(x["prefetched_bytes"] for x in on) > 0, on
# what the prefetch brought, the feed did not read again
assert sum(x["restored_io_bytes"] + x["decoded_bytes"] for x in on) < \
    sum(x["restored_io_bytes"] + x["decoded_bytes"] for x in off), rets
PY
run_fails u3 2 'prefetch' "$REBOUND" bench-pool -m kv.gguf --prefetch sometimes

check "usage errors: no model, a budget that is not a size"
run_fails u1 2 'model' "$REBOUND" bench-pool
run_fails u2 2 'budget' "$REBOUND" bench-pool -m kv.gguf --budget lots

passed
