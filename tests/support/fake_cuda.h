/*
 * tests/support/fake_cuda.h: what the host-emulated CUDA driver
 * (tests/support/fake_cuda.c, built as build/fake_cuda/libcuda.so.1) reports
 * about itself, for tests that run the CUDA backend without a GPU.
 *
 * A test finds it through the library the backend loaded:
 *   fake_cuda_counters_fn f = stow_cuda_driver_symbol("fake_cuda_counters");
 * On a real driver the symbol is absent (NULL): the checks that need it skip.
 */
#ifndef STOWAGE_TESTS_FAKE_CUDA_H
#define STOWAGE_TESTS_FAKE_CUDA_H

#include <stddef.h>
#include <stdint.h>

typedef struct fake_cuda_counters {
    uint64_t total_bytes;       /* the emulated device's memory */
    uint64_t used_bytes;        /* cuMemAlloc (in 2 MiB pages) + cuMemCreate, not yet freed */
    uint64_t allocations;       /* live cuMemAlloc blocks */
    uint64_t reservations;      /* live cuMemAddressReserve ranges */
    uint64_t handles;           /* cuMemCreate handles not yet freed (released ones still
                                   mapped included: CUDA frees them at their last unmap) */
    uint64_t mappings;          /* live cuMemMap mappings */
    uint64_t streams, events;   /* live cuStreamCreate / cuEventCreate objects */
    int primary_retains;        /* device 0's primary context retain count */
    uint64_t calls_alloc, calls_free, calls_create, calls_release, calls_map, calls_unmap;
    uint64_t calls_event_record, calls_event_query_not_ready;
    uint64_t violations;        /* calls that broke the driver API's rules (each also
                                   returned an error); 0 in a correct program */
    uint64_t faults_injected;   /* failures returned on request (fake_cuda_fail_nth) */
    char last_violation[256];   /* "cuMemMap: range already mapped (0x...)" */
} fake_cuda_counters_t;

typedef void (*fake_cuda_counters_fn)(fake_cuda_counters_t *out);
/* fake_cuda_fail_nth(fn, n, code): the nth call from now of entry point fn
 * ("cuMemMap") returns code and does nothing; fake_cuda_calls(fn): its calls. */
typedef void (*fake_cuda_fail_nth_fn)(const char *fn, uint64_t n, int code);
typedef uint64_t (*fake_cuda_calls_fn)(const char *fn);

#endif
