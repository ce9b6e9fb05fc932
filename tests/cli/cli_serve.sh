#!/usr/bin/env bash
# cli_serve.sh - `rebound serve` end to end over real HTTP on loopback
# (curl as the client, python3 to read the JSON): /health, /v1/models,
# chat and text completions with and without streaming (the stream's text
# equals the whole reply's), stop strings, usage with cached tokens when a
# request continues a conversation (by prefix and by conversation_id),
# every hostile input (malformed JSON, wrong types, absurd values,
# oversize bodies and headers, unsafe conversation ids, too many requests
# in flight, wrong API key) answered with an OpenAI error object and the
# server still up, a client that leaves mid-stream (its generation stops,
# the conversation goes on), the Unix socket, the bounds on stored
# conversations, chats sharing a system prompt whose files link one
# prefix file (after a restart, a fork reopened beside its source shares
# the prefix and reads only its tail, exact; the prefix file is deleted
# with the last link), and kill -9 mid-stream then a restart that serves the
# next turn from the session file with the same greedy reply as a server
# that was never killed, concurrent streams decoded in one forward pass
# with the same greedy replies as one at a time, a lone prompt prefilled
# in one pass and one beside a decoding stream in chunks that keep that
# stream's tokens coming. /metrics is Prometheus text with the counters.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

. "$CLI_DIR/serve_lib.sh"

alive() {
    kill -0 "$SERVER_PID" 2>/dev/null && ok || fail "the server died"
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ] && ok || fail "/health is not 200"
}

# post PATH OUT [CURL ARGS...]: POST stdin as JSON; prints the status
post() {
    local path=$1 out=$2
    shift 2
    curl -s -o "$out" -w '%{http_code}' -H 'Content-Type: application/json' --data-binary @- \
        "$@" "$URL$path"
}

# jget FILE EXPR: a Python expression over the JSON in FILE (as d)
jget() {
    python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(eval(sys.argv[2]))' "$1" "$2"
}

# sse_text FILE: the text of a stream's chunks, joined; checks the framing
sse_text() {
    python3 - "$1" <<'EOF'
import json, sys
ev = [l[6:] for l in open(sys.argv[1], encoding="utf-8").read().split("\n") if l.startswith("data: ")]
assert ev and ev[-1] == "[DONE]", "the stream does not end with data: [DONE]"
out = []
for e in ev[:-1]:
    d = json.loads(e)
    assert "error" not in d, "error event: %r" % d
    for c in d["choices"]:
        out.append(c.get("delta", {}).get("content") or c.get("text") or "")
sys.stdout.write("".join(out))
EOF
}

# expect_error STATUS TYPE_REGEX BODY_FILE GOT
# (the server writes compact JSON: grep reads it, python3 would cost a
# start per call)
expect_error() {
    [ "$4" = "$1" ] && ok || { cat "$3" >&2; fail "status $4, expected $1"; }
    grep -Eq '^\{"error":\{"message":".+","type":"[a-z_]*'"$2"'[a-z_]*","param":' "$3" \
        && ok || { cat "$3" >&2; fail "no OpenAI error object of type /$2/ in $3"; }
}

run_ok mk "$REBOUND" make-model --arch qwen3 --vocab-style bpe --dim 64 --layers 2 --heads 4 \
    --kv-heads 2 --ffn 256 --vocab 1024 --ctx 256 --type q8_0 -o qwen.gguf
# slower (about 4 ms a token on 2 threads), for requests that must still
# run when the client leaves or others arrive
run_ok mks "$REBOUND" make-model --arch qwen3 --vocab-style bpe --dim 256 --layers 4 --heads 4 \
    --kv-heads 2 --ffn 1024 --vocab 4096 --ctx 2048 --type q8_0 -o slow.gguf
# slower still (a few ms a token on an idle machine with the AVX-512
# kernels): a reply of 1900 tokens must outlast a client that leaves after 1 s
run_ok mkl "$REBOUND" make-model --arch qwen3 --vocab-style bpe --dim 768 --layers 8 --heads 8 \
    --kv-heads 2 --ffn 2048 --vocab 4096 --ctx 2048 --type q8_0 -o slower.gguf

HELLO='{"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 8, "temperature": 0}'

check "a server starts, /health and /v1/models answer"
# pages of 32 tokens (the default): the restart below (--kv-page 256)
# resumes these files at the size they were saved with
start_server s1.log -m qwen.gguf -t 2 --sessions convs --max-body 64K
[ "$(curl -s "$URL/health")" = '{"status":"ok"}' ] && ok || fail "/health body"
curl -s "$URL/v1/models" > models.json
[ "$(jget models.json 'd["data"][0]["id"]')" = qwen.gguf ] && ok || fail "/v1/models id"
expect_line s1.log 'chat template chatml'

check "chat completion: 8 greedy tokens, usage, a conversation id"
[ "$(echo "$HELLO" | post /v1/chat/completions c1.json)" = 200 ] && ok || { cat c1.json; fail "chat status"; }
[ "$(jget c1.json 'd["object"]')" = chat.completion ] && ok || fail "object"
[ "$(jget c1.json 'd["choices"][0]["finish_reason"]')" = length ] && ok || fail "finish_reason"
[ "$(jget c1.json 'd["usage"]["completion_tokens"]')" = 8 ] && ok || fail "completion_tokens"
[ "$(jget c1.json 'd["usage"]["prompt_tokens_details"]["cached_tokens"]')" = 0 ] && ok || fail "cached on a new conversation"
P1=$(jget c1.json 'd["usage"]["prompt_tokens"]')
CONV1=$(jget c1.json 'd["conversation_id"]')
REPLY1=$(jget c1.json 'd["choices"][0]["message"]["content"]')
[ -n "$REPLY1" ] && ok || fail "empty reply"
[ -f "convs/$CONV1.rbs" ] && ok || fail "no session file convs/$CONV1.rbs"
# where the time went: llama-server's timings fields and the phases of the
# first token, which add up to it
jget c1.json 'd["timings"]["prompt_n"] == d["usage"]["prompt_tokens"] - d["usage"]["prompt_tokens_details"]["cached_tokens"] and d["timings"]["cache_n"] == 0 and d["timings"]["predicted_n"] == 8' | grep -q True \
    && ok || { cat c1.json; fail "timings: prompt_n, cache_n or predicted_n"; }
