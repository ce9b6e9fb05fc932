package org.rebound;

/**
 * A memory pool (rb_pool): one budget over a model's weights and the
 * memory of every session that joins it ({@link Session.Config#pool}).
 * Over its budget it takes memory back from background sessions before
 * foreground ones, least recently used first; nothing computed is lost
 * (the next generate restores what it needs).
 *
 * <p>Threads: every method may be called from any thread at any time (an
 * Android memory callback on the main thread while the model thread
 * generates): a busy session gives its part at its next layer boundary.
 */
public final class Pool implements AutoCloseable {
    private final Model model;
    private volatile long handle;

    /** budgetBytes 0: no limit (the pool still shares the weights and takes trims). */
    public Pool(Model model, long budgetBytes) {
        this.model = model;
        handle = Native.poolCreate(model.handle(), budgetBytes);
        model.users.incrementAndGet();
    }

    long handle() {
        long h = handle;
        if (h == 0)
            throw new IllegalStateException("the pool is closed");
        return h;
    }

    public Model model() { return model; }

    public void setBudget(long budgetBytes) {
        Native.poolSetBudget(handle(), budgetBytes);
    }

    /**
     * Trims every session of the pool by level (BYTES: bytes in all).
     * COMPLETE releases the weights too. Returns the bytes freed before the
     * return (a session feeding elsewhere gives its part a layer later).
     */
    public long trim(TrimLevel level, long bytes) {
        return Native.poolTrim(handle(), bytes, level.value);
    }

    public long trim(TrimLevel level) {
        return trim(level, 0);
    }

    /**
     * Lets the library watch the kernel's memory pressure (PSI; cgroup v1
     * levels) and trim the pool by itself (rb_pool_watch_pressure): since
     * Android 14 an app is told only UI_HIDDEN and BACKGROUND. systemWide:
     * the whole machine's PSI instead of the process's cgroup. Throws
     * RB_E_UNSUPPORTED when the machine offers no signal (the message says
     * why for each).
     */
    public void watchPressure(boolean systemWide) {
        Native.poolWatchPressure(handle(), systemWide);
    }

    /** Stops watching; no trim comes from the monitor after this returns. */
    public void unwatchPressure() {
        Native.poolUnwatchPressure(handle());
    }

    /** The pool's accounts (rb_pool_stats). */
    public static final class Stats {
        public final long budgetBytes, totalBytes, weightsBytes, weightsTotalBytes, sessionsBytes,
            overBytes, nSessions, nBackground, nEnforcements, trimmedBytes, weightsReleasedBytes;

        Stats(long[] v) {
            budgetBytes = v[0];
            totalBytes = v[1];
            weightsBytes = v[2];
            weightsTotalBytes = v[3];
            sessionsBytes = v[4];
            overBytes = v[5];
            nSessions = v[6];
            nBackground = v[7];
            nEnforcements = v[8];
            trimmedBytes = v[9];
            weightsReleasedBytes = v[10];
        }
    }

    public Stats stats() {
        return new Stats(Native.poolStats(handle()));
    }

    /** Destroys the pool (its sessions keep working; it goes with the last). */
    @Override
    public synchronized void close() {
        if (handle == 0)
            return;
        long h = handle;
        handle = 0;
        Native.poolDestroy(h);
        model.users.decrementAndGet();
    }
}
