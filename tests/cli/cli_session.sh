#!/usr/bin/env bash
# cli_session.sh - session files through `rebound run` and `rebound chat`,
# as a careful user and as an attacker would try them: a -c smaller than
# the saved tokens, another model's dimensions, a crafted chat record under
# --ctx-shift, /reset, a dangling link, long paths, mode 0600, two writers
# at once (refused naming the holder, or --wait), a SIGKILL at every write,
# fsync and rename of a scripted chat (REBOUND_FAULT_KILL_AT: each reopened
# state is one the chat saved, and the chat goes on from it as an unbroken
# one would; a leftover new file goes at the next open), token ids beyond
# 32 bits, a full stdout.
#
#   cli_session.sh REBOUND_BIN SCRATCH_DIR MODELS_DIR SESSION_TOOL FAULTS_BIN
# FAULTS_BIN: the test build's CLI with the fault-injection hook
# (rebound_faults); REBOUND_BIN, the installed one, must have none.
set -euo pipefail
TOOL=${4:?usage: cli_session.sh REBOUND SCRATCH MODELS SESSION_TOOL FAULTS}
TOOL=$(cd "$(dirname "$TOOL")" && pwd)/$(basename "$TOOL")
FAULTS=${5:?usage: cli_session.sh REBOUND SCRATCH MODELS SESSION_TOOL FAULTS}
FAULTS=$(cd "$(dirname "$FAULTS")" && pwd)/$(basename "$FAULTS")
. "$(dirname "$0")/lib.sh"

run_ok mk "$REBOUND" make-model --shape tiny --type q8_0 -o tiny.gguf
run_ok mk2 "$REBOUND" make-model --shape tiny --type q8_0 --dim 128 --heads 2 -o wide.gguf

# resumed FILE.err: "N T" from chat's "resumed F: N tokens, T turns" line
resumed() {
    sed -n 's/^rebound chat: resumed .*: \([0-9]*\) tokens, \([0-9]*\) turns$/\1 \2/p' "$1"
}

check "a -c smaller than the saved tokens: an error naming the -c that opens it, no crash"
run_ok c0 "$REBOUND" run -m tiny.gguf -p "one two three" -n 200 -c 256 --temp 0 --session c0.rbs
run_fails c0b 1 "holds [0-9]+ tokens, saved with n_ctx 256.*open it with n_ctx 256" \
    "$REBOUND" run -m tiny.gguf -p " four" -n 4 -c 128 --temp 0 --session c0.rbs
run_ok c1 "$REBOUND" run -m tiny.gguf -p "one two three" -n 400 -c 512 --temp 0 --session c.rbs
run_fails c2 1 "holds [0-9]+ tokens, saved with n_ctx 512.*open it with n_ctx 512" \
    "$REBOUND" run -m tiny.gguf -p " four" -n 4 -c 300 --temp 0 --session c.rbs
run_fails c2b 1 "was saved with n_ctx 512 .*open it with n_ctx 512" \
    "$REBOUND" run -m tiny.gguf -p " four" -n 4 -c 256 --temp 0 --session c.rbs
run_ok c3 "$REBOUND" run -m tiny.gguf -p " four" -n 4 -c 512 --temp 0 --session c.rbs

check "another model's dimensions: said as that"
run_fails d1 1 "written for another model: [0-9]+ layers, [0-9]+ KV heads, head dims" \
    "$REBOUND" run -m wide.gguf -p " four" -n 4 -c 512 --temp 0 --session c.rbs

check "a crafted chat record (a turn past the tokens) under --ctx-shift: an error, no crash"
printf 'Hello there\n' | "$REBOUND" chat -m tiny.gguf -c 256 -n 8 --temp 0 --session cr.rbs \
    > cr0.out 2> cr0.err
