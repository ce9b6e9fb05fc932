package org.rebound;

import java.nio.charset.StandardCharsets;

/**
 * One conversation on a model (rb_session): its tokens, its KV cache and
 * the state to extend it. Create it with {@link Model#createSession},
 * {@link #openSaved} reopens one saved with {@link #save}.
 *
 * <p>Threads: one thread at a time uses a session (generate, feed, save,
 * close); {@link #trim}, {@link #abort} and {@link #setPriority} may come
 * from any thread at any time (a generate on another thread honours them at
 * its next layer boundary, and its results stay exact).
 */
public final class Session implements AutoCloseable {
    /** How a session is made (rb_session_params); unset fields keep the library's defaults. */
    public static final class Config {
        /** context length; 0: the model's trained context */
        public int nCtx = 0;
        /** tokens per forward batch in the prompt; 0: the library's (128) */
        public int nBatch = 0;
        /** worker threads; 0: all online cores */
        public int nThreads = 0;
        /** RAM the session may hold (0: none); must be 0 in a pool (the pool holds the budget) */
        public long budgetBytes = 0;
        /** the pool the session joins, or null: a pool of its own */
        public Pool pool = null;
        public Priority priority = Priority.FOREGROUND;
        /** the live KV cache's type: "f16" (default), "q8_0" or "q4_0" */
        public String kvType = "f16";
        /** how trimmed KV comes back: "pipelined" (default) or "recompute" */
        public String restore = "pipelined";
        /** the compressed RAM tier's codec: "lossless" (default) or "q8" */
        public String ramCodec = "lossless";

        public Config nCtx(int n) { nCtx = n; return this; }
        public Config nBatch(int n) { nBatch = n; return this; }
        public Config nThreads(int n) { nThreads = n; return this; }
        public Config budgetBytes(long b) { budgetBytes = b; return this; }
        public Config pool(Pool p) { pool = p; return this; }
        public Config priority(Priority p) { priority = p; return this; }
        public Config kvType(String t) { kvType = t; return this; }
        public Config restore(String r) { restore = r; return this; }
        public Config ramCodec(String c) { ramCodec = c; return this; }

        private static int pick(String what, String v, String... names) {
            for (int i = 0; i < names.length; i++)
                if (names[i].equals(v))
                    return i;
            throw new IllegalArgumentException(what + " '" + v + "': one of " + String.join(", ", names));
        }

        int[] ints() {
            int kv = pick("kvType", kvType, "f16", "q8_0", "q4_0");
            int rs = restore.equals("recompute") ? 2 : pick("restore", restore, "pipelined");
            int rc = pick("ramCodec", ramCodec, "lossless", "q8");
            return new int[] {nCtx, nBatch, nThreads, priority.value, kv, kv, rs, rc};
        }
    }

    /** Flags of {@link #save}. */
    public static final int SAVE_FSYNC = 1, SAVE_SNAPSHOT = 2, SAVE_ON_REQUEST = 4, SAVE_WAIT = 8;

    private final Model model;
    private volatile long handle;

    Session(Model model, Pool pool, Config config, String savedPath) {
        this.model = model;
        long m = model.handle();
        long p = config.pool != null ? config.pool.handle() : 0;
        handle = savedPath == null
            ? Native.sessionCreate(m, p, config.ints(), config.budgetBytes)
            : Native.sessionOpenSaved(m, p, config.ints(), config.budgetBytes,
                                      savedPath.getBytes(StandardCharsets.UTF_8));
        model.users.incrementAndGet();
    }

    /**
     * Reopens a session saved by {@link #save} on the same model (config.nCtx
     * must be the saved one). It stays bound to path: every feed is
     * committed there.
     */
    public static Session openSaved(Model model, String path, Config config) {
        return new Session(model, null, config, path);
    }

    long handle() {
        long h = handle;
        if (h == 0)
            throw new IllegalStateException("the session is closed");
        return h;
    }

    public Model model() { return model; }

