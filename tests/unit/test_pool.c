/*
 * tests/unit/test_pool.c: the classic pool (allocator/pool.c, segment.c):
 * split and coalesce, best fit, empty_cache, out of memory and its retry,
 * fault injection, bad input, limits, and the leak gate.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "test_support.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)

static stow_backend_t *sim;
static stow_pool_t *pool;

/* A pool of cfg (NULL: ts_classic()) and tuning (NULL: the defaults) on a
 * fresh simulated device of `capacity` (0: unlimited). */
static void make_pool_tuned(size_t capacity, const stow_config_t *cfg,
                            const stow_tuning_t *tuning)
{
    sim = ts_sim(capacity, false, false);
    cr_assert_not_null(sim);
    cr_assert_eq(stow_pool_create_tuned(cfg ? cfg : ts_classic(), tuning, sim, &pool), STOW_OK);
}

static void make_pool(size_t capacity, const stow_config_t *cfg)
{
    make_pool_tuned(capacity, cfg, NULL);
}

static void check_pool(void)
{
    char why[256];
    cr_assert_eq(stow_pool_check(pool, why, sizeof why), STOW_OK, "%s", why);
}

/* Leak gate: every test ends with a clean destroy and an empty device. */
static void finish_pool(void)
{
    check_pool();
    cr_assert_eq(stow_pool_destroy(pool), STOW_OK);
    stow_sim_counters_t c;
    stow_sim_counters(sim, &c);
    cr_assert_eq(c.reserved_bytes, 0, "device still holds %llu bytes",
                 (unsigned long long)c.reserved_bytes);
    cr_assert_eq(stow_sim_destroy(sim), STOW_OK);
}

static stow_stats_t stats_now(void)
{
    stow_stats_t s;
    cr_assert_eq(stow_pool_stats(pool, &s), STOW_OK);
    return s;
}

/* The memory books: every stow_stat_t array and the waste snapshot. Counters
 * of rejected calls (num_invalid_frees, num_ooms...) may change; these not. */