# turn 2 one past the tokens where the shift comes (237): a keep count of -1 before
"$TOOL" chat-record tiny.gguf cr.rbs 256 30 31 238 && ok || fail "session_tool failed"
run_fails cr1 1 "turn 2 starts at 238.*does not match the tokens" sh -c \
    "printf 'a b c d e f g h i j k l m n o p\n%.0s' 1 2 3 4 5 6 | \"$REBOUND\" chat -m tiny.gguf -c 256 -n 60 --temp 0 --ctx-shift --session cr.rbs"
"$TOOL" chat-record tiny.gguf cr.rbs 256 300 && ok || fail "session_tool failed"
run_fails cr2 1 "claims 300 system tokens" sh -c \
    "printf 'x\n' | \"$REBOUND\" chat -m tiny.gguf -c 256 -n 4 --temp 0 --session cr.rbs"

check "/reset then /quit: the file holds the reset conversation, not the old turn list"
printf 'one\ntwo\n/reset\n/quit\n' | "$REBOUND" chat -m tiny.gguf -n 4 --temp 0 --session rs.rbs \
    > rs0.out 2> rs0.err
run_ok rs1 sh -c "printf '' | \"$REBOUND\" chat -m tiny.gguf -n 4 --temp 0 --session rs.rbs"
[ "$(resumed rs1.err | cut -d' ' -f2)" = 0 ] && ok || { cat rs1.err >&2; fail "/reset left old turns"; }

check "a symbolic link at the session path: one to nothing refused and kept, one to a file followed"
ln -s missing.rbs dangling.rbs
run_fails l1 1 "symbolic link that leads nowhere" \
    "$REBOUND" run -m tiny.gguf -p "one" -n 2 --temp 0 --session dangling.rbs
[ -L dangling.rbs ] && ok || fail "the dangling link was replaced"
[ -e missing.rbs ] && fail "the link's target was created" || ok
ln -s self.rbs self.rbs
run_fails l2 1 "symbolic link that leads nowhere" \
    "$REBOUND" run -m tiny.gguf -p "one" -n 2 --temp 0 --session self.rbs
cp c.rbs target.rbs
ln -s target.rbs good.rbs
run_ok l3 "$REBOUND" run -m tiny.gguf -p " five" -n 2 -c 512 --temp 0 --session good.rbs
[ -L good.rbs ] && ok || fail "the link to a file was replaced by a file"

