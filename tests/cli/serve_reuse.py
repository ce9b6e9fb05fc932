#!/usr/bin/env python3
"""serve_reuse.py - a reply sent back reuses the model's own tokens in
`rebound serve`, over real HTTP on loopback. On a random-weight model
(whose replies never tokenize back into the tokens that made them) a
client that sends the assistant's reply back verbatim gets every token
before its new message cached (usage.prompt_tokens_details.cached_tokens =
the first turn's prompt + its fed reply tokens + the template's closing =
the prompt minus the new message's tokens), non-streaming and streaming,
with a stop string, on the third turn (both replies), after a restart
(the replies kept in the session files) and by id; a reply edited by one
character is tokenized as text (not all of it cached); another namespace
sending the same text gets no reuse; the second turn's greedy reply
equals a fresh `rebound run` fed the same tokens (read from the session
file). Run by cli_serve_reuse.sh (which makes the model):

    serve_reuse.py REBOUND MODEL SPM_MODEL SESSION_TOOL WORKDIR

MODEL: a qwen3 (chatml, byte-level BPE); SPM_MODEL: a SentencePiece
llama, served with the plain template (a reply's closing "\n" then
"User: ..." in one text run tokenizes otherwise than the closing alone).

Each check prints "-- what"; a failure raises and the script exits 1.
"""
import http.client
import json
import os
import subprocess
import sys
import threading
import time

sys.dont_write_bytecode = True  # nothing written beside the sources
from serve_test import Fail, ServeProcess, check, expect, n_checks  # noqa: E402

REBOUND, MODEL, SPM, TOOL, WORK = sys.argv[1:6]
N_CTX = 512


class Server(ServeProcess):
    def __init__(self, name, *args, model=None):
        ServeProcess.__init__(self, REBOUND, model or MODEL, WORK, name, *args)

    def raw(self, path, body, key=None):
        c = http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)
        h = {"Content-Type": "application/json"}
        if key:
            h["Authorization"] = "Bearer " + key
        c.request("POST", path, body=json.dumps(body), headers=h)
        r = c.getresponse()
        data = r.read()
        c.close()
        expect(r.status == 200, "%s: status %d: %r" % (path, r.status, data[:300]))
        return data

    def post(self, path, body, key=None):
        return json.loads(self.raw(path, body, key))

    def chat(self, msgs, key=None, stream=False, **kw):
        """(reply text, usage, finish_reason, conversation id)"""
        d = {"messages": msgs, "max_tokens": 12, "temperature": 0}
        d.update(kw)
        if not stream:
            j = self.post("/v1/chat/completions", d, key)
            ch = j["choices"][0]
            return ch["message"]["content"], j["usage"], ch["finish_reason"], j["conversation_id"]
        d["stream"] = True
        d["stream_options"] = {"include_usage": True}
        data = self.raw("/v1/chat/completions", d, key).decode()
        ev = [l[6:] for l in data.split("\n") if l.startswith("data: ")]
        expect(ev and ev[-1] == "[DONE]", "the stream does not end with [DONE]")
        text, usage, reason, conv = [], None, None, None
        for e in ev[:-1]:
            j = json.loads(e)
            conv = j.get("conversation_id", conv)
            usage = j.get("usage") or usage
            for c in j.get("choices", []):
                text.append(c.get("delta", {}).get("content") or "")
                reason = c.get("finish_reason") or reason
        expect(usage is not None, "no usage in the stream")
        return "".join(text), usage, reason, conv

    def n_tokens(self, text):
        """the tokens of text with the template's markers as control tokens"""
        return len(self.post("/tokenize", {"content": text})["tokens"])


def cached(u):
    return u["prompt_tokens_details"]["cached_tokens"]


def user(t):
    return {"role": "user", "content": t}


def assistant(t):
    return {"role": "assistant", "content": t}


TAIL = "<|im_start|>user\n%s<|im_end|>\n<|im_start|>assistant\n"


def tail(text):
    """the template's rendering of a new user message and the reply's
    header (chatml; TAIL is switched for the plain template)"""
    return TAIL % text


