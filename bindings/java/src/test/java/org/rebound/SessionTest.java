package org.rebound;

import static org.junit.jupiter.api.Assertions.*;

import java.io.File;
import java.util.ArrayList;
import java.util.Arrays;
import java.util.List;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.Test;

/**
 * The Java API on a small random-weight model (made by `rebound make-model`,
 * path in the system property rebound.test.model; scratch files under
 * rebound.test.dir). Greedy text is checked against the raw API's own
 * argmax loop, so the generate loop is checked, not only run.
 */
class SessionTest {
    static final String PROMPT = "Once upon a time";
    Model model;

    static String modelPath() {
        String p = System.getProperty("rebound.test.model");
        assertNotNull(p, "system property rebound.test.model is not set");
        return p;
    }

    static File scratch(String name) {
        File d = new File(System.getProperty("rebound.test.dir", System.getProperty("java.io.tmpdir")));
        d.mkdirs();
        File f = new File(d, name);
        f.delete();
        return f;
    }

    @BeforeEach
    void open() {
        model = new Model(modelPath());
    }

    @AfterEach
    void close() {
        model.close();
    }

    static int argmax(float[] v) {
        int best = 0;
        for (int i = 1; i < v.length; i++)
            if (v[i] > v[best])
                best = i;
        return best;
    }

    /** n greedy tokens by hand: feed, argmax of the logits, feed. */
    int[] greedyByHand(String prompt, int n) {
        try (Session s = model.createSession(new Session.Config().nCtx(256))) {
            s.feed(model.tokenize(prompt, true));
            int[] out = new int[n];
            int k = 0;
            for (; k < n; k++) {
                int t = argmax(s.logits());
                if (model.isEndOfGeneration(t))
                    break;
                out[k] = t;
                s.feed(new int[] {t});
            }
            return Arrays.copyOf(out, k);
        }
    }

    @Test
    void info() {
        Model.Info in = model.info();
        assertEquals("llama", in.architecture);
        assertTrue(in.nLayers > 0 && in.nVocab > 0 && in.kvBytesPerToken > 0);
        assertFalse(Model.libraryVersion().isEmpty());
    }

    @Test
    void tokenizeRoundTrip() {
        int[] t = model.tokenize(PROMPT, true);
        assertEquals(model.tokenBos(), t[0]);
        assertEquals(PROMPT, model.detokenize(Arrays.copyOfRange(t, 1, t.length)));
    }

    @Test
    void openMissingFileNamesIt() {
        ReboundException e = assertThrows(ReboundException.class, () -> new Model("/nonexistent/m.gguf"));
        assertTrue(e.getMessage().contains("/nonexistent/m.gguf"), e.getMessage());
    }

    @Test
    void greedyGenerateIsTheArgmaxLoop() {
        int[] want = greedyByHand(PROMPT, 12);
        List<Integer> got = new ArrayList<>();
        StringBuilder pieces = new StringBuilder();
        String text;
        try (Session s = model.createSession(new Session.Config().nCtx(256))) {
            text = s.generate(PROMPT, 12, Sampler.greedy(), (tok, piece) -> {
                if (tok >= 0)
                    got.add(tok);
                pieces.append(piece);
                return true;
            });
            assertEquals(model.tokenize(PROMPT, true).length + want.length, s.tokens().length);
        }
        assertArrayEquals(want, got.stream().mapToInt(Integer::intValue).toArray());
        assertEquals(text, pieces.toString());
        assertFalse(text.isEmpty());
    }

    @Test
    void callbackStops() {
        try (Session s = model.createSession(new Session.Config().nCtx(256))) {
            int[] n = {0};
            s.generate(PROMPT, 50, Sampler.greedy(), (tok, piece) -> ++n[0] < 3);
            assertEquals(3, n[0]);
            assertEquals(model.tokenize(PROMPT, true).length + 3, s.tokens().length);
        }
    }

    @Test
    void abortStopsTheNextFeed() {
        try (Session s = model.createSession(new Session.Config().nCtx(256))) {
            int[] n = {0};
            ReboundException e = assertThrows(ReboundException.class,
                () -> s.generate(PROMPT, 50, Sampler.greedy(), (tok, piece) -> {
                    if (++n[0] == 2)
                        s.abort(); // as another thread would: the next feed stops
                    return true;
                }));
            assertEquals("RB_E_ABORTED", e.status());
            assertEquals(model.tokenize(PROMPT, true).length + 2, s.tokens().length);
            assertFalse(s.generate("", 2, Sampler.greedy()).isEmpty(), "the session goes on");
        }
    }

    @Test
    void badSamplerNamesTheParameter() {
        try (Session s = model.createSession(new Session.Config().nCtx(64))) {
            ReboundException e = assertThrows(ReboundException.class,
                () -> s.generate(PROMPT, 4, new Sampler().topP(0f)));
            assertEquals("RB_E_INVALID_ARG", e.status());
            assertTrue(e.getMessage().contains("top_p"), e.getMessage());
        }
    }

    @Test
    void seededSamplingRepeats() {
        String a, b;
        try (Session s = model.createSession(new Session.Config().nCtx(128))) {
            a = s.generate(PROMPT, 10, new Sampler().temperature(1.0f).seed(42));
        }
        try (Session s = model.createSession(new Session.Config().nCtx(128))) {
            b = s.generate(PROMPT, 10, new Sampler().temperature(1.0f).seed(42));
        }
        assertEquals(a, b);
    }

