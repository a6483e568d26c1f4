/*
 * tests/unit/test_quick.c: quick lists (allocator/quick.c): small blocks kept
 * whole between a free and the next request of their size (lists of up to
 * 64 KiB, and the mid ring above that); their books, the flush before
 * growing, releasing or retrying, stream safety, the limits, and bad frees of
 * a kept block.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "test_support.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define S1 ((stow_stream_t)(uintptr_t)0x11)
#define S2 ((stow_stream_t)(uintptr_t)0x22)

static stow_backend_t *sim;
static stow_pool_t *pool;

static void make_mid(size_t capacity, bool manual_events, unsigned depth, unsigned mid_slots)
{
    sim = ts_sim(capacity, false, manual_events);
    cr_assert_not_null(sim);
    stow_tuning_t t;
    stow_tuning_default(&t);
    t.quick_depth = depth;
    t.quick_mid_slots = mid_slots;
    cr_assert_eq(stow_pool_create_tuned(ts_classic(), &t, sim, &pool), STOW_OK);
}

static void make(size_t capacity, bool manual_events, unsigned depth)
{
    make_mid(capacity, manual_events, depth, STOW_QUICK_MID_SLOTS_MAX);
}

static void check(void)
{
    char why[256];
    cr_assert_eq(stow_pool_check(pool, why, sizeof why), STOW_OK, "%s", why);
}

static void finish(void)
{
    check();
    cr_assert_eq(stow_pool_destroy(pool), STOW_OK);
    stow_sim_counters_t c;
    stow_sim_counters(sim, &c);
    cr_assert_eq(c.reserved_bytes, 0);
    cr_assert_eq(stow_sim_destroy(sim), STOW_OK);
}

static stow_stats_t stats(void)
{
    stow_stats_t s;
    cr_assert_eq(stow_pool_stats(pool, &s), STOW_OK);
    return s;
}

static void *alloc_on(stow_stream_t st, size_t size)
{
    void *p = NULL;
    cr_assert_eq(stow_pool_alloc(pool, size, st, &p), STOW_OK, "alloc %zu", size);
    return p;
}

static void free_ok(void *p)
{
    cr_assert_eq(stow_pool_free(pool, p), STOW_OK);
    check();
}

Test(quick, default_depth_and_the_key_sets_it)
{
    stow_tuning_t t;
    stow_tuning_default(&t);
    cr_assert_eq(t.quick_depth, STOW_QUICK_DEPTH_DEFAULT);
    cr_assert_eq(STOW_QUICK_DEPTH_DEFAULT, 64u);
    char err[128];
    cr_assert_eq(stow_tuning_parse(NULL, &t, "quick_depth:0", err, sizeof err), STOW_OK, "%s",
                 err);
    cr_assert_eq(t.quick_depth, 0);
    cr_assert_eq(stow_tuning_parse(NULL, &t, "quick_depth:255", err, sizeof err), STOW_OK, "%s",
                 err);
    cr_assert_eq(t.quick_depth, 255);
    cr_assert_eq(stow_tuning_parse(NULL, &t, "quick_depth:256", err, sizeof err), STOW_EINVAL);
    cr_assert(strstr(err, "quick_depth"), "%s", err);
    cr_assert_eq(stow_tuning_parse(NULL, &t, "quick_depth:-1", err, sizeof err), STOW_EINVAL);
    cr_assert_eq(t.quick_depth, 255, "a refused value changes nothing");

    cr_assert_eq(t.quick_mid_slots, STOW_QUICK_MID_SLOTS_MAX);
    cr_assert_eq(STOW_QUICK_MID_SLOTS_MAX, 8u);
    cr_assert_eq(stow_tuning_parse(NULL, &t, "quick_mid_slots:0", err, sizeof err), STOW_OK,
                 "%s", err);
    cr_assert_eq(t.quick_mid_slots, 0);
    cr_assert_eq(stow_tuning_parse(NULL, &t, "quick_mid_slots:3", err, sizeof err), STOW_OK,
                 "%s", err);
    cr_assert_eq(t.quick_mid_slots, 3);
    cr_assert_eq(stow_tuning_parse(NULL, &t, "quick_mid_slots:9", err, sizeof err), STOW_EINVAL);
    cr_assert(strstr(err, "quick_mid_slots"), "%s", err);
    cr_assert_eq(t.quick_mid_slots, 3, "a refused value changes nothing");

    /* A tuning built by hand is validated at pool creation. */
    sim = ts_sim(0, false, false);
    stow_pool_t *p = NULL;
    t.quick_mid_slots = 9;
    cr_assert_eq(stow_pool_create_tuned(ts_classic(), &t, sim, &p), STOW_EINVAL);
    t.quick_mid_slots = 8;
    t.quick_depth = 1000;
    cr_assert_eq(stow_pool_create_tuned(ts_classic(), &t, sim, &p), STOW_EINVAL);
    cr_assert_null(p);
    cr_assert_eq(stow_sim_destroy(sim), STOW_OK);
}

