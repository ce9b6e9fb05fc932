#!/usr/bin/env bash
# cli_errors.sh - `rebound info` on files that are not models (missing, a
# folder, empty, truncated at several points, random bytes, a damaged
# header): a non-zero exit, one clear message on stderr, never a crash.
# Also the top-level usage: unknown command (exit 2), --help of each
# subcommand (exit 0).
#
# usage: cli_errors.sh REBOUND_BIN SCRATCH_DIR
set -euo pipefail
. "$(dirname "$0")/lib.sh"

check "info on a missing file: cannot open ... No such file"
run_fails missing 1 "cannot open 'missing.gguf': No such file or directory" "$REBOUND" info missing.gguf

check "info on a directory"
mkdir adir
run_fails dir 1 "adir.*(Is a directory|not a regular file)" "$REBOUND" info adir

check "info on an empty file"
: > empty.gguf
run_fails empty 1 'empty.gguf.*0 bytes' "$REBOUND" info empty.gguf

check "info on random bytes: bad magic"
head -c 65536 /dev/urandom > random.gguf
run_fails random 1 'bad magic.*not a GGUF file' "$REBOUND" info random.gguf
expect_line random.err '^hint: the file is damaged or not a GGUF model'

check "info on truncated copies of a made model (header, metadata, index, data)"
run_ok mk "$REBOUND" make-model --shape tiny --type q4_k_m -o whole.gguf
run_ok mki "$REBOUND" info whole.gguf --tensors
size=$(wc -c < whole.gguf)
data=$(first_data_offset mki.out)
for cut in 3 8 20 100 1000 4000 $((data - 1)) $((data + 10)) $((size / 2)) $((size - 1)); do
    head -c $cut whole.gguf > cut.gguf
    run_fails cut-$cut 1 'cut.gguf' "$REBOUND" info cut.gguf
    # the message names what is wrong, not just "error"
    grep -Eqi 'truncat|too small|cannot hold|beyond|file has|file size' cut-$cut.err && ok ||
        { cat cut-$cut.err >&2; fail "cut at $cut bytes: the message does not say the file is short"; }
done

check "info on a model with a damaged header: version, tensor count"
cp whole.gguf bad-version.gguf
printf '\x63\x00\x00\x00' | dd of=bad-version.gguf bs=1 seek=4 conv=notrunc status=none
run_fails bad-version 1 'version' "$REBOUND" info bad-version.gguf
cp whole.gguf bad-count.gguf
printf '\xff\xff\xff\xff\xff\xff\xff\x7f' | dd of=bad-count.gguf bs=1 seek=8 conv=notrunc status=none
run_fails bad-count 1 'bad-count.gguf' "$REBOUND" info bad-count.gguf

check "info on random bytes behind a valid magic and version"
{ printf 'GGUF\x03\x00\x00\x00'; head -c 4096 /dev/urandom; } > magic-random.gguf
run_fails magic-random 1 'magic-random.gguf' "$REBOUND" info magic-random.gguf

check "info usage errors"
run_fails noarg 2 'no model given' "$REBOUND" info
run_fails badopt 2 "unknown option '--bogus'" "$REBOUND" info --bogus whole.gguf
run_fails badctx 2 "option -c needs a valid value: '0' is not a non-negative integer from 1 to" "$REBOUND" info whole.gguf -c 0
run_fails twomodels 2 'more than one model' "$REBOUND" info whole.gguf whole.gguf

check "rebound with an unknown command exits 2 with the usage"
run_fails unknown 2 "unknown command 'frobnicate'" "$REBOUND" frobnicate
expect_line unknown.err '^usage: rebound <command>'
run_fails nocmd 2 '^usage: rebound <command>' "$REBOUND"

check "--help of rebound and of each subcommand exits 0 and prints a usage"
run_ok help "$REBOUND" --help
expect_line help.out '^usage: rebound <command>'
for cmd in $(awk '/^commands:/ { on = 1; next } on && NF { print $1 } on && !NF { exit }' help.out); do
    run_ok help-$cmd "$REBOUND" $cmd --help
    expect_line help-$cmd.out "^usage: rebound $cmd"
done
run_ok version "$REBOUND" --version
expect_line version.out '^rebound [0-9]+\.[0-9]+\.[0-9]+$'

passed