    @Test
    void saveAndOpenContinuesExactly() {
        String whole;
        try (Session s = model.createSession(new Session.Config().nCtx(256))) {
            whole = s.generate(PROMPT, 8, Sampler.greedy()) + s.generate("", 8, Sampler.greedy());
        }
        File f = scratch("java-save.rbs");
        String first;
        int[] tokens;
        try (Session s = model.createSession(new Session.Config().nCtx(256))) {
            first = s.generate(PROMPT, 8, Sampler.greedy());
            s.save(f.getPath());
            tokens = s.tokens();
        }
        assertTrue(f.length() > 0);
        try (Session s = Session.openSaved(model, f.getPath(), new Session.Config().nCtx(256))) {
            assertArrayEquals(tokens, s.tokens());
            assertEquals(whole, first + s.generate("", 8, Sampler.greedy()));
        }
        ReboundException e = assertThrows(ReboundException.class,
            () -> Session.openSaved(model, f.getPath() + ".missing", new Session.Config().nCtx(256)));
        assertEquals("RB_E_NOT_FOUND", e.status());
    }

    @Test
    void trimLosesNothing() {
        String ref;
        try (Session s = model.createSession(new Session.Config().nCtx(256))) {
            ref = s.generate(PROMPT, 8, Sampler.greedy()) + s.generate(" and", 8, Sampler.greedy());
        }
        for (TrimLevel level : new TrimLevel[] {TrimLevel.BACKGROUND, TrimLevel.MODERATE, TrimLevel.COMPLETE}) {
            try (Session s = model.createSession(new Session.Config().nCtx(256))) {
                String a = s.generate(PROMPT, 8, Sampler.greedy());
                long freed = s.trim(level);
                assertTrue(freed > 0, level + " freed nothing");
                Session.Stats st = s.stats();
                assertTrue(st.nPagesCompressed + st.nPagesStored + st.nPagesDropped > 0
                           || st.weightsEvictedBytes > 0, level + ": nothing left RAM");
                assertEquals(ref, a + s.generate(" and", 8, Sampler.greedy()), level.toString());
            }
        }
        try (Session s = model.createSession(new Session.Config().nCtx(256))) {
            s.generate(PROMPT, 4, Sampler.greedy());
            assertTrue(s.trim(TrimLevel.BYTES, 1) > 0);
            assertThrows(ReboundException.class, () -> s.trim(TrimLevel.BYTES, -1));
        }
    }

    @Test
    void poolPriorityAndTrim() {
        String ref;
        try (Session s = model.createSession(new Session.Config().nCtx(256))) {
            ref = s.generate(PROMPT, 6, Sampler.greedy()) + s.generate("", 4, Sampler.greedy());
        }
        try (Pool pool = new Pool(model, 0);
             Session a = model.createSession(new Session.Config().nCtx(256).pool(pool));
             Session b = model.createSession(new Session.Config().nCtx(256).pool(pool)
                                                 .priority(Priority.BACKGROUND))) {
            String first = a.generate(PROMPT, 6, Sampler.greedy());
            b.generate("Twice", 6, Sampler.greedy());
            Pool.Stats st = pool.stats();
            assertEquals(2, st.nSessions);
            assertEquals(1, st.nBackground);
            b.setPriority(Priority.FOREGROUND);
            assertEquals(0, pool.stats().nBackground);
            assertTrue(pool.trim(TrimLevel.COMPLETE) > 0);
            Pool.Stats after = pool.stats();
            assertTrue(after.weightsBytes < after.weightsTotalBytes, "weights not released");
            assertEquals(ref, first + a.generate("", 4, Sampler.greedy()));
        }
    }

    @Test
    void modelRefusesToCloseUnderASession() {
        Session s = model.createSession(new Session.Config().nCtx(64));
        assertThrows(IllegalStateException.class, () -> model.close());
        s.close();
        s.close(); // twice: nothing
        assertThrows(IllegalStateException.class, () -> s.tokens());
    }

    @Test
    void kvTypeAndRestoreOptions() {
        try (Session s = model.createSession(new Session.Config().nCtx(256).restore("recompute"))) {
            String a = s.generate(PROMPT, 6, Sampler.greedy());
            assertTrue(s.trim(TrimLevel.COMPLETE) > 0);
            assertTrue(s.stats().nPagesDropped > 0, "recompute drops the KV");
            assertFalse(a.isEmpty());
        }
        IllegalArgumentException e = assertThrows(IllegalArgumentException.class,
            () -> model.createSession(new Session.Config().kvType("q3")));
        assertTrue(e.getMessage().contains("kvType 'q3'"), e.getMessage());
        // the test model's heads are 16 wide: a q8_0 cache needs multiples of 32,
        // so the library refuses it (the option reached it)
        ReboundException r = assertThrows(ReboundException.class,
            () -> model.createSession(new Session.Config().nCtx(64).kvType("q8_0")));
        assertTrue(r.getMessage().contains("32"), r.getMessage());
    }

    @Test
    void feedRejectsABadToken() {
        try (Session s = model.createSession(new Session.Config().nCtx(64))) {
            ReboundException e = assertThrows(ReboundException.class, () -> s.feed(new int[] {1 << 30}));
            assertEquals("RB_E_INVALID_ARG", e.status());
            assertEquals(0, s.tokens().length);
        }
    }
}