def turns(s, n_end, stream, stop=None, key=None, first="Hello there"):
    """three turns (the first with the stop string), each reply sent back
    verbatim: every turn after the first has all its tokens before the new
    message cached"""
    msgs = [user(first)]
    text, u, reason, conv = s.chat(msgs, key, stream, **({"stop": [stop]} if stop else {}))
    # the tokens the session holds: a stop string's last token was sampled,
    # never fed (an end-of-generation token is not counted)
    fed = u["completion_tokens"]
    if stop:
        expect(reason == "stop", "the stop string did not end the reply (%s)" % reason)
        fed -= 1
    held = u["prompt_tokens"] + fed + n_end
    for k, new in enumerate(["Tell me more", "And then?"]):
        msgs += [assistant(text), user(new)]
        text, u2, reason2, conv2 = s.chat(msgs, key, stream)
        want = u2["prompt_tokens"] - s.n_tokens(tail(new))
        expect(conv2 == conv, "turn %d went to conversation %s, not %s" % (k + 2, conv2, conv))
        expect(want == held, "turn %d: its prompt minus the new message (%d) is not the "
               "conversation's tokens (%d): the reply was not replaced by its own tokens"
               % (k + 2, want, held))
        expect(cached(u2) == held, "turn %d cached %d of the %d tokens before the new message"
               % (k + 2, cached(u2), held))
        held = u2["prompt_tokens"] + u2["completion_tokens"] + n_end
    return msgs, text, held, conv


