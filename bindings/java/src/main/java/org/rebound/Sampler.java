package org.rebound;

/**
 * Sampling options (rb_sampler_params), llama.cpp's defaults: temperature
 * 0.8, topK 40, topP 0.95, minP 0.05, repeatPenalty 1 (off), repeatLastN
 * 64, seed 0. {@link #greedy()} picks the most likely token every time.
 * Checked by the library when a generate starts (a bad value: a
 * ReboundException naming it).
 */
public final class Sampler {
    public float temperature = 0.8f;
    public int topK = 40;
    public float topP = 0.95f;
    public float minP = 0.05f;
    public float repeatPenalty = 1.0f;
    public int repeatLastN = 64;
    public long seed = 0;

    /** temperature 0: the argmax, as {@code rebound run --temp 0}. */
    public static Sampler greedy() {
        Sampler s = new Sampler();
        s.temperature = 0f;
        return s;
    }

    public Sampler temperature(float t) { temperature = t; return this; }
    public Sampler topK(int k) { topK = k; return this; }
    public Sampler topP(float p) { topP = p; return this; }
    public Sampler minP(float p) { minP = p; return this; }
    public Sampler repeatPenalty(float p) { repeatPenalty = p; return this; }
    public Sampler repeatLastN(int n) { repeatLastN = n; return this; }
    public Sampler seed(long s) { seed = s; return this; }
}
