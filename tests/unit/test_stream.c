/*
 * tests/unit/test_stream.c: stream-ordered reuse (allocator/stream.c) on a
 * simulated device whose events complete only when the test says so.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "test_support.h"

#define MIB ((size_t)1 << 20)
#define S1 ((stow_stream_t)(uintptr_t)0x11)
#define S2 ((stow_stream_t)(uintptr_t)0x22)

static stow_backend_t *sim;
static stow_pool_t *pool;

static void setup_with(bool reuse_other_streams_on_miss)
{
    sim = ts_sim(0, false, true);
    cr_assert_not_null(sim);
    /* Keep idle segments cached so that reuse, not release, is what is seen. */
    stow_config_t c;
    ts_config_classic(&c);
    c.release_idle_on_grow = false;
    stow_tuning_t t;
    stow_tuning_default(&t);
    t.reuse_other_streams_on_miss = reuse_other_streams_on_miss;
    cr_assert_eq(stow_pool_create_tuned(&c, &t, sim, &pool), STOW_OK);
}

static void setup(void) { setup_with(false); }

/* Other streams' completed frees cleared (an event each) before the pool grows. */
static void setup_on_miss(void) { setup_with(true); }

static void finish(void)
{
    char why[256];
    cr_assert_eq(stow_pool_check(pool, why, sizeof why), STOW_OK, "%s", why);
    cr_assert_eq(stow_pool_destroy(pool), STOW_OK);
    stow_sim_counters_t c;
    stow_sim_counters(sim, &c);
    cr_assert_eq(c.reserved_bytes, 0);
    cr_assert_eq(stow_sim_destroy(sim), STOW_OK);
}

/* A backend with no event methods (all three NULL): it has one stream, so
 * every free is reusable at once whatever stream a request names. */
static stow_backend_t single_stream;

/* A pool over `device` seen through single_stream, with or without scrubs. */
static void single_stream_pool(stow_backend_t *device, bool scrub_on_free)
{
    sim = device;
    cr_assert_not_null(sim);
    single_stream = ts_single_stream(sim);
    stow_config_t c;
    ts_config_classic(&c);
    c.release_idle_on_grow = false;
    c.scrub_on_free = scrub_on_free;
    cr_assert_eq(stow_pool_create(&c, &single_stream, &pool), STOW_OK);
}

static void setup_single_stream(void) { single_stream_pool(ts_sim(0, false, true), false); }

static void *alloc_on(stow_stream_t s, size_t size)
{
    void *p = NULL;
    cr_assert_eq(stow_pool_alloc(pool, size, s, &p), STOW_OK);
    return p;
}

static void check(void)
{
    char why[256];
    cr_assert_eq(stow_pool_check(pool, why, sizeof why), STOW_OK, "%s", why);
}

Test(stream, same_stream_reuses_at_once, .init = setup)
{
    void *a = alloc_on(S1, 4 * MIB);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    cr_assert_eq(alloc_on(S1, 4 * MIB), a);
    stow_stats_t s;
    stow_pool_stats(pool, &s);
    cr_assert_eq(s.num_event_records, 0, "single-stream reuse records no event");
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    finish();
}

Test(stream, other_stream_waits_for_the_clearance_event, .init = setup_on_miss)
{
    void *a = alloc_on(S1, 16 * MIB);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    /* S1 has not finished: S2 must not get a's memory. */
    void *b = alloc_on(S2, 16 * MIB);
    cr_assert_neq(b, a);
    check();
    stow_sim_complete_stream(sim, S1);
    /* Now the event recorded on S1 after the free is complete. */
    void *d = alloc_on(S2, 16 * MIB);
    cr_assert_eq(d, a);
    stow_stats_t s;
    stow_pool_stats(pool, &s);
    cr_assert_eq(s.num_event_records, 1, "one clearance event for the stream");
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, d), STOW_OK);
    check();
    finish();
}

