package org.rebound;

/**
 * A failed call of the library: {@link #status()} is the C status name
 * ("RB_E_FORMAT", "RB_E_BUDGET", ...), the message says exactly what.
 */
public class ReboundException extends RuntimeException {
    private static final long serialVersionUID = 1L;
    private final String status;

    public ReboundException(String status, String message) {
        super(status + ": " + message);
        this.status = status;
    }

    /** The rb_status name, e.g. "RB_E_INVALID_ARG". */
    public String status() {
        return status;
    }
}