Test(quick, a_freed_small_block_comes_back_whole_for_its_size)
{
    make(0, false, 4);
    void *a = alloc_on(NULL, 1000), *b = alloc_on(NULL, 3000), *c = alloc_on(NULL, 1000);
    free_ok(b);
    stow_stats_t s = stats();
    /* b is kept unmerged: a cached, split block, not an allocation. */
    cr_assert_eq(s.allocated_bytes[STOW_POOL_ALL].current, 2048);
    cr_assert_eq(s.inactive_split[STOW_POOL_SMALL].current, 2, "b and the segment's tail");
    cr_assert_eq(s.inactive_split_bytes[STOW_POOL_SMALL].current, 3072 + (2 * MIB - 5120));
    cr_assert_eq(s.free_reserved_bytes, 2 * MIB - 2048);
    /* A request of another size does not take it... */
    void *d = alloc_on(NULL, 2000);
    cr_assert_neq(d, b);
    /* ...one that rounds to its size does, with no index work. */
    void *e = alloc_on(NULL, 2600);
    cr_assert_eq(e, b);
    s = stats();
    cr_assert_eq(s.num_quick_hits, 1);
    cr_assert_eq(s.num_cache_hits, 4);
    cr_assert_eq(s.num_cache_misses, 1);
    cr_assert_eq(s.requested_bytes[STOW_POOL_ALL].current, 1000 + 1000 + 2000 + 2600);
    size_t block = 0, requested = 0;
    cr_assert_eq(stow_pool_block_size(pool, e, &block, &requested), STOW_OK);
    cr_assert_eq(block, 3072);
    cr_assert_eq(requested, 2600);
    for (void **p = (void *[]){a, c, d, e, NULL}; *p; p++)
        free_ok(*p);
    cr_assert_eq(stats().allocation[STOW_POOL_ALL].current, 0);
    finish();
}

Test(quick, a_kept_block_cannot_be_freed_again_or_used)
{
    make(0, false, 4);
    void *a = alloc_on(NULL, 4 * KIB), *keep = alloc_on(NULL, 4 * KIB);
    free_ok(a);
    stow_stats_t before = stats();
    cr_assert_eq(stow_pool_free(pool, a), STOW_ENOTOWNED, "double free of a kept block");
    cr_assert_eq(stow_record_stream(pool, a, S1), STOW_ENOTOWNED);
    size_t block = 0;
    cr_assert_eq(stow_pool_block_size(pool, a, &block, NULL), STOW_ENOTOWNED);
    cr_assert_eq(stow_pool_free(pool, (char *)a + 512), STOW_ENOTOWNED, "interior pointer");
    stow_stats_t after = stats();
    cr_assert_eq(after.num_invalid_frees, before.num_invalid_frees + 2);
    cr_assert_eq(after.allocated_bytes[STOW_POOL_ALL].current,
                 before.allocated_bytes[STOW_POOL_ALL].current);
    cr_assert_eq(after.inactive_split_bytes[STOW_POOL_ALL].current,
                 before.inactive_split_bytes[STOW_POOL_ALL].current);
    check();
    free_ok(keep);
    finish();
}

