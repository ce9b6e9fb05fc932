#!/bin/bash
# grammar_vs_llama_server.sh - alternating rounds on tinyllama-1.1b Q4_0, 2 threads:
# rebound run free and under bench/grammar_schema.json, then llama-server
# (127.0.0.1 only) free and with the same json_schema; decode tok/s as each
# tool reports it. Paths: M (model), R (rebound), S (schema), LS (llama-server).
M=${M:-tinyllama-1.1b-q4_0.gguf}
R=${R:-./build/rebound}
S=${S:-$(dirname "$0")/grammar_schema.json}
N=32
LS=${LS:-llama-server}
$LS -m $M -t 2 --host 127.0.0.1 --port 18556 -c 512 -np 1 --no-webui > ${TMPDIR:-/tmp}/grammar_ls.log 2>&1 &
LSPID=$!
for i in $(seq 1 120); do curl -s 127.0.0.1:18556/health | grep -q ok && break; sleep 1; done
SCH=$(cat $S)
for round in 1 2; do
  uptime | sed 's/.*load/load/'
  $R run -m $M -p "Inventory:" -n $N -t 2 -s $round --temp 1 2>&1 >/dev/null | grep -o "decode [0-9]* tokens [0-9.]* tok/s" | sed 's/^/rebound free: /'
  $R run -m $M -p "Inventory:" -n $N -t 2 -s $round --temp 1 -jf $S 2>&1 >/dev/null | grep -oE "decode [0-9]* tokens [0-9.]* tok/s" | sed 's/^/rebound schema: /'
  for mode in free schema; do
    extra=""; [ $mode = schema ] && extra=",\"json_schema\":$SCH"
    curl -s -m 300 127.0.0.1:18556/completion -d "{\"prompt\":\"Inventory:\",\"n_predict\":$N,\"seed\":$round,\"temperature\":1,\"ignore_eos\":true,\"cache_prompt\":false$extra}" > ${TMPDIR:-/tmp}/grammar_r.json
    python3 -c 'import json,sys; d=json.load(open(sys.argv[2])); t=d["timings"]; print("llama-server %s: decode %d tokens %.2f tok/s" % (sys.argv[1], t["predicted_n"], t["predicted_per_second"]))' $mode ${TMPDIR:-/tmp}/grammar_r.json || head -c 300 ${TMPDIR:-/tmp}/grammar_r.json
  done
done
kill $LSPID
