"""The Python API on small random-weight models: greedy text checked
against the raw API's own argmax loop, sessions in a pool, trims at every
level, save/open, sampler options, stats, the research calls."""
import os
import threading

import pytest

import rebound

PROMPT = "Once upon a time"


def argmax(v):
    return max(range(len(v)), key=lambda i: (v[i], -i))


def greedy_by_hand(model, prompt, n):
    with model.create_session(n_ctx=256) as s:
        s.feed(model.tokenize(prompt))
        out = []
        for _ in range(n):
            t = argmax(s.logits())
            if model.is_eog(t):
                break
            out.append(t)
            s.feed([t])
        return out


def test_required_names(model):
    s = model.create_session(n_ctx=128)
    text = s.generate(PROMPT, max_tokens=8, temperature=0)
    assert isinstance(text, str) and text
    s.close()


def test_info_and_tensors(model):
    info = model.info
    assert info["architecture"] == "llama"
    assert info["n_layers"] > 0 and info["n_vocab"] > 0
    tensors = model.tensors()
    assert len(tensors) == info["n_tensors"]
    assert sum(t["n_bytes"] for t in tensors) == info["tensor_data_bytes"]
    assert sum(model.layer_bytes(i) for i in range(info["n_layers"])) == info["layer_weight_bytes"]
    assert model.kv_bytes(10) == 10 * info["kv_bytes_per_token"]
    assert model.meta("general.architecture") == "llama"
    assert model.meta("no.such.key") is None
    inc = os.environ.get("REBOUND_INCLUDE_DIR")
    if inc:   # the library of this tree: the header's version
        header = open(os.path.join(inc, "rebound.h")).read()
        assert '#define REBOUND_VERSION_STRING "%s"' % rebound.version() in header
    assert "tier" in rebound.cpu_describe()


def test_tokenize_round_trip(model):
    t = model.tokenize(PROMPT)
    assert t[0] == model.token_bos
    assert model.detokenize(t[1:]) == PROMPT
    assert model.tokenize(PROMPT, add_special=False) == t[1:]


def test_open_missing_file_names_it():
    with pytest.raises(rebound.Error) as e:
        rebound.Model("/nonexistent/m.gguf")
    assert "/nonexistent/m.gguf" in str(e.value)
    assert e.value.status in ("RB_E_IO", "RB_E_NOT_FOUND")


@pytest.mark.parametrize("which", ["model_path", "bpe_model_path"])
def test_greedy_generate_is_the_argmax_loop(which, request):
    with rebound.Model(request.getfixturevalue(which)) as model:
        want = greedy_by_hand(model, PROMPT, 12)
        seen = []
        with model.create_session(n_ctx=256) as s:
            text = s.generate(PROMPT, max_tokens=12, temperature=0,
                              on_token=lambda t, piece: seen.append((t, piece)))
            assert s.n_tokens == len(model.tokenize(PROMPT)) + len(want)
        assert [t for t, _ in seen if t >= 0] == want
        assert "".join(p for _, p in seen) == text
        assert text == model.detokenize(want, continuation=True)
        with model.create_session(n_ctx=256) as s:
            assert s.generate_tokens(model.tokenize(PROMPT), max_tokens=12, temperature=0) == want


def test_feed_text_and_tokens_agree(model):
    with model.create_session(n_ctx=128) as a, model.create_session(n_ctx=128) as b:
        a.feed(PROMPT)
        b.feed(model.tokenize(PROMPT))
        assert a.tokens == b.tokens
        assert a.logits() == b.logits()
        with pytest.raises(rebound.Error) as e:
            a.feed([1 << 30])
        assert e.value.status == "RB_E_INVALID_ARG"
        assert a.tokens == b.tokens


def test_on_token_false_stops(model):
    with model.create_session(n_ctx=256) as s:
        n = []
        s.generate(PROMPT, max_tokens=50, temperature=0, on_token=lambda t, p: n.append(t) or len(n) < 3)
        assert len(n) == 3
        assert s.n_tokens == len(model.tokenize(PROMPT)) + 3


def test_sampler_options(model):
    def run(**kw):
        with model.create_session(n_ctx=128) as s:
            return s.generate_tokens(PROMPT, max_tokens=10, **kw)
    greedy = run(temperature=0)
    assert run(temperature=1.0, top_k=1) == greedy           # top-k 1 is the argmax
    assert run(temperature=1.0, seed=7) == run(temperature=1.0, seed=7)
    a, b = run(temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=1), run(
        temperature=1.5, top_k=0, top_p=1.0, min_p=0.0, seed=2)
    assert a != b                                            # the seed matters
    with pytest.raises(rebound.Error) as e:
        run(temperature=1.0, top_p=0.0)
    assert "top_p" in str(e.value)
    # a Sampler keeps its random state across calls; state() restores it
    with model.create_session(n_ctx=128) as s:
        sp = rebound.Sampler(temperature=1.0, seed=3)
        s.feed(PROMPT)
        st = sp.state() or (sp.sample(s), sp.state())[1]
        x = [sp.sample(s) for _ in range(4)]
        sp.set_state(st, s.n_vocab)
        assert [sp.sample(s) for _ in range(4)] == x
        c = sp.candidates(s)
        assert c and all(c[i][1] >= c[i + 1][1] for i in range(len(c) - 1))
        with pytest.raises(TypeError):   # a sampler and keywords: which one? refused
            s.generate(sampler=sp, temperature=0)


