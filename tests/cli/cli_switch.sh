#!/usr/bin/env bash
# cli_switch.sh - `rebound switch` end to end on a small generated model:
# every strategy runs and reports, the exact strategies give logits
# identical to the warm turn, the JSON and SVG are written, the cgroup
# pressure mode either runs with the kernel's signals or says why not, and
# a user's mistakes get clear errors.
set -euo pipefail
. "$(dirname "$0")/lib.sh"

check "a small KV-heavy model: 4 layers, 8 KV heads of 64"
run_ok mk "$REBOUND" make-model --shape tiny --type q8_0 --arch qwen3 --dim 256 --layers 4 \
    --heads 8 --kv-heads 8 --head-dim 64 --ffn 512 --ctx 1024 -o sw.gguf

check "every strategy at 50% of the KV, phone profile"
run_ok sw "$REBOUND" switch -m sw.gguf -c 600 --turn 4 -t 2 \
    --strategies kill,recompute,zram,storage,rebound,rebound-q8 --json sw.json --plot sw.svg
for s in kill recompute storage rebound rebound-q8; do
    expect_line sw.out "^$s +[0-9]+\.[0-9]"
done
expect_line sw.out '^zram-lz4 '
expect_line sw.out '^zram-zstd '
for s in recompute storage rebound; do
    grep -E "^$s .*logits identical to warm" sw.out >/dev/null && ok ||
        fail "$s: the turn's logits differ from the warm turn's"
done
# (identical when the split sent every page to storage: in time for its layer)
expect_line sw.out '^rebound-q8 .*(top-1 [0-9]+/4|logits identical to warm)'
expect_line sw.out 'warm TTFT [0-9.]+ ms'
grep -q '"name": "rebound"' sw.json && ok || fail "sw.json lacks the rebound strategy"
grep -q '"restore_bytes_io"' sw.json && ok || fail "sw.json lacks restore figures"
head -c 200 sw.svg | grep -q '<svg' && ok || fail "sw.svg is not an SVG"
tail -c 20 sw.svg | grep -q '</svg>' && ok || fail "sw.svg is truncated"
grep -q 'fill="#4e79a7"' sw.svg && ok || fail "sw.svg has no storage-restore spans"

check "kill+session: a fresh process restores; its I/O floors, the disk and a bare read measured beside it"
run_ok ks "$REBOUND" switch -m sw.gguf -c 300 --turn 2 -t 2 --strategies kill+session \
    --json ks.json
expect_line ks.out '^kill\+session +[0-9]+\.[0-9].*fresh process: opens the session file'
expect_line ks.out 'I/O floor \([0-9.]+ [KMG]iB\) [0-9]+ ms at the profile: [0-9.]+x'
if grep -q 'the disk read' ks.out; then
    expect_line ks.out 'the disk read [0-9.]+/[0-9.]+ GB/s before/after: [0-9]+ ms at the slower'
else
    echo "note: no O_DIRECT here, the disk's own bandwidth is not measured"
fi
expect_line ks.out 'a bare read of the same files after it [0-9.]+ GB/s: [0-9]+ ms at the slower of it and profile, [0-9.]+x'
grep -q '"io_floor_s": [0-9]' ks.json && ok || fail "ks.json lacks the I/O floor"
grep -q '"bare_floor_s": [0-9]' ks.json && ok || fail "ks.json lacks the bare read's floor"
# the VM's memory reclaim, read here independently of switch_disk.c
order=$(cat /sys/module/page_reporting/parameters/page_reporting_order 2>/dev/null || echo 99)
features=$(cat /sys/bus/virtio/drivers/virtio_balloon/virtio*/features 2>/dev/null | head -n 1 ||
    true)
if [ "$order" -le 10 ] && [ "${features:5:1}" = 1 ]; then
    expect_line ks.out "this VM's host takes free memory back \(free page reporting\)"
    grep -q '"host_reclaims_free_memory": 1' ks.json && ok || fail "ks.json: host reclaim not set"
else
    grep -q "host takes free memory back" ks.out && fail "host reclaim reported without it" || ok
    grep -q '"host_reclaims_free_memory": 0' ks.json && ok || fail "ks.json: host reclaim set"
fi

check "levels, bytes and the complete level (weights too)"
run_ok lv "$REBOUND" switch -m sw.gguf -c 300 --turn 2 -t 2 --trim complete \
    --strategies rebound --device watch
grep -E "^rebound .*logits identical to warm" lv.out >/dev/null && ok || fail "complete trim: logits differ"
run_ok by "$REBOUND" switch -m sw.gguf -c 300 --turn 2 -t 2 --trim 1M --strategies storage \
    --device host
expect_line by.out '^storage +[0-9]'

check "--context FILE: the built context is kept, read back, and rebuilt when it does not fit"
run_ok c1 "$REBOUND" switch -m sw.gguf -c 300 --turn 2 -t 2 --strategies storage,rebound \
    --context ctx.session
expect_line c1.out 'context built in'
[ -s ctx.session ] && ok || fail "--context did not write ctx.session"
cp ctx.session ctx.before
run_ok c2 "$REBOUND" switch -m sw.gguf -c 300 --turn 2 -t 2 --strategies storage,rebound \
    --context ctx.session
expect_line c2.out 'context read from --context'
for s in storage rebound; do
    grep -E "^$s .*logits identical to warm" c2.out >/dev/null && ok ||
        fail "$s from a read context: logits differ from the warm turn's"
done
cmp -s ctx.session ctx.before && ok || fail "a run from --context changed the file"
run_ok c3 "$REBOUND" switch -m sw.gguf -c 200 --turn 2 -t 2 --strategies storage \
    --context ctx.session
expect_line c3.err 'building the context again'
expect_line c3.out 'context built in'

check "--pressure cgroup: the kernel's signals, or why not"
run_ok pr "$REBOUND" switch -m sw.gguf -c 300 --turn 2 -t 2 --strategies rebound \
    --pressure cgroup
if grep -q 'real pressure: cgroup' pr.out; then
    expect_line pr.out '^what the kernel did'
    grep -E "^rebound +[0-9]+ +[0-9]+ " pr.out >/dev/null && ok || fail "no kernel/trim row"
    grep -E "^rebound .*logits identical to warm" pr.out >/dev/null && ok ||
        fail "after real pressure the logits differ"
else
    expect_line pr.err 'explicit trim instead'
fi

check "errors: bad trim, strategy, device, pressure mode; no model"
run_fails e1 2 "--trim '150%'" "$REBOUND" switch -m sw.gguf --trim 150%
run_fails e2 2 "unknown strategy 'teleport'" "$REBOUND" switch -m sw.gguf -c 64 --strategies teleport
run_fails e3 1 "toaster" "$REBOUND" switch -m sw.gguf --device toaster
run_fails e4 2 "--pressure is explicit or cgroup" "$REBOUND" switch -m sw.gguf --pressure magic
run_fails e5 2 "no model" "$REBOUND" switch
passed
