// Compile-only stand-in for Android's class; see ComponentCallbacks.java.
package android.content.res;

public final class Configuration {}