def test_save_and_open_continue_exactly(model, tmp_path):
    with model.create_session(n_ctx=256) as s:
        whole = s.generate(PROMPT, max_tokens=8, temperature=0) + s.generate(
            max_tokens=8, temperature=0)
    path = tmp_path / "py.rbs"
    with model.create_session(n_ctx=256) as s:
        first = s.generate(PROMPT, max_tokens=8, temperature=0)
        s.set_blob(b"chat history")
        s.save(path)
        tokens = s.tokens
    with model.open_session(path, n_ctx=256) as s:
        assert s.tokens == tokens
        assert s.get_blob() == b"chat history"
        assert first + s.generate(max_tokens=8, temperature=0) == whole
        tokens = s.tokens
    # still bound: its feeds were committed (the commit worker is done at close)
    with model.open_session(path, n_ctx=256) as s:
        assert s.tokens == tokens
    with pytest.raises(rebound.Error) as e:
        model.open_session(tmp_path / "missing.rbs", n_ctx=256)
    assert e.value.status == "RB_E_NOT_FOUND"


@pytest.mark.parametrize("level", ["background", "moderate", "complete"])
def test_trim_loses_nothing(model, level):
    with model.create_session(n_ctx=256) as s:
        ref = s.generate(PROMPT, max_tokens=8, temperature=0) + s.generate(" and", max_tokens=8, temperature=0)
    with model.create_session(n_ctx=256) as s:
        a = s.generate(PROMPT, max_tokens=8, temperature=0)
        before = s.stats()
        assert s.trim(level) > 0
        st = s.stats()
        assert st["total_bytes"] < before["total_bytes"]
        assert st["kv_pages"]["resident"] < before["kv_pages"]["resident"] or st["weights_evicted_bytes"] > 0
        assert a + s.generate(" and", max_tokens=8, temperature=0) == ref
        assert s.restore_events(), "the restore left no timeline"


def test_trim_bytes_and_bad_level(model):
    with model.create_session(n_ctx=256) as s:
        s.feed(PROMPT)
        assert s.trim("bytes", bytes=1) > 0
        with pytest.raises(ValueError):
            s.trim("everything")


def test_ram_codec_q8_then_trim(model):
    with model.create_session(n_ctx=256) as s:
        s.generate(PROMPT, max_tokens=8, temperature=0)
        s.set_restore("pipelined", "q8")
        s.trim("complete")
        assert s.generate(max_tokens=4, temperature=0) is not None
        with pytest.raises(ValueError):
            s.set_restore("pipelined", "gzip")


def test_pool_priority_trim_and_stats(model):
    with model.create_session(n_ctx=256) as s:
        ref = s.generate(PROMPT, max_tokens=6, temperature=0) + s.generate(max_tokens=4, temperature=0)
    with rebound.Pool(model) as pool:
        a = model.create_session(n_ctx=256, pool=pool)
        b = model.create_session(n_ctx=256, pool=pool, priority="background")
        first = a.generate(PROMPT, max_tokens=6, temperature=0)
        b.generate("Twice", max_tokens=6, temperature=0)
        st = pool.stats()
        assert (st["n_sessions"], st["n_background"]) == (2, 1)
        b.set_priority("foreground")
        assert pool.stats()["n_background"] == 0
        assert pool.trim("complete") > 0
        st = pool.stats()
        assert st["weights_bytes"] < st["weights_total_bytes"]
        assert first + a.generate(max_tokens=4, temperature=0) == ref
        with pytest.raises(RuntimeError):
            model.close()  # sessions and the pool are open
        a.close()
        b.close()


