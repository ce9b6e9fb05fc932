package org.rebound;

import java.util.List;
import java.util.concurrent.CopyOnWriteArrayList;

/**
 * Android's memory signals mapped to a pool and its sessions, in plain Java
 * (no Android class: it runs and is tested on any JVM). An app forwards
 * {@code ComponentCallbacks2.onTrimMemory(level)} to {@link #onTrimMemory}
 * (bindings/java/android/ holds that glue) and its foreground/background
 * moves (an Activity's onStart/onStop) to {@link #onForeground} /
 * {@link #onBackground}.
 *
 * <p>The levels are Android's integer values. Since API 34 only
 * TRIM_MEMORY_UI_HIDDEN (20) and TRIM_MEMORY_BACKGROUND (40) are delivered;
 * the others (deprecated) still come on older releases. Unknown values are
 * treated as the highest known level below them, as Android asks
 * ("level &gt;= X" comparisons). The mapping ({@link #actionFor}):
 *
 * <pre>
 * level                      action                  why
 * &gt;= 40 BACKGROUND, MODERATE, RELEASE_ALL            the app is on the LRU list and may be
 *       COMPLETE             (pool trim COMPLETE,     killed next: give back everything, the
 *                            sessions background)     weights too; the tokens stay, nothing
 *                                                     computed is lost (rb_pool_trim)
 * &gt;= 20 UI_HIDDEN            HIDDEN (sessions         the user left: cheapest-to-restore
 *                            background, pool trim    memory first, the last quarter of the
 *                            BACKGROUND)              layers' KV (rebound.h's advice)
 * &gt;= 10 RUNNING_LOW,         TRIM_MODERATE            in use, the device is low: the last
 *       RUNNING_CRITICAL                              half's KV; the weights stay, so the next
 *                                                     token does not wait for a reload
 * &gt;=  5 RUNNING_MODERATE     TRIM_BACKGROUND          in use, memory getting scarce
 * &lt;   5                      NONE
 * </pre>
 *
 * <p>Threads: every method may be called from any thread (onTrimMemory
 * comes on the main thread while the model thread generates): the pool and
 * priority calls it makes are the C API's any-thread calls, and a session
 * generating elsewhere gives its part at its next layer boundary.
 */
public final class AndroidMemory {
    /** android.content.ComponentCallbacks2's values. */
    public static final int TRIM_MEMORY_RUNNING_MODERATE = 5;
    public static final int TRIM_MEMORY_RUNNING_LOW = 10;
    public static final int TRIM_MEMORY_RUNNING_CRITICAL = 15;
    public static final int TRIM_MEMORY_UI_HIDDEN = 20;
    public static final int TRIM_MEMORY_BACKGROUND = 40;
    public static final int TRIM_MEMORY_MODERATE = 60;
    public static final int TRIM_MEMORY_COMPLETE = 80;

    /** What a level asks of the pool. */
    public enum Action {
        NONE(null),
        TRIM_BACKGROUND(TrimLevel.BACKGROUND),
        TRIM_MODERATE(TrimLevel.MODERATE),
        /** sessions to background priority, then a BACKGROUND trim */
        HIDDEN(TrimLevel.BACKGROUND),
        /** sessions to background priority, then a COMPLETE trim (weights too) */
        RELEASE_ALL(TrimLevel.COMPLETE);

        /** the pool trim it makes, or null */
        public final TrimLevel trim;

        Action(TrimLevel trim) {
            this.trim = trim;
        }
    }

    /** The action for an onTrimMemory level (the table above). */
    public static Action actionFor(int level) {
        if (level >= TRIM_MEMORY_BACKGROUND)
            return Action.RELEASE_ALL;
        if (level >= TRIM_MEMORY_UI_HIDDEN)
            return Action.HIDDEN;
        if (level >= TRIM_MEMORY_RUNNING_LOW)
            return Action.TRIM_MODERATE;
        if (level >= TRIM_MEMORY_RUNNING_MODERATE)
            return Action.TRIM_BACKGROUND;
        return Action.NONE;
    }

    private final Pool pool;
    private final List<Session> sessions = new CopyOnWriteArrayList<>();
    private volatile boolean background;

    /** pool: the pool the app's sessions share. */
    public AndroidMemory(Pool pool) {
        if (pool == null)
            throw new IllegalArgumentException("pool is null");
        this.pool = pool;
    }

    /** A session whose priority follows the app (it should be in the pool). */
    public void add(Session s) {
        sessions.add(s);
        s.setPriority(background ? Priority.BACKGROUND : Priority.FOREGROUND);
    }

    /** Forget s (before closing it). */
    public void remove(Session s) {
        sessions.remove(s);
    }

    public boolean isBackground() {
        return background;
    }

    /**
     * ComponentCallbacks2.onTrimMemory(level): applies {@link #actionFor}
     * and returns the action taken.
     */
    public Action onTrimMemory(int level) {
        Action a = actionFor(level);
        if (a == Action.HIDDEN || a == Action.RELEASE_ALL)
            setAll(Priority.BACKGROUND);
        if (a.trim != null)
            pool.trim(a.trim);
        return a;
    }

    /** The app came to the foreground (an Activity's onStart). */
    public void onForeground() {
        setAll(Priority.FOREGROUND);
    }

    /** The app went to the background (an Activity's onStop; UI_HIDDEN does it too). */
    public void onBackground() {
        setAll(Priority.BACKGROUND);
    }

    private void setAll(Priority p) {
        background = p == Priority.BACKGROUND;
        for (Session s : sessions)
            s.setPriority(p);
    }
}
