#!/usr/bin/env bash
# cli_info_reference.sh - `rebound info` on the reference models of
# ../shared/models: the stories260K numbers of the models README (the mzCache
# paper's Table 1 for that model), the parity files open with their shapes,
# and rebound's per-tensor type choice against the files llama-quantize wrote.
# Skips (77) when the models folder is absent, as in a user's fresh clone.
#
# usage: cli_info_reference.sh REBOUND_BIN SCRATCH_DIR MODELS_DIR
set -euo pipefail
. "$(dirname "$0")/lib.sh"

MODELS=${3:-}
if [ -z "$MODELS" ] || [ ! -f "$MODELS/stories260K.gguf" ]; then
    echo "SKIP [$TEST_NAME]: reference models not found in '${MODELS}' (set -DREBOUND_MODELS_DIR=...)"
    exit 77
fi
MODELS=$(cd "$MODELS" && pwd)

check "info stories260K.gguf -c 512: the README's numbers"
run_ok s "$REBOUND" info "$MODELS/stories260K.gguf" -c 512
expect_line s.out '^architecture +llama '
expect_line s.out '^shape +dim 64, 5 layers, 8 heads, 4 KV heads, head dim 8, ffn 172, vocab 512$'
expect_line s.out '^context +128 trained; rope dims 8, '
expect_line s.out '^output +separate output.weight'
expect_line s.out '^tensors +48: F32 x48 '
expect_line s.out '^weights +1,171,200 bytes .* of tensor data'
expect_line s.out '^  per layer +181,760 bytes .*every layer'
expect_line s.out '^  all layers +908,800 bytes .* in 5 layers'
expect_line s.out '^  other +262,400 bytes'
expect_line s.out '^KV cache f16 +640 bytes per token = 2 \(K,V\) x 5 layers x 4 KV heads x 8 dims x 2 bytes'
expect_line s.out '^  at ctx 512 +327,680 bytes \(320.00 KiB\)'

check "info stories260K.gguf --tensors: 48 tensors, all F32"
run_ok st "$REBOUND" info "$MODELS/stories260K.gguf" --tensors
n=$(tensor_table st.out | wc -l)
[ "$n" -eq 48 ] && ok || fail "the tensor table has $n rows, expected 48"
n=$(tensor_table st.out | awk '$2 != "F32"' | wc -l)
[ "$n" -eq 0 ] && ok || fail "$n tensors are not F32"
expect_line st.out '^  at ctx 128 '   # default context: the trained one

declare -A PARITY_TYPES=(
    [parity-F16.gguf]='^tensors +20: F32 x5 .*, F16 x15 '
    [parity-Q8_0.gguf]='^tensors +20: F32 x5 .*, Q8_0 x15 '
    [parity-Q4_0.gguf]='^tensors +20: F32 x5 .*, Q6_K x1 .*, Q4_0 x14 '
    [parity-Q4_K_M.gguf]='^tensors +20: F32 x5 .*, Q6_K x3 .*, Q4_K x12 '
    [parity-qwen3-Q8_0.gguf]='^tensors +24: F32 x9 .*, Q8_0 x15 '
)
for f in parity-F16.gguf parity-Q8_0.gguf parity-Q4_0.gguf parity-Q4_K_M.gguf parity-qwen3-Q8_0.gguf; do
    check "info $f opens: shape and tensor types"
    [ -f "$MODELS/$f" ] && ok || fail "$MODELS/$f is missing"
    run_ok p "$REBOUND" info "$MODELS/$f" --tensors
    expect_line p.out "${PARITY_TYPES[$f]}"
    expect_line p.out '^output +tied '
    expect_line p.out '^context +512 trained'
    if [ $f = parity-qwen3-Q8_0.gguf ]; then
        expect_line p.out '^architecture +qwen3 '
        expect_line p.out '^shape +dim 256, 2 layers, 8 heads, 2 KV heads, head dim 64, ffn 768, vocab 50257$'
        expect_line p.out '^blk.1.attn_q_norm.weight +F32 +64 '
        expect_line p.out '^blk.0.attn_q.weight +Q8_0 +256 x 512 '
    else
        expect_line p.out '^architecture +llama '
        expect_line p.out '^shape +dim 256, 2 layers, 8 heads, 2 KV heads, head dim 32, ffn 768, vocab 32000$'
        expect_line p.out '^KV cache f16 +512 bytes per token'
    fi
    tensor_table p.out | sort > ref-$f.txt
done

# rebound's per-tensor types must be llama-quantize's: quantize the F16
# parity file and make a model of the same shape, and compare the tables
# (names, types, dims, bytes) with the files llama-quantize wrote.
for kind in q8_0 q4_0 q4_k_m; do
    ref=parity-$(echo $kind | tr a-z A-Z).gguf
    check "make-model of the parity shape at $kind: same tensor table as llama-quantize's $ref"
    run_ok mk "$REBOUND" make-model --dim 256 --layers 2 --heads 8 --kv-heads 2 --ffn 768 \
        --vocab 32000 --ctx 512 --tied --type $kind -o mk-$kind.gguf
    run_ok mki "$REBOUND" info mk-$kind.gguf --tensors
    tensor_table mki.out | sort > mk-$kind.txt
    diff mk-$kind.txt ref-$ref.txt && ok || fail "make-model $kind: tensor table differs from $ref (above: < rebound, > llama-quantize)"
done

check "quantize parity-F16.gguf to q4_k_m: same tensor table as parity-Q4_K_M.gguf"
run_ok q "$REBOUND" quantize "$MODELS/parity-F16.gguf" q-q4_k_m.gguf q4_k_m
run_ok qi "$REBOUND" info q-q4_k_m.gguf --tensors
tensor_table qi.out | sort > q-q4_k_m.txt
diff q-q4_k_m.txt ref-parity-Q4_K_M.gguf.txt && ok || fail "quantize q4_k_m: tensor table differs from parity-Q4_K_M.gguf"

check "make-model of the qwen3 parity shape at q8_0: same tensor table as parity-qwen3-Q8_0.gguf"
run_ok mkq "$REBOUND" make-model --arch qwen3 --dim 256 --layers 2 --heads 8 --kv-heads 2 --head-dim 64 \
    --ffn 768 --vocab 50257 --ctx 512 --tied --vocab-style bpe --type q8_0 -o mk-qwen3.gguf
run_ok mkqi "$REBOUND" info mk-qwen3.gguf --tensors
tensor_table mkqi.out | sort > mk-qwen3.txt
diff mk-qwen3.txt ref-parity-qwen3-Q8_0.gguf.txt && ok || fail "make-model qwen3 q8_0: tensor table differs from parity-qwen3-Q8_0.gguf"

passed
