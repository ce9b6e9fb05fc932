"""rebound: an on-device LLM runtime that keeps a conversation usable while
the operating system takes memory away (Python binding of librebound's
public C API, include/rebound.h).

    import rebound
    model = rebound.Model("model.gguf")
    session = model.create_session(n_ctx=2048)
    print(session.generate("Once upon a time", max_tokens=32, temperature=0))

Objects: Model (a GGUF file), Session (one conversation), Pool (one memory
budget over a model's sessions), Sampler (a sampling chain with its own
random state). Failed calls raise rebound.Error, whose .status is the C
status name ("RB_E_FORMAT", ...) and whose message names the problem.

Threads: an object is used by one thread at a time, except
Session.trim / abort / set_priority / prefetch and every Pool method, which any thread
may call at any time (the library's rule; the GIL is released while the
library computes, so a trim from another thread lands at the next layer).
The library is found as rebound._lib says (REBOUND_LIBRARY, a source
checkout's build folder, or the system's search path).
"""
import os as _os
import weakref as _weakref

from ._lib import ffi as _ffi, lib as _lib, library_path
from ._lib import model_params as _model_params, session_params as _session_params
from ._lib import PARAMS as _PARAMS

__all__ = ["Error", "Model", "Session", "Pool", "Sampler", "version", "cpu_describe",
           "decode_multi", "TRIM_BYTES", "TRIM_BACKGROUND", "TRIM_MODERATE", "TRIM_COMPLETE",
           "library_path"]

__version__ = "0.5.0"

TRIM_BYTES, TRIM_BACKGROUND, TRIM_MODERATE, TRIM_COMPLETE = 0, 1, 2, 3
_TRIM = {"bytes": 0, "background": 1, "moderate": 2, "complete": 3}
_PRIORITY = {"foreground": 0, "background": 1}
_RESTORE = {"pipelined": 0, "eager": 1, "recompute": 2}
_RAM_CODEC = {"lossless": 0, "q8": 1, "lz4": 2, "zstd": 3}
_TIERS = ("resident", "compressed", "stored", "dropped")
_EVENTS = ("restore_io", "restore_decode", "compute", "wait")
SAVE_FSYNC, SAVE_SNAPSHOT, SAVE_ON_REQUEST, SAVE_WAIT = 1, 2, 4, 8


class Error(Exception):
    """A failed library call: .status is the rb_status name, str() the message."""

    def __init__(self, status, message):
        self.status = status
        self.message = message
        super().__init__("%s: %s" % (status, message))


def _status_name(st):
    return _ffi.string(_lib.rb_status_name(st)).decode()


def _str(p):
    return "" if p == _ffi.NULL else _ffi.string(p).decode("utf-8", "replace")


def _check(st, msg_fn):
    if st != 0:
        raise Error(_status_name(st), msg_fn())


def _err_raise(err):
    raise Error(_status_name(err.status), _ffi.string(err.message).decode("utf-8", "replace"))


def _level(level):
    if isinstance(level, str):
        if level not in _TRIM:
            raise ValueError("trim level %r: one of %s" % (level, ", ".join(_TRIM)))
        return _TRIM[level]
    return int(level)


def _choice(name, value, table):
    if isinstance(value, str):
        if value not in table:
            raise ValueError("%s %r: one of %s" % (name, value, ", ".join(table)))
        return table[value]
    return int(value)


def _struct_dict(cdata, ctype):
    out = {}
    for name, field in _ffi.typeof(ctype).fields:
        v = getattr(cdata, name)
        kind = field.type.kind
        if kind == "array" and field.type.item.cname == "char":
            v = _ffi.string(v).decode("utf-8", "replace")
        elif kind == "array":
            v = list(v)
        elif kind == "pointer" and field.type.item.cname == "char":
            v = None if v == _ffi.NULL else _ffi.string(v).decode("utf-8", "replace")
        elif kind == "pointer":
            continue
        out[name] = v
    return out


def version():
    """The library's version, e.g. "0.5.0"."""
    return _ffi.string(_lib.rb_version()).decode()


def cpu_describe():
    """The CPU, its features, the kernel tier in use and the kernels per weight type."""
    n = _lib.rb_cpu_describe(_ffi.NULL, 0)
    buf = _ffi.new("char[]", n + 1)
    _lib.rb_cpu_describe(buf, n + 1)
    return _ffi.string(buf).decode()


# ---- model -------------------------------------------------------------------

