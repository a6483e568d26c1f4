/*
 * tests/support/test_support.c: helpers shared by the Criterion tests.
 */
#include "test_support.h"

#include <criterion/criterion.h>
#include <jemalloc/jemalloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#ifndef STOW_SHARED_DIR
#define STOW_SHARED_DIR "../shared"
#endif

#ifndef STOW_SOURCE_DIR
#define STOW_SOURCE_DIR "."
#endif

/* ../shared/traces first; the trace bundled in bench/traces (resnet50_train)
 * when ../shared is absent, so that the tests on it never skip. */
const char *ts_shared_trace(const char *name, char *buf, size_t len)
{
    snprintf(buf, len, "%s/traces/%s", STOW_SHARED_DIR, name);
    if (access(buf, R_OK) == 0)
        return buf;
    snprintf(buf, len, "%s/bench/traces/%s", STOW_SOURCE_DIR, name);
    return access(buf, R_OK) == 0 ? buf : NULL;
}

void *ts_host_alloc(size_t size_bytes, size_t alignment_bytes, void *arg)
{
    (void)arg;
    return mallocx(size_bytes, MALLOCX_ALIGN(alignment_bytes));
}

void ts_host_free(void *ptr, size_t size_bytes, void *arg)
{
    (void)arg;
    sdallocx(ptr, size_bytes, 0);
}

stow_backend_t *ts_sim(size_t capacity_bytes, bool host_backed, bool manual_events)
{
    stow_sim_config_t c;
    stow_sim_config_default(&c);
    c.capacity_bytes = capacity_bytes;
    c.host_backed = host_backed;
    c.manual_events = manual_events;
    if (host_backed) {
        c.host_alloc = ts_host_alloc;
        c.host_free = ts_host_free;
    }
    stow_backend_t *b = NULL;
    return stow_sim_create(&c, &b) == STOW_OK ? b : NULL;
}

void ts_config_classic(stow_config_t *config)
{
    stow_config_default(config);
    config->policy = STOW_POLICY_CLASSIC;
}

const stow_config_t *ts_classic(void)
{
    static stow_config_t config;
    ts_config_classic(&config);
    return &config;
}

void ts_sim_assert_released_then_destroy(stow_backend_t *sim)
{
    stow_sim_counters_t c;
    stow_sim_counters(sim, &c);
    cr_assert_eq(c.reserved_bytes, 0, "physical memory left: %llu",
                 (unsigned long long)c.reserved_bytes);
    cr_assert_eq(c.calls[STOW_SIM_MAP] - c.failures[STOW_SIM_MAP],
                 c.calls[STOW_SIM_UNMAP] - c.failures[STOW_SIM_UNMAP], "every mapping undone");
    cr_assert_eq(c.calls[STOW_SIM_VA_RESERVE] - c.failures[STOW_SIM_VA_RESERVE],
                 c.calls[STOW_SIM_VA_RELEASE] - c.failures[STOW_SIM_VA_RELEASE],
                 "every address range released");
    cr_assert_eq(stow_sim_destroy(sim), STOW_OK);
}

stow_backend_t ts_single_stream(const stow_backend_t *device)
{
    stow_backend_t b = *device;
    b.event_record = NULL;
    b.event_query = NULL;
    b.event_destroy = NULL;
    return b;
}

