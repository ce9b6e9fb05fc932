#!/usr/bin/env bash
# cli_make_model_info.sh - `rebound make-model` read back by `rebound info`:
# the named shapes at every --type with the per-tensor types llama-quantize
# would choose, custom dims, qwen3, a BPE vocab, determinism (seed, threads)
# and the error cases.
#
# usage: cli_make_model_info.sh REBOUND_BIN SCRATCH_DIR
set -euo pipefail
. "$(dirname "$0")/lib.sh"

TYPES="f32 f16 bf16 q8_0 q4_0 q4_k q4_k_m q6_k"

# ---- what llama-quantize would choose -------------------------------------
# After llama.cpp's llama_tensor_get_type, for the file kinds rebound writes:
#   - 1-D tensors (norms) stay F32;
#   - output.weight: Q8_0 if its row is not a multiple of 256 (QK_K), else
#     Q6_K unless the file kind is Q8_0;
#   - Q4_K_M: attn_v and ffn_down get Q6_K in the layers use_more_bits picks;
#   - a row length the chosen block does not divide falls back:
#     Q4_K -> Q5_0, Q6_K -> Q8_0, and a 32-block type -> F16.

# check_tensors INFO_OUT KIND N_LAYERS: every tensor of `info --tensors` has
# the type above and the byte size its dims and type imply; prints the count.
check_tensors() {
    awk -v kind="$2" -v n_layers="$3" -v file="$1" '
    function use_more_bits(i, n) {
        return i < int(n / 8) || i >= int(7 * n / 8) || (i - int(n / 8)) % 3 == 2
    }
    function expected(name, row, nd,    t, layer) {
        if (nd < 2 || kind == "f32") return "F32"
        if (kind == "f16") return "F16"
        if (kind == "bf16") return "BF16"
        t = kind == "q8_0" ? "Q8_0" : kind == "q4_0" ? "Q4_0" : kind == "q6_k" ? "Q6_K" : "Q4_K"
        if (name == "output.weight") {
            if (row % 256 != 0) t = "Q8_0"; else if (t != "Q8_0") t = "Q6_K"
        } else if (kind == "q4_k_m" && name ~ /^blk\.[0-9]+\.(attn_v|ffn_down)\.weight$/) {
            split(name, part, "."); layer = part[2] + 0
            if (use_more_bits(layer, n_layers)) t = "Q6_K"
        }
        while (row % blk[t] != 0)
            t = t == "Q4_K" ? "Q5_0" : t == "Q6_K" ? "Q8_0" : "F16"
        return t
    }
    BEGIN {
        blk["F32"] = blk["F16"] = blk["BF16"] = 1; size["F32"] = 4; size["F16"] = size["BF16"] = 2
        blk["Q8_0"] = blk["Q4_0"] = blk["Q5_0"] = 32; size["Q8_0"] = 34; size["Q4_0"] = 18; size["Q5_0"] = 22
        blk["Q4_K"] = blk["Q6_K"] = 256; size["Q4_K"] = 144; size["Q6_K"] = 210
        bad = 0
    }
    /^tensor +type +dims/ { on = 1; next }
    on && NF >= 4 {
        name = $1; type = $2; bytes = $(NF - 1)
        nd = 0; elems = 1
        for (i = 3; i < NF - 1; i++) if ($i != "x") { d[nd++] = $i; elems *= $i }
        want = expected(name, d[0], nd)
        if (type != want) {
            printf "FAIL: %s: %s is %s, llama-quantize would choose %s\n", file, name, type, want > "/dev/stderr"; bad = 1
        } else if (!(type in size) || bytes != elems / blk[type] * size[type]) {
            printf "FAIL: %s: %s (%s) is %s bytes, expected %d\n", file, name, type, bytes, elems / blk[type] * size[type] > "/dev/stderr"; bad = 1
        }
        n++
    }
    END { print n + 0; exit bad }' "$1" && ok || fail "$1: tensor types or sizes are wrong (above)"
}

# ---- named shapes at every type --------------------------------------------
declare -A SHAPE_LINE=(
    [tiny]="dim 64, 2 layers, 4 heads, 2 KV heads, head dim 16, ffn 256, vocab 512"
    [stories260k]="dim 64, 5 layers, 8 heads, 4 KV heads, head dim 8, ffn 172, vocab 512"
)
declare -A N_TENSORS=([tiny]=21 [stories260k]=48)
declare -A N_LAYERS=([tiny]=2 [stories260k]=5)
declare -A KV_PER_TOKEN=([tiny]=256 [stories260k]=640)