Test(stream, by_default_a_miss_grows_rather_than_take_another_streams_frees, .init = setup)
{
    void *a = alloc_on(S1, 16 * MIB);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    stow_sim_complete_stream(sim, S1);
    /* S1's work is done, but S2's miss grows the pool: no clearance event. */
    void *b = alloc_on(S2, 16 * MIB);
    cr_assert_neq(b, a);
    stow_stats_t s;
    stow_pool_stats(pool, &s);
    cr_assert_eq(s.num_event_records, 0, "no clearance event on a miss");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 32 * MIB);
    /* S1 still reuses its own free block at once. */
    void *c = alloc_on(S1, 16 * MIB);
    cr_assert_eq(c, a);
    check();
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, c), STOW_OK);
    finish();
}

Test(stream, blocks_freed_after_the_event_stay_private, .init = setup_on_miss)
{
    void *a = alloc_on(S1, 16 * MIB);
    void *a2 = alloc_on(S1, 24 * MIB);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    void *b = alloc_on(S2, 16 * MIB); /* records the clearance event on S1 */
    cr_assert_neq(b, a);
    cr_assert_eq(stow_pool_free(pool, a2), STOW_OK); /* freed after that event */
    stow_sim_complete_stream(sim, S1);
    void *c = alloc_on(S2, 16 * MIB); /* gets a, covered by the event */
    cr_assert_eq(c, a);
    void *d = alloc_on(S2, 24 * MIB); /* a2 was not covered: new memory */
    cr_assert_neq(d, a2);
    for (void **p = (void *[]){b, c, d, NULL}; *p; p++)
        cr_assert_eq(stow_pool_free(pool, *p), STOW_OK);
    finish();
}

Test(stream, record_stream_defers_reuse_until_the_user_stream_finished, .init = setup)
{
    void *a = alloc_on(S1, 4 * MIB);
    cr_assert_eq(stow_record_stream(pool, a, S2), STOW_OK);
    cr_assert_eq(stow_record_stream(pool, a, S2), STOW_OK, "naming a stream twice is fine");
    cr_assert_eq(stow_record_stream(pool, a, S1), STOW_OK, "the allocation stream: no-op");
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    stow_stats_t s;
    stow_pool_stats(pool, &s);
    cr_assert_eq(s.allocated_bytes[STOW_POOL_ALL].current, 0, "allocated drops at free");
    cr_assert_eq(s.active_bytes[STOW_POOL_ALL].current, 4 * MIB, "still active until S2 is done");
    cr_assert_eq(s.num_event_records, 1);
    cr_assert_eq(stow_pool_free(pool, a), STOW_ENOTOWNED, "a pending block is not live");
    cr_assert_eq(stow_record_stream(pool, a, S2), STOW_ENOTOWNED);
    void *b = alloc_on(S1, 4 * MIB);
    cr_assert_neq(b, a, "S2 may still be reading a");
    check();
    stow_sim_complete_stream(sim, S2);
    void *c = alloc_on(S1, 4 * MIB);
    cr_assert_eq(c, a);
    stow_pool_stats(pool, &s);
    cr_assert_eq(s.active_bytes[STOW_POOL_ALL].current, 8 * MIB);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, c), STOW_OK);
    finish();
}

/* active = allocated + pending is derived, not counted (accounting.h): its
 * peak, totals and resets must still read as if counted at every event. */