class Model:
    """A GGUF model file. Opening reads the header and the tensor index; the
    first session loads the weights. The model must outlive its sessions
    and pools: close() refuses while one is open (they hold a reference, so
    the garbage collector never frees it first)."""

    def __init__(self, path, mmap=False):
        self._h = _ffi.NULL
        self._users = 0
        self.path = _os.fspath(path)
        mp = _model_params()
        mp.use_mmap = 1 if mmap else 0
        out = _ffi.new("rb_model **")
        err = _ffi.new("rb_error *")
        if _lib.rb_model_open(_os.fsencode(self.path), mp, out, err) != 0:
            _err_raise(err)
        self._h = out[0]

    def _handle(self):
        if self._h == _ffi.NULL:
            raise ValueError("the model is closed")
        return self._h

    def _msg(self):
        return _str(_lib.rb_model_errmsg(self._h))

    def close(self):
        """Closes the model; RuntimeError while a session or pool of it is open."""
        if self._h == _ffi.NULL:
            return
        if self._users:
            raise RuntimeError("the model still has %d open session(s) or pool(s): close them "
                               "first" % self._users)
        h, self._h = self._h, _ffi.NULL
        _lib.rb_model_close(h)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_h", _ffi.NULL) != _ffi.NULL and not self._users:
            self.close()

    @property
    def info(self):
        """What the model is and what it costs in memory (rb_model_info) as a dict."""
        out = _ffi.new("rb_model_info *")
        _check(_lib.rb_model_get_info_sized(self._handle(), out, _ffi.sizeof("rb_model_info")),
               self._msg)
        return _struct_dict(out[0], "rb_model_info")

    @property
    def n_vocab(self):
        return self.info["n_vocab"]

    def meta(self, key):
        """A string value of the file's metadata, or None when the key is absent."""
        out = _ffi.new("const char **")
        n = _ffi.new("size_t *")
        st = _lib.rb_model_get_meta_str(self._handle(), key.encode(), out, n)
        if st == 7:  # RB_E_NOT_FOUND
            return None
        _check(st, lambda: "metadata key '%s' is not a string" % key)
        return _ffi.unpack(out[0], n[0]).decode("utf-8", "replace")

    def kv_bytes(self, n_tokens):
        """f16 K and V bytes a context of n_tokens positions needs."""
        return _lib.rb_model_kv_bytes(self._handle(), n_tokens)

    def layer_bytes(self, layer):
        """Bytes of the tensors of one layer (0 out of range)."""
        return _lib.rb_model_get_layer_bytes(self._handle(), layer)

    def tensors(self):
        """The file's tensor index: dicts of name, type, dims, n_bytes, file_offset
        (the weight I/O a forward pass does, tensor by tensor)."""
        h = self._handle()
        out = []
        ti = _ffi.new("rb_tensor_info *")
        for i in range(self.info["n_tensors"]):
            _check(_lib.rb_model_get_tensor_info(h, i, ti), self._msg)
            out.append({"name": _str(ti.name), "type": _str(ti.type_name),
                        "dims": list(ti.dims)[:ti.n_dims], "n_bytes": ti.n_bytes,
                        "file_offset": ti.file_offset})
        return out

    # tokens

    def tokenize(self, text, add_special=True, parse_special=True):
        """Text to token ids (add_special: BOS as the model asks; parse_special:
        special-token text such as "<|im_start|>" becomes its token)."""
        h = self._handle()
        b = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        n = _ffi.new("size_t *")
        st = _lib.rb_model_tokenize(h, b, len(b), int(add_special), int(parse_special),
                                    _ffi.NULL, 0, n)
        if st not in (0, 1):
            _check(st, self._msg)
        ids = _ffi.new("int32_t[]", max(n[0], 1))
        _check(_lib.rb_model_tokenize(h, b, len(b), int(add_special), int(parse_special), ids,
                                      n[0], n), self._msg)
        return list(ids[0:n[0]])

    def detokenize(self, tokens, continuation=False):
        """Token ids to text (special tokens not rendered; continuation keeps the
        first piece's leading space, as text that goes on from earlier text)."""
        d = _Detokenizer(self, continuation)
        return "".join(d.push(t) for t in tokens) + d.flush()

    def token_to_piece(self, token, special=False):
        """The bytes of one token (may be part of a UTF-8 character)."""
        h = self._handle()
        n = _ffi.new("size_t *")
        st = _lib.rb_model_token_to_piece(h, token, int(special), _ffi.NULL, 0, n)
        _check(st, self._msg)
        buf = _ffi.new("char[]", n[0] + 1)
        _check(_lib.rb_model_token_to_piece(h, token, int(special), buf, n[0] + 1, n), self._msg)
        return _ffi.unpack(buf, n[0])

    @property
    def token_bos(self):
        """BOS id, or -1."""
        return _lib.rb_model_token_bos(self._handle())

    @property
    def token_eos(self):
        """EOS id, or -1."""
        return _lib.rb_model_token_eos(self._handle())

    def is_eog(self, token):
        """True when token ends generation (EOS, end of turn)."""
        return bool(_lib.rb_model_token_is_eog(self._handle(), token))

    def apply_chat_template(self, messages, add_assistant=True, template=None):
        """Renders [{"role": ..., "content": ...}, ...] with the model's chat
        template (or a family name: rebound.chat_template_names())."""
        h = self._handle()
        keep = []
        msgs = _ffi.new("rb_chat_message[]", max(len(messages), 1))
        for i, m in enumerate(messages):
            r = _ffi.new("char[]", m["role"].encode())
            c = _ffi.new("char[]", m["content"].encode("utf-8"))
            keep += [r, c]
            msgs[i].role, msgs[i].content = r, c
        t = _ffi.NULL if template is None else template.encode()
        n = _ffi.new("size_t *")
        _check(_lib.rb_chat_apply_template(h, t, msgs, len(messages), int(add_assistant),
                                           _ffi.NULL, 0, n), self._msg)
        buf = _ffi.new("char[]", n[0] + 1)
        _check(_lib.rb_chat_apply_template(h, t, msgs, len(messages), int(add_assistant), buf,
                                           n[0] + 1, n), self._msg)
        return _ffi.unpack(buf, n[0]).decode("utf-8", "replace")

    # sessions

    def create_session(self, n_ctx=0, **params):
        """A new session; parameters as Session's (n_ctx 0: the trained context)."""
        return Session(self, n_ctx=n_ctx, **params)

    def open_session(self, path, n_ctx=0, **params):
        """Reopens a session saved with Session.save (n_ctx must be the saved one);
        it stays bound to path (every feed is committed there)."""
        return Session(self, n_ctx=n_ctx, _path=path, **params)


