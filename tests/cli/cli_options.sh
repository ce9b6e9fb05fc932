#!/usr/bin/env bash
# cli_options.sh - the option parser every command shares, end to end:
# `rebound help [COMMAND]` equals `COMMAND --help`; every spelling of every
# option the help lists is accepted by its command (never "unknown
# option"); usage errors exit 2 and name the option and the value; and
# llama.cpp's flags in run / chat / bench (-f, -e, -n -1, -s and the
# printed random seed, -no-cnv, -sys, -sysf, --chat-template, the ignored
# -ngl / -fa / --mlock, -r, --ignore-eos, --color, --no-display-prompt,
# --log-disable, the refused -ub and run's -i, bench's comma lists and
# -o json|jsonl|csv).
#
# usage: cli_options.sh REBOUND_BIN SCRATCH_DIR
set -euo pipefail
. "$(dirname "$0")/lib.sh"

run_ok help "$REBOUND" --help
COMMANDS=$(awk '/^commands:/ { on = 1; next } on && NF { print $1 } on && !NF { exit }' help.out)
[ -n "$COMMANDS" ] && ok || fail "no commands in rebound --help"

check "rebound help, rebound help COMMAND = COMMAND --help, help of an unknown command exits 2"
run_ok h0 "$REBOUND" help
cmp -s h0.out help.out && ok || fail "rebound help differs from rebound --help"
expect_line help.out 'exit status: 0 success, 1 failure, 2 usage error'
for cmd in $COMMANDS; do
    run_ok hc-$cmd "$REBOUND" help "$cmd"
    run_ok hh-$cmd "$REBOUND" "$cmd" --help
    cmp -s hc-$cmd.out hh-$cmd.out && ok || fail "rebound help $cmd differs from rebound $cmd --help"
    expect_line hh-$cmd.out '^exit status: 0 success, 1 failure, 2 usage error'
done
run_fails hu 2 "unknown command 'frobnicate'" "$REBOUND" help frobnicate

check "the help lists the options that work (run: --weights-budget, --policy; llama.cpp's flags)"
for o in --weights-budget --policy --mem-budget --restore --ram-codec --session --trace \
         '-f, --file' '-e, --escape' '-s, --seed' '-no-cnv' '-sys, --system-prompt' \
         --chat-template '-ngl' '-fa' --mlock; do
    grep -q -- "^  .*$o" hh-run.out && ok || fail "run --help does not list $o"
done
for o in '-sys, --system-prompt' '-sysf' '--chat-template' '-s, --seed' '-cnv' '-n, --n-predict'; do
    grep -q -- "^  .*$o" hh-chat.out && ok || fail "chat --help does not list $o"
done
for o in '-p, --n-prompt N\[,N..\]' '-n, --n-gen N\[,N..\]' '-t, --threads N\[,N..\]' \
         '-o, --output FMT' --weights-budget --policy --no-cgroup; do
    grep -q -- "^  .*$o" hh-bench.out && ok || fail "bench --help does not list $o"
done

check "every spelling of every option in each command's help is accepted"
# arguments that make each command stop right after parsing, on a missing file
base_args() {
    case $1 in
        run) echo "-m nope.gguf -p hi" ;;
        chat|bench|bench-pool|demo|switch|serve) echo "-m nope.gguf" ;;
        bench-serve) echo "http://127.0.0.1:1 --timeout 2" ;;
        kvquality) echo "-m nope.gguf --codec q8" ;;
        info) echo "nope.gguf" ;;
        make-model) echo "--vocab 100 -o x.gguf" ;;
        quantize) echo "nope.gguf out.gguf q4_0" ;;
        trace) echo "-o t.trace --import-strace nope.log" ;;
        classify|sim) echo "nope.trace" ;;
        plan) echo "--device nope" ;;
        *) fail "no base arguments for command $1" ;;
    esac
}
n_tried=0
for cmd in $COMMANDS; do
    # "  -n, --n-predict N    help": the spellings, and whether a value follows
    while IFS= read -r line; do
        spec=$(printf '%s\n' "$line" | sed -E 's/^  //; s/ {2,}.*$//')
        arg=""
        names=""
        for w in $spec; do
            case $w in
                -*) names="$names ${w%,}" ;;
                *) arg=1 ;;
            esac
        done
        for name in $names; do
            [ "$name" = -h ] || [ "$name" = --help ] && continue
            # shellcheck disable=SC2046
            rc=0
            "$REBOUND" $cmd $(base_args $cmd) "$name" ${arg:+1} >opt.out 2>opt.err </dev/null || rc=$?
            n_tried=$((n_tried + 1))
            if grep -q 'unknown option' opt.err || [ $rc -ge 126 ] || [ $rc -eq 0 ]; then
                cat opt.err >&2
                fail "$cmd $name${arg:+ 1}: status $rc (expected a failure on the missing file, not an unknown option)"
            fi
        done
    done < <(grep -E '^  -' hh-$cmd.out)