jget c1.json '(lambda t: abs(t["ttft_ms"] - (t["prepare_ms"] + t["queue_ms"] + t["open_ms"] + t["prompt_ms"])) < 0.01 and t["prompt_ms"] > 0 and t["predicted_ms"] > 0 and t["restore_read_bytes"] == 0)(d["timings"])' \
    | grep -q True && ok || { cat c1.json; fail "timings: the phases do not add up to ttft_ms"; }

check "the same request again: a new chat forked from the stored one (its KV reused up to the prompt), the greedy reply the same"
echo "$HELLO" | post /v1/chat/completions c2.json >/dev/null
[ "$(jget c2.json 'd["usage"]["prompt_tokens_details"]["cached_tokens"]')" = $((P1 - 1)) ] && ok || fail "cached tokens of a repeated prompt"
[ "$(jget c2.json 'd["choices"][0]["message"]["content"]')" = "$REPLY1" ] && ok || fail "the repeated greedy reply differs"
[ "$(jget c2.json 'd["conversation_id"]')" != "$CONV1" ] && ok || fail "a second chat joined the first one's conversation"
expect_line s1.log "forked from $CONV1 at token [0-9]+ of [0-9]+ \(its KV pages shared\)"
# the source kept its session: by its id it returns from RAM, nothing read
python3 -c 'import json, sys; d = json.loads(sys.argv[1]); d["conversation_id"] = sys.argv[2]; print(json.dumps(d))' "$HELLO" "$CONV1" \
    | post /v1/chat/completions c3.json >/dev/null
[ "$(jget c3.json 'd["conversation_id"]')" = "$CONV1" ] && ok || fail "the source conversation by its id"
[ "$(jget c3.json 'd["usage"]["prompt_tokens_details"]["cached_tokens"]')" = $((P1 - 1)) ] && ok || fail "cached tokens of the source after a fork"
[ "$(jget c3.json 'd["timings"]["restore_read_bytes"]')" = 0 ] && ok || { cat c3.json; fail "the source after a fork was read back"; }
[ "$(jget c3.json 'd["choices"][0]["message"]["content"]')" = "$REPLY1" ] && ok || fail "the source's greedy reply after a fork differs"

check "streaming (SSE): the chunks' text equals the whole reply; usage chunk; [DONE]"
echo '{"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 8, "temperature": 0, "stream": true, "stream_options": {"include_usage": true}}' \
    | post /v1/chat/completions s.sse -N > s.code
[ "$(cat s.code)" = 200 ] && ok || fail "stream status"
[ "$(sse_text s.sse)" = "$REPLY1" ] && ok || fail "streamed text '$(sse_text s.sse)' differs from '$REPLY1'"
grep -q '"finish_reason":"length"' s.sse && ok || fail "no finish_reason in the stream"
grep -q '"usage":{"prompt_tokens":' s.sse && ok || fail "no usage chunk"

check "the next turn continues the conversation by prefix: only the new tokens are computed"
python3 - "$REPLY1" > turn2.json <<'EOF'
import json, sys
print(json.dumps({"messages": [{"role": "user", "content": "Hello there"},
                               {"role": "assistant", "content": sys.argv[1]},
                               {"role": "user", "content": "Tell me more"}],
                  "max_tokens": 8, "temperature": 0}))
EOF
post /v1/chat/completions t2.json < turn2.json >/dev/null
[ "$(jget t2.json 'd["conversation_id"]')" = "$CONV1" ] && ok || fail "turn 2 went to another conversation"
cached=$(jget t2.json 'd["usage"]["prompt_tokens_details"]["cached_tokens"]')
[ "$cached" -ge "$P1" ] && ok || fail "turn 2 reused $cached tokens, fewer than turn 1's prompt ($P1)"

check "stop strings: the reply ends before the stop string, also when streamed"
STOP=$(python3 -c 'import sys; print(sys.argv[1][2:5])' "$REPLY1")
WANT=$(python3 -c 'import sys; r, s = sys.argv[1], sys.argv[2]; print(r[:r.find(s)])' "$REPLY1" "$STOP")
python3 -c 'import json, sys; print(json.dumps({"messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 8, "temperature": 0, "stop": [sys.argv[1]]}))' "$STOP" > stop.json
post /v1/chat/completions st.json < stop.json >/dev/null
[ "$(jget st.json 'd["choices"][0]["message"]["content"]')" = "$WANT" ] && ok || fail "stop: '$(jget st.json 'd["choices"][0]["message"]["content"]')' != '$WANT'"
[ "$(jget st.json 'd["choices"][0]["finish_reason"]')" = stop ] && ok || fail "stop: finish_reason"
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d["stream"] = True; print(json.dumps(d))' stop.json \
    | post /v1/chat/completions st.sse -N >/dev/null
[ "$(sse_text st.sse)" = "$WANT" ] && ok || fail "streamed stop: '$(sse_text st.sse)' != '$WANT'"

check "text completions, plain and streamed, agree"
echo '{"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0}' | post /v1/completions tc.json >/dev/null
[ "$(jget tc.json 'd["object"]')" = text_completion ] && ok || fail "completion object"
TEXT=$(jget tc.json 'd["choices"][0]["text"]')
echo '{"prompt": "Once upon a time", "max_tokens": 6, "temperature": 0, "stream": true}' | post /v1/completions tc.sse -N >/dev/null
[ "$(sse_text tc.sse)" = "$TEXT" ] && ok || fail "streamed completion differs"

check "conversation_id: a named conversation is created, then continued"
echo '{"conversation_id": "alice-1", "prompt": "One two three", "max_tokens": 4, "temperature": 0}' | post /v1/completions a1.json >/dev/null
[ "$(jget a1.json 'd["conversation_id"]')" = alice-1 ] && ok || fail "the id was not used"
echo '{"conversation_id": "alice-1", "prompt": "One two three four five", "max_tokens": 4, "temperature": 0}' | post /v1/completions a2.json >/dev/null
[ "$(jget a2.json 'd["usage"]["prompt_tokens_details"]["cached_tokens"]')" -ge 3 ] && ok || fail "alice-1 did not reuse its prefix"
[ -f convs/alice-1.rbs ] && ok || fail "no convs/alice-1.rbs"