def chat_template_names():
    """The built-in chat template families."""
    return _ffi.string(_lib.rb_chat_template_names()).decode().split(",")


class _Detokenizer:
    def __init__(self, model, continuation):
        out = _ffi.new("rb_detokenizer **")
        err = _ffi.new("rb_error *")
        if _lib.rb_detokenizer_create_flags(model._handle(), 1 if continuation else 0, out,
                                            err) != 0:
            _err_raise(err)
        self._d = _ffi.gc(out[0], _lib.rb_detokenizer_destroy)
        self._cap = _lib.rb_detokenizer_max_bytes(self._d)
        self._buf = _ffi.new("char[]", self._cap)
        self._n = _ffi.new("size_t *")

    def push(self, token):
        st = _lib.rb_detokenizer_push(self._d, token, self._buf, self._cap, self._n)
        _check(st, lambda: _str(_lib.rb_detokenizer_errmsg(self._d)))
        return _ffi.unpack(self._buf, self._n[0]).decode("utf-8", "replace")

    def flush(self):
        st = _lib.rb_detokenizer_flush(self._d, self._buf, self._cap, self._n)
        _check(st, lambda: _str(_lib.rb_detokenizer_errmsg(self._d)))
        return _ffi.unpack(self._buf, self._n[0]).decode("utf-8", "replace")


# ---- sampler -----------------------------------------------------------------

