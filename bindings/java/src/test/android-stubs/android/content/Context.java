// Compile-only stand-in for Android's class; see ComponentCallbacks.java.
package android.content;

public abstract class Context {
    public void registerComponentCallbacks(ComponentCallbacks callback) {}
}
