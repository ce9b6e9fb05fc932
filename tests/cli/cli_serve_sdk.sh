#!/usr/bin/env bash
# cli_serve_sdk.sh - real OpenAI clients against `rebound serve` on
# loopback: the official `openai` npm SDK and the Vercel AI SDK (`ai` +
# `@ai-sdk/openai-compatible`), installed with npm into the build tree
# (build/tests/npm-sdk, kept between runs; never the source tree), run
# serve_sdk.mjs: structured output (response_format json_schema and
# json_object, streamed and not, chat and completions; generateObject and
# Output.object), tool calls through a whole agent turn (required, named,
# streamed; the tool's result; the answer), logprobs, penalties,
# logit_bias, embeddings (base64 and float), the errors. Skips (77) when
# serve, node or npm is missing, or npm cannot reach its registry.
set -euo pipefail
. "$(dirname "$0")/lib.sh"
. "$CLI_DIR/serve_lib.sh"

for tool in node npm; do
    command -v $tool >/dev/null 2>&1 || { echo "SKIP: $tool is not installed (scripts/deps.sh installs nodejs and npm)"; exit 77; }
done

# the packages, once per build tree
NPM_DIR=$(cd "$SCRATCH/../.." && pwd)/npm-sdk
mkdir -p "$NPM_DIR"
if ! (cd "$NPM_DIR" && node -e "require.resolve('openai'); require.resolve('ai'); require.resolve('@ai-sdk/openai-compatible')" 2>/dev/null); then
    check "npm install openai ai @ai-sdk/openai-compatible into $NPM_DIR"
    if ! (cd "$NPM_DIR" && timeout 600 npm install --no-audit --no-fund --loglevel=error \
              openai ai @ai-sdk/openai-compatible > "$SCRATCH/npm.log" 2>&1); then
        cat "$SCRATCH/npm.log" >&2
        echo "SKIP: npm install failed (no registry?); see above"
        exit 77
    fi
    (cd "$NPM_DIR" && node -e "require.resolve('openai'); require.resolve('ai'); require.resolve('@ai-sdk/openai-compatible')") \
        && ok || fail "npm install left a package unresolvable"
fi
(cd "$NPM_DIR" && npm ls --depth=0 2>/dev/null | sed 's/^/   /') || true

check "a random-weight model and a server"
run_ok mk "$REBOUND" make-model --shape tiny --type q8_0 --ctx 4096 -o "$SCRATCH/tiny.gguf"
start_server "$SCRATCH/serve.log" -m "$SCRATCH/tiny.gguf" -c 4096

check "serve_sdk.mjs: openai and the Vercel AI SDK"
cp "$CLI_DIR/serve_sdk.mjs" "$NPM_DIR/serve_sdk.mjs"
if ! (cd "$NPM_DIR" && timeout 600 node serve_sdk.mjs "$URL") > "$SCRATCH/sdk.log" 2>&1; then
    tail -n 40 "$SCRATCH/sdk.log" >&2
    tail -n 20 "$SCRATCH/serve.log" >&2
    fail "serve_sdk.mjs failed"
fi
grep -E '^(-- |PASS)' "$SCRATCH/sdk.log" | cut -c1-120
N_CHECKS=$((N_CHECKS + $(grep -c '^-- ' "$SCRATCH/sdk.log")))
stop_server
passed
