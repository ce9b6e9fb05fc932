#!/usr/bin/env bash
# cli_analysis.sh - the weight I/O analysis end to end: `rebound run/bench
# --trace` and `rebound trace -- rebound run`, `trace --import-strace` (a
# hand-written log, and a real strace run when strace is installed),
# `classify`, `sim` (tables, CSV, SVG; class within 5% of OPT on a real
# trace of rebound decoding), `plan` (the paper's figures), and the errors
# a user can cause (malformed lines reported with line numbers and
# skipped, fatal only when nothing parses; impossible plan parameters).
set -euo pipefail
. "$(dirname "$0")/lib.sh"

check "run --trace and trace -- rebound run record the load and per-token accesses"
run_ok mk "$REBOUND" make-model --shape tiny --type q8_0 -o tiny.gguf
run_ok r1 "$REBOUND" run -m tiny.gguf -p "Hello world" -n 4 --temp 0 -t 1 --trace run.trace
head -1 run.trace | grep -qx '# rebound-trace 1' && ok || fail "run.trace does not start with the magic"
expect_line run.trace '^F 0 [0-9]+ tiny.gguf$'
expect_line run.trace ' -1 load$'
expect_line run.trace ' prefill$'
expect_line run.trace ' decode$'
expect_line run.trace 'not page faults'
run_ok r2 "$REBOUND" trace -o wrapped.trace -- rebound run -m tiny.gguf -p "Hello world" -n 4 --temp 0 -t 1
cmp -s r1.out r2.out && ok || fail "the traced run printed different text"
[ "$(grep -c '^A' run.trace)" -eq "$(grep -c '^A' wrapped.trace)" ] && ok || fail "the two traces differ in length"
run_ok b "$REBOUND" bench -m tiny.gguf -p 8 -n 2 -r 1 -t 1 --trace bench.trace
expect_line bench.trace ' decode$'

check "classify labels the blocks and reports the loop per token"
run_ok c "$REBOUND" classify run.trace
expect_line c.out '^\| SEQ \|'
expect_line c.out '^\| LOOP \|'
expect_line c.out '^loop length N per token: min .* over 4 token spans'
expect_line c.out '^metadata: .* 1.00 MiB per 512 MiB'

check "sim prints the tables, a CSV row per policy and size, and an SVG plot"
run_ok s "$REBOUND" sim run.trace --csv sim.csv --svg sim.svg
expect_line s.out '^\| cache \| of loop \| lru \| fifo \| clock \| 2q \| arc \| lirs \| mru \| class \| opt \|'
expect_line s.out '^class vs opt: largest gap'
expect_line s.err '^result sim policy=opt .*maccess_per_s='
[ "$(wc -l < sim.csv)" -eq $((1 + 9 * 10)) ] && ok || fail "sim.csv has $(wc -l < sim.csv) lines, expected 91"
head -1 sim.csv | grep -q '^policy,cache_bytes,' && ok || fail "sim.csv header"
grep -q '^<svg ' sim.svg && grep -q '</svg>' sim.svg && ok || fail "sim.svg is not an SVG document"
[ "$(grep -c '<polyline' sim.svg)" -eq 9 ] && ok || fail "sim.svg should have one line per policy"

check "class is within 5% of OPT on a real trace of rebound decoding (and on a synthetic one)"
run_ok mm "$REBOUND" make-model --dim 512 --layers 4 --heads 8 --kv-heads 4 --ffn 1408 --vocab 4096 --type q4_0 -o mid.gguf
run_ok mr "$REBOUND" trace -o mid.trace -- rebound run -m mid.gguf -p "Hello world" -n 16 --temp 0 -t 2
run_ok ms "$REBOUND" sim mid.trace --policy lru,class,opt --csv mid.csv
awk -F, 'NR > 1 { h[$1 "," $2] = $6; t[$1 "," $2] = $9; sz[$2] = 1 }
         END { for (z in sz) {
                 if (h["opt," z] - h["class," z] > 0.05 || t["opt," z] - t["class," z] > 0.05) {
                   print "cache " z ": class " h["class," z] "/" t["class," z] " opt " h["opt," z] "/" t["opt," z]; bad = 1 }
                 if (z < 8000000 && t["lru," z] > 0.05) { print "lru hits on the loop at " z; bad = 1 } }
               exit bad }' mid.csv && ok || fail "class is not within 5% of OPT on mid.trace"
run_ok mo "$REBOUND" sim mid.trace --policy class,opt --labels offline
gap=$(sed -n 's/^class vs opt: largest gap \([0-9.]*\) (all accesses), \([0-9.]*\) .*/\1 \2/p' mo.out)
awk -v g="$gap" 'BEGIN { split(g, a, " "); exit !(a[1] <= 0.05 && a[2] <= 0.05) }' && ok || fail "offline-label gap $gap"
run_ok sy "$REBOUND" trace --synthetic -o syn.trace --loop 32M --hot 1M --tokens 6
run_ok ss "$REBOUND" sim syn.trace --policy class,opt
gap=$(sed -n 's/^class vs opt: largest gap \([0-9.]*\) (all accesses), \([0-9.]*\) .*/\1 \2/p' ss.out)
awk -v g="$gap" 'BEGIN { split(g, a, " "); exit !(a[1] <= 0.05 && a[2] <= 0.05) }' && ok || fail "synthetic gap $gap"