done
[ $n_tried -gt 100 ] && ok || fail "only $n_tried option spellings found in the helps"
echo "   $n_tried spellings tried"

check "usage errors exit 2 and name the option and the value; failures exit 1"
run_ok mk "$REBOUND" make-model --shape tiny --type q8_0 -o tiny.gguf
for cmd in $COMMANDS; do
    run_fails u-$cmd 2 "rebound $cmd: error: unknown option '--no-such-option'" \
        "$REBOUND" $cmd --no-such-option
done
run_fails v1 2 "option -n needs a valid value: 'x' is not an integer" "$REBOUND" run -m tiny.gguf -p hi -n x
run_fails v2 2 "option -n needs a valid value: '-3' is not an integer of at least -2" "$REBOUND" run -m tiny.gguf -p hi -n -3
run_fails v3 2 "option --temp needs a valid value: 'hot' is not a number" "$REBOUND" run -m tiny.gguf -p hi --temp hot
run_fails v4 2 "option --restore needs a valid value: 'later' is not pipelined, eager or recompute" "$REBOUND" run -m tiny.gguf -p hi --restore later
run_fails v5 2 "option -c needs a value" "$REBOUND" run -m tiny.gguf -p hi -c
run_fails v6 2 "option -p needs a valid value: '8,x' is not a comma-separated list" "$REBOUND" bench -m tiny.gguf -p 8,x
run_fails v7 2 "option -o needs a valid value: 'xml' is not md, json, jsonl or csv" "$REBOUND" bench -m tiny.gguf -o xml
run_fails v8 2 "option -s needs a valid value: 'abc' is not a non-negative integer, or -1" "$REBOUND" chat -m tiny.gguf -s abc
run_fails v9 2 "option --mmap takes no value" "$REBOUND" run -m tiny.gguf -p hi --mmap=1
run_fails v10 2 "unexpected argument 'stray'" "$REBOUND" run -m tiny.gguf -p hi stray
run_fails f1 1 "cannot open 'nope.gguf'" "$REBOUND" run -m nope.gguf -p hi
run_fails f2 1 "cannot read the prompt from 'nope.txt'" "$REBOUND" run -m tiny.gguf -f nope.txt
run_ok eq "$REBOUND" run -m tiny.gguf --prompt=hi --n-predict=4 --temp=0
run_ok eq2 "$REBOUND" run -m tiny.gguf -p hi -n 4 --temp 0
cmp -s eq.out eq2.out && ok || fail "--name=value differs from --name value"

check "run: -f FILE is -p with the file's text (one final newline dropped)"
printf 'Hello world\n' > prompt.txt
run_ok f "$REBOUND" run -m tiny.gguf -f prompt.txt -n 8 --temp 0
run_ok p "$REBOUND" run -m tiny.gguf -p "Hello world" -n 8 --temp 0
cmp -s f.out p.out && ok || fail "-f prompt.txt differs from -p 'Hello world'"
run_fails fp 2 "exactly one of -p PROMPT, -f FILE and --tokens FILE" "$REBOUND" run -m tiny.gguf -p hi -f prompt.txt