check "hostile requests: an OpenAI error object with the right status, the server stays up"
bad() {   # bad STATUS TYPE BODY
    local got
    got=$(printf '%s' "$3" | post /v1/chat/completions bad.json)
    expect_error "$1" "$2" bad.json "$got"
}
bad 400 invalid_request '{"messages": [{"role": "user", "content": "Hi"}'
bad 400 invalid_request '[]'
bad 400 invalid_request ''
bad 400 invalid_request '{"messages": "Hi"}'
bad 400 invalid_request '{"messages": []}'
bad 400 invalid_request '{"messages": [{"role": "robot", "content": "Hi"}]}'
bad 400 invalid_request '{"messages": [{"role": "user", "content": 7}]}'
bad 400 invalid_request '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": "8"}'
bad 400 invalid_request '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1.5}'
bad 400 invalid_request '{"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 0}'
bad 400 invalid_request '{"messages": [{"role": "user", "content": "Hi"}], "temperature": "hot"}'
bad 400 invalid_request '{"messages": [{"role": "user", "content": "Hi"}], "temperature": 1e309}'
bad 400 invalid_request '{"messages": [{"role": "user", "content": "Hi"}], "stream": "yes"}'
bad 400 invalid_request '{"messages": [{"role": "user", "content": "Hi"}], "stop": ["a", "b", "c", "d", "e"]}'
bad 400 invalid_request '{"messages": [{"role": "user", "content": "Hi"}], "n": 2}'
bad 400 invalid_request '{"messages": [{"role": "user", "content": "Hi"}], "conversation_id": "../../etc/passwd"}'
bad 400 invalid_request '{"messages": [{"role": "user", "content": "Hi"}], "conversation_id": "a/b"}'
bad 400 invalid_request "{\"messages\": [{\"role\": \"user\", \"content\": \"Hi\"}], \"conversation_id\": \"$(printf 'x%.0s' $(seq 1 65))\"}"
bad 400 invalid_request "$(printf '%.0s[' $(seq 1 5000))"
bad 400 invalid_request "$(printf '{"messages": [{"role": "user", "content": "\xff\xfe"}]}')"
[ "$(ls convs | grep -c -v '\.rbs$' || true)" = 0 ] && ok || { ls -la convs; fail "a file other than a session file in convs"; }
# max_tokens far above the context: clamped to the room left, finish_reason "length"
echo '{"prompt": "Hi", "max_tokens": 1000000000000}' | post /v1/completions huge.json > huge.code
[ "$(cat huge.code)" = 200 ] && ok || { cat huge.json; fail "max_tokens over the context: status $(cat huge.code)"; }
case $(jget huge.json 'd["choices"][0]["finish_reason"]') in length|stop) ok ;; *) fail "max_tokens over the context: finish_reason" ;; esac
# (the last token is sampled from the full context's logits, never fed: 256 + 1)
[ "$(jget huge.json 'd["usage"]["total_tokens"] <= 257')" = True ] && ok || fail "max_tokens over the context: more tokens than the context"
# a prompt longer than the context (256)
python3 -c 'import json; print(json.dumps({"prompt": "word " * 2000, "max_tokens": 4}))' | post /v1/completions long.json > long.code
expect_error 400 invalid_request long.json "$(cat long.code)"
grep -q 'context holds 256' long.json && ok || fail "the long prompt's error does not name the context"
# a body over --max-body (64K), with and without a Content-Length
head -c 100000 /dev/zero | tr '\0' 'a' > big.txt
got=$(curl -s -o big.json -w '%{http_code}' -H 'Content-Type: application/json' --data-binary @big.txt "$URL/v1/chat/completions")
expect_error 413 invalid_request big.json "$got"
got=$(curl -s -o big2.json -w '%{http_code}' -H 'Transfer-Encoding: chunked' --data-binary @big.txt "$URL/v1/chat/completions")
expect_error 413 invalid_request big2.json "$got"
# headers beyond the connection's memory (64 KiB): refused by the HTTP layer
got=$(curl -s -o /dev/null -w '%{http_code}' -H "X-Big: $(head -c 70000 /dev/zero | tr '\0' 'b')" "$URL/health" || true)
case $got in 413|431|400|000) ;; *) fail "oversize header: status $got" ;; esac
got=$(curl -s -o nf.json -w '%{http_code}' "$URL/v2/nothing")
expect_error 404 . nf.json "$got"
got=$(curl -s -o m.json -w '%{http_code}' "$URL/v1/chat/completions")
expect_error 405 invalid_request m.json "$got"
alive

check "/metrics: Prometheus text with requests, tokens, conversations, TTFT"
curl -s "$URL/metrics" > metrics.txt
expect_line metrics.txt '^rebound_requests_total\{endpoint="chat_completions",code="2xx"\} [1-9]'
expect_line metrics.txt '^rebound_requests_total\{endpoint="chat_completions",code="4xx"\} [1-9]'
expect_line metrics.txt '^rebound_tokens_total\{kind="cached"\} [1-9]'
expect_line metrics.txt '^rebound_ttft_seconds_count [1-9]'
expect_line metrics.txt '^rebound_conversations\{state="stored"\} [1-9]'
expect_line metrics.txt '^rebound_memory_bytes\{kind="weights",tier="resident"\} [1-9]'

check "a second server on the same --sessions folder is refused"
run_fails second any 'another rebound serve \(pid [0-9]+\) uses --sessions' \
    "$REBOUND" serve -m qwen.gguf --port 0 --sessions convs
stop_server
expect_line s1.log 'SIGTERM: stopping'

check "restart: the conversations are resumed from their files (prefix and id)"
start_server s2.log -m qwen.gguf -t 2 --sessions convs --kv-page 256
expect_line s2.log '[0-9]+ conversations resumable from convs'
# turn 2 again, by prefix: a fork of the stored conversation, its KV read from its file
post /v1/chat/completions r2.json < turn2.json >/dev/null
[ "$(jget r2.json 'd["conversation_id"]')" != "$CONV1" ] && ok || fail "after a restart turn 2 sent again rewound the stored conversation"
[ "$(jget r2.json 'd["usage"]["prompt_tokens_details"]["cached_tokens"]')" -ge "$P1" ] && ok || fail "after a restart nothing was reused"
[ "$(jget r2.json 'd["choices"][0]["message"]["content"]')" = "$(jget t2.json 'd["choices"][0]["message"]["content"]')" ] \
    && ok || fail "turn 2 after a restart differs from turn 2 before"