static void assert_same_books(const stow_stats_t *a, const stow_stats_t *b)
{
#define SAME_ARRAY_(name, label) \
    cr_assert(memcmp(a->name, b->name, sizeof a->name) == 0, #name " changed");
    STOW_STAT_ARRAY_FIELDS(SAME_ARRAY_)
#undef SAME_ARRAY_
    cr_assert(memcmp(&a->waste_at_peak, &b->waste_at_peak, sizeof a->waste_at_peak) == 0);
    cr_assert_eq(a->largest_free_block_bytes, b->largest_free_block_bytes);
    cr_assert_eq(a->free_reserved_bytes, b->free_reserved_bytes);
}

static void *alloc_ok(size_t size)
{
    void *p = NULL;
    cr_assert_eq(stow_pool_alloc(pool, size, NULL, &p), STOW_OK, "alloc %zu", size);
    cr_assert_not_null(p);
    return p;
}

Test(pool, create_rejects_bad_backend_and_config)
{
    stow_backend_t *b = ts_sim(0, false, false);
    stow_backend_t bad = *b;
    stow_pool_t *p = (stow_pool_t *)0x1;
    bad.abi_version = 999;
    cr_assert_eq(stow_pool_create(NULL, &bad, &p), STOW_EINVAL);
    bad = *b;
    bad.reserve = NULL;
    cr_assert_eq(stow_pool_create(NULL, &bad, &p), STOW_EINVAL);
    bad = *b;
    bad.granularity_bytes = 3 * MIB;
    cr_assert_eq(stow_pool_create(NULL, &bad, &p), STOW_EINVAL);
    /* Event methods come as a set: with one missing the pool would take the
     * backend for a single-stream one and reuse blocks across its streams. */
    bad = *b;
    bad.event_query = NULL;
    cr_assert_eq(stow_pool_create(NULL, &bad, &p), STOW_EINVAL);
    bad = *b;
    bad.event_record = NULL;
    bad.event_destroy = NULL;
    cr_assert_eq(stow_pool_create(NULL, &bad, &p), STOW_EINVAL);
    cr_assert_eq(p, (stow_pool_t *)0x1, "out untouched on error");
    stow_config_t c;
    ts_config_classic(&c);
    c.memory_fraction = 0.0;
    cr_assert_eq(stow_pool_create(&c, b, &p), STOW_EINVAL);
    c.memory_fraction = 1e-98; /* valid syntax, but less than one 2 MiB granule of the device */
    cr_assert_eq(stow_pool_create(&c, b, &p), STOW_EINVAL);
    ts_config_classic(&c);
    c.policy = STOW_POLICY_VMM;
    bad = *b;
    bad.map = NULL; /* page mapping unsupported */
    cr_assert_eq(stow_pool_create(&c, &bad, &p), STOW_ENOSYS);
    cr_assert_eq(stow_pool_create(&c, b, &p), STOW_OK);
    cr_assert_eq(stow_pool_destroy(p), STOW_OK);
    cr_assert_eq(stow_pool_create(NULL, b, NULL), STOW_EINVAL);
    cr_assert_eq(stow_pool_destroy(NULL), STOW_OK);
    cr_assert_eq(stow_sim_destroy(b), STOW_OK);
}

/* The default policy, auto, takes the page-mapped pool where the backend maps
 * pages and the classic pool where it cannot; the pool's configuration names
 * the one it took. */
Test(pool, policy_auto_maps_pages_where_the_backend_can)
{
    stow_backend_t *b = ts_sim(0, false, false);
    stow_backend_t no_vmm = *b;
    no_vmm.unmap = NULL;
    struct {
        const stow_config_t *config;
        const stow_backend_t *backend;
        stow_policy_t want;
    } cases[] = {
        {NULL, b, STOW_POLICY_VMM},
        {NULL, &no_vmm, STOW_POLICY_CLASSIC},
        {ts_classic(), b, STOW_POLICY_CLASSIC},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        stow_pool_t *p = NULL;
        cr_assert_eq(stow_pool_create(cases[i].config, cases[i].backend, &p), STOW_OK, "case %zu", i);
        stow_config_t got;
        stow_pool_config(p, &got);
        cr_assert_eq(got.policy, cases[i].want, "case %zu", i);
        void *ptr = NULL;
        cr_assert_eq(stow_pool_alloc(p, 3 * MIB, NULL, &ptr), STOW_OK);
        cr_assert_eq(stow_pool_free(p, ptr), STOW_OK);
        cr_assert_eq(stow_pool_destroy(p), STOW_OK);
    }
    stow_config_t c;
    char err[128];
    stow_config_default(&c);
    cr_assert_eq(stow_config_parse(&c, "policy:classic", err, sizeof err), STOW_OK);
    cr_assert_eq(stow_config_parse(&c, "policy:auto", err, sizeof err), STOW_OK, "%s", err);
    cr_assert_eq(c.policy, STOW_POLICY_AUTO);
    cr_assert_eq(stow_config_parse(&c, "policy:paged", err, sizeof err), STOW_EINVAL);
    cr_assert_str_eq(err, "key 'policy': 'paged' is not auto, classic or vmm");
    cr_assert_eq(stow_sim_destroy(b), STOW_OK);
}

Test(pool, small_blocks_share_a_segment_and_coalesce)
{
    /* Merging at free, without quick lists (tests/unit/test_quick.c has them). */
    stow_tuning_t tuning;
    stow_tuning_default(&tuning);
    tuning.quick_depth = 0;
    make_pool_tuned(0, NULL, &tuning);
    void *a = alloc_ok(1000), *b = alloc_ok(512), *c = alloc_ok(3000);
    /* Best fit from one 2 MiB segment: consecutive addresses. */
    cr_assert_eq((char *)b - (char *)a, 1024);
    cr_assert_eq((char *)c - (char *)b, 512);
    stow_stats_t s = stats_now();
    cr_assert_eq(s.segment[STOW_POOL_ALL].current, 1);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_SMALL].current, 2 * MIB);
    cr_assert_eq(s.allocated_bytes[STOW_POOL_ALL].current, 1024 + 512 + 3072);
    cr_assert_eq(s.requested_bytes[STOW_POOL_ALL].current, 1000 + 512 + 3000);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    check_pool();
    s = stats_now();
    cr_assert_eq(s.inactive_split_bytes[STOW_POOL_ALL].current, 512 + (2 * MIB - 4608));
    /* The hole is reused by a request that fits it exactly (best fit). */
    void *d = alloc_ok(400);
    cr_assert_eq(d, b);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, c), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, d), STOW_OK);
    s = stats_now();
    /* Everything merged back into one free block covering the segment. */
    cr_assert_eq(s.inactive_split_bytes[STOW_POOL_ALL].current, 0);
    cr_assert_eq(s.largest_free_block_bytes, 2 * MIB);
    cr_assert_eq(s.fragmentation, 0.0);
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    s = stats_now();
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 0);
    cr_assert_eq(s.num_device_free, 1);
    finish_pool();
}

Test(pool, best_fit_prefers_smallest_then_lowest_address)
{
    make_pool(0, NULL);
    /* Three large segments of 4, 8 and 6 MiB, freed: requests take the best fit. */
    void *a = alloc_ok(16 * MIB), *b = alloc_ok(32 * MIB), *c = alloc_ok(24 * MIB);
    void *hold = alloc_ok(8 * MIB + 1);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, c), STOW_OK);
    cr_assert_eq(alloc_ok(20 * MIB), c);
    cr_assert_eq(alloc_ok(12 * MIB), a);
    cr_assert_eq(alloc_ok(28 * MIB), b);
    stow_stats_t s = stats_now();
    cr_assert_eq(s.num_cache_hits, 3);
    stow_pool_destroy_force(pool);
    cr_assert_eq(stow_sim_destroy(sim), STOW_OK);
    (void)hold;
}

Test(pool, large_remainders_split_only_above_one_mib)
{
    make_pool(0, NULL);
    void *a = alloc_ok(10 * MIB);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    /* 10 MiB block, 9.5 MiB request: remainder 0.5 MiB stays in the block. */
    void *b = alloc_ok(9 * MIB + 512 * KIB);
    size_t block;
    cr_assert_eq(stow_pool_block_size(pool, b, &block, NULL), STOW_OK);
    cr_assert_eq(block, 10 * MIB);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    /* 4 MiB request: the 6 MiB remainder is split off and reusable. */
    void *c = alloc_ok(4 * MIB);
    void *d = alloc_ok(6 * MIB);
    cr_assert_eq((char *)d - (char *)c, (ptrdiff_t)(4 * MIB));
    cr_assert_eq(stats_now().segment[STOW_POOL_ALL].current, 1);
    cr_assert_eq(stow_pool_free(pool, c), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, d), STOW_OK);
    finish_pool();
}