class Sampler:
    """A sampling chain (rb_sampler) with llama.cpp's defaults; temperature <= 0
    is greedy. Keeps its random state across generate calls (state() /
    set_state() save and restore it). Checked by the library at the first
    use: a bad value raises Error naming it."""

    def __init__(self, temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repeat_penalty=1.0,
                 repeat_last_n=64, seed=0):
        self.params = dict(temperature=temperature, top_k=top_k, top_p=top_p, min_p=min_p,
                           repeat_penalty=repeat_penalty, repeat_last_n=repeat_last_n, seed=seed)
        self._s = None
        self._n_vocab = None

    def _bind(self, n_vocab):
        if self._s is not None:
            if n_vocab != self._n_vocab:
                raise ValueError("this sampler was made for %d tokens, the session has %d"
                                 % (self._n_vocab, n_vocab))
            return self._s
        p = _lib.rb_sampler_default_params()
        q = self.params
        p.temp, p.top_k, p.top_p, p.min_p = q["temperature"], q["top_k"], q["top_p"], q["min_p"]
        p.repeat_penalty, p.repeat_last_n, p.seed = (q["repeat_penalty"], q["repeat_last_n"],
                                                     q["seed"])
        out = _ffi.new("rb_sampler **")
        err = _ffi.new("rb_error *")
        if _lib.rb_sampler_create(_ffi.new("rb_sampler_params *", p), n_vocab, out, err) != 0:
            _err_raise(err)
        self._s = _ffi.gc(out[0], _lib.rb_sampler_destroy)
        self._n_vocab = n_vocab
        self._tok = _ffi.new("int32_t *")
        return self._s

    def _msg(self):
        return _str(_lib.rb_sampler_errmsg(self._s))

    def sample(self, session):
        """The next token from the session's last logits and its history."""
        s = self._bind(session.n_vocab)
        h = session._handle()
        logits = _lib.rb_session_get_logits(h)
        if logits == _ffi.NULL:
            raise Error("RB_E_INVALID_ARG", "the session has no logits (feed something first)")
        _check(_lib.rb_sampler_sample(s, logits, _lib.rb_session_get_tokens(h),
                                      _lib.rb_session_n_tokens(h), self._tok), self._msg)
        return self._tok[0]

    def candidates(self, session):
        """The chain's survivors for the session's logits: [(token, logit)], most
        likely first (the random state is not touched)."""
        s = self._bind(session.n_vocab)
        h = session._handle()
        logits = _lib.rb_session_get_logits(h)
        if logits == _ffi.NULL:
            raise Error("RB_E_INVALID_ARG", "the session has no logits (feed something first)")
        out = _ffi.new("rb_sampler_candidate **")
        n = _ffi.new("size_t *")
        _check(_lib.rb_sampler_get_candidates(s, logits, _lib.rb_session_get_tokens(h),
                                              _lib.rb_session_n_tokens(h), out, n), self._msg)
        return sorted(((out[0][i].id, out[0][i].logit) for i in range(n[0])),
                      key=lambda c: (-c[1], c[0]))

    def state(self):
        """The random state as (seed, s0, s1, s2, s3); None before the first use."""
        if self._s is None:
            return None
        st = _ffi.new("rb_sampler_state *")
        _lib.rb_sampler_get_state(self._s, st)
        return (st.seed,) + tuple(st.s)

    def set_state(self, state, n_vocab):
        """Restores a state() (binds the sampler to n_vocab tokens first)."""
        s = self._bind(n_vocab)
        st = _ffi.new("rb_sampler_state *")
        st.seed = state[0]
        for i in range(4):
            st.s[i] = state[1 + i]
        _check(_lib.rb_sampler_set_state(s, st), self._msg)


# ---- pool --------------------------------------------------------------------