# and by id: the conversation itself, resumed from its file
python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); d["conversation_id"] = sys.argv[2]; print(json.dumps(d))' turn2.json "$CONV1" \
    | post /v1/chat/completions r3.json >/dev/null
[ "$(jget r3.json 'd["conversation_id"]')" = "$CONV1" ] && ok || fail "after a restart the conversation named by its id was not used"
[ "$(jget r3.json 'd["usage"]["prompt_tokens_details"]["cached_tokens"]')" -ge "$P1" ] && ok || fail "after a restart nothing of $CONV1 was reused"
curl -s "$URL/metrics" > metrics2.txt
expect_line metrics2.txt '^rebound_conversation_restores_total\{path="file"\} [1-9]'
grep -q 'cannot be opened\|is not resumed' s2.log && fail "a file of 32-token pages was not opened by a server of 256" || ok
stop_server

check "--api-key (Bearer, constant-time compare) and --unix"
"$REBOUND" serve -m qwen.gguf -t 2 --unix "$SCRATCH/s.sock" --api-key sekrit > s3.log 2>&1 &
SERVER_PID=$!
for _ in $(seq 1 300); do grep -q 'listening on unix:' s3.log && break; sleep 0.1; done
expect_line s3.log 'listening on unix:'
U=(curl -s --unix-socket "$SCRATCH/s.sock")
[ "$("${U[@]}" http://localhost/health)" = '{"status":"ok"}' ] && ok || fail "/health over the unix socket"
got=$(echo "$HELLO" | "${U[@]}" -o k1.json -w '%{http_code}' --data-binary @- http://localhost/v1/chat/completions)
expect_error 401 authentication k1.json "$got"
got=$(echo "$HELLO" | "${U[@]}" -o k2.json -w '%{http_code}' -H 'Authorization: Bearer sekrit2' --data-binary @- http://localhost/v1/chat/completions)
expect_error 401 authentication k2.json "$got"
got=$(echo "$HELLO" | "${U[@]}" -o k3.json -w '%{http_code}' -H 'Authorization: Bearer sekrit' --data-binary @- http://localhost/v1/chat/completions)
[ "$got" = 200 ] && ok || { cat k3.json; fail "the right key: status $got"; }
[ "$(jget k3.json 'd["choices"][0]["message"]["content"]')" = "$REPLY1" ] && ok || fail "reply over the unix socket differs"
# the utilities are behind the key as any request
for ep in /tokenize /detokenize /apply-template /v1/embeddings; do
    case $ep in
        /tokenize) body='{"content": "hello"}' ;;
        /detokenize) body='{"tokens": [1, 2]}' ;;
        /apply-template) body='{"messages": [{"role": "user", "content": "hi"}]}' ;;
        *) body='{"input": "hello"}' ;;
    esac
    got=$(echo "$body" | "${U[@]}" -o ku.json -w '%{http_code}' --data-binary @- "http://localhost$ep")
    expect_error 401 authentication ku.json "$got"
    got=$(echo "$body" | "${U[@]}" -o ku.json -w '%{http_code}' -H 'Authorization: Bearer sekrit' --data-binary @- "http://localhost$ep")
    [ "$got" = 200 ] && ok || { cat ku.json; fail "$ep with the right key: status $got"; }
done
[ "$(jget ku.json 'len(d["data"][0]["embedding"]) > 0')" = True ] && ok || fail "no embedding with the key"
stop_server
[ ! -e "$SCRATCH/s.sock" ] && ok || fail "the socket file was left behind"

check "too many requests in flight: 429 for the rest, the others complete"
start_server s4.log -m slower.gguf -t 2 -c 2048 --parallel 1 --max-queue 1
pids=()
for i in 1 2 3 4 5 6; do
    (echo '{"prompt": "count with me", "max_tokens": 100, "temperature": 0}' | post /v1/completions "q$i.json" > "q$i.code") &
    pids+=($!)
done
wait "${pids[@]}"
n200=0; n429=0
for i in 1 2 3 4 5 6; do
    case $(cat "q$i.code") in
        200) n200=$((n200 + 1)) ;;
        429) n429=$((n429 + 1)); expect_error 429 rate_limit "q$i.json" 429 ;;
        *) cat "q$i.json"; fail "request $i: status $(cat "q$i.code")" ;;
    esac
done
[ $n200 -ge 1 ] && [ $n429 -ge 1 ] && ok || fail "$n200 answered and $n429 refused, expected some of both"

check "a client that leaves mid-stream: its generation stops, the conversation goes on"
# the client leaves once its first events arrived (head closes the pipe:
# curl dies of SIGPIPE), however slow the server (a TSan build) is
echo '{"conversation_id": "leaver", "prompt": "tell a long story", "max_tokens": 1900, "temperature": 0, "stream": true}' \
    | timeout 120 curl -s -N -H 'Content-Type: application/json' --data-binary @- "$URL/v1/completions" \
    | head -c 300 > leave.sse || true
[ -s leave.sse ] && ok || fail "no event arrived before the client left"
for _ in $(seq 1 600); do grep -q 'conversation leaver: .* cancelled' s4.log && break; sleep 0.1; done
expect_line s4.log 'conversation leaver: [0-9]+ prompt tokens .*, [0-9]+ generated, cancelled'
n_gen=$(sed -n 's/.*conversation leaver: .*, \([0-9]*\) generated, cancelled.*/\1/p' s4.log)
[ "$n_gen" -lt 1900 ] && ok || fail "the generation ran to its end ($n_gen tokens)"
echo '{"conversation_id": "leaver", "prompt": "tell a long story", "max_tokens": 4, "temperature": 0}' | post /v1/completions after.json > after.code
[ "$(cat after.code)" = 200 ] && ok || fail "the conversation of the client that left: status $(cat after.code)"
[ "$(jget after.json 'd["usage"]["prompt_tokens_details"]["cached_tokens"]')" -ge 1 ] && ok || fail "nothing reused after the client left"
# and a client that leaves while waiting for a whole (not streamed) reply
echo '{"conversation_id": "leaver2", "prompt": "tell a long story", "max_tokens": 1900, "temperature": 0}' \
    | curl -s --max-time 1 -H 'Content-Type: application/json' --data-binary @- "$URL/v1/completions" > leave2.json || true
