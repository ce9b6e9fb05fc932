package org.rebound.android;

import android.content.ComponentCallbacks2;
import android.content.Context;
import android.content.res.Configuration;
import org.rebound.AndroidMemory;

/**
 * The Android glue: forwards the system's memory callbacks to an
 * {@link AndroidMemory} (which maps them to the pool). Compiled only when
 * an Android platform jar is found (CMake's REBOUND_ANDROID_JAR); in an
 * app, copy it into the sources or use the jar built with it.
 *
 * <pre>
 * AndroidMemory memory = new AndroidMemory(pool);
 * ReboundMemoryCallbacks.register(getApplicationContext(), memory);
 * // Activity.onStart: memory.onForeground(); onStop: memory.onBackground()
 * </pre>
 */
public final class ReboundMemoryCallbacks implements ComponentCallbacks2 {
    private final AndroidMemory memory;

    public ReboundMemoryCallbacks(AndroidMemory memory) {
        this.memory = memory;
    }

    public static ReboundMemoryCallbacks register(Context context, AndroidMemory memory) {
        ReboundMemoryCallbacks cb = new ReboundMemoryCallbacks(memory);
        context.registerComponentCallbacks(cb);
        return cb;
    }

    @Override
    public void onTrimMemory(int level) {
        memory.onTrimMemory(level);
    }

    @Override
    public void onLowMemory() {
        memory.onTrimMemory(TRIM_MEMORY_COMPLETE);
    }

    @Override
    public void onConfigurationChanged(Configuration newConfig) {}
}