check "strace import follows descriptors; malformed lines are reported with numbers and skipped"
cat > app.strace <<'LOG'
100 10:00:00.000001 openat(AT_FDCWD, "/data/model.bin", O_RDONLY) = 5
100 10:00:00.000002 read(5, "\0\0"..., 1048576) = 1048576
100 10:00:00.000003 this is not a system call
100 10:00:00.000004 lseek(5, 0, SEEK_SET) = 0
100 10:00:00.000005 read(5, "\0\0"..., 1048576) = 1048576
garbage line
100 10:00:00.000006 pread64(5, "\0"..., 4096, 0) = 4096
LOG
run_ok im "$REBOUND" trace --import-strace app.strace -o app.trace
expect_line im.err 'app.strace:3: .*\(skipped\)'
expect_line im.err 'app.strace:6: .*\(skipped\)'
[ "$(grep -c '^A' app.trace)" -eq 3 ] && ok || fail "app.trace should hold 3 reads"
run_ok ic "$REBOUND" classify app.trace
printf 'nothing\nto see\n' > junk.strace
run_fails ij 1 "no line of 'junk.strace' parses" "$REBOUND" trace --import-strace junk.strace -o j.trace

check "malformed trace lines: warnings with line numbers; nothing parsed is fatal"
{ head -5 run.trace; echo "A 1 2 3"; echo "Z what"; tail -n +6 run.trace; } > bad.trace
run_ok bc "$REBOUND" classify bad.trace
expect_line bc.err 'bad.trace:6: A line: expected'
expect_line bc.err 'bad.trace:7: not a comment, F or A line'
printf '# rebound-trace 1\nA 1\n' > empty.trace
run_fails be 1 "no access record .*first at line 2" "$REBOUND" sim empty.trace
run_fails bs 1 "not a rebound trace.*hint|hint: an strace log" "$REBOUND" classify app.strace

if command -v strace >/dev/null 2>&1; then
    check "trace -- PROGRAM runs it under strace and imports the log"
    head -c 200000 /dev/zero > data.bin
    if "$REBOUND" trace -o dd.trace --only data.bin -- dd if=data.bin of=/dev/null bs=65536 >dd.out 2>dd.err; then
        total=$(awk '/^A/ { s += $5 } END { print s + 0 }' dd.trace)
        [ "$total" -eq 200000 ] && ok || fail "dd.trace reads $total bytes, expected 200000"
    else
        grep -qi 'ptrace' dd.err && echo "-- strace cannot trace here (ptrace refused): skipped" && ok || { cat dd.err >&2; fail "trace -- dd failed"; }
    fi
else
    echo "-- strace is not installed: the live strace check is skipped"
fi

check "plan reproduces the paper's figures"
run_ok pw "$REBOUND" plan --device watch
expect_line pw.out '^\| 64.0 MiB \| 4.0 MiB \| .* \| 60.0 MiB \| 10.0 MiB \| 70.0 MiB \|'
run_ok pp "$REBOUND" plan --device phone
expect_line pp.out '^\| 512.0 MiB \| .* \| 256.0 MiB \| 100.0 MiB \| 356.0 MiB \|'
expect_line pp.out '^\| 1024.0 MiB \| .* \| 512.0 MiB \| 100.0 MiB \| 612.0 MiB \|'
expect_line pp.out '1.00 MiB \|$'
run_ok p1 "$REBOUND" plan --device phone --cache 512M --loop 500M --kv 256M
expect_line p1.out '^\| 512.0 MiB \| 500.0 MiB \| 400.0 MiB \| 252.0 MiB \| no \|'
expect_line p1.out '760.0 MiB over 512.0 MiB'
run_ok pa "$REBOUND" plan --device all
[ "$(grep -c '^device ' pa.out)" -eq 4 ] && ok || fail "plan --device all should print the 4 profiles"
run_ok pm "$REBOUND" plan --device phone -m mid.gguf -c 256
expect_line pm.out 'loop N = .* per token, hot set \(GGUF header\)'
expect_line pm.out '\| yes \|'

check "plan: impossible parameters get a clear error"
run_fails q1 1 "bandwidth 0 MiB/s is impossible" "$REBOUND" plan --device custom --bw 0
run_fails q2 1 "bandwidth -5 MiB/s is impossible" "$REBOUND" plan --device custom --bw -5
run_fails q3 1 "smaller than the hot set" "$REBOUND" plan --device watch --cache 2M
run_fails q4 2 "cannot be negative" "$REBOUND" plan --device watch --cache -64M
run_fails q5 1 "exceed the pool" "$REBOUND" plan --device watch --kv 100M
run_fails q6 1 "unknown device 'toaster'" "$REBOUND" plan --device toaster
run_fails q7 2 "no device given" "$REBOUND" plan

passed