Test(pool, bad_input_changes_nothing)
{
    make_pool(0, NULL);
    void *p = alloc_ok(4096);
    stow_stats_t before = stats_now();
    void *out = (void *)0x77;
    cr_assert_eq(stow_pool_alloc(pool, 0, NULL, &out), STOW_EINVAL);
    cr_assert_eq(stow_pool_alloc(pool, SIZE_MAX, NULL, &out), STOW_EOVERFLOW);
    cr_assert_eq(stow_pool_alloc(pool, SIZE_MAX - 4096, NULL, &out), STOW_EOVERFLOW);
    cr_assert_eq(stow_pool_alloc(pool, 16, NULL, NULL), STOW_EINVAL);
    cr_assert_eq(stow_pool_alloc(NULL, 16, NULL, &out), STOW_EINVAL);
    cr_assert_eq(out, (void *)0x77, "out untouched on error");
    int on_stack;
    cr_assert_eq(stow_pool_free(pool, &on_stack), STOW_ENOTOWNED);
    cr_assert_eq(stow_pool_free(pool, (char *)p + 512), STOW_ENOTOWNED);
    cr_assert_eq(stow_pool_free(pool, NULL), STOW_EINVAL);
    cr_assert_eq(stow_record_stream(pool, &on_stack, (stow_stream_t)2), STOW_ENOTOWNED);
    cr_assert_eq(stow_pool_block_size(pool, &on_stack, NULL, NULL), STOW_ENOTOWNED);
    stow_stats_t after = stats_now();
    assert_same_books(&before, &after);
    cr_assert_eq(after.num_invalid_frees, before.num_invalid_frees + 2);
    /* Absurd but representable: the OOM path runs (and may release cache). */
    cr_assert_eq(stow_pool_alloc(pool, SIZE_MAX / 2 + 1, NULL, &out), STOW_ENOMEM);
    cr_assert_eq(stats_now().num_ooms, before.num_ooms + 1);
    cr_assert_eq(stow_pool_free(pool, p), STOW_OK);
    stow_stats_t s = stats_now();
    cr_assert_eq(stow_pool_free(pool, p), STOW_ENOTOWNED, "double free");
    stow_stats_t s2 = stats_now();
    cr_assert_eq(s2.num_invalid_frees, s.num_invalid_frees + 1);
    cr_assert_eq(s2.allocated_bytes[STOW_POOL_ALL].current, 0);
    cr_assert_eq(s2.allocation[STOW_POOL_ALL].freed, 1);
    finish_pool();
}

Test(pool, destroy_with_live_blocks_is_busy)
{
    make_pool(0, NULL);
    void *p = alloc_ok(100);
    cr_assert_eq(stow_pool_destroy(pool), STOW_EBUSY);
    cr_assert_eq(stow_pool_free(pool, p), STOW_OK);
    finish_pool();
}

Test(pool, out_of_memory_explains_and_changes_nothing)
{
    make_pool(32 * MIB, NULL);
    void *a = alloc_ok(24 * MIB);
    stow_stats_t before = stats_now();
    void *out = NULL;
    cr_assert_eq(stow_pool_alloc(pool, 16 * MIB, NULL, &out), STOW_ENOMEM);
    cr_assert_null(out);
    stow_stats_t s = stats_now();
    cr_assert_eq(s.num_ooms, 1);
    cr_assert_eq(s.num_alloc_retries, 1);
    cr_assert_eq(s.allocated_bytes[STOW_POOL_ALL].current,
                 before.allocated_bytes[STOW_POOL_ALL].current);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current,
                 before.reserved_bytes[STOW_POOL_ALL].current);
    char msg[768];
    size_t n = stow_pool_oom_message(pool, msg, sizeof msg);
    cr_assert(n > 0 && n < sizeof msg);
    cr_assert_not_null(strstr(msg, "16.00 MiB"), "%s", msg);
    cr_assert_not_null(strstr(msg, "24.00 MiB reserved"), "%s", msg);
    cr_assert_not_null(strstr(msg, "largest free block"), "%s", msg);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    finish_pool();
}

Test(pool, release_and_retry_recovers_cached_memory)
{
    stow_config_t c;
    ts_config_classic(&c);
    c.release_idle_on_grow = false; /* exercise the retry path itself */
    make_pool(32 * MIB, &c);
    void *a = alloc_ok(24 * MIB);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    void *b = alloc_ok(32 * MIB); /* needs the cached 6 MiB back */
    stow_stats_t s = stats_now();
    cr_assert_eq(s.num_alloc_retries, 1);
    cr_assert_eq(s.num_ooms, 0);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 32 * MIB);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].peak, 32 * MIB);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    finish_pool();
}

/* The classic configuration with release_idle_on_grow (a C API field; off by
 * default, as PyTorch releases only at out-of-memory). */
static const stow_config_t *releasing_on_grow(void)
{
    static stow_config_t c;
    ts_config_classic(&c);
    c.release_idle_on_grow = true;
    return &c;
}

