package org.rebound;

import java.nio.charset.StandardCharsets;
import java.util.concurrent.atomic.AtomicInteger;

/**
 * A GGUF model file (rb_model). Opening reads the header and the tensor
 * index; the first session loads the weights. The model must outlive its
 * sessions and pools: {@link #close()} refuses while any is open.
 *
 * <p>Threads: sessions of one model may be created and used on different
 * threads; the model's own calls (tokenize, info) one thread at a time.
 */
public final class Model implements AutoCloseable {
    private volatile long handle;
    final AtomicInteger users = new AtomicInteger();

    /** Opens path; the weights are read (not mapped). */
    public Model(String path) {
        this(path, false);
    }

    /** Opens path; useMmap maps the weights instead of reading them. */
    public Model(String path, boolean useMmap) {
        handle = Native.modelOpen(path.getBytes(StandardCharsets.UTF_8), useMmap);
    }

    long handle() {
        long h = handle;
        if (h == 0)
            throw new IllegalStateException("the model is closed");
        return h;
    }

    /** The library's version, e.g. "0.5.0". */
    public static String libraryVersion() {
        return Native.version();
    }

    /** What the model is: sizes and memory costs. */
    public static final class Info {
        public final String architecture, name;
        public final int nLayers, nEmbd, nHead, nHeadKv, headDim, nFf, nVocab, nCtxTrain;
        public final long fileBytes, tensorDataBytes, kvBytesPerToken;

        Info(long[] v, byte[][] names) {
            architecture = new String(names[0], StandardCharsets.UTF_8);
            name = new String(names[1], StandardCharsets.UTF_8);
            nLayers = (int) v[0];
            nEmbd = (int) v[1];
            nHead = (int) v[2];
            nHeadKv = (int) v[3];
            headDim = (int) v[4];
            nFf = (int) v[5];
            nVocab = (int) v[6];
            nCtxTrain = (int) v[7];
            fileBytes = v[8];
            tensorDataBytes = v[9];
            kvBytesPerToken = v[10];
        }
    }

    public Info info() {
        long h = handle();
        return new Info(Native.modelInfo(h), Native.modelNames(h));
    }

    /** Text to token ids; addSpecial adds BOS as the model asks, special-token text is parsed. */
    public int[] tokenize(String text, boolean addSpecial) {
        return Native.tokenize(handle(), text.getBytes(StandardCharsets.UTF_8), addSpecial, true);
    }

    /** Token ids to text (special tokens are not rendered). */
    public String detokenize(int[] tokens) {
        return new String(Native.detokenize(handle(), tokens, 0), StandardCharsets.UTF_8);
    }

    /** BOS id, or -1 when the model has none. */
    public int tokenBos() { return Native.tokenSpecial(handle(), 0); }
    /** EOS id, or -1. */
    public int tokenEos() { return Native.tokenSpecial(handle(), 1); }
    /** True when the token ends generation (EOS, end of turn). */
    public boolean isEndOfGeneration(int token) { return Native.tokenIsEog(handle(), token); }

    /** A session with the defaults: the trained context, all cores. */
    public Session createSession() {
        return new Session(this, null, new Session.Config(), null);
    }

    public Session createSession(Session.Config config) {
        return new Session(this, null, config, null);
    }

    /**
     * Closes the model. Throws IllegalStateException while a session or a
     * pool of it is open. A second close does nothing.
     */
    @Override
    public synchronized void close() {
        if (handle == 0)
            return;
        if (users.get() != 0)
            throw new IllegalStateException("the model still has " + users.get()
                                            + " open session(s) or pool(s): close them first");
        long h = handle;
        handle = 0;
        Native.modelClose(h);
    }
}
