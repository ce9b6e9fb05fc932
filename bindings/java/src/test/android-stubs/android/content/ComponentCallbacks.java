// Compile-only stand-in for Android's class of this name (its signatures
// as the Android API reference gives them): tests.sh compiles the
// ComponentCallbacks2 glue against these where no android.jar exists.
package android.content;

import android.content.res.Configuration;

public interface ComponentCallbacks {
    void onConfigurationChanged(Configuration newConfig);
    void onLowMemory();
}