check "mode 0600; a 511-character path and that path + '.2' are two files"
[ "$(stat -c %a c.rbs)" = 600 ] && ok || fail "session file mode $(stat -c %a c.rbs), expected 600"
d=$SCRATCH
while [ ${#d} -lt 400 ]; do d=$d/dddddddddddddddddddddddddddddddddddddddddddddddddd; mkdir -p "$d"; done
a=$d/
while [ ${#a} -lt 511 ]; do a=${a}a; done
run_ok p1 "$REBOUND" run -m tiny.gguf -p "one two" -n 300 -c 512 --temp 0 --session "$a"
cp "$a" a.copy
run_ok p2 "$REBOUND" run -m tiny.gguf -p "three" -n 100 -c 512 --temp 0 --session "$a.2"
cmp -s "$a" a.copy && ok || fail "the run on A.2 changed A"
[ -s "$a.2" ] && ok || fail "A.2 is empty"

check "token ids beyond 32 bits are errors, not wrapped; a full stdout is an error"
printf '1 4294967297\n' > big.txt
run_fails t1 1 "token id 4294967297 is out of range" "$REBOUND" run -m tiny.gguf --tokens big.txt -n 2
if [ -w /dev/full ]; then
    rc=0
    "$REBOUND" run -m tiny.gguf -p "one" -n 8 --temp 0 > /dev/full 2> full.err || rc=$?
    [ $rc = 1 ] && ok || fail "a run writing to /dev/full exited $rc"
    expect_line full.err 'writing the text to stdout: No space left on device'
fi

check "a NaN weight stops the run naming its layer (no token 0, no empty text, no exit 0)"
run_ok nf "$REBOUND" make-model --shape tiny --type f32 -o f32.gguf
run_ok nfi "$REBOUND" info f32.gguf --tensors
off=$(( $(awk '$1 == "blk.1.ffn_down.weight" { print $NF }' nfi.out) ))
[ "$off" -gt 0 ] && ok || fail "no offset for blk.1.ffn_down.weight"
printf '\x00\x00\xc0\x7f' | dd of=f32.gguf bs=1 seek="$off" conv=notrunc 2>/dev/null
run_fails nf1 1 "forward: layer 1 produced NaN or infinite values" \
    "$REBOUND" run -m f32.gguf -p "one two" -n 4 --temp 0

check "a model or session file cut under a cold-restored chat: an error naming it, no SIGBUS"
printf 'Hello there\n' | "$REBOUND" chat -m tiny.gguf -c 256 -n 8 --temp 0 --session cut0.rbs \
    > cut0.out 2> cut0.err && ok || fail "the chat to restore failed"
for what in model session; do
    cp tiny.gguf cut.gguf
    cp cut0.rbs cut.rbs
    rm -f cut.fifo
    mkfifo cut.fifo
    "$REBOUND" chat -m cut.gguf -c 256 -n 8 --temp 0 --session cut.rbs < cut.fifo \
        > cut.out 2> cut.err &
    cpid=$!
    exec 4> cut.fifo
    printf 'one\n' >&4
    # the first turn computed from the mapped model and restored pages, then saved
    for _ in $(seq 200); do cmp -s cut.rbs cut0.rbs || break; sleep 0.05; done
    cmp -s cut.rbs cut0.rbs && fail "the first turn was not saved" || ok
    if [ $what = model ]; then truncate -s 4096 cut.gguf; else truncate -s 4096 cut.rbs; fi
    printf 'two\nthree\n' >&4
    exec 4>&-
    rc=0
    wait $cpid || rc=$?
    if [ $what = model ]; then
        [ $rc = 1 ] && ok || { cat cut.err >&2; fail "a model cut under the chat: exit $rc"; }
        grep -q "model: 'cut.gguf' was cut short" cut.err && ok ||
            { cat cut.err >&2; fail "the model's cut is not named"; }
    else # the chat goes on in RAM, each save refused naming the file
        [ $rc = 0 ] && ok || { cat cut.err >&2; fail "a session file cut under the chat: exit $rc"; }
        [ "$(grep -c "'cut.rbs' was cut short under the running session" cut.err)" = 2 ] && ok ||
            { cat cut.err >&2; fail "the session file's cut is not named at each save"; }
        [ "$(stat -c %s cut.rbs)" = 4096 ] && ok || fail "the cut session file was written to"
    fi
done

check "two writers: the second is refused naming the first's pid, or waits with --wait"
mkfifo in.fifo
"$REBOUND" chat -m tiny.gguf -n 4 --temp 0 -c 256 --session w.rbs < in.fifo > wa.out 2> wa.err &
apid=$!
exec 3> in.fifo
for _ in $(seq 100); do [ -e w.rbs ] && break; sleep 0.05; done
[ -e w.rbs ] && ok || fail "the first chat did not create its file"
printf 'first\n' >&3
run_fails w1 1 "in use by process $apid" \
    "$REBOUND" run -m tiny.gguf -p " x" -n 2 -c 256 --temp 0 --session w.rbs
run_fails w2 1 "in use by process $apid" sh -c \
    "printf 'hi\n' | \"$REBOUND\" chat -m tiny.gguf -n 4 -c 256 --temp 0 --session w.rbs"
printf 'third\n' | "$REBOUND" chat -m tiny.gguf -n 4 -c 256 --temp 0 --wait --session w.rbs \
    > wb.out 2> wb.err 3>&- &
bpid=$!
sleep 0.3
kill -0 $bpid 2>/dev/null && ok || { cat wb.err >&2; fail "the --wait chat did not wait"; }
printf 'second\n' >&3
exec 3>&-
wait $apid && ok || fail "the first chat failed"
wait $bpid && ok || { cat wb.err >&2; fail "the --wait chat failed"; }
[ "$(resumed wb.err | cut -d' ' -f2)" = 2 ] && ok || { cat wb.err >&2; fail "--wait did not resume the first chat's 2 turns"; }
run_ok w3 sh -c "printf '' | \"$REBOUND\" chat -m tiny.gguf -n 4 -c 256 --temp 0 --session w.rbs"
[ "$(resumed w3.err | cut -d' ' -f2)" = 3 ] && ok || fail "the file does not hold all 3 turns"
# two runs creating one new file at once: one wins, the other is told
n_both=0
for i in 1 2 3 4 5 6; do
    rm -f n.rbs
    rca=0; rcb=0
    "$REBOUND" run -m tiny.gguf -p "alpha" -n 40 -c 512 --temp 0 --session n.rbs > na.out 2> na.err &
    pa=$!
    "$REBOUND" run -m tiny.gguf -p "beta" -n 40 -c 512 --temp 0 --session n.rbs > nb.out 2> nb.err &
    pb=$!
    wait $pa || rca=$?
    wait $pb || rcb=$?
    for x in a b; do
        eval "r=\$rc$x"
        if [ "$r" != 0 ]; then
            grep -Eq 'in use by process|created it meanwhile' n$x.err && ok || { cat n$x.err >&2; fail "run $x failed without saying why"; }
        fi
    done
    [ $rca = 0 ] || [ $rcb = 0 ] && ok || fail "both runs failed"
    [ $rca = 0 ] && [ $rcb = 0 ] && n_both=$((n_both + 1)) # one after the other
    true
done
echo "   (6 trials, $n_both ran one after the other)"

check "a SIGKILL at every write, fsync and rename of a scripted chat (--fsync): each file reopens to a saved state that goes on unbroken"
msgs=("Hello" "How are you" "Tell me more")
chat_args=(chat -m tiny.gguf -c 256 -n 6 --temp 0.9 --seed 5 -t 1 --fsync)
# the clean states: after T turns, and what the remaining turns then print
rm -f s0.rbs
run_ok s0 sh -c "printf '' | \"$REBOUND\" ${chat_args[*]} --session s0.rbs"
run_ok s0r sh -c "printf '' | \"$REBOUND\" ${chat_args[*]} --session s0.rbs"
declare -a want_n want_tail
want_n[0]=$(resumed s0r.err | cut -d' ' -f1)
for t in 0 1 2 3; do
    rm -f st.rbs
    in_a=""; in_b=""
    for k in 0 1 2; do
        if [ $k -lt $t ]; then in_a+="${msgs[$k]}"$'\n'; else in_b+="${msgs[$k]}"$'\n'; fi
    done
    printf '%s' "$in_a" | "$REBOUND" "${chat_args[@]}" --session st.rbs > /dev/null 2> sa.err && ok ||
        fail "clean chat of $t turns failed"
    printf '%s' "$in_b" | "$REBOUND" "${chat_args[@]}" --session st.rbs > "tail$t.out" 2> sb.err && ok ||
        fail "clean resume after $t turns failed"
    if [ $t -gt 0 ]; then
        want_n[$t]=$(resumed sb.err | cut -d' ' -f1)
        [ "$(resumed sb.err | cut -d' ' -f2)" = $t ] && ok || fail "clean state after $t turns"
    fi
done
# the installed CLI has no hook: the variable changes nothing
rm -f k.rbs k.rbs.new-*
run_ok kn sh -c "printf 'Hello\n' | REBOUND_FAULT_KILL_AT=1 \"$REBOUND\" ${chat_args[*]} --session k.rbs"
n_points=0; n_none=0; seen_file=0; n_strays=0
declare -A n_at
for k in $(seq 1 400); do
    rm -f k.rbs k.rbs.new-*
    rc=0 # (a subshell: the shell's own "Killed" notice stays out of the log)
    (printf '%s\n' "${msgs[@]}" | REBOUND_FAULT_KILL_AT=$k "$FAULTS" "${chat_args[@]}" \
        --session k.rbs > k.out 2> k.err) 2> /dev/null || rc=$?
    [ $rc = 0 ] && break
    [ $rc = 137 ] && ok || { cat k.err >&2; fail "kill point $k: exit $rc, not a SIGKILL"; }
    n_points=$k
    strays=$(find . -maxdepth 1 -name "k.rbs.new-*" | wc -l)
    n_strays=$((n_strays + strays))
    if [ ! -e k.rbs ]; then
        [ $seen_file = 0 ] && ok || fail "kill point $k: the file vanished"
        n_none=$((n_none + 1))
        # the next chat on the path starts afresh and takes the dead one's leftover away
        printf '' | "$REBOUND" "${chat_args[@]}" --session k.rbs > kr.out 2> kr.err && ok ||
            { cat kr.err >&2; fail "kill point $k: a new chat on the path fails"; }
        ls k.rbs.new-* > /dev/null 2>&1 && fail "kill point $k: a killed chat's new file stays" || ok
        continue
    fi
    seen_file=1
    printf '' | "$REBOUND" "${chat_args[@]}" --session k.rbs > kr.out 2> kr.err && ok ||
        { cat kr.err >&2; fail "kill point $k: the file does not reopen"; }
    ls k.rbs.new-* > /dev/null 2>&1 && fail "kill point $k: a killed chat's new file stays" || ok
    read -r n t < <(resumed kr.err)
    [ "$n" = "${want_n[$t]}" ] && ok ||
        fail "kill point $k: $n tokens with $t turns; the chat saved ${want_n[$t]} with $t turns"
    n_at[$t]=$(( ${n_at[$t]:-0} + 1 ))
    in_b=""
    for kk in 0 1 2; do [ $kk -lt $t ] || in_b+="${msgs[$kk]}"$'\n'; done
    printf '%s' "$in_b" | "$REBOUND" "${chat_args[@]}" --session k.rbs > kt.out 2> kt.err && ok ||
        fail "kill point $k: the chat does not go on"
    cmp -s kt.out "tail$t.out" && ok ||
        fail "kill point $k: resumed after $t turns, the replies differ from an unbroken chat's"
done
[ $rc = 0 ] && ok || fail "still killed after 400 points"
[ $n_points -ge 8 ] && ok || fail "only $n_points kill points: the injection does not count writes"
echo "   ($n_points kill points: $n_none before the file existed, then by turns: 0:${n_at[0]:-0} 1:${n_at[1]:-0} 2:${n_at[2]:-0} 3:${n_at[3]:-0}; $n_strays left a FILE.new-PID-K, each removed by the next open)"
[ $n_strays -gt 0 ] && ok || fail "no kill point left a new file behind: the clean-up is not tried"

check "leftover FILE.new-PID-K: a dead process's removed at open, a live one's kept"
run_ok lo0 sh -c "printf 'hi\n' | \"$REBOUND\" ${chat_args[*]} --session lo.rbs"
sh -c 'exit 0' & dead=$!
wait $dead
sleep 60 & live=$!
printf 'x' > "lo.rbs.new-$dead-0"
printf 'x' > "lo.rbs.new-$live-3"
printf 'x' > lo.rbs.new-notapid
run_ok lo1 sh -c "printf 'more\n' | \"$REBOUND\" ${chat_args[*]} --session lo.rbs"
[ -e "lo.rbs.new-$dead-0" ] && fail "a dead process's leftover stays" || ok
[ -e "lo.rbs.new-$live-3" ] && ok || fail "a live process's new file was removed"
[ -e lo.rbs.new-notapid ] && ok || fail "a file of another name was removed"
kill $live 2>/dev/null || true
passed
