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

/* Path of a shared trace (../shared/traces/NAME, else bench/traces/NAME), or
 * NULL if absent. */
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

/* The defaults with policy classic, for tests of what only the classic pool
 * does (the default, policy auto, is the page-mapped pool on the simulated
 * device). ts_classic() points to such a configuration. */
void ts_config_classic(stow_config_t *config);
const stow_config_t *ts_classic(void);
/* After the pools on it are destroyed: the simulated device holds no memory,
 * every mapping was undone and every address range released. Then destroys
 * it. */
void ts_sim_assert_released_then_destroy(stow_backend_t *sim);
/* `device` seen as a backend with no event methods (one stream): a copy that
 * shares its context, valid while `device` lives. */
stow_backend_t ts_single_stream(const stow_backend_t *device);

/* A training loop of bench/random_loops.py (docs/design.md, adaptive
 * allowance): weights that stay, then a step program over a few request
 * sizes, each entry allocating its slot's size or, when that slot holds a
 * block, freeing it; what a step leaves is freed oldest first. */
typedef struct ts_loop {
    const unsigned *weights_mib;
    size_t weight_count;
    const size_t *slot_kib;
    size_t slot_count; /* at most TS_LOOP_SLOTS_MAX */
    const unsigned char *program;
    size_t program_len;
} ts_loop_t;

#define TS_LOOP(w, s, p) \
    {w, sizeof w / sizeof w[0], s, sizeof s / sizeof s[0], p, sizeof p / sizeof p[0]}
#define TS_LOOP_SLOTS_MAX 16

/* Allocates the loop's weights on stream into weights[0 .. weight_count),
 * and frees them; every call must succeed. */
void ts_loop_weights_alloc(stow_pool_t *pool, const ts_loop_t *loop, stow_stream_t stream,
                           void **weights);
void ts_loop_weights_free(stow_pool_t *pool, const ts_loop_t *loop, void **weights);
/* Runs one step of the loop on stream; every call must succeed. */
void ts_loop_step(stow_pool_t *pool, const ts_loop_t *loop, stow_stream_t stream);

/* The PyTorch entry points' environment: the simulated device, of capacity
 * (STOWAGE_SIM_CAPACITY's syntax; NULL: its default), and no STOWAGE_CONF. */
void ts_torch_use_sim(const char *capacity);

/* conf: "key:value,..." (or NULL) mixing the settings of stow_config_parse,
 * release_idle_on_grow and the measured constants of stowage/tuning.h, as
 * stow_tuning_parse takes them; each helper asserts that it parses. */
/* The default settings with conf's settings over them. */
stow_config_t ts_config(const char *conf);
/* The default constants with conf's constants over them. */
stow_tuning_t ts_tuning(const char *conf);
/* A pool of ts_config(conf) and ts_tuning(conf) on backend; asserts that it
 * was created. */
stow_pool_t *ts_pool(const char *conf, stow_backend_t *backend);

/* Asserts that stow_pool_check finds the pool's books exact (its reason if not). */
void ts_pool_check(stow_pool_t *pool);
/* The pool's stats; asserts that they could be read. */
stow_stats_t ts_pool_stats(stow_pool_t *pool);

/* Asserts that the pool's reserved peak is at most (1 + slack) x its live
 * (allocated) peak, plus the granule that rounding the allowance down can
 * leave. */
void ts_assert_reserved_within(stow_pool_t *pool, double slack, size_t granule_bytes);

/* Seeds 4, 12 and 33 of bench/random_loops.py (test_support.c says what each shows). */
extern const unsigned ts_loop4_weights_mib[15], ts_loop12_weights_mib[19],
    ts_loop33_weights_mib[6];
extern const size_t ts_loop4_slot_kib[7], ts_loop12_slot_kib[9], ts_loop33_slot_kib[10];
extern const unsigned char ts_loop4_program[74], ts_loop12_program[79], ts_loop33_program[44];
#define TS_LOOP4 TS_LOOP(ts_loop4_weights_mib, ts_loop4_slot_kib, ts_loop4_program)
#define TS_LOOP12 TS_LOOP(ts_loop12_weights_mib, ts_loop12_slot_kib, ts_loop12_program)
#define TS_LOOP33 TS_LOOP(ts_loop33_weights_mib, ts_loop33_slot_kib, ts_loop33_program)

/* Runs `build/stowage SUBCOMMAND ARGS` (the CLI next to the test binary),
 * capturing stdout and stderr into out; returns the exit status. Skips the
 * test when the CLI is not built. */
int ts_cli(const char *subcommand, const char *args, char *out, size_t out_len);

#endif