Test(pool, release_idle_on_grow_keeps_reserved_flat)
{
    make_pool(0, releasing_on_grow());
    void *a = alloc_ok(24 * MIB);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    void *b = alloc_ok(32 * MIB); /* the idle 6 MiB segment goes first */
    stow_stats_t s = stats_now();
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].peak, 32 * MIB);
    cr_assert_eq(s.num_idle_releases, 1);
    cr_assert_eq(s.num_alloc_retries, 0);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    finish_pool();
}

/* A loop that needs a segment or two beyond the high-water mark over its
 * step (seed 6 of bench/random_loops.py). Releasing idle segments on growth,
 * it released and reserved on every step for good (4 backend calls a step). */
static const unsigned loop6_weights_mib[] = {64, 64, 24, 24, 24, 24, 64, 40, 64, 64, 64};
static const size_t loop6_slot_kib[] = {262144, 133632, 1024,   4608,  262656, 41472,
                                        1536,   133120, 99840, 206336, 2048,   263680};
static const unsigned char loop6_program[] = {
    10, 9, 10, 1, 6, 5,  1, 5,  6, 4,  7, 11, 1, 3, 11, 10, 4, 1, 0,  9, 3, 10, 5, 7, 3, 8, 9, 10,
    11, 8, 0,  10, 5, 3, 9, 6, 4, 5,  9, 1,  1, 8, 10, 8,  3, 1, 9, 10, 4, 4, 11, 3, 6, 7, 3, 2};
static const ts_loop_t loop6 = TS_LOOP(loop6_weights_mib, loop6_slot_kib, loop6_program);

/* Runs loop 6 for `steps` steps and returns the backend calls of its last
 * `tail` steps. */
static uint64_t run_loop6(unsigned steps, unsigned tail)
{
    void *weights[sizeof loop6_weights_mib / sizeof loop6_weights_mib[0]];
    ts_loop_weights_alloc(pool, &loop6, NULL, weights);
    uint64_t tail_start = 0;
    for (unsigned step = 0; step < steps; step++) {
        if (step == steps - tail)
            tail_start = stats_now().num_backend_calls;
        if (step % 500 == 0)
            check_pool();
        ts_loop_step(pool, &loop6, NULL);
    }
    uint64_t calls = stats_now().num_backend_calls - tail_start;
    ts_loop_weights_free(pool, &loop6, weights);
    return calls;
}

/* A pool on a device of capacity_bytes (0: unlimited) that releases idle
 * segments on growth, with keep_idle_max set. */
static void make_pool_keeping(size_t capacity_bytes, double keep_idle_max)
{
    stow_tuning_t t;
    stow_tuning_default(&t);
    t.keep_idle_max = keep_idle_max;
    make_pool_tuned(capacity_bytes, releasing_on_grow(), &t);
}

Test(pool, by_default_the_loop_settles_without_releasing)
{
    /* PyTorch's rule: idle segments go back only at out-of-memory, so the
     * loop's step finds what the last one left and calls nothing. */
    make_pool(0, NULL);
    uint64_t tail_calls = run_loop6(2000, 200);
    stow_stats_t s = stats_now();
    cr_assert_eq(tail_calls, 0, "the last 200 steps made %llu backend calls",
                 (unsigned long long)tail_calls);
    cr_assert_eq(s.num_idle_releases, 0);
    cr_assert_gt(s.num_device_alloc, 0);
    finish_pool();
}

Test(pool, a_loop_that_keeps_releasing_idle_segments_keeps_them)
{
    make_pool(0, releasing_on_grow()); /* keep_idle_max 0.05 by default */
    uint64_t tail_calls = run_loop6(2000, 200);
    stow_stats_t s = stats_now();
    cr_assert_eq(tail_calls, 0, "the last 200 steps still made %llu backend calls",
                 (unsigned long long)tail_calls);
    cr_assert_gt(s.num_idle_keeps, 0);
    cr_assert_gt(s.num_idle_releases, 0, "it released them until the loop showed");
    /* Within the cap: reserved at most 1.05 x the allocated peak. */
    uint64_t allocated_peak = s.allocated_bytes[STOW_POOL_ALL].peak;
    cr_assert_leq(s.reserved_bytes[STOW_POOL_ALL].peak,
                  (uint64_t)(1.05 * (double)allocated_peak), "reserved %llu, allocated peak %llu",
                  (unsigned long long)s.reserved_bytes[STOW_POOL_ALL].peak,
                  (unsigned long long)allocated_peak);
    char text[8192];
    cr_assert_lt(stow_summary(pool, text, sizeof text), sizeof text);
    cr_assert(strstr(text, "Idle segments released to grow "), "summary:\n%s", text);
    finish_pool();
}

Test(pool, with_keep_idle_max_0_the_same_loop_releases_on_every_step)
{
    make_pool_keeping(0, 0.0);
    uint64_t tail_calls = run_loop6(2000, 200);
    cr_assert_eq(stats_now().num_idle_keeps, 0);
    cr_assert_geq(tail_calls, 200 * 2, "a release and a reserve a step at least, not %llu",
                  (unsigned long long)tail_calls);
    finish_pool();
}

Test(pool, a_loop_kept_on_a_small_device_still_fits)
{
    /* Kept segments are cache: under the device limit the out-of-memory
     * retry releases them, and the loop runs where it ran before. */
    make_pool_keeping(0, 0.0);
    (void)run_loop6(2000, 200);
    uint64_t need = stats_now().reserved_bytes[STOW_POOL_ALL].peak; /* releasing: 1.021 x */
    finish_pool();
    make_pool(need, releasing_on_grow()); /* keeping would hold 1.022 x unlimited */
    (void)run_loop6(2000, 200);
    cr_assert_eq(stats_now().num_ooms, 0);
    finish_pool();
}

