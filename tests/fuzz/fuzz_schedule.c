/*
 * tests/fuzz/fuzz_schedule.c: libFuzzer entry for the schedule parser and the
 * exact peak. Checks the profile's internal consistency: the peak is the
 * largest in-op value, tensors alive at the peak sum to it, ranked largest
 * first, and memory after an op never exceeds memory during it. Build:
 *   clang -fsanitize=fuzzer,address,undefined -Iinclude -I. \
 *       tests/fuzz/fuzz_schedule.c planner/\*.c allocator/status.c
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "stowage/plan.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    stow_schedule_t s;
    char err[256];
    stow_status_t rc = stow_schedule_parse("fuzz.txt", (const char *)data, size, &s, err, sizeof err);
    if (rc != STOW_OK) {
        if (rc != STOW_EPARSE && rc != STOW_EHOSTMEM)
            abort();
        if (rc == STOW_EPARSE && strncmp(err, "fuzz.txt:", 9) != 0)
            abort();
        return 0;
    }
    stow_schedule_peak_t pk;
    rc = stow_schedule_peak(&s, &pk);
    if (rc == STOW_OK) {
        uint64_t mx = 0, sum = 0;
        for (size_t k = 0; k < pk.op_count; k++) {
            if (pk.memory_after_op[k] > pk.memory_during_op[k])
                abort();
            if (pk.memory_during_op[k] > mx)
                mx = pk.memory_during_op[k];
        }
        if (mx != pk.peak_bytes)
            abort();
        if (pk.op_count && pk.memory_during_op[pk.peak_op] != pk.peak_bytes)
            abort();
        for (size_t j = 0; j < pk.alive_count; j++) {
            sum += s.tensors[pk.alive_at_peak[j]].bytes;
            if (j && s.tensors[pk.alive_at_peak[j - 1]].bytes < s.tensors[pk.alive_at_peak[j]].bytes)
                abort();
        }
        if (sum != pk.peak_bytes)
            abort();
        if (pk.op_count && pk.memory_after_op[pk.op_count - 1] != 0)
            abort(); /* everything is freed after its last use */
        stow_schedule_peak_free(&pk);
    } else if (rc != STOW_EOVERFLOW && rc != STOW_EHOSTMEM) {
        abort();
    }
    stow_schedule_free(&s);
    return 0;
}