class Pool:
    """One memory budget over a model's weights and every session that joins
    it (create_session(pool=...)). Over budget it takes memory back from
    background sessions first, least recently used first; nothing computed
    is lost. Every method may be called from any thread at any time."""

    def __init__(self, model, budget_bytes=0):
        self.model = model
        self._h = _ffi.NULL
        out = _ffi.new("rb_pool **")
        err = _ffi.new("rb_error *")
        if _lib.rb_pool_create(model._handle(), budget_bytes, out, err) != 0:
            _err_raise(err)
        self._h = out[0]
        self._sessions = _weakref.WeakValueDictionary()  # handle -> Session
        model._users += 1

    def _handle(self):
        if self._h == _ffi.NULL:
            raise ValueError("the pool is closed")
        return self._h

    def set_budget(self, budget_bytes):
        _check(_lib.rb_pool_set_budget(self._handle(), budget_bytes),
               lambda: "budget_bytes %d refused" % budget_bytes)

    def count_process(self):
        """Counts the process's other memory in the pool's total from now on."""
        _check(_lib.rb_pool_count_process(self._handle()), lambda: "rb_pool_count_process")

    def trim(self, level="moderate", bytes=0):
        """Trims every session: "background", "moderate", "complete" (weights
        too), or "bytes" (bytes in all). Returns the bytes freed."""
        freed = _ffi.new("uint64_t *")
        lv = _level(level)
        _check(_lib.rb_pool_trim(self._handle(), bytes, lv, freed),
               lambda: "trim level %r bytes %d refused" % (level, bytes))
        return freed[0]

    def prefetch_next(self):
        """Restores ahead of time the idle session most likely to return next
        (feeds / (1 + the others' feeds since its last)), with the budget's
        free bytes only (it trims nothing). Returns (session, planned_bytes):
        the Session prefetched (None when none qualified) and the bytes it
        brings back."""
        picked = _ffi.new("rb_session **")
        planned = _ffi.new("uint64_t *")
        _check(_lib.rb_pool_prefetch_next(self._handle(), picked, planned),
               lambda: "rb_pool_prefetch_next")
        if picked[0] == _ffi.NULL:
            return None, planned[0]
        return self._sessions.get(int(_ffi.cast("uintptr_t", picked[0]))), planned[0]

    def watch_pressure(self, system_wide=False):
        """Lets the library trim the pool on the kernel's memory pressure (PSI)."""
        p = _ffi.new("rb_pool_pressure_params *")
        p.is_system_wide = int(system_wide)
        err = _ffi.new("rb_error *")
        if _lib.rb_pool_watch_pressure(self._handle(), p, err) != 0:
            _err_raise(err)

    def unwatch_pressure(self):
        _lib.rb_pool_unwatch_pressure(self._handle())

    def stats(self):
        """The pool's accounts (rb_pool_stats) as a dict."""
        out = _ffi.new("rb_pool_stats *")
        _check(_lib.rb_pool_get_stats_sized(self._handle(), out, _ffi.sizeof("rb_pool_stats")),
               lambda: "rb_pool_get_stats")
        return _struct_dict(out[0], "rb_pool_stats")

    def close(self):
        """Destroys the pool (its sessions keep working: it goes with the last)."""
        if self._h == _ffi.NULL:
            return
        h, self._h = self._h, _ffi.NULL
        _lib.rb_pool_destroy(h)
        self.model._users -= 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_h", _ffi.NULL) != _ffi.NULL:
            self.close()


# ---- session -----------------------------------------------------------------

