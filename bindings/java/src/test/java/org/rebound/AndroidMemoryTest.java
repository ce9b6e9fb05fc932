package org.rebound;

import static org.junit.jupiter.api.Assertions.*;

import org.junit.jupiter.api.Test;

/** The onTrimMemory mapping, and what it does to a real pool. */
class AndroidMemoryTest {
    @Test
    void levelsMapAsDocumented() {
        assertEquals(AndroidMemory.Action.NONE, AndroidMemory.actionFor(0));
        assertEquals(AndroidMemory.Action.NONE, AndroidMemory.actionFor(4));
        assertEquals(AndroidMemory.Action.TRIM_BACKGROUND, AndroidMemory.actionFor(AndroidMemory.TRIM_MEMORY_RUNNING_MODERATE));
        assertEquals(AndroidMemory.Action.TRIM_MODERATE, AndroidMemory.actionFor(AndroidMemory.TRIM_MEMORY_RUNNING_LOW));
        assertEquals(AndroidMemory.Action.TRIM_MODERATE, AndroidMemory.actionFor(AndroidMemory.TRIM_MEMORY_RUNNING_CRITICAL));
        assertEquals(AndroidMemory.Action.HIDDEN, AndroidMemory.actionFor(AndroidMemory.TRIM_MEMORY_UI_HIDDEN));
        assertEquals(AndroidMemory.Action.HIDDEN, AndroidMemory.actionFor(39));
        assertEquals(AndroidMemory.Action.RELEASE_ALL, AndroidMemory.actionFor(AndroidMemory.TRIM_MEMORY_BACKGROUND));
        assertEquals(AndroidMemory.Action.RELEASE_ALL, AndroidMemory.actionFor(AndroidMemory.TRIM_MEMORY_MODERATE));
        assertEquals(AndroidMemory.Action.RELEASE_ALL, AndroidMemory.actionFor(AndroidMemory.TRIM_MEMORY_COMPLETE));
        assertEquals(AndroidMemory.Action.RELEASE_ALL, AndroidMemory.actionFor(1000));
        // Android's values (android.content.ComponentCallbacks2)
        assertEquals(5, AndroidMemory.TRIM_MEMORY_RUNNING_MODERATE);
        assertEquals(10, AndroidMemory.TRIM_MEMORY_RUNNING_LOW);
        assertEquals(15, AndroidMemory.TRIM_MEMORY_RUNNING_CRITICAL);
        assertEquals(20, AndroidMemory.TRIM_MEMORY_UI_HIDDEN);
        assertEquals(40, AndroidMemory.TRIM_MEMORY_BACKGROUND);
        assertEquals(60, AndroidMemory.TRIM_MEMORY_MODERATE);
        assertEquals(80, AndroidMemory.TRIM_MEMORY_COMPLETE);
    }

    @Test
    void appSwitchOnARealPool() {
        String prompt = SessionTest.PROMPT;
        String ref;
        try (Model model = new Model(SessionTest.modelPath())) {
            try (Session s = model.createSession(new Session.Config().nCtx(256))) {
                ref = s.generate(prompt, 8, Sampler.greedy()) + s.generate("", 8, Sampler.greedy());
            }
            try (Pool pool = new Pool(model, 0);
                 Session a = model.createSession(new Session.Config().nCtx(256).pool(pool));
                 Session b = model.createSession(new Session.Config().nCtx(256).pool(pool))) {
                AndroidMemory mem = new AndroidMemory(pool);
                mem.add(a);
                mem.add(b);
                String first = a.generate(prompt, 8, Sampler.greedy());
                b.generate("Twice", 8, Sampler.greedy());
                long sessions0 = pool.stats().sessionsBytes;
                assertEquals(0, pool.stats().nBackground);

                // running low while in use: KV of the last layers goes, weights stay
                assertEquals(AndroidMemory.Action.TRIM_MODERATE,
                             mem.onTrimMemory(AndroidMemory.TRIM_MEMORY_RUNNING_LOW));
                Pool.Stats st = pool.stats();
                assertEquals(0, st.nBackground);
                assertTrue(st.trimmedBytes > 0, "nothing trimmed");
                assertEquals(st.weightsTotalBytes, st.weightsBytes);

                // the user leaves: background, the cheapest memory first
                assertEquals(AndroidMemory.Action.HIDDEN, mem.onTrimMemory(AndroidMemory.TRIM_MEMORY_UI_HIDDEN));
                assertTrue(mem.isBackground());
                assertEquals(2, pool.stats().nBackground);

                // on the LRU list (API 34+'s other level): everything, weights too
                assertEquals(AndroidMemory.Action.RELEASE_ALL,
                             mem.onTrimMemory(AndroidMemory.TRIM_MEMORY_BACKGROUND));
                st = pool.stats();
                assertTrue(st.weightsBytes < st.weightsTotalBytes, "weights not released");
                assertTrue(st.weightsReleasedBytes > 0);
                assertTrue(st.sessionsBytes < sessions0, "sessions kept their KV");

                // back: foreground, and the conversation goes on exactly
                mem.onForeground();
                assertFalse(mem.isBackground());
                assertEquals(0, pool.stats().nBackground);
                assertEquals(ref, first + a.generate("", 8, Sampler.greedy()));

                // a session added while in the background starts there
                mem.onBackground();
                try (Session c = model.createSession(new Session.Config().nCtx(64).pool(pool))) {
                    mem.add(c);
                    assertEquals(3, pool.stats().nBackground);
                    mem.remove(c);
                }
                mem.remove(a);
                mem.remove(b);
            }
        }
    }
}