for _ in $(seq 1 600); do grep -q 'conversation leaver2: .* cancelled' s4.log && break; sleep 0.1; done
expect_line s4.log 'conversation leaver2: [0-9]+ prompt tokens .*, [0-9]+ generated, cancelled'
curl -s "$URL/metrics" > m4.txt
grep -Eq '^rebound_requests_cancelled_total [1-9]' m4.txt && ok || fail "no cancelled request in /metrics"
alive
stop_server

check "bounds: --max-conversations 2 deletes the least recently used conversation's file"
start_server s5.log -m qwen.gguf -t 2 --sessions bounded --max-conversations 2 --max-connections 3
for id in b1 b2 b3; do
    echo "{\"conversation_id\": \"$id\", \"prompt\": \"hello $id\", \"max_tokens\": 2}" | post /v1/completions "$id.json" >/dev/null
done
[ ! -e bounded/b1.rbs ] && [ -e bounded/b2.rbs ] && [ -e bounded/b3.rbs ] && ok || { ls bounded; fail "the oldest conversation's file was not the one deleted"; }
expect_line s5.log 'conversation b1 deleted \(more than --max-conversations\)'
curl -s "$URL/metrics" > m5.txt
# four idle connections held open: the fifth (over --max-connections 3) hears 503
python3 - "${URL#http://}" > conn.out <<'EOF'
import socket, sys
host, port = sys.argv[1].split(":")
idle = [socket.create_connection((host, int(port))) for _ in range(4)]
s = socket.create_connection((host, int(port)))
s.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
s.settimeout(10)
print(s.recv(4096).decode("latin-1").split("\r\n")[0])
for c in idle + [s]:
    c.close()
EOF
grep -q '^HTTP/1.1 503' conn.out && ok || { cat conn.out; fail "over --max-connections: not 503"; }
for _ in $(seq 1 50); do [ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/health")" = 200 ] && break; sleep 0.1; done
alive
grep -Eq '^rebound_conversations\{state="total"\} 2$' m5.txt && ok || fail "/metrics does not count 2 conversations"
stop_server
check "chats sharing a system prompt: their files link one prefix file; reopened beside its source a fork shares the prefix and reads its tail, exact; the last deletion takes the prefix file"
SYS=$(python3 -c 'print(" ".join("rule %d: answer in the voice of entry %d." % (i, 7 * i) for i in range(7)))')
chat() { # chat SYSTEM USER [ASSISTANT USER2] [ID]: a request body
    python3 - "$@" <<'EOF'
import json, sys
a = sys.argv[1:]
m = [{"role": "system", "content": a[0]}, {"role": "user", "content": a[1]}]
if len(a) >= 4:
    m += [{"role": "assistant", "content": a[2]}, {"role": "user", "content": a[3]}]
d = {"messages": m, "max_tokens": 8, "temperature": 0}
if len(a) in (3, 5):
    d["conversation_id"] = a[-1]
print(json.dumps(d))
EOF
}
start_server sp1.log -m qwen.gguf -t 2 --sessions pfx --max-conversations 2
chat "$SYS" "one" | post /v1/chat/completions pa.json >/dev/null
chat "$SYS" "two" | post /v1/chat/completions pb.json >/dev/null
[ "$(jget pa.json 'd["usage"]["prompt_tokens"]')" -ge 140 ] && ok || fail "the shared system prompt is shorter than 4 pages: $(jget pa.json 'd["usage"]["prompt_tokens"]') tokens"
CA=$(jget pa.json 'd["conversation_id"]'); CB=$(jget pb.json 'd["conversation_id"]')
RB1=$(jget pb.json 'd["choices"][0]["message"]["content"]')
expect_line sp1.log "forked from $CA at token"
[ "$(ls -a pfx | grep -c '^\.rbprefix-')" = 1 ] && ok || { ls -la pfx; fail "not one prefix file in pfx/"; }
PFX=$(ls -a pfx | grep '^\.rbprefix-' || true)
[ "$(stat -c %i "pfx/$CB.rbs.base")" = "$(stat -c %i "pfx/$PFX")" ] && ok || { ls -lai pfx; fail "$CB.rbs.base is not a link to the prefix file"; }
[ ! -e "pfx/$CA.rbs.base" ] && ok || fail "the source's own file links a prefix file"
[ "$(stat -c %s "pfx/$CB.rbs")" -lt "$(stat -c %s "pfx/$CA.rbs")" ] && ok || { ls -la pfx; fail "the fork's file is not smaller than its source's"; }
curl -s "$URL/metrics" > mp1.txt
DISK=$(grep '^rebound_sessions_disk_bytes ' mp1.txt | cut -d' ' -f2)
[ "$DISK" = $(( $(stat -c %s "pfx/$CA.rbs") + $(stat -c %s "pfx/$CB.rbs") + $(stat -c %s "pfx/$PFX") )) ] \
    && ok || { ls -la pfx; fail "rebound_sessions_disk_bytes $DISK is not the two files and the prefix file"; }
stop_server
# restarted: the source's next turn reopens it from its file; then the
# fork's, its prefix shared with the open source (not read: the pages'
# bits checked against its file), its tail read from its file
start_server sp2.log -m qwen.gguf -t 2 --sessions pfx --max-conversations 2
chat "$SYS" "one" "$(jget pa.json 'd["choices"][0]["message"]["content"]')" "again" "$CA" \
    | post /v1/chat/completions pa2.json >/dev/null
chat "$SYS" "two" "$RB1" "three" "$CB" | post /v1/chat/completions pc.json >/dev/null
RA=$(jget pa2.json 'd["timings"]["restore_read_bytes"]'); RC=$(jget pc.json 'd["timings"]["restore_read_bytes"]')
[ "$RC" -gt 0 ] && [ $((RC * 4)) -lt "$RA" ] && ok || fail "the fork reopened beside its source read $RC bytes, its source $RA"
[ "$(jget pc.json 'd["conversation_id"]')" = "$CB" ] && ok || fail "the fork by its id after a restart"
[ "$(jget pc.json 'd["usage"]["prompt_tokens_details"]["cached_tokens"]')" -gt "$(jget pb.json 'd["usage"]["prompt_tokens"]')" ] \
    && ok || { cat pc.json; fail "the reopened fork reused less than its first turn"; }