Test(stream, active_figures_count_pending_blocks, .init = setup)
{
    void *a = alloc_on(S1, 4 * MIB);
    cr_assert_eq(stow_record_stream(pool, a, S2), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK); /* PENDING: active, not allocated */
    void *b = alloc_on(S1, 6 * MIB);
    stow_stats_t s;
    stow_pool_stats(pool, &s);
    const stow_stat_t *ab = &s.active_bytes[STOW_POOL_ALL], *ac = &s.active[STOW_POOL_ALL];
    cr_assert_eq(ab->current, 10 * MIB);
    cr_assert_eq(ab->peak, 10 * MIB, "a's pending bytes count in the active peak");
    cr_assert_eq(s.allocated_bytes[STOW_POOL_ALL].peak, 6 * MIB);
    cr_assert_eq(ab->allocated, 10 * MIB);
    cr_assert_eq(ab->freed, 0);
    cr_assert_eq(ac->current, 2);
    cr_assert_eq(ac->peak, 2);
    cr_assert_eq(s.active_bytes[STOW_POOL_LARGE].current, 10 * MIB);
    cr_assert_eq(s.active_bytes[STOW_POOL_SMALL].peak, 0);

    stow_stats_reset_accumulated(pool);
    stow_stats_reset_peak(pool);
    stow_pool_stats(pool, &s);
    cr_assert_eq(ab->peak, 10 * MIB, "reset to the current value, pending included");
    cr_assert_eq(ab->allocated, 10 * MIB, "totals restart from what is active now");
    cr_assert_eq(ab->freed, 0);

    stow_sim_complete_stream(sim, S2);
    void *c = alloc_on(S1, 2 * MIB); /* processes a's event first: a is free again */
    stow_pool_stats(pool, &s);
    cr_assert_eq(ab->current, 8 * MIB);
    cr_assert_eq(ab->peak, 10 * MIB);
    cr_assert_eq(ab->allocated, 12 * MIB);
    cr_assert_eq(ab->freed, 4 * MIB);
    cr_assert_eq(ac->current, 2);
    cr_assert_eq(ac->allocated, 3);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, c), STOW_OK);
    stow_pool_stats(pool, &s);
    cr_assert_eq(ab->current, 0);
    cr_assert_eq(ab->freed, 12 * MIB);
    finish();
}

Test(stream, empty_cache_synchronizes_pending_blocks_away, .init = setup)
{
    void *a = alloc_on(S1, 16 * MIB);
    cr_assert_eq(stow_record_stream(pool, a, S2), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    void *b = alloc_on(S2, 8 * MIB);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    stow_stats_t s;
    stow_pool_stats(pool, &s);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 0);
    cr_assert_eq(s.active_bytes[STOW_POOL_ALL].current, 0);
    cr_assert_eq(s.num_sync_all_streams, 1);
    stow_sim_counters_t c;
    stow_sim_counters(sim, &c);
    cr_assert_eq(c.pending_events, 0, "every event was returned");
    finish();
}

Test(stream, failed_event_record_falls_back_to_synchronize, .init = setup)
{
    void *a = alloc_on(S1, 4 * MIB);
    cr_assert_eq(stow_record_stream(pool, a, S2), STOW_OK);
    stow_sim_fail_nth(sim, STOW_SIM_EVENT_RECORD, 1, STOW_OK);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    stow_stats_t s;
    stow_pool_stats(pool, &s);
    cr_assert_eq(s.num_sync_all_streams, 1);
    cr_assert_eq(s.active_bytes[STOW_POOL_ALL].current, 0, "synchronized: free at once");
    cr_assert_eq(alloc_on(S1, 4 * MIB), a);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    finish();
}

Test(stream, destroy_with_pending_blocks_is_clean, .init = setup)
{
    void *a = alloc_on(S1, 4 * MIB);
    cr_assert_eq(stow_record_stream(pool, a, S2), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    cr_assert_eq(stow_pool_destroy(pool), STOW_OK);
    stow_sim_counters_t c;
    stow_sim_counters(sim, &c);
    cr_assert_eq(c.reserved_bytes, 0);
    cr_assert_eq(c.pending_events, 0);
    cr_assert_eq(stow_sim_destroy(sim), STOW_OK);
}

Test(stream, out_of_memory_synchronizes_and_reuses_other_streams_blocks)
{
    sim = ts_sim(32 * MIB, false, true);
    cr_assert_eq(stow_pool_create(ts_classic(), sim, &pool), STOW_OK);
    void *a = alloc_on(S1, 10 * MIB + 1);
    void *hold = alloc_on(S1, 10 * MIB + 1);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    /* S2 cannot reuse a yet, and the device is nearly full: the retry path
     * synchronizes, after which a's segment may be reused or released. */
    void *b = alloc_on(S2, 16 * MIB);
    stow_stats_t s;
    stow_pool_stats(pool, &s);
    cr_assert_eq(s.num_ooms, 0);
    cr_assert(s.reserved_bytes[STOW_POOL_ALL].current <= 32 * MIB);
    check();
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, hold), STOW_OK);
    finish();
}