for shape in tiny stories260k; do
    for kind in $TYPES; do
        f=$shape-$kind.gguf
        check "make-model --shape $shape --type $kind, read back by info --tensors"
        run_ok mk-$shape-$kind "$REBOUND" make-model --shape "$shape" --type "$kind" -o "$f" -t 2
        expect_line mk-$shape-$kind.out "^wrote $f: .* shape $shape, type $kind"
        run_ok info-$shape-$kind "$REBOUND" info "$f" --tensors
        i=info-$shape-$kind.out
        expect_line $i "^shape +${SHAPE_LINE[$shape]}\$"
        expect_line $i "^architecture +llama "
        expect_line $i "^tensors +${N_TENSORS[$shape]}:"
        expect_line $i "^output +separate output.weight"
        expect_line $i "^KV cache f16 +${KV_PER_TOKEN[$shape]} bytes per token"
        n=$(check_tensors $i "$kind" "${N_LAYERS[$shape]}")
        [ "$n" -eq "${N_TENSORS[$shape]}" ] && ok || fail "$i lists $n tensors, expected ${N_TENSORS[$shape]}"
        # the same tensors (names and dims) whatever the type
        tensor_table $i | awk '{ $2 = ""; $NF = ""; print }' > names-$shape-$kind.txt
        cmp -s names-$shape-$kind.txt names-$shape-f32.txt && ok ||
            fail "$f: tensor names/dims differ from the f32 file"
    done
done

check "spot checks of llama-quantize's choices"
grep -Eq '^output.weight +Q8_0 ' info-tiny-q4_0.out && ok ||
    fail "tiny q4_0: output.weight must fall back to Q8_0 (row 64 is not a multiple of 256)"
grep -Eq '^blk.0.ffn_down.weight +Q4_K ' info-tiny-q4_k_m.out && ok || fail "tiny q4_k_m: blk.0.ffn_down must stay Q4_K"
grep -Eq '^blk.1.ffn_down.weight +Q6_K ' info-tiny-q4_k_m.out && ok || fail "tiny q4_k_m: blk.1.ffn_down must be Q6_K"
grep -Eq '^blk.2.attn_v.weight +Q8_0 ' info-stories260k-q4_k_m.out && ok ||
    fail "stories260k q4_k_m: blk.2.attn_v must be Q6_K -> Q8_0"
grep -Eq '^blk.0.ffn_down.weight +F16 ' info-stories260k-q8_0.out && ok ||
    fail "stories260k q8_0: ffn_down (row 172) must fall back to F16"
expect_line info-stories260k-f32.out '^tensors +48: F32 x48 '

# ---- custom dims ------------------------------------------------------------
check "custom dims: --dim 128 --layers 3 --heads 4 --kv-heads 2 --ffn 256 --vocab 300"
run_ok custom "$REBOUND" make-model --dim 128 --layers 3 --heads 4 --kv-heads 2 --ffn 256 --vocab 300 -o custom.gguf
expect_line custom.out "shape custom, type f32"
run_ok info-custom "$REBOUND" info custom.gguf --tensors
expect_line info-custom.out '^shape +dim 128, 3 layers, 4 heads, 2 KV heads, head dim 32, ffn 256, vocab 300$'
expect_line info-custom.out '^tensors +30: F32 x30 '
expect_line info-custom.out '^KV cache f16 +768 bytes per token'
expect_line info-custom.out '^token_embd.weight +F32 +128 x 300 '
expect_line info-custom.out '^blk.2.ffn_down.weight +F32 +256 x 128 '

check "custom dims quantized: q4_k_m with 128-wide rows"
run_ok custom-q "$REBOUND" make-model --dim 128 --layers 3 --heads 4 --kv-heads 2 --ffn 256 --vocab 300 --type q4_k_m -o custom-q.gguf
run_ok info-custom-q "$REBOUND" info custom-q.gguf --tensors
n=$(check_tensors info-custom-q.out q4_k_m 3)
[ "$n" -eq 30 ] && ok || fail "custom q4_k_m: $n tensors, expected 30"

check "--arch qwen3 --head-dim 32: Q/K norm tensors in every layer"
run_ok qwen3 "$REBOUND" make-model --arch qwen3 --head-dim 32 -o qwen3.gguf
run_ok info-qwen3 "$REBOUND" info qwen3.gguf --tensors
expect_line info-qwen3.out '^architecture +qwen3 '
expect_line info-qwen3.out '^shape +dim 64, 2 layers, 4 heads, 2 KV heads, head dim 32, ffn 256, vocab 512$'
expect_line info-qwen3.out '^tensors +25: '
for l in 0 1; do
    expect_line info-qwen3.out "^blk.$l.attn_q_norm.weight +F32 +32 "
    expect_line info-qwen3.out "^blk.$l.attn_k_norm.weight +F32 +32 "
