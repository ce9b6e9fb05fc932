#!/usr/bin/env bash
# cli_serve_attack.sh - the attack suite of `rebound serve` over real HTTP
# on loopback (tests/cli/serve_attack.py, a python3 client): namespaces
# (another app's id is an unknown id, the prefix oracle tells nothing,
# eviction, /metrics and prefix files stay inside a namespace, 128-bit
# ids), forked conversations, slow-header and slow-body attacks with a canary,
# concurrent large bodies with the server's VmHWM sampled, 429 with the
# defaults, damaged and deleted session files, control-token text, GET
# pipelining, strict HTTP, a half-closed POST, CORS, the --unix takeover
# and the --sessions lock. Bounded for CI (well under 2 minutes);
# serve_attack.py --long runs the measured targets at full size.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

. "$CLI_DIR/serve_lib.sh"

run_ok mk "$REBOUND" make-model --arch qwen3 --vocab-style bpe --dim 64 --layers 2 --heads 4 \
    --kv-heads 2 --ffn 256 --vocab 1024 --ctx 256 --type q8_0 -o qwen.gguf
# slower (about 4 ms a token on 2 threads): requests that overlap
run_ok mks "$REBOUND" make-model --arch qwen3 --vocab-style bpe --dim 256 --layers 4 --heads 4 \
    --kv-heads 2 --ffn 1024 --vocab 4096 --ctx 2048 --type q8_0 -o slow.gguf

python3 "$CLI_DIR/serve_attack.py" "$REBOUND" "$SCRATCH/qwen.gguf" "$SCRATCH/slow.gguf" "$SCRATCH"