# two more conversations: the oldest two go, and the prefix file with the last link
for k in 1 2; do
    echo "{\"prompt\": \"unrelated $k\", \"max_tokens\": 2}" | post /v1/completions "pu$k.json" >/dev/null
done
[ ! -e "pfx/$CA.rbs" ] && [ ! -e "pfx/$CB.rbs" ] && [ ! -e "pfx/$CB.rbs.base" ] && ok || { ls -la pfx; fail "--max-conversations kept a sharing conversation"; }
[ "$(ls -a pfx | grep -c '^\.rbprefix-' || true)" = 0 ] && ok || { ls -la pfx; fail "the prefix file outlived its last link"; }
stop_server
# the same turns on a server without files, never reopened (the reply
# reused as the tokens the model generated): the same greedy reply
start_server sp3.log -m qwen.gguf -t 2
chat "$SYS" "one" | post /v1/chat/completions pa3.json >/dev/null
chat "$SYS" "two" | post /v1/chat/completions pb3.json >/dev/null
chat "$SYS" "two" "$RB1" "three" | post /v1/chat/completions pd.json >/dev/null
[ "$(jget pd.json 'd["usage"]["prompt_tokens"]')" = "$(jget pc.json 'd["usage"]["prompt_tokens"]')" ] \
    && ok || fail "the reference turn has other tokens than the reopened fork's"
[ "$(jget pd.json 'd["choices"][0]["message"]["content"]')" = "$(jget pc.json 'd["choices"][0]["message"]["content"]')" ] \
    && ok || fail "the reopened fork's reply differs from a server's that never closed it"
stop_server

# --max-open 2: the pool names the idle session to close (rb_pool_next_to_close),
# the conversation's file keeps it, and its next turn reopens the file
start_server s5b.log -m qwen.gguf -t 2 --sessions maxopen --max-open 2 --parallel 1
for id in o1 o2 o3 o1; do
    echo "{\"conversation_id\": \"$id\", \"prompt\": \"hello $id\", \"max_tokens\": 2}" | post /v1/completions "$id.json" >/dev/null
done
expect_line s5b.log "conversation o1 closed \\(the pool's budget or --max-open; its file keeps it\\)"
[ "$(jget o1.json 'd["restore"]')" = file ] || fail "o1's return after the pool closed it: restore $(jget o1.json 'd["restore"]'), not file"
curl -s "$URL/metrics" > m5b.txt
grep -Eq '^rebound_conversations_closed_total [1-9]' m5b.txt || fail "/metrics counts no closed conversation"
stop_server

check "kill -9 mid-stream, restart: the next turn comes from the file, greedy reply as uninterrupted"
TURN='{"conversation_id": "k", "messages": [{"role": "user", "content": "first"}], "max_tokens": 6, "temperature": 0}'
TURN2='{"conversation_id": "k", "messages": [{"role": "user", "content": "first"}, {"role": "assistant", "content": "ok"}, {"role": "user", "content": "second"}], "max_tokens": 12, "temperature": 0}'
start_server s6.log -m slow.gguf -t 2 -c 2048 --sessions ref
echo "$TURN" | post /v1/chat/completions ref1.json >/dev/null
echo "$TURN2" | post /v1/chat/completions ref2.json >/dev/null
stop_server
start_server s7.log -m slow.gguf -t 2 -c 2048 --sessions killed
echo "$TURN" | post /v1/chat/completions k1.json >/dev/null
python3 -c 'import json, sys; d = json.loads(sys.argv[1]); d["stream"] = True; d["max_tokens"] = 1500; print(json.dumps(d))' "$TURN2" \
    | curl -s -N -H 'Content-Type: application/json' --data-binary @- "$URL/v1/chat/completions" > killed.sse &
CURL_PID=$!
for _ in $(seq 1 100); do grep -q '"content"' killed.sse 2>/dev/null && break; sleep 0.05; done
grep -q '"content"' killed.sse && ok || fail "the stream to be killed sent nothing"
kill -KILL "$SERVER_PID"
wait "$SERVER_PID" 2>/dev/null || true
wait "$CURL_PID" 2>/dev/null || true
SERVER_PID=""
grep -q 'data: \[DONE\]' killed.sse && fail "the stream ended before the kill (make the model slower)" || ok
start_server s8.log -m slow.gguf -t 2 -c 2048 --sessions killed
echo "$TURN2" | post /v1/chat/completions k2.json >/dev/null
[ "$(jget k2.json 'd["choices"][0]["message"]["content"]')" = "$(jget ref2.json 'd["choices"][0]["message"]["content"]')" ] \
    && ok || fail "after kill -9 the reply '$(jget k2.json 'd["choices"][0]["message"]["content"]')' differs from '$(jget ref2.json 'd["choices"][0]["message"]["content"]')'"
[ "$(jget k2.json 'd["usage"]["prompt_tokens_details"]["cached_tokens"]')" -ge "$(jget k1.json 'd["usage"]["prompt_tokens"]')" ] \
    && ok || fail "after kill -9 the first turn was not served from the file"
curl -s "$URL/metrics" > m8.txt
grep -Eq '^rebound_conversation_restores_total\{path="file"\} [1-9]' m8.txt && ok || fail "no restore from file in /metrics"
stop_server

check "more conversations than --mem-budget holds: the pool trims idle KV, a returning one is exact"
# slow.gguf at -c 1024: 6.4 MB of weights, ~3.2 MB per 400-token
# conversation (KV + run state at -b 128; an idle one's run state is given
# back): three of them need ~14 MB, the budget is 10
LONG=$(python3 -c 'print("the cat sat on the mat and " * 40)')
mb_round() {   # mb_round PREFIX: three conversations, then m1's next turn
    for id in m1 m2 m3; do
        echo "{\"conversation_id\": \"$id\", \"prompt\": \"$LONG $id\", \"max_tokens\": 4, \"temperature\": 0}" \
            | post /v1/completions "$1-$id.json" >/dev/null
    done
    echo "{\"conversation_id\": \"m1\", \"prompt\": \"$LONG m1 and then\", \"max_tokens\": 8, \"temperature\": 0}" \
        | post /v1/completions "$1-back.json" >/dev/null
}
start_server s9.log -m slow.gguf -t 2 -c 1024 -b 128
mb_round ref
stop_server
pressure=""
[ -r /proc/pressure/memory ] && pressure=--pressure   # the monitor too, where PSI exists
start_server s10.log -m slow.gguf -t 2 -c 1024 -b 128 --mem-budget 10M $pressure
if [ -n "$pressure" ]; then
    grep -q 'the pool trims on memory pressure from .*/proc/pressure/memory\|the pool trims on memory pressure from .*memory.pressure' s10.log \
        && ok || { cat s10.log >&2; fail "--pressure: serve does not say what it watches"; }
