#!/usr/bin/env bash
# cli_quantize.sh - `rebound quantize`: F32 and F16 models to q8_0, q4_0 and
# q4_k_m, read back by `rebound info`; quantizing an F32 model writes the
# same tensors (types, dims and data bytes) as `make-model --type` with the
# same seed; refusals and errors.
#
# usage: cli_quantize.sh REBOUND_BIN SCRATCH_DIR
set -euo pipefail
. "$(dirname "$0")/lib.sh"

# data_bytes FILE INFO_OUT > OUT: the file from its first tensor's offset on
# (the tensor data; the metadata before it may differ between writers).
data_bytes() {
    local off
    off=$(first_data_offset "$2")
    tail -c +$((off + 1)) "$1"
}

check "inputs: a tiny f32 model and a stories260k f16 model (seed 5)"
run_ok in1 "$REBOUND" make-model --shape tiny --type f32 --seed 5 -o tiny-f32.gguf
run_ok in2 "$REBOUND" make-model --shape stories260k --type f16 --seed 5 -o s-f16.gguf
run_ok in1i "$REBOUND" info tiny-f32.gguf --tensors
run_ok in2i "$REBOUND" info s-f16.gguf --tensors

for kind in q8_0 q4_0 q4_k_m; do
    for src in tiny-f32 s-f16; do
        check "quantize $src.gguf -> $kind"
        out=$src-to-$kind.gguf
        run_ok q "$REBOUND" quantize $src.gguf $out $kind -t 2
        expect_line q.out "^wrote $out \\($kind\\)"
        run_ok qi "$REBOUND" info $out --tensors
        cp qi.out info-$src-to-$kind.out
        # the shape is unchanged; the tensor names and dims too
        [ $src = tiny-f32 ] && ref=in1i.out || ref=in2i.out
        diff <(grep '^shape' $ref) <(grep '^shape' qi.out) && ok || fail "$out: shape changed"
        diff <(tensor_table $ref | awk '{ $2 = ""; $NF = ""; print }') \
             <(tensor_table qi.out | awk '{ $2 = ""; $NF = ""; print }') && ok ||
            fail "$out: tensor names or dims changed"
        [ ! -e $out.tmp ] && ok || fail "$out.tmp left behind"
    done
done

check "types chosen: tiny q4_0 output.weight falls back to Q8_0; stories260k ffn_down (row 172) to F16"
expect_line info-tiny-f32-to-q4_0.out '^output.weight +Q8_0 '
expect_line info-tiny-f32-to-q4_0.out '^blk.0.attn_q.weight +Q4_0 '
expect_line info-tiny-f32-to-q4_k_m.out '^blk.1.ffn_down.weight +Q6_K '
expect_line info-s-f16-to-q8_0.out '^blk.3.ffn_down.weight +F16 '
expect_line info-s-f16-to-q4_k_m.out '^blk.4.attn_v.weight +Q8_0 '
expect_line info-s-f16-to-q4_k_m.out '^blk.0.attn_norm.weight +F32 '

for kind in q8_0 q4_0 q4_k_m; do
    check "quantize tiny f32 -> $kind equals make-model --type $kind --seed 5 (tensor table and data bytes)"
    run_ok mk "$REBOUND" make-model --shape tiny --type $kind --seed 5 -o mk-$kind.gguf
    run_ok mki "$REBOUND" info mk-$kind.gguf --tensors
    diff <(tensor_table mki.out) <(tensor_table info-tiny-f32-to-$kind.out) && ok ||
        fail "tensor tables differ (< make-model, > quantize)"
    cmp <(data_bytes mk-$kind.gguf mki.out) <(data_bytes tiny-f32-to-$kind.gguf info-tiny-f32-to-$kind.out) && ok ||
        fail "tensor data differs between make-model and quantize for $kind"
done

check "thread count does not change the bytes (-t 1 vs -t 2)"
run_ok t1 "$REBOUND" quantize s-f16.gguf t1.gguf q4_k_m -t 1
cmp t1.gguf s-f16-to-q4_k_m.gguf && ok || fail "quantize -t 1 and -t 2 wrote different bytes"

check "an already-quantized input is refused with a clear message"
run_fails e-requant any 'already Q4_0.*F32, F16 or BF16' "$REBOUND" quantize tiny-f32-to-q4_0.gguf r.gguf q8_0
[ ! -e r.gguf ] && ok || fail "a refused quantize left r.gguf behind"

check "errors: missing input, unknown type, same file, bad thread count, wrong argument count"
run_fails e-missing any "cannot open 'nothere.gguf': No such file or directory" "$REBOUND" quantize nothere.gguf r.gguf q4_0
run_fails e-type 2 'unknown TYPE' "$REBOUND" quantize tiny-f32.gguf r.gguf q3_k
run_fails e-same 2 'same file' "$REBOUND" quantize tiny-f32.gguf tiny-f32.gguf q4_0
run_fails e-threads 2 "option -t needs a valid value: '0x' is not a non-negative integer from 0 to 64" "$REBOUND" quantize tiny-f32.gguf r.gguf q4_0 -t 0x
run_fails e-args 2 'needs IN.gguf OUT.gguf TYPE' "$REBOUND" quantize tiny-f32.gguf r.gguf
run_fails e-outdir any 'No such file or directory' "$REBOUND" quantize tiny-f32.gguf "$SCRATCH/no/dir/r.gguf" q4_0
run_fails e-garbage any 'not a GGUF file' "$REBOUND" quantize "$REBOUND" r.gguf q4_0
[ ! -e r.gguf ] && ok || fail "a failed quantize left r.gguf behind"
run_ok again "$REBOUND" make-model --shape tiny --type f32 --seed 5 -o again.gguf
cmp tiny-f32.gguf again.gguf && ok || fail "the input of the failed quantizes changed"

passed
