#!/usr/bin/env bash
# cli_run.sh - `rebound run` and `rebound bench` end to end: greedy text
# equal to llama.cpp's on the reference models (when present), the output
# contract (stdout = prompt + continuation, stats on stderr), --tokens,
# --dump-logits, sampling with a seed, and the errors a user can cause.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
MODELS=${3:-}

check "a synthetic model generates, greedy is deterministic, -n 0 prints the prompt only"
run_ok mk "$REBOUND" make-model --shape tiny --type q8_0 -o tiny.gguf
run_ok g1 "$REBOUND" run -m tiny.gguf -p "Hello world" -n 16 --temp 0 -t 2
run_ok g2 "$REBOUND" run -m tiny.gguf -p "Hello world" -n 16 --temp 0 -t 1
cmp -s g1.out g2.out && ok || fail "greedy output differs between 1 and 2 threads"
expect_line g1.out '^Hello world'
expect_line g1.err 'prefill .* tok/s \| decode .* tok/s \| peak RSS'
run_ok n0 "$REBOUND" run -m tiny.gguf -p "Hello world" -n 0
[ "$(cat n0.out)" = "Hello world" ] && ok || fail "-n 0 printed '$(cat n0.out)', expected the prompt only"

check "sampling with a seed is reproducible; another seed differs"
run_ok s1 "$REBOUND" run -m tiny.gguf -p "a" -n 24 --temp 1.5 --seed 7
run_ok s2 "$REBOUND" run -m tiny.gguf -p "a" -n 24 --temp 1.5 --seed 7
run_ok s3 "$REBOUND" run -m tiny.gguf -p "a" -n 24 --temp 1.5 --seed 8
cmp -s s1.out s2.out && ok || fail "same seed, different text"
cmp -s s1.out s3.out && fail "different seeds, same text" || ok

check "--tokens and --dump-logits write positions x vocab floats"
echo "1 200 300 400" > ids.txt
run_ok dl "$REBOUND" run -m tiny.gguf --tokens ids.txt -n 0 --dump-logits logits.f32
[ "$(stat -c %s logits.f32)" -eq $((4 * 512 * 4)) ] && ok || fail "logits.f32 has $(stat -c %s logits.f32) bytes, expected $((4 * 512 * 4))"

check "a full context stops with a hint, or --context-shift drops the oldest half and goes on"
run_ok cf "$REBOUND" run -m tiny.gguf -p "Hello world" -n 60 --temp 0 -c 32
expect_line cf.err 'context full \(32 tokens\); --context-shift drops the oldest half'
run_ok cs "$REBOUND" run -m tiny.gguf -p "Hello world" -n 60 --temp 0 -c 32 --context-shift --keep 2
expect_line cs.err '^rebound run: context shift: kept 3, dropped 14 tokens'
expect_line cs.err 'decode 60 tokens'
run_ok ck "$REBOUND" run -m tiny.gguf -p "Hello world" -n 60 --temp 0 -c 32 --context-shift --keep 40
expect_line ck.err 'context full \(32 tokens\): --keep leaves nothing to drop'

check "bench prints pp and tg lines"
run_ok b "$REBOUND" bench -m tiny.gguf -p 16 -n 4 -r 1 -t 2
expect_line b.out '\| pp16 \|'
expect_line b.out '\| tg4 \|'
expect_line b.err '^result bench=tg4 .*tok_s_median='

check "weight streaming: the same text under a weight budget (class and lru), stats, bench, too small a budget"
run_ok wm "$REBOUND" make-model --dim 128 --layers 4 --heads 4 --kv-heads 2 --ffn 384 --vocab 512 \
    --type q8_0 -o mid.gguf
run_ok w0 "$REBOUND" run -m mid.gguf -p "Hello world" -n 16 --temp 0 -t 2
run_ok w1 "$REBOUND" run -m mid.gguf -p "Hello world" -n 16 --temp 0 -t 2 --weights-budget 500K \
    --stats --device phone
run_ok w2 "$REBOUND" run -m mid.gguf -p "Hello world" -n 16 --temp 0 -t 2 --weights-budget 500K \
    --policy lru