fi
mb_round mb
curl -s "$URL/metrics" > m10.txt
stop_server
[ "$(jget mb-back.json 'd["choices"][0]["text"]')" = "$(jget ref-back.json 'd["choices"][0]["text"]')" ] \
    && ok || fail "the returning conversation's reply under the budget differs from the reference"
[ "$(jget mb-back.json 'd["usage"]["prompt_tokens_details"]["cached_tokens"]')" -ge 400 ] \
    && ok || fail "the returning conversation was recomputed, not restored"
# its timings say what came back: bytes read or decoded by the restore
jget mb-back.json '(lambda t: t["restore_read_bytes"] + t["restore_decoded_bytes"] + t["restore_prefetched_bytes"] > 0)(d["timings"])' \
    | grep -q True && ok || { cat mb-back.json; fail "timings: the return's restore is not reported"; }
# and the wait for room (the pool's trims of the others) inside its prefill
jget mb-back.json '(lambda t: 0 <= t["room_ms"] <= t["prompt_ms"])(d["timings"])' \
    | grep -q True && ok || { cat mb-back.json; fail "timings: room_ms missing or outside prompt_ms"; }
grep -Eq '^rebound_pool_bytes\{what="trimmed"\} [1-9]' m10.txt && ok || { cat m10.txt >&2; fail "the pool trimmed nothing"; }
# m1's return was admitted with its KV trimmed: its restore began at admission
grep -Eq '^rebound_pool_prefetches_total [1-9]' m10.txt && ok || { grep prefetch m10.txt >&2; fail "no restore began ahead of the returning conversation's feed"; }
# the room came from the idle conversations leveled (the planner's line is shown)
grep -Eq '^rebound_pool_leveled_trims_total [1-9]' m10.txt && grep -Eq '^rebound_pool_level_line_bytes [0-9]+$' m10.txt \
    && ok || { grep level m10.txt >&2; fail "/metrics: no leveled trim reported"; }
grep -Eq '^rebound_pool_shared_trims_total [0-9]+$' m10.txt && ok || { grep shared m10.txt >&2; fail "/metrics: no shared_trims counter"; }
total=$(sed -n 's/^rebound_pool_bytes{what="total"} //p' m10.txt)
[ "$total" -le $((10 * 1048576 * 105 / 100)) ] && ok || fail "the pool holds $total bytes, over the 10 MiB budget + 5%"

check "concurrent streams: decoded in one pass, each greedy reply the same as alone"
# four streamed completions (one with a prompt of several prefill chunks),
# first one after the other, then all at once: each text must be the same
# (each stream's logits are the bits of decoding it alone), and the
# concurrent run must have decoded several streams in one pass
conc_body() {   # conc_body I ID: a new conversation each (no prefix reused)
    python3 - "$1" "$2" <<'EOF'
import json, sys
i = int(sys.argv[1])
prompt = ("a long preamble of words " * 60 if i == 4 else "") + "stream %d counts" % i
print(json.dumps({"conversation_id": sys.argv[2], "prompt": prompt * (1 + i % 2),
                  "max_tokens": 40 + 8 * i, "temperature": 0, "seed": 7, "stream": True}))
EOF
}
start_server s11.log -m slow.gguf -t 2 -c 2048 --parallel 4 -b 64
for i in 1 2 3 4; do
    conc_body $i "seq-$i" | post /v1/completions "seq$i.sse" -N > "seq$i.code"
    [ "$(cat "seq$i.code")" = 200 ] && ok || fail "sequential stream $i: status $(cat "seq$i.code")"
done
curl -s "$URL/metrics" > m11a.txt
grep -Eq '^rebound_decode_passes_total\{streams="several"\} 0$' m11a.txt \
    && ok || fail "one request at a time still decoded several streams in a pass"
pids=()
for i in 1 2 3 4; do
    (conc_body $i "par-$i" | post /v1/completions "par$i.sse" -N > "par$i.code") &
    pids+=($!)
done
wait "${pids[@]}"
for i in 1 2 3 4; do
    [ "$(cat "par$i.code")" = 200 ] && ok || fail "concurrent stream $i: status $(cat "par$i.code")"
    [ -n "$(sse_text "seq$i.sse")" ] && ok || fail "stream $i: empty text"
    [ "$(sse_text "par$i.sse")" = "$(sse_text "seq$i.sse")" ] \
        && ok || fail "stream $i: concurrent '$(sse_text "par$i.sse")' != alone '$(sse_text "seq$i.sse")'"
done
curl -s "$URL/metrics" > m11b.txt
grep -Eq '^rebound_decode_passes_total\{streams="several"\} [1-9]' m11b.txt \
    && ok || { grep decode_passes m11b.txt >&2; fail "the concurrent streams were never decoded in one pass"; }
alive
stop_server

check "--weights-budget: two concurrent conversations stream the weights from one shared cache, replies as resident"
# slow.gguf holds ~6.4 MB of weights; 3 MB streams about half of them per
# token. Streams 1 and 2 at once (-np 2, decoded in one pass, each unit
# read once for both): their texts must be those computed alone above
start_server s11w.log -m slow.gguf -t 2 -c 2048 --parallel 2 -b 64 --weights-budget 3M
pids=()
for i in 1 2; do
    (conc_body $i "wb-$i" | post /v1/completions "wb$i.sse" -N > "wb$i.code") &
    pids+=($!)
