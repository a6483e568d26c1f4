/*
 * tests/fuzz/fuzz_plan_csv.c: libFuzzer entry for the planner's CSV reader and
 * the solver. Whatever parses must solve to a plan that the independent
 * validator accepts, that is no lower than the load bound, and whose offsets
 * are aligned. Build (not part of CMake):
 *   clang -fsanitize=fuzzer,address,undefined -Iinclude -I. \
 *       tests/fuzz/fuzz_plan_csv.c planner/\*.c allocator/status.c
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "stowage/plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    stow_plan_problem_t p;
    char err[256];
    stow_status_t rc = stow_plan_parse_csv("fuzz.csv", (const char *)data, size, &p, err, sizeof err);
    if (rc != STOW_OK) {
        if (rc != STOW_EPARSE && rc != STOW_EHOSTMEM)
            abort();
        if (rc == STOW_EPARSE && strncmp(err, "fuzz.csv:", 9) != 0)
            abort(); /* every parse error names the file and line */
        return 0;
    }
    uint64_t lb;
    rc = stow_plan_lower_bound(&p, &lb);
    if (rc != STOW_OK && rc != STOW_EOVERFLOW)
        abort();
    stow_plan_options_t o = stow_plan_options_default();
    /* Small problems also go through the exact search, briefly. */
    o.time_limit_seconds = p.count <= 16 ? 0.005 : 0;
    o.capacity = (p.count & 1) && rc == STOW_OK ? lb : 0;
    stow_plan_result_t r;
    stow_status_t src = stow_plan_solve(&p, &o, &r);
    if (rc == STOW_EOVERFLOW && src == STOW_OK)
        abort(); /* a load beyond 64 bits cannot have a 64-bit plan */
    if (src == STOW_OK) {
        if (stow_plan_validate(&p, r.offsets, 0, NULL, 0) != STOW_OK)
            abort();
        if (r.height < r.lower_bound || r.lower_bound != lb)
            abort();
        if (r.fits != (o.capacity == 0 || r.height <= o.capacity))
            abort();
        for (size_t i = 0; i < p.count; i++)
            if (r.offsets[i] % p.buffers[i].alignment != 0)
                abort();
        stow_plan_result_free(&r);
    } else if (src != STOW_EOVERFLOW && src != STOW_EHOSTMEM) {
        abort();
    }
    stow_plan_problem_free(&p);
    return 0;
}
