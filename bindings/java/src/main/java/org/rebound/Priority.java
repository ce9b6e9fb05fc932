package org.rebound;

/** A session's place in its pool (rb_priority): background gives memory back first. */
public enum Priority {
    FOREGROUND(0),
    BACKGROUND(1);

    final int value;

    Priority(int value) {
        this.value = value;
    }
}
