/*
 * tests/support/test_support.h: helpers shared by the Criterion tests.
 */
#ifndef STOWAGE_TEST_SUPPORT_H
#define STOWAGE_TEST_SUPPORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "stowage.h"
#include "stowage/sim.h"
#include "stowage/trace.h"

/* Path of a shared trace (../shared/traces/NAME), or NULL if absent. */
const char *ts_shared_trace(const char *name, char *buf, size_t len);

/* jemalloc-backed host memory for host-backed simulated devices. */
void *ts_host_alloc(size_t size_bytes, size_t alignment_bytes, void *arg);
void ts_host_free(void *ptr, size_t size_bytes, void *arg);

/* Marsaglia's xorshift64: the next state (and value) of a test's random
 * sequence; *state must start non-zero. Deterministic, so a failure repeats. */
static inline uint64_t ts_xorshift(uint64_t *state)
{
    uint64_t x = *state;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *state = x;
}

/* A simulated device with the given capacity (0 = unlimited). */
stow_backend_t *ts_sim(size_t capacity_bytes, bool host_backed, bool manual_events);
/* `device` seen as a backend with no event methods (one stream): a copy that
 * shares its context, valid while `device` lives. */
stow_backend_t ts_single_stream(const stow_backend_t *device);

/* Runs `build/stowage SUBCOMMAND ARGS` (the CLI next to the test binary),
 * capturing stdout and stderr into out; returns the exit status. Skips the
 * test when the CLI is not built. */
int ts_cli(const char *subcommand, const char *args, char *out, size_t out_len);

#endif
