/*
 * check.h - the tests' tiny check macros: a failed check prints file:line,
 * the expression and the values, counts the failure and goes on, so one run
 * shows every broken case. main() ends with `return check_report();`.
 * A test that needs an absent optional resource returns CHECK_SKIP (77,
 * which CTest reports as skipped).
 */
#ifndef RB_TEST_CHECK_H
#define RB_TEST_CHECK_H

#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#define CHECK_SKIP 77

static int check_failures;
static int check_count;

#define CHECK(cond)                                                           \
    do {                                                                      \
        check_count++;                                                        \
        if (!(cond)) {                                                        \
            check_failures++;                                                 \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__,  \
                    #cond);                                                   \
        }                                                                     \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                    \
    do {                                                                      \
        long long check_a_ = (long long)(a), check_b_ = (long long)(b);       \
        check_count++;                                                        \
        if (check_a_ != check_b_) {                                           \
            check_failures++;                                                 \
            fprintf(stderr, "%s:%d: %s == %s failed: %lld != %lld\n",         \
                    __FILE__, __LINE__, #a, #b, check_a_, check_b_);          \
        }                                                                     \
    } while (0)

#define CHECK_EQ_U64(a, b)                                                    \
    do {                                                                      \
        uint64_t check_a_ = (uint64_t)(a), check_b_ = (uint64_t)(b);          \
        check_count++;                                                        \
        if (check_a_ != check_b_) {                                           \
            check_failures++;                                                 \
            fprintf(stderr, "%s:%d: %s == %s failed: %" PRIu64 " != %" PRIu64 \
                    "\n", __FILE__, __LINE__, #a, #b, check_a_, check_b_);    \
        }                                                                     \
    } while (0)

#define CHECK_NEAR(a, b, tol)                                                 \
    do {                                                                      \
        double check_a_ = (double)(a), check_b_ = (double)(b);                \
        check_count++;                                                        \
        if (!(fabs(check_a_ - check_b_) <= (tol))) {                          \
            check_failures++;                                                 \
            fprintf(stderr, "%s:%d: |%s - %s| <= %s failed: %g vs %g\n",      \
                    __FILE__, __LINE__, #a, #b, #tol, check_a_, check_b_);    \
        }                                                                     \
    } while (0)

#define CHECK_STR_EQ(a, b)                                                    \
    do {                                                                      \
        const char *check_a_ = (a), *check_b_ = (b);                          \
        check_count++;                                                        \
        if (!check_a_ || !check_b_ || strcmp(check_a_, check_b_) != 0) {      \
            check_failures++;                                                 \
            fprintf(stderr, "%s:%d: %s == %s failed: \"%s\" != \"%s\"\n",     \
                    __FILE__, __LINE__, #a, #b, check_a_ ? check_a_ : "(null)", \
                    check_b_ ? check_b_ : "(null)");                          \
        }                                                                     \
    } while (0)

#define CHECK_CONTAINS(hay, needle)                                           \
    do {                                                                      \
        const char *check_h_ = (hay), *check_n_ = (needle);                   \
        check_count++;                                                        \
        if (!check_h_ || !strstr(check_h_, check_n_)) {                       \
            check_failures++;                                                 \
            fprintf(stderr, "%s:%d: \"%s\" does not contain \"%s\"\n",        \
                    __FILE__, __LINE__, check_h_ ? check_h_ : "(null)",       \
                    check_n_);                                                \
        }                                                                     \
    } while (0)

static inline int check_report(void)
{
    fprintf(stderr, "%d checks, %d failed\n", check_count, check_failures);
    return check_failures ? 1 : 0;
}

#endif