check "run: -e processes llama.cpp's escapes, only when asked"
run_ok e1 "$REBOUND" run -m tiny.gguf -p 'a\nb\tc\\d\x41\q' -e -n 0
[ "$(cat e1.out)" = "$(printf 'a\nb\tc\\dA\\q')" ] && ok || fail "-e gave '$(cat e1.out)'"
run_ok e0 "$REBOUND" run -m tiny.gguf -p 'a\nb' -n 0
[ "$(cat e0.out)" = 'a\nb' ] && ok || fail "without -e the prompt changed: '$(cat e0.out)'"
run_ok e2 "$REBOUND" run -m tiny.gguf -p 'a\nb' -e --no-escape -n 0
[ "$(cat e2.out)" = 'a\nb' ] && ok || fail "--no-escape after -e changed the prompt: '$(cat e2.out)'"

check "run: -n -1 generates until the end of text or a full context (past the default 64)"
run_ok n1 "$REBOUND" run -m tiny.gguf -p "Hello" -n -1 -c 100 --temp 0
expect_line n1.err '^rebound run: context full \(100 tokens\)'
expect_line n1.err 'decode 9[0-9] tokens'
run_ok n2 "$REBOUND" run -m tiny.gguf -p "Hello" -n -2 -c 100 --temp 0
cmp -s n1.out n2.out && ok || fail "-n -2 differs from -n -1"

check "run: a random seed by default, printed; -s with it repeats the run; -s -1 is random"
run_ok r1 "$REBOUND" run -m tiny.gguf -p "a" -n 24 --temp 1.5
expect_line r1.err '^rebound run: seed [0-9]+ \(random; -s with it repeats this run\)$'
seed=$(sed -nE 's/^rebound run: seed ([0-9]+) .*/\1/p' r1.err)
run_ok r2 "$REBOUND" run -m tiny.gguf -p "a" -n 24 --temp 1.5 -s "$seed"
cmp -s r1.out r2.out && ok || fail "-s $seed did not repeat the run"
expect_line r2.err "^rebound run: seed $seed\$"
run_ok r3 "$REBOUND" run -m tiny.gguf -p "a" -n 24 --temp 1.5 -s -1
expect_line r3.err '^rebound run: seed [0-9]+ \(random'
seed3=$(sed -nE 's/^rebound run: seed ([0-9]+) .*/\1/p' r3.err)
[ "$seed" != "$seed3" ] && ok || fail "two random seeds are equal ($seed)"
cmp -s r1.out r3.out && fail "two random seeds gave the same text" || ok

check "run: -no-cnv is what run does; -sys, --chat-template, -ngl, -fa, --mlock are noted as ignored"
run_ok c1 "$REBOUND" run -m tiny.gguf -p "Hello" -n 8 --temp 0 -no-cnv -ngl 99 -fa on --mlock \
    -sys "Be brief." --chat-template chatml
run_ok c0 "$REBOUND" run -m tiny.gguf -p "Hello" -n 8 --temp 0
cmp -s c1.out c0.out && ok || fail "-no-cnv and the ignored flags changed the text"
for o in '-ngl 99' '-fa on' '--mlock' '-sys Be brief.' '--chat-template chatml'; do
    [ "$(grep -c -- "^rebound run: note: $o is ignored: " c1.err)" -eq 1 ] && ok ||
        { cat c1.err >&2; fail "no one-line note for $o"; }
done