Test(pool, a_large_request_takes_the_smallest_block_that_fits_split_or_idle)
{
    make_pool(0, NULL);
    void *a = alloc_ok(50 * MIB), *b = alloc_ok(20 * MIB);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    /* Both segments are idle; 24 MiB fits only the 50 MiB one, which splits. */
    void *c = alloc_ok(24 * MIB);
    cr_assert_eq(c, a);
    /* 18 MiB: the idle 20 MiB segment is smaller than the 26 MiB split
     * remainder, and PyTorch's best fit takes it. */
    void *d = alloc_ok(18 * MIB);
    cr_assert_eq(d, b);
    check_pool();
    cr_assert_eq(stats_now().num_device_alloc, 2);
    void *e = alloc_ok(20 * MIB);
    cr_assert_eq((char *)e, (char *)a + 24 * MIB, "the split remainder serves it");
    cr_assert_eq(stats_now().num_device_alloc, 2);
    cr_assert_eq(stow_pool_free(pool, c), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, d), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, e), STOW_OK);
    finish_pool();
}

Test(pool, a_whole_idle_segment_serves_a_smaller_request_when_no_split_block_fits)
{
    make_pool(0, NULL);
    void *a = alloc_ok(40 * MIB);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    void *b = alloc_ok(10 * MIB);
    cr_assert_eq(b, a);
    cr_assert_eq(stats_now().num_device_free, 0);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    finish_pool();
}

Test(pool, memory_fraction_limits_reservations)
{
    stow_config_t c;
    ts_config_classic(&c);
    c.memory_fraction = 0.5;
    make_pool(16 * MIB, &c);
    void *a = alloc_ok(8 * MIB);
    void *out;
    cr_assert_eq(stow_pool_alloc(pool, 2 * MIB, NULL, &out), STOW_ENOMEM);
    stow_stats_t s = stats_now();
    cr_assert_eq(s.limit_bytes, 8 * MIB);
    cr_assert_eq(s.capacity_bytes, 16 * MIB);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    finish_pool();
}

Test(pool, memory_fraction_can_change_at_run_time)
{
    make_pool(64 * MIB, NULL);
    void *a = alloc_ok(32 * MIB);
    cr_assert_eq(stow_pool_set_memory_fraction(pool, 0.0), STOW_EINVAL);
    cr_assert_eq(stow_pool_set_memory_fraction(pool, 1.5), STOW_EINVAL);
    cr_assert_eq(stow_pool_set_memory_fraction(pool, 1e-98), STOW_EINVAL, "no granule left");
    cr_assert_eq(stow_pool_set_memory_fraction(pool, 0.5), STOW_OK);
    void *out;
    cr_assert_eq(stow_pool_alloc(pool, 8 * MIB, NULL, &out), STOW_ENOMEM);
    cr_assert_eq(stats_now().limit_bytes, 32 * MIB);
    cr_assert_eq(stow_pool_set_memory_fraction(pool, 1.0), STOW_OK);
    void *b = alloc_ok(8 * MIB);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    finish_pool();
}

Test(pool, max_split_size_keeps_large_blocks_whole)
{
    stow_config_t c;
    ts_config_classic(&c);
    c.max_split_size_bytes = 20 * MIB;
    c.release_idle_on_grow = false; /* keep the idle oversize segment cached */
    make_pool(0, &c);
    void *big = alloc_ok(40 * MIB);
    cr_assert_eq(stow_pool_free(pool, big), STOW_OK);
    /* A small-ish large request must not split the oversize block. */
    void *p = alloc_ok(4 * MIB);
    cr_assert_neq(p, big);
    /* A request within max_non_split_rounding (20 MiB) of it takes it whole. */
    void *q = alloc_ok(30 * MIB);
    cr_assert_eq(q, big);
    size_t block;
    cr_assert_eq(stow_pool_block_size(pool, q, &block, NULL), STOW_OK);
    cr_assert_eq(block, 40 * MIB);
    cr_assert_eq(stow_pool_free(pool, p), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, q), STOW_OK);
    finish_pool();
}

Test(pool, injected_backend_failures_return_errors)
{
    make_pool(0, NULL);
    void *out = NULL;
    stow_sim_fail_nth(sim, STOW_SIM_RESERVE, 1, STOW_EBACKEND);
    cr_assert_eq(stow_pool_alloc(pool, 16 * MIB, NULL, &out), STOW_EBACKEND);
    cr_assert_eq(stats_now().reserved_bytes[STOW_POOL_ALL].current, 0);
    /* An injected ENOMEM is retried once after releasing the cache. */
    stow_sim_fail_nth(sim, STOW_SIM_RESERVE, 1, STOW_ENOMEM);
    void *p = alloc_ok(16 * MIB);
    cr_assert_eq(stats_now().num_alloc_retries, 1);
    cr_assert_eq(stow_pool_free(pool, p), STOW_OK);
    /* A failing release leaves the segment cached and the books exact. */
    stow_sim_fail_nth(sim, STOW_SIM_RELEASE, 1, STOW_EBACKEND);
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    stow_stats_t s = stats_now();
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 16 * MIB);
    check_pool();
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    cr_assert_eq(stats_now().reserved_bytes[STOW_POOL_ALL].current, 0);
    finish_pool();
}

