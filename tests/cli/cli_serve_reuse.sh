#!/usr/bin/env bash
# cli_serve_reuse.sh - a chat reply sent back verbatim reuses the tokens the
# model generated (tests/cli/serve_reuse.py, a python3 client): every token
# before the new message cached on a random-weight model, streamed or not,
# with a stop string, after a restart; an edited reply tokenized as text;
# no reuse across namespaces; the reply equal to a fresh session's on the
# same tokens; the plain template on a BPE and a SentencePiece model.
#
#   cli_serve_reuse.sh REBOUND_BIN SCRATCH_DIR MODELS_DIR SESSION_TOOL
# SESSION_TOOL: tests/session_tool (prints a session file's tokens).
set -euo pipefail
TOOL=${4:?usage: cli_serve_reuse.sh REBOUND SCRATCH MODELS SESSION_TOOL}
TOOL=$(cd "$(dirname "$TOOL")" && pwd)/$(basename "$TOOL")
. "$(dirname "$0")/lib.sh"

. "$CLI_DIR/serve_lib.sh"

check "a chat reply sent back reuses the model's own tokens"
run_ok mk "$REBOUND" make-model --arch qwen3 --vocab-style bpe --dim 64 --layers 2 --heads 4 \
    --kv-heads 2 --ffn 256 --vocab 1024 --ctx 512 --type q8_0 -o qwen.gguf
run_ok mk2 "$REBOUND" make-model --arch llama --vocab-style spm --dim 64 --layers 2 --heads 4 \
    --kv-heads 2 --ffn 256 --vocab 1024 --ctx 512 --type q8_0 -o spm.gguf
python3 "$CLI_DIR/serve_reuse.py" "$REBOUND" "$SCRATCH/qwen.gguf" "$SCRATCH/spm.gguf" "$TOOL" \
    "$SCRATCH/work" \
    && ok || fail "serve_reuse.py failed (above)"
passed
