package org.rebound;

/** Receives each generated token on the generating thread. */
@FunctionalInterface
public interface TokenCallback {
    /**
     * @param token the token id; -1 at the end for the rest of an unfinished
     *              UTF-8 character (U+FFFD), when there is one
     * @param piece the text it completes (whole UTF-8 characters; may be "")
     * @return false to stop generating after this token
     */
    boolean onToken(int token, String piece);
}
