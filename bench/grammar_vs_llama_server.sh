#!/bin/bash
# grammar_vs_llama_server.sh - alternating rounds on tinyllama-1.1b Q4_0, 2 threads:
# rebound run free and under bench/grammar_schema.json, then llama-server
# (127.0.0.1 only) free and with the same json_schema; decode tok/s as each
# tool reports it. Paths: M (model), R (rebound), S (schema), LS (llama-server);
# N tokens per run (32), ROUNDS (2), LSPORT (18556); LS=none: rebound only.
M=${M:-tinyllama-1.1b-q4_0.gguf}
R=${R:-./build/rebound}
S=${S:-$(dirname "$0")/grammar_schema.json}
N=${N:-32}
ROUNDS=${ROUNDS:-2}
LSPORT=${LSPORT:-18556}
LS=${LS:-llama-server}
if [ "$LS" != none ]; then
  $LS -m $M -t 2 --host 127.0.0.1 --port $LSPORT -c 512 -np 1 --no-webui > ${TMPDIR:-/tmp}/grammar_ls.log 2>&1 &
  LSPID=$!
  for i in $(seq 1 120); do curl -s 127.0.0.1:$LSPORT/health | grep -q ok && break; sleep 1; done
fi
SCH=$(cat $S)
rb() { # mode seed
  if [ $1 = free ]; then
    $R run -m $M -p "Inventory:" -n $N -t 2 -s $2 --temp 1 2>&1 >/dev/null
  else
    $R run -m $M -p "Inventory:" -n $N -t 2 -s $2 --temp 1 -jf $S 2>&1 >/dev/null
  fi | grep -oE "decode [0-9]* tokens [0-9.]* tok/s" | sed "s/^/rebound $1: /"
}
ls_run() { # mode seed
  extra=""; [ $1 = schema ] && extra=",\"json_schema\":$SCH"
  curl -s -m 300 127.0.0.1:$LSPORT/completion -d "{\"prompt\":\"Inventory:\",\"n_predict\":$N,\"seed\":$2,\"temperature\":1,\"ignore_eos\":true,\"cache_prompt\":false$extra}" > ${TMPDIR:-/tmp}/grammar_r.json
  python3 -c 'import json,sys; d=json.load(open(sys.argv[2])); t=d["timings"]; print("llama-server %s: decode %d tokens %.2f tok/s" % (sys.argv[1], t["predicted_n"], t["predicted_per_second"]))' $1 ${TMPDIR:-/tmp}/grammar_r.json || head -c 300 ${TMPDIR:-/tmp}/grammar_r.json
}
# odd rounds free first, even rounds constrained first
for round in $(seq 1 $ROUNDS); do
  uptime | sed 's/.*load/load/'
  if [ $((round % 2)) = 1 ]; then order="free schema"; else order="schema free"; fi
  for mode in $order; do rb $mode $round; done
  [ "$LS" = none ] && continue
  for mode in $order; do ls_run $mode $round; done
done
[ "$LS" != none ] && kill $LSPID
