package org.rebound;

/** What a trim gives back (rb_trim_level). */
public enum TrimLevel {
    /** exactly the bytes asked for, last layers first */
    BYTES(0),
    /** the KV of the last quarter of the layers */
    BACKGROUND(1),
    /** the KV of the last half of the layers */
    MODERATE(2),
    /** all KV and all layers' weights (the tokens stay: nothing is lost) */
    COMPLETE(3);

    final int value;

    TrimLevel(int value) {
        this.value = value;
    }
}