done
expect_line info-qwen3.out '^blk.0.attn_q.weight +F32 +64 x 128 '
expect_line info-qwen3.out '^blk.0.attn_output.weight +F32 +128 x 64 '
if grep -Eq 'attn_q_norm' info-tiny-f32.out; then fail "a llama model must not have attn_q_norm"; fi

check "qwen3 quantized to q4_0 keeps its norms F32"
run_ok qwen3-q "$REBOUND" make-model --arch qwen3 --head-dim 32 --type q4_0 -o qwen3-q4_0.gguf
run_ok info-qwen3-q "$REBOUND" info qwen3-q4_0.gguf --tensors
expect_line info-qwen3-q.out '^blk.1.attn_k_norm.weight +F32 '
n=$(check_tensors info-qwen3-q.out q4_0 2)
[ "$n" -eq 25 ] && ok || fail "qwen3 q4_0: $n tensors, expected 25"

check "--vocab-style bpe writes a gpt2 tokenizer with merges; spm does not"
run_ok bpe "$REBOUND" make-model --vocab-style bpe -o bpe.gguf
run_ok info-bpe "$REBOUND" info bpe.gguf
expect_line info-bpe.out '^shape +dim 64, 2 layers, .*vocab 512$'
grep -aq 'tokenizer.ggml.merges' bpe.gguf && ok || fail "bpe.gguf has no tokenizer.ggml.merges"
grep -aq 'gpt2' bpe.gguf && ok || fail "bpe.gguf: tokenizer.ggml.model is not gpt2"
if grep -aq 'tokenizer.ggml.merges' tiny-f32.gguf; then fail "an spm vocab must have no merges"; fi

# ---- determinism ------------------------------------------------------------
check "same seed -> byte-identical files; another seed -> different bytes"
run_ok seed-a "$REBOUND" make-model --shape stories260k --type q4_k_m --seed 7 -o seed7a.gguf
run_ok seed-b "$REBOUND" make-model --shape stories260k --type q4_k_m --seed 7 -o seed7b.gguf
run_ok seed-c "$REBOUND" make-model --shape stories260k --type q4_k_m --seed 8 -o seed8.gguf
cmp seed7a.gguf seed7b.gguf && ok || fail "the same seed gave different files"
if cmp -s seed7a.gguf seed8.gguf; then fail "seeds 7 and 8 gave the same file"; fi

check "thread count does not change the bytes (-t 1 vs -t 2)"
for kind in f32 q4_0 q4_k_m q6_k; do
    run_ok t1 "$REBOUND" make-model --shape stories260k --type $kind -t 1 -o t1-$kind.gguf
    run_ok t2 "$REBOUND" make-model --shape stories260k --type $kind -t 2 -o t2-$kind.gguf
    cmp t1-$kind.gguf t2-$kind.gguf && ok || fail "$kind: -t 1 and -t 2 wrote different bytes"
done

# ---- errors ------------------------------------------------------------------
check "errors: non-zero exit and a message on stderr"
run_fails e-shape 2 'unknown shape' "$REBOUND" make-model --shape nope -o e.gguf
run_fails e-type 2 'unknown --type' "$REBOUND" make-model --type q9_9 -o e.gguf
run_fails e-num 2 "option --dim needs a valid value: 'abc' is not a non-negative integer" "$REBOUND" make-model --dim abc -o e.gguf
run_fails e-neg 2 "option --layers needs a valid value: '-3' is not a non-negative integer" "$REBOUND" make-model --layers -3 -o e.gguf
run_fails e-seed 2 "option --seed needs a valid value: 'x1' is not" "$REBOUND" make-model --seed x1 -o e.gguf
run_fails e-vocab any 'vocab 100' "$REBOUND" make-model --vocab 100 -o e.gguf
run_fails e-heads any 'not a multiple of heads 3' "$REBOUND" make-model --heads 3 -o e.gguf
run_fails e-dir any 'No such file or directory' "$REBOUND" make-model -o "$SCRATCH/no/such/dir/x.gguf"
run_fails e-opt 2 "unknown option '--bogus'" "$REBOUND" make-model --bogus
[ ! -e e.gguf ] && ok || fail "a failed make-model left e.gguf behind"
ls ./*.tmp >/dev/null 2>&1 && fail "a failed make-model left a .tmp file behind" || ok

check "make-model --help exits 0 and lists the types"
run_ok help "$REBOUND" make-model --help
expect_line help.out 'q4_k_m'

passed