done
wait "${pids[@]}"
for i in 1 2; do
    [ "$(cat "wb$i.code")" = 200 ] && ok || { cat "wb$i.sse" s11w.log >&2; fail "streamed-weights stream $i: status $(cat "wb$i.code")"; }
    [ "$(sse_text "wb$i.sse")" = "$(sse_text "seq$i.sse")" ] \
        && ok || fail "stream $i under --weights-budget: '$(sse_text "wb$i.sse")' != resident '$(sse_text "seq$i.sse")'"
done
curl -s "$URL/metrics" > m11w.txt
grep -Eq '^rebound_decode_passes_total\{streams="several"\} [1-9]' m11w.txt \
    && ok || { grep decode_passes m11w.txt >&2; fail "the streaming conversations were never decoded in one pass"; }
alive
stop_server

check "prefill chunks: a lone prompt in one pass; beside a decoding stream in chunks, its tokens' gaps bounded"
# slower.gguf: a 700-token prompt takes seconds of prefill, a decode step
# tens of ms. (a) alone, with -b 2048, the prompt is one pass; (b) while
# stream A decodes, B's prompt of the same length is cut into chunks, so
# A's tokens keep coming during B's prefill: A's longest gap is bounded
# relative to B's own time to first token (unchunked, A would wait all of
# it), not by a wall-clock figure
metric() {   # metric FILE NAME{LABELS}: its value
    awk -v k="$2" '$1 == k { print $2; exit }' "$1"
}
start_server s12.log -m slower.gguf -t 2 -c 2048 -b 2048 --parallel 2 --max-stall-ms 50
python3 -c 'import json; print(json.dumps({"prompt": "the cat sat on the mat and " * 70, "max_tokens": 1, "temperature": 0}))' \
    | post /v1/completions lone.json > lone.code
[ "$(cat lone.code)" = 200 ] && ok || { cat lone.json >&2; fail "the lone prompt: status $(cat lone.code)"; }
NP=$(jget lone.json 'd["usage"]["prompt_tokens"]')
curl -s "$URL/metrics" > m12a.txt
[ "$NP" -ge 500 ] && ok || fail "the lone prompt has $NP tokens, too few to tell one pass from chunks"
[ "$(metric m12a.txt 'rebound_prefill_chunks_total{mode="alone"}')" = 1 ] \
    && ok || { grep prefill m12a.txt >&2; fail "the lone $NP-token prompt was not prefilled in one pass"; }
[ "$(metric m12a.txt 'rebound_prefill_chunk_tokens_total{mode="alone"}')" = "$NP" ] \
    && ok || { grep prefill m12a.txt >&2; fail "the one pass did not hold all $NP prompt tokens"; }
[ "$(metric m12a.txt 'rebound_prefill_chunks_total{mode="shared"}')" = 0 ] \
    && ok || { grep prefill m12a.txt >&2; fail "a lone prompt was chunked"; }
python3 - "$URL" > gaps.txt <<'EOF' || fail "the stream client failed"
import http.client, json, sys, threading, time, urllib.parse
u = urllib.parse.urlparse(sys.argv[1])
def stream(body, times, stop=None):
    c = http.client.HTTPConnection(u.hostname, u.port, timeout=300)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    assert r.status == 200, r.status
    while True:
        line = r.readline()
        if not line or line.strip() == b"data: [DONE]" or (stop and stop.is_set()):
            break
        if line.startswith(b"data: "):
            times.append(time.monotonic())
    c.close()
a_times, b_times, stop = [], [], threading.Event()
ta = threading.Thread(target=stream, args=({"prompt": "Once upon a time", "max_tokens": 1900,
                      "temperature": 0, "stream": True}, a_times, stop))
ta.start()
while len(a_times) < 5:
    assert ta.is_alive(), "stream A ended before B was sent"
    time.sleep(0.01)
t_b = time.monotonic()
stream({"prompt": "a dog ran in the park and " * 70, "max_tokens": 1, "temperature": 0,
        "stream": True}, b_times)
stop.set()
ta.join()
t_first = b_times[0]
inside = [t for t in a_times if t_b <= t <= t_first]
ts = [t_b] + inside + [t_first]
gap = max(y - x for x, y in zip(ts, ts[1:]))
print("ttft %.4f gap %.4f tokens %d" % (t_first - t_b, gap, len(inside)))
EOF
read -r _ TTFT _ GAP _ NIN < gaps.txt
echo "   B's TTFT ${TTFT} s; A: $NIN tokens meanwhile, longest gap ${GAP} s"
[ "$NIN" -ge 5 ] && ok || fail "stream A got $NIN tokens during B's prefill (${TTFT} s): B's prompt was not chunked between them"
python3 -c "import sys; sys.exit(0 if float('$GAP') < float('$TTFT') / 3 else 1)" \
    && ok || fail "stream A waited ${GAP} s for a token during B's ${TTFT} s prefill (more than a third of it)"
curl -s "$URL/metrics" > m12b.txt
[ "$(metric m12b.txt 'rebound_prefill_chunks_total{mode="shared"}')" -ge 5 ] \
    && ok || { grep prefill m12b.txt >&2; fail "B's prompt was not cut into chunks"; }
PPT=$(metric m12b.txt 'rebound_step_seconds{kind="prefill_per_token"}')
DST=$(metric m12b.txt 'rebound_step_seconds{kind="decode"}')
python3 -c "import sys; sys.exit(0 if float('$PPT') > 0 and float('$DST') > 0 else 1)" \
    && ok || { grep step_seconds m12b.txt >&2; fail "/metrics shows no step time estimates"; }
GMAX=$(metric m12b.txt rebound_decode_gap_max_seconds)
python3 -c "import sys; sys.exit(0 if 0 < float('$GMAX') < float('$TTFT') / 3 else 1)" \
    && ok || fail "the server's longest decode gap ${GMAX} s is not within a third of B's ${TTFT} s prefill"
grep -E '^rebound_(prefill_chunk|step_seconds|decode_gap)' m12b.txt | sed 's/^/   /'
alive
stop_server

check "usage errors: no model, bad --chat-template, --max-open below --parallel"
run_fails u1 2 'no model given' "$REBOUND" serve
run_fails u2 2 "unknown --chat-template 'nope'" "$REBOUND" serve -m qwen.gguf --chat-template nope
run_fails u3 2 'is below --parallel' "$REBOUND" serve -m qwen.gguf --max-open 1 --parallel 2
run_fails u4 1 'nope.gguf' "$REBOUND" serve -m nope.gguf

passed