def test_pool_budget_trims(model):
    with rebound.Pool(model) as pool:
        fg = model.create_session(n_ctx=256, pool=pool)
        bg = model.create_session(n_ctx=256, pool=pool, priority="background")
        bg.generate(PROMPT, max_tokens=20, temperature=0)
        fg.generate(PROMPT, max_tokens=20, temperature=0)
        kv_bg = bg.stats()["kv_raw_bytes"]
        kv_fg = fg.stats()["kv_raw_bytes"]
        st = pool.stats()
        pool.set_budget(st["total_bytes"] - kv_bg // 2)
        try:
            assert bg.stats()["kv_raw_bytes"] < kv_bg
            assert fg.stats()["kv_raw_bytes"] <= kv_fg
            after = pool.stats()
            assert after["trimmed_bytes"] > 0 and after["total_bytes"] < st["total_bytes"]
            assert after["budget_bytes"] == st["total_bytes"] - kv_bg // 2
        finally:
            fg.close()
            bg.close()


def test_prefetch(model):
    with model.create_session(n_ctx=256) as r:
        ref = r.generate(PROMPT, max_tokens=6, temperature=0) + r.generate(max_tokens=4, temperature=0)
    with rebound.Pool(model) as pool:
        a = model.create_session(n_ctx=256, pool=pool)
        b = model.create_session(n_ctx=256, pool=pool, priority="background")
        first = a.generate(PROMPT, max_tokens=6, temperature=0)
        b.generate("Twice", max_tokens=6, temperature=0)
        assert a.prefetch() == 0  # all in RAM
        a.trim("moderate")
        b.trim("moderate")
        assert a.prefetch() > 0
        picked, planned = pool.prefetch_next()
        assert picked is b and planned > 0
        assert pool.prefetch_next() == (None, 0)
        st = pool.stats()
        assert st["n_prefetches"] == 2 and st["prefetch_granted_bytes"] > 0
        assert a.stats()["n_prefetches"] == 1
        assert first + a.generate(max_tokens=4, temperature=0) == ref
        a.close()
        b.close()


def test_trim_from_another_thread(model):
    with model.create_session(n_ctx=256, n_batch=4) as s:
        ref_model_text = None
        with model.create_session(n_ctx=256) as r:
            ref_model_text = r.generate(PROMPT * 3, max_tokens=16, temperature=0)
        stop = threading.Event()

        def trimmer():
            while not stop.is_set():
                s.trim("moderate")
        th = threading.Thread(target=trimmer)
        th.start()
        try:
            text = s.generate(PROMPT * 3, max_tokens=16, temperature=0)
        finally:
            stop.set()
            th.join()
        assert text == ref_model_text


def test_abort_stops_the_next_feed(model):
    with model.create_session(n_ctx=256) as s:
        n = []

        def on_token(t, piece):
            n.append(t)
            if len(n) == 2:
                s.abort()   # as another thread would: the next feed stops

        with pytest.raises(rebound.Error) as e:
            s.generate(PROMPT, max_tokens=50, temperature=0, on_token=on_token)
        assert e.value.status == "RB_E_ABORTED"
        assert s.n_tokens == len(model.tokenize(PROMPT)) + 2
        assert s.generate(max_tokens=2, temperature=0)


def test_progress_can_stop_a_feed(model):
    calls = []
    with model.create_session(n_ctx=256, n_batch=4,
                              progress=lambda phase, done, total: calls.append(phase) or len(calls) > 2) as s:
        with pytest.raises(rebound.Error) as e:
            s.feed(PROMPT * 3)
        assert e.value.status == "RB_E_ABORTED"
        assert "feed" in calls
        assert s.n_tokens < len(model.tokenize(PROMPT * 3))


def test_chat_template(model):
    text = model.apply_chat_template([{"role": "user", "content": "Hi"}], template="chatml")
    assert text == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    assert "chatml" in rebound.chat_template_names()


def test_decode_multi_equals_feeding_alone(model):
    with model.create_session(n_ctx=64, n_threads=2) as a, model.create_session(n_ctx=64, n_threads=2) as b, \
            model.create_session(n_ctx=64, n_threads=2) as c:
        a.feed(PROMPT)
        b.feed("Twice")
        c.feed(PROMPT)
        rebound.decode_multi([a, b], [5, 6])
        c.feed([5])
        assert a.logits() == c.logits()
        assert b.tokens[-1] == 6


def test_closed_objects_refuse(model):
    s = model.create_session(n_ctx=64)
    s.close()
    s.close()
    with pytest.raises(ValueError):
        s.tokens
    with pytest.raises(ValueError):
        model.create_session(n_ctx=64, priority="sometimes")


def test_exact_attention_is_one_token_at_a_time(model):
    """exact_attention=True: a batch of 64+ tokens gives the logits of
    feeding them one by one, bit for bit; the default (tiled f32 for such a
    batch) need not, but stays close."""
    toks = [3 + (i * 37) % 200 for i in range(80)]
    with model.create_session(n_ctx=128, exact_attention=True) as e, \
            model.create_session(n_ctx=128) as t, \
            model.create_session(n_ctx=128, exact_attention=True) as one:
        e.feed(toks)
        t.feed(toks)
        for tok in toks:
            one.feed([tok])
        assert e.logits() == one.logits()
        assert max(abs(a - b) for a, b in zip(t.logits(), one.logits())) < 0.5


def test_kv_page_tokens_same_logits_and_fork_shares(model):
    """Pages of 32 tokens: the logits are those of 256-token pages, bit for
    bit; a bad size is an error that names it."""
    toks = [3 + (i * 37) % 200 for i in range(100)]
    with model.create_session(n_ctx=256, kv_page_tokens=32) as small, \
            model.create_session(n_ctx=256) as big:
        small.feed(toks)
        big.feed(toks)
        assert small.logits() == big.logits()
    with pytest.raises(rebound.Error, match="kv_page_tokens 100"):
        model.create_session(n_ctx=256, kv_page_tokens=100)