class Session:
    """One conversation on a model: its tokens, KV cache and compute state.
    Made by Model.create_session / Model.open_session, with these keyword
    parameters (rb_session_params; unset ones keep the library's defaults):

      n_ctx, n_batch, n_threads     context, prompt batch, threads (0: defaults)
      pool, priority                a Pool to join; "foreground"/"background"
      budget_bytes                  RAM the session may hold (0: none; 0 in a pool)
      kv_type (or kv_type_k, kv_type_v)  "f16", "q8_0", "q4_0"
      restore, ram_codec            how trimmed KV comes back ("pipelined",
                                    "recompute", "eager") and the RAM tier's codec
                                    ("lossless", "q8", "lz4", "zstd")
      spill_dir                     folder of the spill file
      weights_budget_bytes, weights_policy   weight streaming
      device, decode_bytes_per_s, storage_bytes_per_s   research knobs
                                    (rebound_experimental.h: an emulated
                                    "phone"/"watch" disk, the tier split's rates)
      progress                      callable(phase, done, total) on the feeding
                                    thread between layers; a true return stops
                                    the feed (Error RB_E_ABORTED)
      save_flags                    rebound.SAVE_* for open_session
      exact_attention               True: every batch in llama.cpp's one-query
                                    arithmetic (bit-identical logits); False
                                    (default): batches of 64+ tokens tiled in f32
      kv_page_tokens                tokens per KV page: 0 (256) or a multiple of
                                    32 up to 1024 (forks share a common prefix
                                    down to a page; the logits do not change)
    """

    def __init__(self, model, n_ctx=0, n_batch=0, n_threads=0, pool=None,
                 priority="foreground", budget_bytes=0, kv_type=None, kv_type_k="f16",
                 kv_type_v="f16", restore="pipelined", ram_codec="lossless", spill_dir=None,
                 weights_budget_bytes=0, weights_policy=None, device=None,
                 decode_bytes_per_s=0.0, storage_bytes_per_s=0.0, progress=None, save_flags=0,
                 exact_attention=False, kv_page_tokens=0, _path=None):
        self._h = _ffi.NULL
        self.model = model
        self.pool = pool
        p = _session_params()
        p.n_ctx = n_ctx
        if n_batch:
            p.n_batch = n_batch
        p.n_threads = n_threads
        p.pool = pool._handle() if pool is not None else _ffi.NULL
        p.priority = _choice("priority", priority, _PRIORITY)
        p.budget_bytes = budget_bytes
        if kv_type is not None:
            kv_type_k = kv_type_v = kv_type
        for field, name in (("kv_type_k", kv_type_k), ("kv_type_v", kv_type_v)):
            t = _lib.rb_kv_type_from_name(name.encode()) if isinstance(name, str) else name
            if t < 0:
                raise ValueError("%s %r: one of f16, q8_0, q4_0" % (field, name))
            setattr(p, field, t)
        p.restore = _choice("restore", restore, _RESTORE)
        p.ram_codec = _choice("ram_codec", ram_codec, _RAM_CODEC)
        if exact_attention:
            if _PARAMS != "v3":
                raise ValueError("exact_attention: this librebound predates it")
            p.exact_attention = 1
        if kv_page_tokens:
            if _PARAMS != "v3":
                raise ValueError("kv_page_tokens: this librebound predates it")
            p.kv_page_tokens = kv_page_tokens
        self._keep = []  # C strings and structs the params point to
        if spill_dir is not None:
            self._keep.append(_ffi.new("char[]", _os.fsencode(spill_dir)))
            p.spill_dir = self._keep[-1]
        p.weights_budget_bytes = weights_budget_bytes
        if weights_policy is not None:
            self._keep.append(_ffi.new("char[]", weights_policy.encode()))
            p.weights_policy = self._keep[-1]
        if device is not None or decode_bytes_per_s or storage_bytes_per_s:
            x = _ffi.new("rb_experimental_params *", _lib.rb_experimental_default_params())
            if device is not None:
                self._keep.append(_ffi.new("char[]", device.encode()))
                x.device = self._keep[-1]
            x.decode_bytes_per_s = decode_bytes_per_s
            x.storage_bytes_per_s = storage_bytes_per_s
            self._keep.append(x)
            p.experimental = x
        self._progress_error = None
        if progress is not None:
            def _cb(ctx, phase, done, total):
                try:
                    return 1 if progress(("restore", "feed", "load")[phase] if phase < 3
                                         else phase, done, total) else 0
                except BaseException as e:  # stop the feed; raised after it returns
                    self._progress_error = e
                    return 1
            self._progress_cb = _ffi.callback("rb_progress_fn", _cb)
            p.progress = self._progress_cb
        p.file_flags = save_flags
        out = _ffi.new("rb_session **")
        err = _ffi.new("rb_error *")
        if _path is None:
            st = _lib.rb_session_create(model._handle(), p, out, err)
        else:
            st = _lib.rb_session_open_saved(model._handle(), p, _os.fsencode(_path), out, err)
        if st != 0:
            _err_raise(err)
        self._h = out[0]
        self.n_vocab = _lib.rb_session_n_vocab(self._h)
        if pool is not None:
            pool._sessions[int(_ffi.cast("uintptr_t", self._h))] = self
        model._users += 1

    def _handle(self):
        if self._h == _ffi.NULL:
            raise ValueError("the session is closed")
        return self._h

    def _msg(self):
        return _str(_lib.rb_session_errmsg(self._h))

    def close(self):
        """Destroys the session (waits for a pending file commit)."""
        if self._h == _ffi.NULL:
            return
        h, self._h = self._h, _ffi.NULL
        if self.pool is not None:
            self.pool._sessions.pop(int(_ffi.cast("uintptr_t", h)), None)
        _lib.rb_session_destroy(h)
        self.model._users -= 1

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        if getattr(self, "_h", _ffi.NULL) != _ffi.NULL:
            self.close()

    # state

    @property
    def n_tokens(self):
        return _lib.rb_session_n_tokens(self._handle())

    @property
    def n_ctx(self):
        return _lib.rb_session_n_ctx(self._handle())

    @property
    def tokens(self):
        """The session's tokens (a list)."""
        h = self._handle()
        n = _lib.rb_session_n_tokens(h)
        return list(_lib.rb_session_get_tokens(h)[0:n]) if n else []

    def logits(self):
        """The last token's logits (a list of n_vocab floats), or None."""
        p = _lib.rb_session_get_logits(self._handle())
        return None if p == _ffi.NULL else list(p[0:self.n_vocab])

    # feed and generate

    def feed(self, prompt):
        """Appends text (BOS first when the session is empty; special-token
        text parsed) or a list of token ids, and computes it."""
        if isinstance(prompt, (str, bytes)):
            prompt = self.model.tokenize(prompt, add_special=self.n_tokens == 0)
        self._feed(prompt)

    def _feed(self, tokens):
        h = self._handle()
        ids = _ffi.new("int32_t[]", list(tokens)) if tokens else _ffi.new("int32_t[1]")
        self._progress_error = None
        st = _lib.rb_session_feed(h, ids, len(tokens), _ffi.NULL)
        if self._progress_error is not None:
            e, self._progress_error = self._progress_error, None
            raise e
        _check(st, self._msg)

    def _ready(self, prompt):
        """Feeds the prompt; an empty one continues the session (a session
        without logits - just opened, rewound - feeds its last token again)."""
        if isinstance(prompt, (str, bytes)):
            toks = self.model.tokenize(prompt, add_special=self.n_tokens == 0) if prompt else []
        else:
            toks = list(prompt)
        if not toks:
            if self.n_tokens == 0:
                raise Error("RB_E_INVALID_ARG", "the prompt has no tokens and the session is empty")
            if _lib.rb_session_get_logits(self._h) == _ffi.NULL:
                last = self.tokens[-1]
                self.rewind(self.n_tokens - 1)
                toks = [last]
        if toks:
            self._feed(toks)

    def stream(self, prompt="", max_tokens=64, sampler=None, stop_at_eog=True, **sampling):
        """Feeds prompt (text or token ids), then yields (token, text) for each
        generated token (text: the whole UTF-8 characters it completes; at the
        end (-1, rest) when an unfinished character remains). Each token is
        fed, so the session holds prompt and reply. Stops after max_tokens,
        at an end-of-generation token (not fed) or a full context. Sampling:
        sampler=Sampler(...) or its keywords (temperature, top_k, top_p,
        min_p, repeat_penalty, repeat_last_n, seed)."""
        if sampler is None:
            sampler = Sampler(**sampling)
        elif sampling:
            raise TypeError("give a sampler or sampling keywords, not both")
        if max_tokens < 0:
            raise ValueError("max_tokens is negative")
        sampler._bind(self.n_vocab)
        detok = _Detokenizer(self.model, True)
        self._ready(prompt)
        h = self._handle()
        n_ctx = _lib.rb_session_n_ctx(h)
        for _ in range(max_tokens):
            if _lib.rb_session_n_tokens(h) >= n_ctx:
                break
            t = sampler.sample(self)
            if stop_at_eog and self.model.is_eog(t):
                break
            piece = detok.push(t)
            self._feed([t])
            yield t, piece
        rest = detok.flush()
        if rest:
            yield -1, rest

    def generate(self, prompt="", max_tokens=64, temperature=None, on_token=None, sampler=None,
                 **sampling):
        """Feeds prompt and returns the generated text (without the prompt).
        temperature 0 is greedy: then it is what `rebound run -p PROMPT
        --temp 0` prints after the prompt. on_token(token, text) is called
        per token; a False return (not None) stops. Other keywords: stream's
        (temperature defaults to 0.8, llama.cpp's)."""
        if temperature is not None:
            sampling["temperature"] = temperature
        out = []
        for t, piece in self.stream(prompt, max_tokens, sampler=sampler, **sampling):
            out.append(piece)
            if on_token is not None and on_token(t, piece) is False:
                break
        return "".join(out)

    def generate_tokens(self, prompt="", max_tokens=64, temperature=None, sampler=None,
                        **sampling):
        """As generate, returning the generated token ids."""
        if temperature is not None:
            sampling["temperature"] = temperature
        return [t for t, _ in self.stream(prompt, max_tokens, sampler=sampler, **sampling)
                if t >= 0]

    def rewind(self, n_tokens):
        """Forgets the tokens from position n_tokens on."""
        _check(_lib.rb_session_rewind(self._handle(), n_tokens), self._msg)

    def shift(self, n_keep, n_discard):
        """Context shift: keeps n_keep tokens, drops the n_discard after them."""
        _check(_lib.rb_session_shift(self._handle(), n_keep, n_discard), self._msg)

    # memory

    def trim(self, level="moderate", bytes=0):
        """Gives memory back (any thread): "background", "moderate",
        "complete", or "bytes" (at least bytes). Returns the bytes freed;
        the next feed restores what it needs."""
        freed = _ffi.new("uint64_t *")
        st = _lib.rb_session_trim(self._handle(), bytes, _level(level), freed)
        _check(st, lambda: "trim level %r bytes %d failed" % (level, bytes))
        return freed[0]

    def set_priority(self, priority):
        """"foreground" or "background" in its pool (any thread)."""
        _check(_lib.rb_session_set_priority(self._handle(),
                                            _choice("priority", priority, _PRIORITY)),
               lambda: "priority %r refused" % (priority,))

    def prefetch(self):
        """Begins restoring now what of the session is out of RAM (any
        thread; does not wait for it, nor for a feed running elsewhere): the
        next feed waits only for what has not arrived. Within the pool's
        free budget (a foreground session's may take it from background
        sessions). Returns the bytes it brings back (0: nothing to do, no
        room, or the session is busy)."""
        planned = _ffi.new("uint64_t *")
        _check(_lib.rb_session_prefetch(self._handle(), planned), self._msg)
        return planned[0]

    def abort(self):
        """Stops a feed running on another thread at its next layer boundary."""
        _lib.rb_session_abort(self._handle())

    def set_restore(self, restore="pipelined", ram_codec="lossless"):
        """How later trims place KV and how it comes back (the KV codec of the
        RAM tier: "lossless", "q8"; the baselines "lz4", "zstd"; restore
        "pipelined", "recompute", or the "eager" baseline)."""
        _check(_lib.rb_session_set_restore(self._handle(), _choice("restore", restore, _RESTORE),
                                           _choice("ram_codec", ram_codec, _RAM_CODEC)),
               self._msg)

    def stats(self):
        """Bytes by category and tier, the last restore's phases, the file's
        commits, weight streaming (rb_session_stats) as a dict; n_kv_pages is
        also given per tier name."""
        out = _ffi.new("rb_session_stats *")
        _check(_lib.rb_session_get_stats_sized(self._handle(), out,
                                               _ffi.sizeof("rb_session_stats")), self._msg)
        d = _struct_dict(out[0], "rb_session_stats")
        d["kv_pages"] = dict(zip(_TIERS, d["n_kv_pages"]))
        d["file_status"] = _status_name(d["file_status"])
        return d

    def restore_events(self, max_events=8192):
        """The last feed's timeline: dicts of kind, layer, start_s, end_s."""
        ev = _ffi.new("rb_restore_event[]", max_events)
        n = _lib.rb_session_restore_events(self._handle(), ev, max_events)
        return [{"kind": _EVENTS[e.kind] if 0 <= e.kind < 4 else e.kind, "layer": e.layer,
                 "start_s": e.start_s, "end_s": e.end_s} for e in ev[0:min(n, max_events)]]

    # files

    def save(self, path, fsync=False, snapshot=False, on_request=False, wait=False):
        """Saves to path and binds the session there (every later feed is
        committed); snapshot: a copy, not bound."""
        flags = ((SAVE_FSYNC if fsync else 0) | (SAVE_SNAPSHOT if snapshot else 0)
                 | (SAVE_ON_REQUEST if on_request else 0) | (SAVE_WAIT if wait else 0))
        _check(_lib.rb_session_save(self._handle(), _os.fsencode(path), flags), self._msg)

    def unbind(self):
        """Stops committing to the bound file."""
        _check(_lib.rb_session_unbind(self._handle()), self._msg)

    def set_blob(self, data):
        """Bytes saved with the session (at most 256 KiB)."""
        data = bytes(data)
        _check(_lib.rb_session_set_blob(self._handle(), data, len(data)), self._msg)

    def get_blob(self):
        n = _ffi.new("size_t *")
        p = _lib.rb_session_get_blob(self._handle(), n)
        return b"" if p == _ffi.NULL else _ffi.unpack(_ffi.cast("char *", p), n[0])


def decode_multi(sessions, tokens):
    """One decode step of several sessions of one model in one forward pass
    (rebound_experimental.h): tokens[i] is fed to sessions[i]; each ends as
    a feed alone would leave it (the same logits, bit for bit)."""
    if len(sessions) != len(tokens):
        raise ValueError("%d sessions but %d tokens" % (len(sessions), len(tokens)))
    arr = _ffi.new("rb_session *[]", [s._handle() for s in sessions])
    ids = _ffi.new("int32_t[]", list(tokens))
    err = _ffi.new("rb_error *")
    if _lib.rb_session_decode_multi(arr, ids, len(sessions), err) != 0:
        _err_raise(err)