Test(quick, depth_bounds_each_list_and_zero_turns_them_off)
{
    make(0, false, 2);
    void *p[4];
    for (int i = 0; i < 4; i++)
        p[i] = alloc_on(NULL, 8 * KIB);
    void *guard = alloc_on(NULL, 512); /* keeps p[3] off the segment's tail */
    for (int i = 0; i < 4; i++)
        free_ok(p[i]);
    /* The first two are kept; with the list full, the last two merged. */
    stow_stats_t s = stats();
    cr_assert_eq(s.inactive_split[STOW_POOL_SMALL].current, 4, "two kept, merged pair, tail");
    cr_assert_eq(s.largest_free_block_bytes, 2 * MIB - 32 * KIB - 512, "the tail");
    cr_assert_eq(alloc_on(NULL, 8 * KIB), p[1], "most recently freed first");
    cr_assert_eq(alloc_on(NULL, 8 * KIB), p[0]);
    cr_assert_eq(stats().num_quick_hits, 2);
    cr_assert_eq(alloc_on(NULL, 8 * KIB), p[2], "then best fit: the merged pair");
    free_ok(p[0]);
    free_ok(p[1]);
    free_ok(p[2]);
    free_ok(guard);
    finish();

    make(0, false, 0);
    void *a = alloc_on(NULL, 8 * KIB), *b = alloc_on(NULL, 8 * KIB);
    free_ok(a);
    free_ok(b);
    s = stats();
    cr_assert_eq(s.num_quick_hits, 0);
    cr_assert_eq(s.inactive_split[STOW_POOL_ALL].current, 0, "merged back at once");
    cr_assert_eq(s.largest_free_block_bytes, 2 * MIB);
    finish();
}

Test(quick, a_block_over_64_kib_comes_back_from_the_mid_ring)
{
    make(0, false, 4);
    void *m = alloc_on(NULL, 64 * KIB + 1), *guard = alloc_on(NULL, 512);
    free_ok(m);
    stow_stats_t s = stats();
    cr_assert_eq(s.inactive_split[STOW_POOL_SMALL].current, 2, "m, kept, and the tail");
    cr_assert_eq(s.inactive_split_bytes[STOW_POOL_SMALL].current, 2 * MIB - 512);
    cr_assert_eq(s.largest_free_block_bytes, 2 * MIB - (64 * KIB + 512) - 512,
                 "the tail: a kept block is in no index");
    void *other = alloc_on(NULL, 128 * KIB);
    cr_assert_neq(other, m, "another size does not take it");
    cr_assert_eq(alloc_on(NULL, 64 * KIB + 300), m, "one of its rounded size does");
    cr_assert_eq(stats().num_quick_hits, 1);
    free_ok(m);
    free_ok(other);
    free_ok(guard);
    finish();

    /* With no slots the block merges at once. */
    make_mid(0, false, 4, 0);
    m = alloc_on(NULL, 64 * KIB + 1);
    guard = alloc_on(NULL, 512);
    free_ok(m);
    s = stats();
    cr_assert_eq(s.inactive_split[STOW_POOL_SMALL].current, 2, "m, merged, and the tail");
    cr_assert_eq(s.largest_free_block_bytes, 2 * MIB - (64 * KIB + 512) - 512);
    cr_assert_eq(alloc_on(NULL, 64 * KIB + 1), m);
    cr_assert_eq(stats().num_quick_hits, 0);
    free_ok(m);
    free_ok(guard);
    finish();
}

