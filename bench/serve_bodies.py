#!/usr/bin/env python3
"""bench/serve_bodies.py - 64 concurrent 4 MB request bodies against
`rebound serve` with --mem-budget = the model file + 300 MiB: the server's
VmHWM against the budget, and a small request's TTFT during the flood
against idle (median of 5 each).

usage: python3 bench/serve_bodies.py REBOUND MODEL.gguf
(the trust issue's target: VmHWM <= budget + 5%, small TTFT <= 2x idle)
"""
import json, os, subprocess, sys, threading, time, http.client
REB, MODEL = sys.argv[1], sys.argv[2]
wbytes = os.path.getsize(MODEL)
budget = wbytes + 300 * 1048576
port = 18190
srv = subprocess.Popen([REB, "serve", "-m", MODEL, "--port", str(port), "-t", "2", "-c", "4096",
                        "--mem-budget", str(budget), "--max-body", "8M"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
def req(body, timeout=120):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
    r = c.getresponse(); r.read(); c.close(); return r.status
for _ in range(300):
    try:
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=2); c.request("GET", "/health")
        if c.getresponse().status == 200: break
    except OSError: time.sleep(0.2)
small = json.dumps({"prompt": "small", "max_tokens": 1})
def ttft():
    t0 = time.time(); st = req(small); return time.time() - t0, st
ttft()
idle = sorted(ttft()[0] for _ in range(5))
def hwm():
    for l in open("/proc/%d/status" % srv.pid):
        if l.startswith("VmHWM"): return int(l.split()[1]) * 1024
filler = json.dumps({"prompt": "word " * ((4 << 20) // 5), "max_tokens": 1})
res = []
def one():
    try: res.append(req(filler))
    except OSError as e: res.append(str(e)[:30])
during = []
ts = [threading.Thread(target=one) for _ in range(64)]
for t in ts: t.start()
for _ in range(5):
    d, st = ttft(); during.append(d)
for t in ts: t.join()
during.sort()
h = hwm()
print("budget %d B (weights %d + 300 MiB); VmHWM %d B = %.1f%% of the budget" % (budget, wbytes, h, 100.0 * h / budget))
print("small request TTFT idle median %.3f s, during 64 x 4 MB bodies median %.3f s (max %.3f): %.2fx" %
      (idle[2], during[2], during[-1], during[2] / idle[2]))
print("body statuses:", sorted(set(map(str, res))))
srv.terminate(); srv.wait()
