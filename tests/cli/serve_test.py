"""serve_test.py - what the Python clients of `rebound serve`'s end-to-end
tests (serve_attack.py, serve_reuse.py) share: the checks (each prints
"-- what"; a failed one raises Fail) and a server process in the
background on a free port or a Unix socket, its log in WORK/NAME.log,
killed at exit if a failed check left it running."""
import atexit
import os
import re
import signal
import subprocess
import time


class Fail(Exception):
    pass


_n_checks = 0


def check(what):
    global _n_checks
    _n_checks += 1
    print("--", what, flush=True)


def n_checks():
    return _n_checks


def expect(cond, msg):
    if not cond:
        raise Fail(msg)


class ServeProcess:
    """`REBOUND serve -m MODEL -t 1 ARGS` started; with wait, returns once
    it listens (self.port: its TCP port, None on --unix)."""

    def __init__(self, rebound, model, work, name, *args, unix=None, wait=True):
        self.log = os.path.join(work, name + ".log")
        self.unix = unix
        cmd = [rebound, "serve", "-m", model, "-t", "1"]
        cmd += ["--unix", unix] if unix else ["--port", "0"]
        cmd += list(args)
        self.proc = subprocess.Popen(cmd, stdout=open(self.log, "w"), stderr=subprocess.STDOUT)
        atexit.register(self.kill)
        self.port = None
        if not wait:
            return
        for _ in range(600):
            text = self.text()
            if "listening on" in text:
                m = re.search(r"listening on http://127\.0\.0\.1:(\d+)", text)
                self.port = int(m.group(1)) if m else None
                return
            if self.proc.poll() is not None:
                raise Fail("serve exited at start:\n" + text)
            time.sleep(0.05)
        raise Fail("serve did not start:\n" + self.text())

    def text(self):
        with open(self.log, errors="replace") as f:
            return f.read()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def stop(self):
        """SIGTERM; it must exit 0 within 30 s."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                rc = self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                raise Fail("serve did not stop after SIGTERM")
            expect(rc == 0, "serve exited with %d after SIGTERM" % rc)