chat() { local p=$1 in=$2; shift 2; printf '%s' "$in" | "$@" >"$p.out" 2>"$p.err" || { cat "$p.err" >&2; fail "$p: exit status $?"; }; }
check "run: -r stops at its text, --ignore-eos past the end, --no-display-prompt, --log-disable, --color"
run_ok g0 "$REBOUND" run -m tiny.gguf -p "Hello" -n 30 --temp 0 -t 2
word=$(cut -c 6-7 g0.out)
run_ok g1 "$REBOUND" run -m tiny.gguf -p "Hello" -n 30 --temp 0 -t 2 -r "$word"
g1=$(cat g1.out)
[[ "$g1" == *"$word" ]] && ok || fail "-r '$word': the text '$g1' does not end with it"
[ "${#g1}" -lt "$(wc -c < g0.out)" ] && ok || fail "-r did not stop the text early"
[[ "$(cat g0.out)" == "$g1"* ]] && ok || fail "-r changed the text before the stop"
# seed 2 at temperature 1.5 ends with an end-of-text token after 29 tokens
run_ok g2 "$REBOUND" run -m tiny.gguf -p "Hello" -n 200 --temp 1.5 -s 2 -t 2
run_ok g3 "$REBOUND" run -m tiny.gguf -p "Hello" -n 200 --temp 1.5 -s 2 -t 2 --ignore-eos
expect_line g3.err 'decode 200 tokens'
grep -q 'decode 200 tokens' g2.err && fail "seed 2 no longer ends early: pick another for the --ignore-eos check"
run_ok g4 "$REBOUND" run -m tiny.gguf -p "Hello" -n 30 --temp 0 -t 2 --no-display-prompt --log-disable
[ "Hello$(cat g4.out)" = "$(cat g0.out)" ] && ok || fail "--no-display-prompt: '$(cat g4.out)' is not run's text without the prompt"
[ -s g4.err ] && { cat g4.err >&2; fail "--log-disable: stderr is not empty"; }
run_ok g5 "$REBOUND" run -m tiny.gguf -p "Hello" -n 30 --temp 0 -t 2 --color
cmp -s g5.out g0.out || fail "--color into a file changed the text (colours are for a terminal)"
run_fails g6 2 "-ub is a llama.cpp option rebound run does not take" "$REBOUND" run -m tiny.gguf -p Hi -ub 512
expect_line g6.err 'hint: .*-b N sets it'
run_fails g7 2 "-i is a llama.cpp option rebound run does not take" "$REBOUND" run -m tiny.gguf -p Hi -i
expect_line g7.err 'rebound chat -m MODEL'
run_fails g8 2 "option -r needs a valid value: '' is not a non-empty text" "$REBOUND" run -m tiny.gguf -p Hi -r ""
chat g9 $'Hi\n' "$REBOUND" chat -m tiny.gguf -n 6 --temp 0 -i --no-display-prompt --color --log-disable
[ -s g9.err ] && { cat g9.err >&2; fail "chat --log-disable: stderr is not empty"; }
[ -s g9.out ] && ok || fail "chat -i gave no reply"
run_fails g10 2 "-ub is a llama.cpp option rebound chat does not take" "$REBOUND" chat -m tiny.gguf -ub 512

check "chat: -sys = --system, -sysf FILE, --chat-template = --template, -cnv, seed printed"
chat() { local p=$1 in=$2; shift 2; printf '%s' "$in" | "$@" >"$p.out" 2>"$p.err" && ok || { cat "$p.err" >&2; fail "$p: exit status $?"; }; }
chat s1 $'Hi\n' "$REBOUND" chat -m tiny.gguf -n 6 --temp 0 --system "Be brief." --template zephyr
chat s2 $'Hi\n' "$REBOUND" chat -m tiny.gguf -n 6 --temp 0 -sys "Be brief." --chat-template zephyr -cnv
printf 'Be brief.\n' > sys.txt
chat s3 $'Hi\n' "$REBOUND" chat -m tiny.gguf -n 6 --temp 0 -sysf sys.txt --chat-template zephyr
cmp -s s1.out s2.out && ok || fail "-sys/--chat-template differ from --system/--template"
cmp -s s1.out s3.out && ok || fail "-sysf differs from -sys"
expect_line s2.err 'template zephyr'
expect_line s2.err '^rebound chat: seed [0-9]+ \(random'
run_fails s4 2 "give one of -sys TEXT and -sysf FILE" "$REBOUND" chat -m tiny.gguf -sys a -sysf sys.txt
run_fails s5 2 "unknown --chat-template 'nope'" "$REBOUND" chat -m tiny.gguf --chat-template nope