Test(quick, the_mid_ring_keeps_the_newest_and_merges_the_oldest)
{
    make(0, false, 4);
    enum { N = STOW_QUICK_MID_SLOTS_MAX + 1 };
    void *p[N];
    for (int i = 0; i < N; i++)
        p[i] = alloc_on(NULL, 96 * KIB);
    void *guard = alloc_on(NULL, 512); /* keeps p[N - 1] off the segment's tail */
    for (int i = 0; i < N; i++)
        free_ok(p[i]);
    /* p[0] was merged and indexed when p[N - 1] took its slot. */
    stow_stats_t s = stats();
    cr_assert_eq(s.inactive_split[STOW_POOL_SMALL].current, N + 1, "eight kept, p[0], the tail");
    cr_assert_eq(s.num_quick_hits, 0);
    for (int i = N - 1; i >= 1; i--)
        cr_assert_eq(alloc_on(NULL, 96 * KIB), p[i], "newest first: %d", i);
    cr_assert_eq(stats().num_quick_hits, N - 1);
    cr_assert_eq(alloc_on(NULL, 96 * KIB), p[0], "then best fit: the merged one");
    cr_assert_eq(stats().num_quick_hits, N - 1);
    for (int i = 0; i < N; i++)
        free_ok(p[i]);
    free_ok(guard);
    finish();
}

Test(quick, large_blocks_and_one_range_page_mapped_pools_are_not_kept)
{
    make(0, false, 4);
    void *a = alloc_on(NULL, 4 * MIB), *b = alloc_on(NULL, 4 * MIB);
    free_ok(a);
    cr_assert_eq(alloc_on(NULL, 4 * MIB), a);
    cr_assert_eq(stats().num_quick_hits, 0, "a large block is merged and indexed");
    free_ok(a);
    free_ok(b);
    finish();

    sim = ts_sim(0, false, false);
    stow_config_t c;
    ts_config_classic(&c);
    c.policy = STOW_POLICY_VMM;
    stow_tuning_t t;
    stow_tuning_default(&t);
    t.vmm_small_kb = 0; /* one range: no small pool (tests/unit/test_vmm.c has the other) */
    cr_assert_eq(stow_pool_create_tuned(&c, &t, sim, &pool), STOW_OK);
    void *s1 = alloc_on(NULL, 4 * KIB);
    free_ok(s1);
    alloc_on(NULL, 4 * KIB);
    cr_assert_eq(stats().num_quick_hits, 0, "no small range in this page-mapped pool");
    cr_assert_eq(stow_pool_destroy(pool), STOW_EBUSY);
    stow_pool_destroy_force(pool);
    cr_assert_eq(stow_sim_destroy(sim), STOW_OK);
}

Test(quick, empty_cache_flushes_and_releases_everything)
{
    make(0, false, 4);
    void *a = alloc_on(NULL, 4 * KIB), *b = alloc_on(NULL, 64 * KIB);
    void *m = alloc_on(NULL, 200 * KIB);
    free_ok(a);
    free_ok(b);
    free_ok(m);
    stow_stats_t s = stats();
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 2 * MIB, "kept blocks hold the segment");
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    check();
    s = stats();
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 0);
    cr_assert_eq(s.inactive_split[STOW_POOL_ALL].current, 0);
    cr_assert_eq(s.num_quick_flushes, 1);
    finish();
}

/* Fills one 2 MiB small segment with n blocks of block_bytes and frees them
 * all: every one is kept (nothing left in the index). A 1 MiB request then
 * fits the segment only once they merged: no new segment. */
static void kept_blocks_merge_before_growing(unsigned depth, size_t block_bytes, int n)
{
    make(0, false, depth);
    void *p[32];
    cr_assert_leq(n, 32);
    for (int i = 0; i < n; i++)
        p[i] = alloc_on(NULL, block_bytes);
    for (int i = 0; i < n; i++)
        free_ok(p[i]);
    stow_stats_t s = stats();
    cr_assert_eq(s.segment[STOW_POOL_ALL].current, 1);
    cr_assert_eq(s.largest_free_block_bytes, 0);
    cr_assert_eq(s.inactive_split[STOW_POOL_SMALL].current, (uint64_t)n, "all kept");
    void *big = alloc_on(NULL, 1 * MIB);
    cr_assert_eq(big, p[0]);
    s = stats();
    cr_assert_eq(s.segment[STOW_POOL_ALL].current, 1, "merged instead of growing");
    cr_assert_eq(s.num_quick_flushes, 1);
    cr_assert_eq(s.num_device_alloc, 1);
    free_ok(big);
    finish();
}