Test(pool, garbage_collection_threshold_releases_oldest_idle)
{
    stow_config_t c;
    ts_config_classic(&c);
    c.release_idle_on_grow = false;
    c.garbage_collection_threshold = 0.5;
    make_pool(128 * MIB, &c);
    void *a = alloc_ok(24 * MIB), *b = alloc_ok(24 * MIB);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    /* 12 MiB cached + 8 MiB new > 16 MiB threshold: the oldest idle goes. */
    void *d = alloc_ok(32 * MIB);
    stow_stats_t s = stats_now();
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 56 * MIB);
    cr_assert_eq(s.num_alloc_retries, 0);
    cr_assert_eq(stow_pool_free(pool, d), STOW_OK);
    finish_pool();
}

Test(pool, waste_at_peak_adds_up)
{
    make_pool(0, NULL);
    void *a = alloc_ok(1000);
    void *b = alloc_ok(12 * MIB + 5); /* a 14 MiB segment; the 2 MiB - 512 tail is split off */
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    stow_stats_t s = stats_now();
    const stow_waste_t *w = &s.waste_at_peak;
    cr_assert_eq(w->reserved_bytes, 2 * MIB + 14 * MIB);
    cr_assert_eq(w->requested_bytes, 1000 + 12 * MIB + 5);
    cr_assert_eq(w->rounding_bytes, 24 + 507);
    cr_assert_eq(w->split_remainder_bytes, (2 * MIB - 1024) + (2 * MIB - 512));
    cr_assert_eq(w->idle_cached_bytes, 0);
    cr_assert_eq(w->requested_bytes + w->rounding_bytes + w->split_remainder_bytes +
                     w->idle_cached_bytes + w->pending_bytes,
                 w->reserved_bytes);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    finish_pool();
}

Test(pool, medium_requests_share_20_mib_segments)
{
    make_pool(0, NULL);
    void *p[7];
    for (int i = 0; i < 6; i++)
        p[i] = alloc_ok(3 * MIB + 100); /* medium: 1 MiB < size < 10 MiB */
    stow_stats_t s = stats_now();
    /* Six 3 MiB blocks fit a 20 MiB segment (PyTorch's kLargeBuffer). */
    cr_assert_eq(s.segment[STOW_POOL_LARGE].current, 1);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_LARGE].current, 20 * MIB);
    p[6] = alloc_ok(3 * MIB + 100); /* the seventh needs another */
    s = stats_now();
    cr_assert_eq(s.segment[STOW_POOL_LARGE].current, 2);
    void *big = alloc_ok(18 * MIB); /* large: a segment of its own size */
    s = stats_now();
    cr_assert_eq(s.segment[STOW_POOL_LARGE].current, 3);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_LARGE].current, 58 * MIB);
    for (int i = 0; i < 7; i++)
        cr_assert_eq(stow_pool_free(pool, p[i]), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, big), STOW_OK);
    finish_pool();
}

Test(pool, summary_and_json_describe_the_pool)
{
    make_pool(0, NULL);
    void *a = alloc_ok(12345);
    char buf[16384];
    size_t n = stow_summary(pool, buf, sizeof buf);
    cr_assert(n > 0 && n < sizeof buf);
    cr_assert_not_null(strstr(buf, "Allocated memory"));
    cr_assert_not_null(strstr(buf, "Reserved memory"));
    cr_assert_not_null(strstr(buf, "from small pool"));
    stow_stats_t s = stats_now();
    n = stow_stats_json(&s, buf, sizeof buf);
    cr_assert(n > 0 && n < sizeof buf);
    cr_assert_not_null(strstr(buf, "\"allocated_bytes.all.current\": 12800"), "%s", buf);
    cr_assert_not_null(strstr(buf, "\"requested_bytes.all.current\": 12345"));
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    finish_pool();
}

/* Host-backed device: each live block is filled with its own tag and checked
 * before it is freed, so any two blocks sharing a byte are caught. */
Test(pool, host_backed_blocks_never_overlap)
{
    sim = ts_sim(64 * MIB, true, false);
    cr_assert_eq(stow_pool_create(ts_classic(), sim, &pool), STOW_OK);
    enum { SLOTS = 64 };
    unsigned char *ptr[SLOTS] = {0};
    size_t size[SLOTS] = {0};
    uint64_t rng = 12345;
    for (int step = 0; step < 4000; step++) {
        rng = rng * 6364136223846793005ull + 1442695040888963407ull;
        unsigned slot = (unsigned)(rng >> 33) % SLOTS;
        if (ptr[slot]) {
            for (size_t i = 0; i < size[slot]; i += 61)
                cr_assert_eq(ptr[slot][i], (unsigned char)slot, "block %u was overwritten", slot);
            cr_assert_eq(ptr[slot][size[slot] - 1], (unsigned char)slot);
            cr_assert_eq(stow_pool_free(pool, ptr[slot]), STOW_OK);
            ptr[slot] = NULL;
        } else {
            size_t sz = (rng >> 40) % 8 == 0 ? 1 + (rng >> 20) % (3 * MIB) : 1 + (rng >> 20) % 9000;
            void *p;
            if (stow_pool_alloc(pool, sz, NULL, &p) != STOW_OK)
                continue; /* 64 MiB device: OOM is allowed, corruption is not */
            ptr[slot] = p;
            size[slot] = sz;
            memset(p, (int)slot, sz);
        }
    }
    check_pool();
    for (unsigned s = 0; s < SLOTS; s++)
        if (ptr[s])
            cr_assert_eq(stow_pool_free(pool, ptr[s]), STOW_OK);
    finish_pool();
}