int ts_cli(const char *subcommand, const char *args, char *out, size_t out_len)
{
    char exe[4096], cmd[8192];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 16);
    cr_assert_gt(n, 0);
    exe[n] = 0;
    strcpy(strrchr(exe, '/'), "/stowage");
    if (access(exe, X_OK))
        cr_skip_test("build/stowage not built");
    snprintf(cmd, sizeof cmd, "'%s' %s %s 2>&1", exe, subcommand, args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t got = fread(out, 1, out_len - 1, p);
    out[got] = 0;
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static void *loop_alloc(stow_pool_t *pool, size_t size, stow_stream_t stream)
{
    void *p = NULL;
    cr_assert_eq(stow_pool_alloc(pool, size, stream, &p), STOW_OK, "alloc %zu", size);
    return p;
}

void ts_loop_weights_alloc(stow_pool_t *pool, const ts_loop_t *loop, stow_stream_t stream,
                           void **weights)
{
    for (size_t i = 0; i < loop->weight_count; i++)
        weights[i] = loop_alloc(pool, (size_t)loop->weights_mib[i] << 20, stream);
}

void ts_loop_weights_free(stow_pool_t *pool, const ts_loop_t *loop, void **weights)
{
    for (size_t i = 0; i < loop->weight_count; i++)
        cr_assert_eq(stow_pool_free(pool, weights[i]), STOW_OK);
}

void ts_loop_step(stow_pool_t *pool, const ts_loop_t *loop, stow_stream_t stream)
{
    cr_assert_leq(loop->slot_count, TS_LOOP_SLOTS_MAX);
    void *slot[TS_LOOP_SLOTS_MAX] = {NULL};
    size_t born[TS_LOOP_SLOTS_MAX] = {0}; /* when each slot's block was allocated */
    for (size_t k = 0; k < loop->program_len; k++) {
        unsigned i = loop->program[k];
        if (slot[i]) {
            cr_assert_eq(stow_pool_free(pool, slot[i]), STOW_OK);
            slot[i] = NULL;
        } else {
            slot[i] = loop_alloc(pool, loop->slot_kib[i] << 10, stream);
            born[i] = k;
        }
    }
    /* What the step left is freed oldest first. */
    for (size_t k = 0; k < loop->program_len; k++)
        for (size_t i = 0; i < loop->slot_count; i++)
            if (slot[i] && born[i] == k) {
                cr_assert_eq(stow_pool_free(pool, slot[i]), STOW_OK);
                slot[i] = NULL;
            }
}

void ts_pool_check(stow_pool_t *pool)
{
    char why[256];
    cr_assert_eq(stow_pool_check(pool, why, sizeof why), STOW_OK, "%s", why);
}

void ts_torch_use_sim(const char *capacity)
{
    setenv("STOWAGE_BACKEND", "sim", 1);
    if (capacity)
        setenv("STOWAGE_SIM_CAPACITY", capacity, 1);
    else
        unsetenv("STOWAGE_SIM_CAPACITY");
    unsetenv("STOWAGE_CONF");
}

/* The settings and constants of conf over the defaults. */
static void parse_conf(const char *conf, stow_config_t *config, stow_tuning_t *tuning)
{
    stow_config_default(config);
    stow_tuning_default(tuning);
    char err[256] = "";
    if (conf)
        cr_assert_eq(stow_tuning_parse(config, tuning, conf, err, sizeof err), STOW_OK, "%s: %s",
                     conf, err);
}

stow_config_t ts_config(const char *conf)
{
    stow_config_t c;
    stow_tuning_t t;
    parse_conf(conf, &c, &t);
    return c;
}

stow_tuning_t ts_tuning(const char *conf)
{
    stow_config_t c;
    stow_tuning_t t;
    parse_conf(conf, &c, &t);
    return t;
}

stow_pool_t *ts_pool(const char *conf, stow_backend_t *backend)
{
    stow_config_t c;
    stow_tuning_t t;
    parse_conf(conf, &c, &t);
    stow_pool_t *pool = NULL;
    cr_assert_eq(stow_pool_create_tuned(&c, &t, backend, &pool), STOW_OK, "%s",
                 conf ? conf : "(defaults)");
    return pool;
}

stow_stats_t ts_pool_stats(stow_pool_t *pool)
{
    stow_stats_t s;
    cr_assert_eq(stow_pool_stats(pool, &s), STOW_OK);
    return s;
}

void ts_assert_reserved_within(stow_pool_t *pool, double slack, size_t granule_bytes)
{
    stow_stats_t s = ts_pool_stats(pool);
    uint64_t live_peak = s.allocated_bytes[STOW_POOL_ALL].peak;
    cr_assert_leq(s.reserved_bytes[STOW_POOL_ALL].peak,
                  (uint64_t)((1.0 + slack) * (double)live_peak) + granule_bytes,
                  "reserved %llu for a live peak of %llu",
                  (unsigned long long)s.reserved_bytes[STOW_POOL_ALL].peak,
                  (unsigned long long)live_peak);
}

/* Seed 4: remaps for good at the default slack; a raise by half stops it. */
const unsigned ts_loop4_weights_mib[] = {24, 64, 24, 24, 40, 24, 64, 64, 40, 40,
                                             24, 40, 40, 64, 64};
const size_t ts_loop4_slot_kib[] = {16384, 98816, 3072, 2048, 99840, 16384, 7680};
const unsigned char ts_loop4_program[] = {
    2, 2, 6, 1, 6, 0, 2, 1, 0, 6, 5, 6, 2, 6, 2, 1, 1, 2, 2, 5, 6, 5, 6, 6, 2,
    0, 6, 4, 2, 5, 3, 4, 1, 1, 1, 3, 2, 0, 6, 6, 4, 6, 2, 0, 2, 4, 5, 2, 6, 6,
    4, 1, 3, 3, 4, 2, 3, 3, 1, 1, 2, 2, 6, 6, 0, 0, 0, 3, 5, 2, 4, 4, 5, 3};

/* Seed 33: its step touches about 1.032 x its live peak in granules, so a
 * raise by half (1.0143) leaves it remapping about 110 granules a step and
 * helps too little for another: the adaptive allowance must raise it to its
 * footprint instead. */
const unsigned ts_loop33_weights_mib[] = {40, 40, 40, 24, 24, 64};
const size_t ts_loop33_slot_kib[] = {4608,  6656,   134656, 206336, 4608,
                                         263680, 42496, 205312, 133632, 308736};
const unsigned char ts_loop33_program[] = {
    4, 6, 4, 8, 7, 0, 9, 6, 4, 5, 8, 3, 1, 0, 5, 4, 3, 1, 5, 1, 5, 3,
    8, 4, 5, 0, 5, 8, 4, 8, 6, 6, 2, 1, 0, 5, 8, 1, 1, 2, 1, 1, 5, 0};

/* Seed 12: no placement block by block fits its step within the allowance
 * (1.066 x its live peak at best), so it remapped on every step, raised to
 * 1.05; the offline planner's layout of the step fits (1.0045, docs/design.md). */
const unsigned ts_loop12_weights_mib[] = {40, 24, 40, 40, 40, 40, 64, 40, 24, 24,
                                          40, 64, 40, 24, 24, 64, 24, 64, 24};
const size_t ts_loop12_slot_kib[] = {17920, 206336, 40960,  98304, 41472,
                                     17920, 134656, 262144, 204800};
const unsigned char ts_loop12_program[] = {
    2, 7, 5, 2, 5, 3, 0, 3, 1, 8, 5, 6, 1, 0, 0, 8, 3, 1, 6, 7, 1, 6, 2, 8, 5, 8, 2,
    0, 8, 2, 8, 1, 6, 6, 7, 7, 6, 8, 0, 1, 3, 4, 5, 5, 6, 4, 1, 4, 3, 5, 5, 5, 8, 8,
    2, 0, 6, 6, 0, 8, 0, 3, 6, 0, 6, 3, 1, 8, 3, 2, 1, 4, 0, 6, 4, 7, 5, 0, 8};