    /**
     * Feeds prompt (BOS first when the session is empty; special-token text
     * such as "&lt;|im_start|&gt;" is parsed), then generates up to maxTokens
     * tokens with sampler, each fed to the session, stopping at an
     * end-of-generation token, a full context, or when callback (may be
     * null) returns false. An empty prompt continues the session. Returns
     * the generated text (without the prompt); greedy, it is what
     * {@code rebound run -p PROMPT --temp 0} prints after the prompt.
     */
    public String generate(String prompt, int maxTokens, Sampler sampler, TokenCallback callback) {
        Sampler s = sampler != null ? sampler : new Sampler();
        float[] f = {s.temperature, s.topP, s.minP, s.repeatPenalty};
        int[] i = {s.topK, s.repeatLastN};
        Object bridge = callback == null ? null : new Bridge(callback);
        byte[] out = Native.sessionGenerate(handle(), model.handle(),
                                            prompt.getBytes(StandardCharsets.UTF_8), maxTokens,
                                            f, i, s.seed, bridge);
        return new String(out, StandardCharsets.UTF_8);
    }

    public String generate(String prompt, int maxTokens, Sampler sampler) {
        return generate(prompt, maxTokens, sampler, null);
    }

    /** Called from C with the piece as UTF-8 bytes. */
    private static final class Bridge {
        private final TokenCallback cb;

        Bridge(TokenCallback cb) {
            this.cb = cb;
        }

        @SuppressWarnings("unused")
        boolean onToken(int token, byte[] piece) {
            return cb.onToken(token, new String(piece, StandardCharsets.UTF_8));
        }
    }

    /** Appends tokens and computes them. */
    public void feed(int[] tokens) {
        Native.sessionFeed(handle(), tokens);
    }

    /** The session's tokens (a copy). */
    public int[] tokens() {
        return Native.sessionTokens(handle());
    }

    /** The last token's logits (a copy of n_vocab floats), or null when there are none. */
    public float[] logits() {
        return Native.sessionLogits(handle());
    }

    public int nCtx() {
        return Native.sessionNCtx(handle());
    }

    /** Forgets the tokens from position nTokens on. */
    public void rewind(int nTokens) {
        Native.sessionRewind(handle(), nTokens);
    }

    /**
     * Saves the session to path and binds it there (every later feed is
     * committed, so a kill loses at most the token in flight); flags:
     * SAVE_FSYNC, SAVE_SNAPSHOT (a copy, not bound), SAVE_ON_REQUEST, SAVE_WAIT.
     */
    public void save(String path, int flags) {
        Native.sessionSave(handle(), path.getBytes(StandardCharsets.UTF_8), flags);
    }

    public void save(String path) {
        save(path, 0);
    }

    /**
     * Gives memory back (any thread): by level, or with BYTES at least
     * bytes. Returns the bytes freed. The next generate restores it.
     */
    public long trim(TrimLevel level, long bytes) {
        return Native.sessionTrim(handle(), bytes, level.value);
    }

    public long trim(TrimLevel level) {
        return trim(level, 0);
    }

    /** Moves the session in its pool (any thread). */
    public void setPriority(Priority p) {
        Native.sessionSetPriority(handle(), p.value);
    }

    /** Stops a generate running on another thread at its next layer boundary (any thread). */
    public void abort() {
        Native.sessionAbort(handle());
    }

    /** Bytes of the session by category and tier (rb_session_stats). */
    public static final class Stats {
        public final long totalBytes, weightsBytes, weightsEvictedBytes, kvRawBytes,
            kvCompressedBytes, kvStoredBytes, kvDroppedBytes, scratchBytes, otherBytes,
            budgetBytes, nPagesResident, nPagesCompressed, nPagesStored, nPagesDropped,
            nLayersWeightsEvicted, fileCommits;

        Stats(long[] v) {
            totalBytes = v[0];
            weightsBytes = v[1];
            weightsEvictedBytes = v[2];
            kvRawBytes = v[3];
            kvCompressedBytes = v[4];
            kvStoredBytes = v[5];
            kvDroppedBytes = v[6];
            scratchBytes = v[7];
            otherBytes = v[8];
            budgetBytes = v[9];
            nPagesResident = v[10];
            nPagesCompressed = v[11];
            nPagesStored = v[12];
            nPagesDropped = v[13];
            nLayersWeightsEvicted = v[14];
            fileCommits = v[15];
        }
    }

    public Stats stats() {
        return new Stats(Native.sessionStats(handle()));
    }

    /** Destroys the session (waits for a pending file commit). A second close does nothing. */
    @Override
    public synchronized void close() {
        if (handle == 0)
            return;
        long h = handle;
        handle = 0;
        Native.sessionDestroy(h);
        model.users.decrementAndGet();
    }
}