static void *thread_body(void *arg)
{
    stow_pool_t *p = arg;
    void *mine[32] = {0};
    for (int i = 0; i < 20000; i++) {
        unsigned k = (unsigned)(i * 7919) % 32;
        if (mine[k]) {
            if (stow_pool_free(p, mine[k]) != STOW_OK)
                return (void *)1;
            mine[k] = NULL;
        } else if (stow_pool_alloc(p, 512 + (size_t)(i % 5000) * 300, NULL, &mine[k]) != STOW_OK) {
            return (void *)1;
        }
    }
    for (int k = 0; k < 32; k++)
        if (mine[k] && stow_pool_free(p, mine[k]) != STOW_OK)
            return (void *)1;
    return NULL;
}

Test(pool, concurrent_threads_keep_books_exact)
{
    make_pool(0, NULL);
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, thread_body, pool), 0);
    for (int i = 0; i < 4; i++) {
        void *r;
        pthread_join(t[i], &r);
        cr_assert_null(r);
    }
    stow_stats_t s = stats_now();
    cr_assert_eq(s.allocated_bytes[STOW_POOL_ALL].current, 0);
    cr_assert_eq(s.allocation[STOW_POOL_ALL].allocated, s.allocation[STOW_POOL_ALL].freed);
    cr_assert(s.allocation[STOW_POOL_ALL].allocated >= 4 * 10000);
    finish_pool();
}

/* A refused scrub leaves the last owner's bytes in the block: it must not be
 * handed out until a later scrub (after a synchronize) succeeds. */
Test(pool, a_block_whose_scrub_failed_is_not_reused_until_scrubbed)
{
    stow_config_t c;
    ts_config_classic(&c);
    c.scrub_on_free = true;
    c.release_idle_on_grow = false;
    sim = ts_sim(64 * MIB, true, false); /* host-backed: real bytes to check */
    cr_assert_eq(stow_pool_create(&c, sim, &pool), STOW_OK);
    unsigned char *a = alloc_ok(5000);
    memset(a, 0xAB, 5000);
    stow_sim_fail_nth(sim, STOW_SIM_SCRUB, 1, STOW_EBACKEND);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK, "the free itself succeeds");
    stow_stats_t s = stats_now();
    cr_assert_eq(s.num_scrub_failures, 1);
    cr_assert_eq(s.allocated_bytes[STOW_POOL_ALL].current, 0);
    cr_assert_eq(s.active_bytes[STOW_POOL_ALL].current, 5120, "waits, counted as active");
    cr_assert_eq(stow_pool_free(pool, a), STOW_ENOTOWNED, "a second free is refused");
    check_pool();
    unsigned char *b = alloc_ok(5000);
    cr_assert_neq(b, a, "the unscrubbed block is not handed out");
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    /* The scrub fails again at the next synchronize: it keeps waiting. */
    stow_sim_fail_nth(sim, STOW_SIM_SCRUB, 1, STOW_EBACKEND);
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    s = stats_now();
    cr_assert_eq(s.num_scrub_failures, 2);
    cr_assert_eq(s.active_bytes[STOW_POOL_ALL].current, 5120);
    check_pool();
    /* Then it succeeds: the block is free, zeroed, and comes back. */
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    s = stats_now();
    cr_assert_eq(s.active_bytes[STOW_POOL_ALL].current, 0);
    cr_assert_eq(s.num_scrub_failures, 2);
    unsigned char *d = alloc_ok(5000);
    for (size_t i = 0; i < 5000; i++)
        cr_assert_eq(d[i], 0, "byte %zu not scrubbed", i);
    cr_assert_eq(stow_pool_free(pool, d), STOW_OK);
    /* A block still waiting at destroy goes with its segment. */
    unsigned char *e = alloc_ok(5000);
    stow_sim_fail_nth(sim, STOW_SIM_SCRUB, 1, STOW_EBACKEND);
    cr_assert_eq(stow_pool_free(pool, e), STOW_OK);
    finish_pool();
}

Test(pool, scrub_on_free_zeroes_blocks_before_reuse)
{
    stow_config_t c;
    ts_config_classic(&c);
    c.scrub_on_free = true;
    sim = ts_sim(64 * MIB, false, false);
    stow_backend_t no_scrub = *sim;
    no_scrub.scrub = NULL;
    cr_assert_eq(stow_pool_create(&c, &no_scrub, &pool), STOW_ENOSYS);
    cr_assert_eq(stow_sim_destroy(sim), STOW_OK);
    sim = ts_sim(64 * MIB, true, false); /* host-backed: real bytes to check */
    cr_assert_eq(stow_pool_create(&c, sim, &pool), STOW_OK);
    unsigned char *a = alloc_ok(5000);
    memset(a, 0xAB, 5000);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    unsigned char *b = alloc_ok(5000);
    cr_assert_eq(b, a, "the same block comes back");
    for (size_t i = 0; i < 5000; i++)
        cr_assert_eq(b[i], 0, "byte %zu not scrubbed", i);
    stow_stats_t s = stats_now();
    cr_assert_eq(s.num_scrubs, 1);
    cr_assert_eq(s.num_scrub_failures, 0);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    finish_pool();
}

