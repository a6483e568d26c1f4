/*
 * tests/fuzz/fuzz_check.h: the check of the fuzz targets. A failed check
 * prints the file, line, condition and a formatted reason, then aborts, which
 * libFuzzer (and replay_fuzz_* under ctest) reports as a crash.
 */
#ifndef STOWAGE_TESTS_FUZZ_CHECK_H
#define STOWAGE_TESTS_FUZZ_CHECK_H

#include <stdio.h>
#include <stdlib.h>

#define FUZZ_CHECK(cond, ...)                                                           \
    do {                                                                                \
        if (!(cond)) {                                                                  \
            fprintf(stderr, "%s:%d: check failed: %s: ", __FILE__, __LINE__, #cond);    \
            fprintf(stderr, __VA_ARGS__);                                               \
            fputc('\n', stderr);                                                        \
            abort();                                                                    \
        }                                                                               \
    } while (0)

#endif
