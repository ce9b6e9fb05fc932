#!/usr/bin/env python3
"""serve_opening.py - the first turn of a long conversation: rebound serve
against llama-server on the same GGUF file, in one sitting.

Starts both servers (127.0.0.1, free ports, the same context, one slot, the
same threads), then for every round sends each of them, alternating which
goes first (after one short untimed chat each), one new chat whose user message is about --tokens tokens of
words never sent before (so neither server has any of it cached), with
max_tokens 1, and takes the time from the request to the whole reply. The
prompt's token count is what each server reports (usage.prompt_tokens).
Prints one line per request and a table of medians, the CPU and the load.

usage: bench/serve_opening.py REBOUND LLAMA_SERVER MODEL.gguf
           [--tokens 2700] [--rounds 3] [--threads 2] [--ctx 4096]
Needs only python3. rebound serve runs with its defaults otherwise (its
prefill batch -b 512, chunks only while other streams decode).
"""
import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

WORDS = ("time year people way day man thing woman life child world school state family student "
         "group country problem hand part place case week company system program question work "
         "government number night point home water room mother area money story fact month lot "
         "right study book eye job word business issue side kind head house service friend father "
         "power hour game line end member law car city community name president team minute idea "
         "kid body information back parent face others level office door health person art war "
         "history party result change morning reason research girl guy moment air teacher force "
         "education river garden window letter paper music market field light voice").split()


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    p = s.getsockname()[1]
    s.close()
    return p


def post(url, body, timeout=900):
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return json.loads(r.read())


def wait_up(url, proc, name, log):
    for _ in range(600):
        if proc.poll() is not None:
            sys.exit("%s exited (%d): see %s" % (name, proc.returncode, log))
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except Exception:
            pass
        time.sleep(0.5)
    sys.exit("%s did not come up: see %s" % (name, log))


def text_of(rng, n_words):
    return " ".join(rng.choice(WORDS) for _ in range(n_words))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("rebound")
    ap.add_argument("llama_server")
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=2700)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=4096)
    a = ap.parse_args()

    tmp = tempfile.mkdtemp(prefix="serve_opening.")
    rp, lp = free_port(), free_port()
    rlog, llog = os.path.join(tmp, "rebound.log"), os.path.join(tmp, "llama-server.log")
    procs = []
    try:
        procs.append(subprocess.Popen(
            [a.rebound, "serve", "-m", a.model, "--port", str(rp), "-c", str(a.ctx), "-np", "1",
             "-t", str(a.threads)], stdout=open(rlog, "w"), stderr=subprocess.STDOUT))
        procs.append(subprocess.Popen(
            [a.llama_server, "-m", a.model, "--host", "127.0.0.1", "--port", str(lp), "-c",
             str(a.ctx), "-np", "1", "-t", str(a.threads), "--no-webui"],
            stdout=open(llog, "w"), stderr=subprocess.STDOUT))
        wait_up("http://127.0.0.1:%d/health" % rp, procs[0], "rebound serve", rlog)
        wait_up("http://127.0.0.1:%d/health" % lp, procs[1], "llama-server", llog)

        # words per token on this vocabulary, from rebound's /tokenize
        rng = random.Random(1)
        probe = text_of(rng, 400)
        n = len(post("http://127.0.0.1:%d/tokenize" % rp, {"content": probe})["tokens"])
        n_words = max(1, int(a.tokens * 400 / n))
        # one short untimed chat each first: model pages, KV and scratch touched
        for port in (rp, lp):
            post("http://127.0.0.1:%d/v1/chat/completions" % port,
                 {"model": "m", "messages": [{"role": "user", "content": text_of(rng, 300)}],
                  "max_tokens": 1, "temperature": 0})
        load0 = open("/proc/loadavg").read().split()[:3]
        times = {"rebound": [], "llama-server": []}
        ptoks = {"rebound": [], "llama-server": []}
        servers = [("rebound", rp), ("llama-server", lp)]
        for rnd in range(a.rounds):
            order = servers if rnd % 2 == 0 else servers[::-1]
            for name, port in order:
                msg = text_of(rng, n_words)  # new words every request: nothing cached
                body = {"model": "m", "messages": [{"role": "user", "content": msg}],
                        "max_tokens": 1, "temperature": 0}
                t0 = time.monotonic()
                r = post("http://127.0.0.1:%d/v1/chat/completions" % port, body)
                dt = time.monotonic() - t0
                pt = r["usage"]["prompt_tokens"]
                times[name].append(dt)
                ptoks[name].append(pt)
                print("round %d %-12s %5d prompt tokens %7.2f s  %6.1f tok/s" %
                      (rnd + 1, name, pt, dt, pt / dt), flush=True)
        load1 = open("/proc/loadavg").read().split()[:3]
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=30)
            except subprocess.TimeoutExpired:
                p.kill()

    cpu = "unknown"
    for line in open("/proc/cpuinfo"):
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    fam = [l.split(":")[1].strip() for l in open("/proc/cpuinfo") if l.startswith("cpu family")][:1]
    mdl = [l.split(":")[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model\t")][:1]
    print()
    print("CPU: %s (family %s, model %s), %d threads; load before %s, after %s" %
          (cpu, fam[0] if fam else "?", mdl[0] if mdl else "?", a.threads, " ".join(load0),
           " ".join(load1)))
    print()
    print("| server | prompt tokens (median) | opening s (median) | tok/s | per round (s) |")
    print("|---|---|---|---|---|")
    med = {}
    for name in ("rebound", "llama-server"):
        med[name] = statistics.median(times[name])
        print("| %s | %d | %.2f | %.1f | %s |" % (
            name, statistics.median(ptoks[name]), med[name],
            statistics.median(ptoks[name]) / med[name], " ".join("%.2f" % t for t in times[name])))
    print()
    print("llama-server / rebound opening time: %.2fx" % (med["llama-server"] / med["rebound"]))


if __name__ == "__main__":
    main()