def main():
    os.makedirs(WORK, exist_ok=True)
    keys = os.path.join(WORK, "keys.txt")
    with open(keys, "w") as f:
        f.write("ka alice\nkb bob\n")
    convs = os.path.join(WORK, "convs")
    s = Server("s1", "--sessions", convs)
    n_end = s.n_tokens("<|im_end|>\n")
    expect(n_end == 2, "the closing <|im_end|>\\n is %d tokens, not 2" % n_end)

    check("3 turns, replies sent back verbatim: all before the new message cached")
    msgs, last, held, conv = turns(s, n_end, False)
    # the random model's reply does not tokenize back into its tokens: the
    # check above is not one the old tokenization passed
    t1, u1, _, _ = s.chat([user("Hello there")])
    expect(s.n_tokens(t1) != u1["completion_tokens"],
           "this model's reply tokenizes back into as many tokens: pick another text")

    check("streamed turns: the same")
    smsgs, slast, sheld, sconv = turns(s, n_end, True, first="Streams are fine")

    for stream in (False, True):
        check("a stop string%s: the trimmed text gets the tokens the session holds"
              % (", streamed" if stream else ""))
        first = "Stop here" if not stream else "Stop there"
        t, u, reason, _ = s.chat([user(first)])
        stop = t[3:5]
        expect(stop and t.find(stop) > 0, "no stop string in %r" % t)
        turns(s, n_end, stream, stop=stop, first=first)

    check("a reply edited by one character is tokenized as text: not all of it cached")
    for stream in (False, True):
        first = "Edit me" if not stream else "Edit me too"
        t, u, reason, conv_e = s.chat([user(first)], stream=stream)
        whole = u["prompt_tokens"] + u["completion_tokens"] + n_end
        i = len(t) // 2
        edited = t[:i] + ("x" if t[i] != "x" else "y") + t[i + 1:]
        msgs_e = [user(first), assistant(edited), user("More")]
        t2, u2, _, conv2 = s.chat(msgs_e, stream=stream)
        expect(cached(u2) < whole, "an edited reply was reused: %d cached of %d"
               % (cached(u2), whole))
        expect(cached(u2) >= u["prompt_tokens"], "the prompt before the edited reply was not "
               "reused (%d < %d)" % (cached(u2), u["prompt_tokens"]))
        # the edited text's own tokens: what a server that never saw the reply makes
        expect(u2["prompt_tokens"] - s.n_tokens(tail("More")) ==
               u["prompt_tokens"] + s.n_tokens(edited + "<|im_end|>\n"),
               "the edited reply was not tokenized as its text")

    check("4 chats at once, each sending its replies back (the connection threads read "
          "the replies while the scheduler writes them)")
    errors = []

    def one(k):
        try:
            turns(s, n_end, k % 2 == 1, first="Concurrent chat %d" % k)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append("chat %d: %s" % (k, e))
    th = [threading.Thread(target=one, args=(k,)) for k in range(4)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    expect(not errors, "; ".join(errors))

    check("exactness: turn 2's greedy reply = a fresh `rebound run` fed the same tokens")
    t1, u1, _, c1 = s.chat([user("Exact")], max_tokens=10)
    m2 = [user("Exact"), assistant(t1), user("Go on")]
    t2, u2, r2, c2 = s.chat(m2, max_tokens=10)
    expect(cached(u2) == u1["prompt_tokens"] + u1["completion_tokens"] + n_end,
           "turn 2 was not reused: %d cached" % cached(u2))
    s.stop()  # its files are its own while it runs
    tool = subprocess.run([TOOL, "tokens", MODEL, os.path.join(convs, c2 + ".rbs"), str(N_CTX)],
                          capture_output=True, text=True)
    expect(tool.returncode == 0, "session_tool: %s" % tool.stderr)
    toks = tool.stdout.split()
    tf = os.path.join(WORK, "turn2.tokens")
    with open(tf, "w") as f:
        f.write(" ".join(toks[:u2["prompt_tokens"]]) + "\n")
    run = subprocess.run([REBOUND, "run", "-m", MODEL, "--tokens", tf, "-n",
                          str(u2["completion_tokens"]), "--temp", "0", "--no-display-prompt",
                          "--log-disable", "-t", "1"], capture_output=True)
    expect(run.returncode == 0, "rebound run: %r" % run.stderr[-300:])
    expect(run.stdout.decode("utf-8", "replace") == t2,
           "turn 2 with reuse %r != a fresh session's %r" % (t2, run.stdout))


    check("another namespace sending alice's text gets none of her tokens")
    s = Server("s2", "--api-keys", keys, "--sessions", os.path.join(WORK, "ns"))
    ta, ua, _, _ = s.chat([user("Secret")], key="ka")
    m = [user("Secret"), assistant(ta), user("Next")]
    _, ub, _, _ = s.chat(m, key="kb")
    _, ub2, _, _ = s.chat(m, key="kb")  # bob's own conversation now: by text
    _, ua2, _, _ = s.chat(m, key="ka")
    held_a = ua["prompt_tokens"] + ua["completion_tokens"] + n_end
    expect(cached(ua2) == held_a, "alice's own return cached %d of %d" % (cached(ua2), held_a))
    expect(ub["prompt_tokens"] != ua2["prompt_tokens"],
           "bob's request was rendered with alice's tokens")
    expect(cached(ub) == 0, "bob got %d of alice's tokens cached" % cached(ub))
    expect(ub2["prompt_tokens"] == ub["prompt_tokens"], "bob's tokens changed")
    s.stop()

    check("after a restart: the replies' tokens come from the session files (prefix and id)")
    s = Server("s3", "--sessions", convs)
    msgs += [assistant(last), user("Once more")]
    _, u, _, c = s.chat(msgs)
    expect(c == conv, "after a restart turn 4 went to %s, not %s" % (c, conv))
    want = u["prompt_tokens"] - s.n_tokens(tail("Once more"))
    expect(want == held, "after a restart the replies were not replaced by their tokens "
           "(%d != %d)" % (want, held))
    expect(cached(u) == held, "after a restart %d of %d cached" % (cached(u), held))
    smsgs += [assistant(slast), user("Once more")]
    _, u, _, c = s.chat(smsgs, conversation_id=sconv)
    expect(c == sconv and cached(u) == sheld, "by id after a restart: %d of %d cached"
           % (cached(u), sheld))
    s.stop()

    for name, model in (("qwen3 (BPE)", MODEL), ("llama (SentencePiece)", SPM)):
        check("the plain template, %s: the same" % name)
        global TAIL
        TAIL = "User: %s\nAssistant:"
        s = Server("plain", "--chat-template", "plain", model=model)
        n_end = s.n_tokens("\n")
        turns(s, n_end, False, first="Plain text")
        turns(s, n_end, True, first="Plain stream")
        s.stop()
    print("serve_reuse: %d checks passed" % n_checks())


if __name__ == "__main__":
    try:
        main()
    except Fail as e:
        print("FAIL:", e, flush=True)
        sys.exit(1)