Test(quick, the_pool_merges_kept_blocks_before_it_grows)
{
    kept_blocks_merge_before_growing(32, 64 * KIB, 32); /* quick lists */
}

Test(quick, the_pool_merges_the_mid_ring_before_it_grows)
{
    kept_blocks_merge_before_growing(4, 256 * KIB, 8); /* the mid ring alone */
}

Test(quick, out_of_memory_retry_flushes_first)
{
    /* Room for two small segments only. Fill both with 64 KiB blocks and keep
     * them all on a quick list: a large request then needs the device memory
     * they hold, so the pool merges them, releases the idle segments and
     * reserves the large one without an out-of-memory error. */
    make(4 * MIB, false, 64);
    void *p[64];
    for (int i = 0; i < 64; i++)
        p[i] = alloc_on(NULL, 64 * KIB);
    for (int i = 0; i < 64; i++)
        free_ok(p[i]);
    cr_assert_eq(stats().reserved_bytes[STOW_POOL_ALL].current, 4 * MIB);
    void *big = alloc_on(NULL, 4 * MIB);
    stow_stats_t s = stats();
    cr_assert_eq(s.num_ooms, 0);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_LARGE].current, 4 * MIB);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_SMALL].current, 0);
    cr_assert_geq(s.num_quick_flushes, 1);
    free_ok(big);
    finish();
}

/* A block freed on S1 is kept for S1: S1's work may still use it, so S2 gets
 * its own memory, from its index; S1 itself reuses it at once. */
static void freed_on_one_stream_not_reused_on_another(size_t block_bytes)
{
    make(0, true, 4);
    void *x = alloc_on(S2, 4 * KIB); /* S2's own segment, with room left */
    void *a = alloc_on(S1, block_bytes);
    void *keep = alloc_on(S1, 4 * KIB);
    free_ok(a);
    void *b = alloc_on(S2, block_bytes);
    cr_assert_eq((char *)b, (char *)x + 4 * KIB, "S1's work may still use a");
    stow_stats_t s = stats();
    cr_assert_eq(s.num_quick_hits, 0);
    cr_assert_eq(s.num_quick_flushes, 0);
    cr_assert_eq(alloc_on(S1, block_bytes), a, "S1 itself reuses it at once");
    cr_assert_eq(stats().num_quick_hits, 1);
    for (void **p = (void *[]){a, keep, b, x, NULL}; *p; p++)
        free_ok(*p);
    finish();
}

Test(quick, a_block_freed_on_one_stream_is_not_reused_on_another)
{
    freed_on_one_stream_not_reused_on_another(4 * KIB);   /* a quick list */
    freed_on_one_stream_not_reused_on_another(300 * KIB); /* the mid ring */
}

Test(quick, scrub_on_free_blocks_are_not_kept)
{
    sim = ts_sim(64 * MIB, true, false);
    stow_config_t c;
    ts_config_classic(&c);
    c.scrub_on_free = true;
    cr_assert_eq(stow_pool_create(&c, sim, &pool), STOW_OK);
    unsigned char *a = alloc_on(NULL, 5000);
    memset(a, 0xAB, 5000);
    free_ok(a);
    unsigned char *b = alloc_on(NULL, 5000);
    cr_assert_eq(b, a);
    for (size_t i = 0; i < 5000; i++)
        cr_assert_eq(b[i], 0, "byte %zu not scrubbed", i);
    stow_stats_t s = stats();
    cr_assert_eq(s.num_quick_hits, 0);
    cr_assert_eq(s.num_scrubs, 1);
    free_ok(b);
    finish();
}