cmp -s w0.out w1.out && ok || fail "streamed weights (class) changed the text"
cmp -s w0.out w2.out && ok || fail "streamed weights (lru) changed the text"
expect_line w1.err '^  weights stream \(class\): budget 496.00 KiB \(min [0-9.]+ KiB\), loop N'
expect_line w1.err '^    read [0-9.]+ [KM]iB in [0-9]+ requests over [0-9]+ passes'
run_fails w3 1 "below the minimum of [0-9]+ bytes" "$REBOUND" run -m mid.gguf -p hi --weights-budget 100K
run_fails w4 1 "policy 'opt' needs the future" "$REBOUND" run -m mid.gguf -p hi --weights-budget 500K --policy opt
run_ok wb "$REBOUND" bench -m mid.gguf --weights-budget 50%,75% --policy class,lru --device phone -n 4 -t 2 --no-cgroup
expect_line wb.out '^\| 50% \([0-9.]+ MiB\) \| class \|'
expect_line wb.out '^\| 75% \([0-9.]+ MiB\) \| lru \|'
expect_line wb.out 'class / lru'
expect_line wb.err '^result bench=stream .* policy=class .* tok_s=[0-9.]+ predicted_tok_s=[0-9.]+'

check "errors: missing model, prompt beyond the context, bad token ids, unknown option"
run_fails e1 1 "cannot open 'nope.gguf'" "$REBOUND" run -m nope.gguf -p hi
run_fails e2 1 "prompt has [0-9]+ tokens but the context holds 8" "$REBOUND" run -m tiny.gguf -c 8 -p "one two three four five six seven eight nine ten"
echo "1 99999" > bad.txt
run_fails e3 1 "outside the vocabulary" "$REBOUND" run -m tiny.gguf --tokens bad.txt -n 1
echo "1 two" > bad2.txt
run_fails e4 1 "cannot read token ids" "$REBOUND" run -m tiny.gguf --tokens bad2.txt
run_fails e5 2 "unknown option '--frobnicate'" "$REBOUND" run -m tiny.gguf -p hi --frobnicate
run_fails e6 2 "exactly one of -p" "$REBOUND" run -m tiny.gguf

if [ -n "$MODELS" ] && [ -f "$MODELS/stories260K.gguf" ]; then
    check "stories260K greedy text equals llama.cpp's golden/stories260K/greedy.txt"
    run_ok st "$REBOUND" run -m "$MODELS/stories260K.gguf" -p "Once upon a time" -n 64 --temp 0
    cmp -s st.out "$MODELS/golden/stories260K/greedy.txt" && ok || { diff st.out "$MODELS/golden/stories260K/greedy.txt" >&2 || true; fail "stories260K text differs"; }
    check "a saved session continued with an empty prompt goes on as one run would (no BOS, the space kept)"
    rm -f cont.rbs
    run_ok c1 "$REBOUND" run -m "$MODELS/stories260K.gguf" -p "Once upon a time" -n 16 --temp 0 --session cont.rbs
    run_ok c2 "$REBOUND" run -m "$MODELS/stories260K.gguf" -p "" -n 24 --temp 0 --session cont.rbs
    run_ok c3 "$REBOUND" run -m "$MODELS/stories260K.gguf" -p "Once upon a time" -n 40 --temp 0
    [ "$(cat c1.out c2.out)" = "$(cat c3.out)" ] && ok || fail "continued '$(cat c1.out)' + '$(cat c2.out)', one run '$(cat c3.out)'"
    for q in F16 Q8_0 Q4_0 Q4_K_M; do
        check "parity-$q greedy text equals llama.cpp's"
        run_ok p$q "$REBOUND" run -m "$MODELS/parity-$q.gguf" -p "The robot walked into the old library" -n 8 --temp 0
        cmp -s p$q.out "$MODELS/golden/parity/$q/greedy.txt" && ok || fail "parity-$q text differs"
    done
    check "parity-qwen3 greedy text equals llama.cpp's"
    run_ok pq "$REBOUND" run -m "$MODELS/parity-qwen3-Q8_0.gguf" -p "The robot walked into the old library" -n 8 --temp 0
    cmp -s pq.out "$MODELS/golden/parity-qwen3/greedy.txt" && ok || fail "parity-qwen3 text differs"
else
    echo "note: reference models absent: golden text checks skipped"
fi
passed