/* stow_pool_alloc_at: a block freed earlier is allocated again at its address,
 * whole or cut out of a larger free block; the books stay exact. */
Test(pool, alloc_at_takes_freed_bytes_at_their_address)
{
    make_pool(0, NULL);
    void *a = alloc_ok(30 * MIB), *b = alloc_ok(40 * MIB), *c = alloc_ok(3 * MIB);
    stow_stats_t before = stats_now();
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    cr_assert_eq(stow_pool_alloc_at(pool, b, 40 * MIB, NULL), STOW_OK);
    stow_stats_t again = stats_now();
    cr_assert_eq(again.allocated_bytes[STOW_POOL_ALL].current,
                 before.allocated_bytes[STOW_POOL_ALL].current);
    cr_assert_eq(again.reserved_bytes[STOW_POOL_ALL].current,
                 before.reserved_bytes[STOW_POOL_ALL].current, "no new segment");
    size_t block = 0, requested = 0;
    cr_assert_eq(stow_pool_block_size(pool, b, &block, &requested), STOW_OK);
    cr_assert_eq(block, 40 * MIB);
    check_pool();
    /* Cut out of the middle of a free block: the bytes below and above stay free. */
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    void *mid = (char *)b + 8 * MIB;
    cr_assert_eq(stow_pool_alloc_at(pool, mid, 10 * MIB, NULL), STOW_OK);
    check_pool();
    void *low = alloc_ok(8 * MIB);
    cr_assert_eq(low, b, "the 8 MiB below are free, best fit");
    cr_assert_eq(stow_pool_free(pool, low), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, mid), STOW_OK);
    /* A small block kept whole on a quick list is free memory too. */
    void *q = alloc_ok(4 * KIB);
    cr_assert_eq(stow_pool_free(pool, q), STOW_OK);
    cr_assert_eq(stow_pool_alloc_at(pool, q, 4 * KIB, NULL), STOW_OK);
    check_pool();
    cr_assert_eq(stow_pool_free(pool, q), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, c), STOW_OK);
    finish_pool();
}

/* Bytes that are not one free block this stream may take are refused, and
 * nothing changes. */
Test(pool, alloc_at_refuses_what_is_not_free_and_changes_nothing)
{
    make_pool(0, NULL);
    void *a = alloc_ok(30 * MIB), *b = alloc_ok(40 * MIB);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    stow_stats_t before = stats_now();
    cr_assert_eq(stow_pool_alloc_at(pool, a, 30 * MIB, NULL), STOW_ENOTOWNED, "live");
    cr_assert_eq(stow_pool_alloc_at(pool, b, 41 * MIB, NULL), STOW_ENOTOWNED, "past its end");
    cr_assert_eq(stow_pool_alloc_at(pool, (char *)b + 40 * MIB - 512, 1024, NULL),
                 STOW_ENOTOWNED, "across two blocks");
    cr_assert_eq(stow_pool_alloc_at(pool, (void *)(uintptr_t)0x1000, 512, NULL), STOW_ENOTOWNED,
                 "not the pool's");
    cr_assert_eq(stow_pool_alloc_at(pool, b, 4 * KIB, NULL), STOW_ENOTOWNED,
                 "a small request in the large pool");
    cr_assert_eq(stow_pool_alloc_at(pool, (char *)b + 256, MIB, NULL), STOW_EINVAL, "unaligned");
    cr_assert_eq(stow_pool_alloc_at(pool, b, 0, NULL), STOW_EINVAL);
    cr_assert_eq(stow_pool_alloc_at(pool, NULL, MIB, NULL), STOW_EINVAL);
    cr_assert_eq(stow_pool_alloc_at(NULL, b, MIB, NULL), STOW_EINVAL);
    cr_assert_eq(stow_pool_alloc_at(pool, b, SIZE_MAX, NULL), STOW_EOVERFLOW);
    stow_stats_t after = stats_now();
    assert_same_books(&before, &after);
    /* Freed on another stream: its work may still run on those bytes. */
    stow_stream_t other = (stow_stream_t)(uintptr_t)0x10;
    void *c = NULL;
    cr_assert_eq(stow_pool_alloc(pool, 50 * MIB, other, &c), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, c), STOW_OK);
    stow_stats_t with_c = stats_now();
    cr_assert_eq(stow_pool_alloc_at(pool, c, 50 * MIB, NULL), STOW_ENOTOWNED, "another stream's");
    stow_stats_t after_c = stats_now();
    assert_same_books(&with_c, &after_c);
    check_pool();
    cr_assert_eq(stow_pool_alloc_at(pool, c, 50 * MIB, other), STOW_OK, "its own stream's");
    cr_assert_eq(stow_pool_free(pool, c), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    finish_pool();
}

Test(pool, alloc_at_is_for_the_classic_pool)
{
    stow_config_t vmm = ts_config("policy:vmm");
    make_pool(0, &vmm);
    void *a = alloc_ok(30 * MIB);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    cr_assert_eq(stow_pool_alloc_at(pool, a, 30 * MIB, NULL), STOW_ENOSYS);
    finish_pool();
}
