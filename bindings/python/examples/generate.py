"""generate.py - a prompt in, greedy text out, as `rebound run --temp 0` prints it.

    python3 generate.py MODEL.gguf "PROMPT" [N_TOKENS]
"""
import sys

import rebound

if len(sys.argv) < 3:
    sys.exit("usage: generate.py MODEL.gguf PROMPT [N_TOKENS]")
path, prompt = sys.argv[1], sys.argv[2]
n = int(sys.argv[3]) if len(sys.argv) > 3 else 64

with rebound.Model(path) as model, model.create_session() as session:
    out = sys.stdout.buffer
    out.write(prompt.encode())
    for token, text in session.stream(prompt, max_tokens=n, temperature=0):
        out.write(text.encode())
        out.flush()