Test(stream, without_events_every_stream_reuses_a_free_at_once, .init = setup_single_stream)
{
    /* Large (index), small (quick list) and mid-sized (mid ring) blocks: each
     * freed on S1 goes back to the next request of its size on S2. */
    static const size_t sizes[] = {16 * MIB, 4096, 256 << 10};
    for (size_t i = 0; i < sizeof sizes / sizeof sizes[0]; i++) {
        stow_stats_t before, after;
        stow_pool_stats(pool, &before);
        void *a = alloc_on(S1, sizes[i]);
        cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
        cr_assert_eq(alloc_on(S2, sizes[i]), a, "size %zu", sizes[i]);
        stow_pool_stats(pool, &after);
        cr_assert_eq(after.num_device_alloc, before.num_device_alloc + (i == 0 ? 1 : i == 1),
                     "size %zu: no segment beyond the first of each pool", sizes[i]);
        if (i > 0)
            cr_assert_eq(after.num_quick_hits, before.num_quick_hits + 1, "size %zu", sizes[i]);
        cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
        check();
    }
    stow_stats_t s;
    stow_pool_stats(pool, &s);
    cr_assert_eq(s.num_event_records, 0);
    cr_assert_eq(s.num_sync_all_streams, 0);
    finish();
}

/* With no events a refused scrub is the only thing that keeps a block
 * pending: empty_cache must still synchronize and try it again. */
Test(stream, without_events_a_refused_scrub_is_retried_at_empty_cache)
{
    single_stream_pool(ts_sim(64 * MIB, true, false), true); /* host-backed: real bytes */
    unsigned char *a = alloc_on(S1, 3 * MIB);
    memset(a, 0xCD, 3 * MIB);
    stow_sim_fail_nth(sim, STOW_SIM_SCRUB, 1, STOW_EBACKEND);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    unsigned char *b = alloc_on(S2, 3 * MIB);
    cr_assert_neq(b, a, "the unscrubbed block is not reused on any stream");
    check();
    cr_assert_eq(stow_empty_cache(pool), STOW_OK); /* b keeps the segment */
    stow_stats_t s;
    stow_pool_stats(pool, &s);
    cr_assert_eq(s.active_bytes[STOW_POOL_ALL].current, 3 * MIB, "a scrubbed and freed, b live");
    cr_assert_eq(s.num_scrub_failures, 1);
    cr_assert_eq(s.num_sync_all_streams, 1);
    check();
    unsigned char *d = alloc_on(S1, 3 * MIB);
    cr_assert_eq(d, a, "the scrubbed block is reusable again");
    for (size_t i = 0; i < 3 * MIB; i++)
        if (d[i])
            cr_assert_fail("byte %zu not scrubbed", i);
    cr_assert_eq(stow_pool_free(pool, d), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    finish();
}

Test(stream, without_events_record_stream_is_accepted_and_orders_nothing,
     .init = setup_single_stream)
{
    void *a = alloc_on(S1, 16 * MIB);
    cr_assert_eq(stow_record_stream(pool, a, S2), STOW_OK);
    cr_assert_eq(stow_record_stream(pool, (char *)a + 512, S2), STOW_ENOTOWNED);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    stow_stats_t s;
    stow_pool_stats(pool, &s);
    cr_assert_eq(s.active_bytes[STOW_POOL_ALL].current, 0, "nothing waits for an event");
    cr_assert_eq(alloc_on(S2, 16 * MIB), a);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    stow_pool_stats(pool, &s);
    cr_assert_eq(s.num_event_records, 0);
    cr_assert_eq(s.num_sync_all_streams, 0, "empty_cache has no stream to wait for");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 0);
    finish();
}
