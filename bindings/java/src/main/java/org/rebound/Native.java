package org.rebound;

import java.io.File;

/**
 * The native methods (bindings/java/jni/rebound_jni.c) and the loading of
 * librebound_jni. Handles are the C pointers; the public classes own them.
 * Not part of the API.
 *
 * <p>Where the library comes from, first found: the system property
 * {@code rebound.jni.library} or the environment variable
 * {@code REBOUND_JNI_LIBRARY} (an absolute path, for a build tree), else
 * {@code System.loadLibrary("rebound_jni")} (java.library.path; on Android
 * the APK's lib folder).
 */
final class Native {
    private Native() {}

    static {
        String path = System.getProperty("rebound.jni.library");
        if (path == null || path.isEmpty())
            path = System.getenv("REBOUND_JNI_LIBRARY");
        if (path != null && !path.isEmpty())
            System.load(new File(path).getAbsolutePath());
        else
            System.loadLibrary("rebound_jni");
    }

    static native String version();

    static native long modelOpen(byte[] path, boolean useMmap);
    static native void modelClose(long model);
    static native long[] modelInfo(long model);
    static native byte[][] modelNames(long model);
    static native int[] tokenize(long model, byte[] text, boolean addSpecial, boolean parseSpecial);
    static native byte[] detokenize(long model, int[] tokens, int flags);
    static native int tokenSpecial(long model, int which);
    static native boolean tokenIsEog(long model, int token);

    static native long poolCreate(long model, long budgetBytes);
    static native void poolDestroy(long pool);
    static native void poolSetBudget(long pool, long budgetBytes);
    static native long poolTrim(long pool, long bytes, int level);
    static native long[] poolStats(long pool);
    static native void poolWatchPressure(long pool, boolean systemWide);
    static native void poolUnwatchPressure(long pool);

    static native long sessionCreate(long model, long pool, int[] cfg, long budgetBytes);
    static native long sessionOpenSaved(long model, long pool, int[] cfg, long budgetBytes, byte[] path);
    static native void sessionDestroy(long session);
    static native void sessionFeed(long session, int[] tokens);
    static native int[] sessionTokens(long session);
    static native float[] sessionLogits(long session);
    static native int sessionNCtx(long session);
    static native void sessionRewind(long session, int nTokens);
    static native void sessionSave(long session, byte[] path, int flags);
    static native long sessionTrim(long session, long bytes, int level);
    static native void sessionSetPriority(long session, int priority);
    static native void sessionAbort(long session);
    static native long[] sessionStats(long session);
    static native byte[] sessionGenerate(long session, long model, byte[] prompt, int maxTokens,
                                         float[] samp, int[] isamp, long seed, Object callback);
}