check "bench: comma lists run every combination; -o json, jsonl and csv carry llama-bench's fields"
run_ok b1 "$REBOUND" bench -m tiny.gguf -p 8,16 -n 2,3 -t 1,2 -r 1 -ngl 99
[ "$(grep -c '^| tiny.gguf |' b1.out)" -eq 8 ] && ok || fail "bench lists: $(grep -c '^| tiny' b1.out) rows, expected 8"
for t in '1 \| pp8' '1 \| pp16' '1 \| tg2' '1 \| tg3' '2 \| pp8' '2 \| pp16' '2 \| tg2' '2 \| tg3'; do
    expect_line b1.out "\| $t \|"
done
expect_line b1.err '^rebound bench: note: -ngl 99 is ignored'
check "bench: -d (depth) and -pg, as llama-bench names them"
run_ok bd "$REBOUND" bench -m tiny.gguf -p 8 -n 2 -pg 4,2 -d 0,16 -r 1 -t 1 -o md
[ "$(grep -c '^| tiny.gguf |' bd.out)" -eq 6 ] && ok || fail "bench -d -pg: $(grep -c '^| tiny' bd.out) rows, expected 6"
for t in 'pp8' 'pp8 @ d16' 'tg2' 'tg2 @ d16' 'pp4\+tg2' 'pp4\+tg2 @ d16'; do
    expect_line bd.out "\| 1 \| $t \|"
done
expect_line bd.err '^result bench=pp4\+tg2 depth=16 .*tok_s_median='
run_ok bj "$REBOUND" bench -m tiny.gguf -p 8 -n 0 -d 16 -r 1 -o csv
expect_line bj.out '^"[^"]*","tiny.gguf","llama","[0-9]+","[0-9]+","[0-9]+","[0-9]+","[0-9]+","f16","f16","0","8","0","16",'
run_fails bp 2 "-pg takes two positive counts, P,G" "$REBOUND" bench -m tiny.gguf -pg 512
run_ok b2 "$REBOUND" bench -m tiny.gguf -p 8 -n 2 -r 2 -o csv
[ "$(head -1 b2.out)" = "cpu_info,model_filename,model_type,model_size,model_n_params,n_batch,n_ubatch,n_threads,type_k,type_v,n_gpu_layers,n_prompt,n_gen,n_depth,test_time,avg_ns,stddev_ns,avg_ts,stddev_ts" ] && ok ||
    fail "csv header: $(head -1 b2.out)"
[ "$(wc -l < b2.out)" -eq 3 ] && ok || fail "csv: $(wc -l < b2.out) lines, expected 3"
expect_line b2.out '^"[^"]*","tiny.gguf","llama","[0-9]+","[0-9]+","8","8","[0-9]+","f16","f16","0","8","0","0","[0-9T:-]+Z","[0-9]+","[0-9]+","[0-9.]+","[0-9.]+"$'
run_ok b3 "$REBOUND" bench -m tiny.gguf -p 8 -n 2 -r 2 -o json
run_ok b4 "$REBOUND" bench -m tiny.gguf -p 8 -n 2 -r 2 -o jsonl
if command -v python3 >/dev/null; then
    python3 - b3.out b4.out <<'EOF' && ok || fail "bench json/jsonl output is not what llama-bench writes"
import json, sys
a = json.load(open(sys.argv[1]))
b = [json.loads(l) for l in open(sys.argv[2])]
for tests in (a, b):
    assert len(tests) == 2, tests
    pp, tg = tests
    assert (pp["n_prompt"], pp["n_gen"], tg["n_prompt"], tg["n_gen"]) == (8, 0, 0, 2)
    for t in tests:
        assert len(t["samples_ns"]) == 2 and len(t["samples_ts"]) == 2
        assert abs(t["avg_ts"] - sum(t["samples_ts"]) / 2) < 1e-3 * t["avg_ts"] + 1e-6
        assert t["model_filename"] == "tiny.gguf" and t["type_k"] == "f16"
EOF
else
    expect_line b3.out '"samples_ts": \['
    [ "$(wc -l < b4.out)" -eq 2 ] && ok || fail "jsonl: $(wc -l < b4.out) lines, expected 2"
fi

passed
