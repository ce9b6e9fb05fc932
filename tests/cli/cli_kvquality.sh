#!/usr/bin/env bash
# cli_kvquality.sh - `rebound kvquality` end to end: a lossless codec leaves
# the logits exactly as they were, a lossy one reports agreement and KL in
# its result line, the errors a user can cause; on stories260K (when the
# reference models are present) the codec's quality targets: 8-bit top-1
# >= 99% and mean KL <= 0.001, 4-bit top-1 >= 97%, over >= 300 positions.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
MODELS=${3:-}

# field NAME FILE: the value of NAME=... in FILE's result line
field() { sed -n "s/^result kvquality .*[ ]$1=\([^ ]*\).*/\1/p" "$2"; }

check "a synthetic model: lossless round trip gives KL 0 and full agreement"
run_ok mk "$REBOUND" make-model --shape tiny --type q8_0 -o tiny.gguf
run_ok ll "$REBOUND" kvquality -m tiny.gguf --codec lossless -n 24 -p "Hello world" -p "one two three" -t 2
expect_line ll.out '^total: [0-9]+ positions after the round trip; top-1 agreement ([0-9]+)/\1 = 100.00%; mean KL 0, max KL 0'
[ "$(field positions ll.out)" -gt 0 ] && ok || fail "no positions measured"

check "lossy codecs report agreement, KL and ratio"
for c in q8 q4 q2; do
    run_ok $c "$REBOUND" kvquality -m tiny.gguf --codec $c -n 24 -p "Hello world" -t 2
    expect_line $c.out "^result kvquality model=tiny.gguf codec=$c prompts=1 positions=[0-9]+ top1=[0-9.]+ mean_kl=[0-9.e-]+ max_kl=[0-9.e-]+ ratio=[0-9.]+"
done

check "errors: unknown codec, no codec, missing model, unknown option"
run_fails e1 2 "unknown codec 'zip'" "$REBOUND" kvquality -m tiny.gguf --codec zip
run_fails e2 2 "no codec given" "$REBOUND" kvquality -m tiny.gguf
run_fails e3 1 "cannot open 'nope.gguf'" "$REBOUND" kvquality -m nope.gguf --codec q8
run_fails e4 2 "unknown option '--frobnicate'" "$REBOUND" kvquality -m tiny.gguf --codec q8 --frobnicate

if [ -n "$MODELS" ] && [ -f "$MODELS/stories260K.gguf" ]; then
    check "stories260K, 6 built-in prompts: q8 top-1 >= 99%, mean KL <= 0.001; q4 top-1 >= 97%"
    run_ok s8 "$REBOUND" kvquality -m "$MODELS/stories260K.gguf" --codec q8 -t 2
    run_ok s4 "$REBOUND" kvquality -m "$MODELS/stories260K.gguf" --codec q4 -t 2
    awk -v p="$(field positions s8.out)" -v t="$(field top1 s8.out)" -v k="$(field mean_kl s8.out)" \
        'BEGIN { exit !(p >= 300 && t >= 0.99 && k <= 0.001) }' && ok ||
        fail "q8 on stories260K: $(grep '^total' s8.out)"
    awk -v p="$(field positions s4.out)" -v t="$(field top1 s4.out)" \
        'BEGIN { exit !(p >= 300 && t >= 0.97) }' && ok ||
        fail "q4 on stories260K: $(grep '^total' s4.out)"
else
    echo "note: reference models not found; the stories260K targets are not checked"
fi

passed
