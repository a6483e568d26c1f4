/*
 * tests/unit/test_vmm_handles.c: physical handles of several granules in a
 * page-mapped pool (the constant vmm_handle_mb, allocator/vmm.c): how a block's
 * stretches of unmapped granules are cut into handles, that a handle is
 * unmapped only whole (never while a live block holds part of it), that an
 * idle handle of the size a block needs is remapped as it is and one of
 * another size goes back to the device for a new one, that remaps of whole
 * handles wait for the work queued before their blocks were freed, the books
 * after a refused map or create, handles shrinking near the device's limit,
 * and growth mapping ahead of a block within the allowance. Through the public
 * API on the simulated device, with stow_pool_check (vmm_check.c: each mapping
 * a start and granules of one handle) along the way.
 */
#include <criterion/criterion.h>

#include "test_support.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define G (2 * MIB)

static stow_backend_t *sim;
static stow_pool_t *pool;

/* A vmm pool whose handles are at most handle_mb, with vmm_slack `slack`, on a
 * fresh simulated device (capacity 0: the default, far from any limit). */
static void make_pool(size_t capacity, bool manual_events, unsigned handle_mb, double slack)
{
    sim = ts_sim(capacity, false, manual_events);
    cr_assert_not_null(sim);
    stow_config_t c;
    stow_config_default(&c);
    c.policy = STOW_POLICY_VMM;
    stow_tuning_t t;
    stow_tuning_default(&t);
    t.vmm_handle_mb = handle_mb;
    t.vmm_slack = slack;
    cr_assert_eq(stow_pool_create_tuned(&c, &t, sim, &pool), STOW_OK);
}

static stow_stats_t stats(void) { return ts_pool_stats(pool); }

static void check(void) { ts_pool_check(pool); }

static void *alloc_on(size_t size, stow_stream_t stream)
{
    void *p = NULL;
    cr_assert_eq(stow_pool_alloc(pool, size, stream, &p), STOW_OK, "alloc %zu", size);
    return p;
}

static void *alloc_ok(size_t size) { return alloc_on(size, NULL); }

static void free_ok(void *p) { cr_assert_eq(stow_pool_free(pool, p), STOW_OK); }

static void finish(void)
{
    check();
    cr_assert_eq(stow_pool_destroy(pool), STOW_OK);
    ts_sim_assert_released_then_destroy(sim);
}

static uint64_t reserved(void) { return stats().reserved_bytes[STOW_POOL_ALL].current; }

/* 8 MiB handles (4 granules). An 8 MiB block from the range's start: one
 * handle. A 20 MiB block after it, both ends on granule boundaries: 10
 * granules in handles of 4, 3 and 3. */
Test(vmm_handles, a_stretch_is_cut_into_handles_of_at_most_the_largest_size)
{
    make_pool(0, false, 8, 0.0095);
    void *a = alloc_ok(8 * MIB);
    stow_stats_t s = stats();
    cr_assert_eq(s.num_map_calls, 1);
    cr_assert_eq(s.num_device_alloc, 1);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 8 * MIB);
    void *b = alloc_ok(20 * MIB);
    cr_assert_eq((char *)b - (char *)a, (ptrdiff_t)(8 * MIB));
    s = stats();
    cr_assert_eq(s.num_map_calls, 4, "3 handles for 10 granules");
    cr_assert_eq(s.num_device_alloc, 4);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 28 * MIB);
    stow_sim_counters_t c;
    stow_sim_counters(sim, &c);
    cr_assert_eq(c.calls[STOW_SIM_MAP], 4, "the device saw one map per handle");
    check();
    free_ok(a);
    free_ok(b);
    finish();
}

/* A stretch longer than the largest handle keeps each end the block covers
 * only in part as a granule of its own: a 1 MiB block a in granule 0, then b
 * of 18 MiB at [1, 19) MiB: granules 1..9 to map, granule 9 only in part.
 * Handles: [1, 5), [5, 9) and [9]. Freed, b leaves three idle mappings, which
 * empty_cache unmaps (3 calls), while granule 0 stays under a. */
Test(vmm_handles, a_partial_end_of_a_long_stretch_is_a_granule_of_its_own)
{
    make_pool(0, false, 8, 0.0095);
    void *a = alloc_ok(1 * MIB);
    void *b = alloc_ok(18 * MIB);
    cr_assert_eq((char *)b - (char *)a, (ptrdiff_t)(1 * MIB));
    stow_stats_t s = stats();
    cr_assert_eq(s.num_map_calls, 4, "a's granule, then b's 4 + 4 + 1");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 20 * MIB);
    check();
    free_ok(b);
    check();
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    s = stats();
    cr_assert_eq(s.num_unmap_calls, 3, "each idle mapping whole");
    cr_assert_eq(s.num_device_free, 3);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 2 * MIB, "a's granule");
    check();
    free_ok(a);
    finish();
}

/* A handle part of which a live block holds is never unmapped: x (8 MiB, one
 * handle of 4 granules) freed, y (2 MiB) takes the start of its room. At
 * empty_cache the 3 unused granules stay: their handle holds y. Once y is
 * freed the handle goes, in one call. */
Test(vmm_handles, a_handle_a_live_block_holds_in_part_is_not_unmapped)
{
    make_pool(0, false, 8, 0.0095);
    void *x = alloc_ok(8 * MIB);
    free_ok(x);
    void *y = alloc_ok(2 * MIB);
    cr_assert_eq(y, x, "best fit: the start of x's room");
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    stow_stats_t s = stats();
    cr_assert_eq(s.num_unmap_calls, 0);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 8 * MIB);
    cr_assert_eq(s.free_reserved_bytes, 6 * MIB, "mapped, unused, pinned by y");
    check();
    free_ok(y);
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    s = stats();
    cr_assert_eq(s.num_unmap_calls, 1);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 0);
    finish();
}

/* Two streams, so that stream 2 cannot take the room stream 1 freed: a (8 MiB,
 * 4 granules) and k (2 MiB) on stream 1, a freed. With vmm_slack 0 the live
 * peak (10 MiB) allows 5 granules, all held. Stream 2's c of c_bytes goes to
 * a range of its own: its granules come from a's handle. Of the same size (8 MiB), the handle
 * is unmapped and mapped under c as it is; of another (6 MiB), it goes back
 * to the device and one of 3 granules is created. Either way the remap waits
 * for a's free (an event on stream 1), not for the device. */
static void remap_of_a_whole_handle(size_t c_bytes, uint64_t created, uint64_t released)
{
    make_pool(0, true, 8, 0.0);
    stow_stream_t s1 = (stow_stream_t)(uintptr_t)1, s2 = (stow_stream_t)(uintptr_t)2;
    void *a = alloc_on(8 * MIB, s1), *k = alloc_on(2 * MIB, s1);
    free_ok(a);
    stow_stats_t before = stats();
    cr_assert_eq(before.num_device_alloc, 2);
    void *c = alloc_on(c_bytes, s2);
    cr_assert((uintptr_t)c > (uintptr_t)k, "c goes to stream 2's range, on new granules");
    stow_stats_t s = stats();
    cr_assert_eq(s.num_unmap_calls, 1, "a's handle, whole");
    cr_assert_eq(s.num_map_calls - before.num_map_calls, 1, "c on one handle");
    cr_assert_eq(s.num_device_alloc - before.num_device_alloc, created);
    cr_assert_eq(s.num_device_free - before.num_device_free, released);
    /* The open epoch is closed (an event on each stream whose free count moved:
     * stream 1's free of a, stream 2's new range) and its events waited on. */
    cr_assert_geq(s.num_event_waits, 1, "waited for a's free");
    cr_assert_eq(s.num_event_waits, s.num_event_records);
    cr_assert_eq(s.num_sync_all_streams, 0, "and not for the device");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 2 * MIB + c_bytes);
    cr_assert(s.reserved_bytes[STOW_POOL_ALL].peak <= 10 * MIB, "never above the allowance");
    check();
    free_ok(c);
    free_ok(k);
    finish();
}

Test(vmm_handles, an_idle_handle_of_the_size_needed_is_remapped_as_it_is)
{
    remap_of_a_whole_handle(8 * MIB, 0, 0);
}

Test(vmm_handles, an_idle_handle_of_another_size_goes_back_for_one_of_the_size_needed)
{
    remap_of_a_whole_handle(6 * MIB, 1, 1);
}

/* A handle a live block holds in part is not remapped: with vmm_slack 0, x
 * (8 MiB, one handle of 4 granules) and w (2 MiB) live, x freed and y (2 MiB)
 * taking the start of its room. z (8 MiB) does not fit the 6 MiB left there
 * and goes above w: 4 granules to map. The live peak (12 MiB) allows 6, the
 * pool holds 5, and the only unused granules are in x's handle, under y:
 * nothing to remap, so z's handle is created beyond the allowance (18 MiB
 * held for 12 live: what handles of several granules can cost). */
Test(vmm_handles, with_no_idle_handle_the_block_is_given_a_new_one)
{
    make_pool(0, false, 8, 0.0);
    void *x = alloc_ok(8 * MIB), *w = alloc_ok(2 * MIB);
    free_ok(x);
    void *y = alloc_ok(2 * MIB);
    void *z = alloc_ok(8 * MIB);
    cr_assert((uintptr_t)z > (uintptr_t)w);
    stow_stats_t s = stats();
    cr_assert_eq(s.num_unmap_calls, 0);
    cr_assert_eq(s.num_device_alloc, 3, "x's, w's and z's handles");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 18 * MIB);
    check();
    free_ok(y);
    free_ok(z);
    free_ok(w);
    finish();
}

/* A request whose second map (of three handles) is refused gives back what it
 * created: the pool and the device hold what they held before, and the books
 * are exact. Then a create refused the same way. */
Test(vmm_handles, a_refused_map_or_create_midway_leaves_what_the_pool_held)
{
    make_pool(0, false, 8, 0.0095);
    void *a = alloc_ok(4 * MIB);
    uint64_t held = reserved();
    void *out = NULL;
    stow_sim_fail_nth(sim, STOW_SIM_MAP, 2, STOW_EBACKEND);
    cr_assert_eq(stow_pool_alloc(pool, 20 * MIB, NULL, &out), STOW_EBACKEND);
    cr_assert_eq(reserved(), held);
    stow_sim_counters_t c;
    stow_sim_counters(sim, &c);
    cr_assert_eq(c.reserved_bytes, held, "the device holds what the pool holds");
    check();
    stow_sim_fail_nth(sim, STOW_SIM_PHYS_CREATE, 2, STOW_EBACKEND);
    cr_assert_eq(stow_pool_alloc(pool, 20 * MIB, NULL, &out), STOW_EBACKEND);
    cr_assert_eq(reserved(), held);
    check();
    void *b = alloc_ok(20 * MIB);
    check();
    free_ok(b);
    free_ok(a);
    finish();
}

/* Near the device's limit a handle takes at most 1/4096 of what the pool may
 * still take: on a 64 GiB device (16 MiB of headroom per 4096) 20 MiB handles
 * shrink to 8 granules, so 32 MiB from the range's start is 2 handles; on a
 * 1 GiB device every handle is a granule, as with vmm_handle_mb:2. */
Test(vmm_handles, near_the_device_limit_handles_shrink_to_a_granule)
{
    make_pool((size_t)64 << 30, false, 20, 0.0095);
    void *a = alloc_ok(32 * MIB);
    cr_assert_eq(stats().num_map_calls, 2);
    check();
    free_ok(a);
    finish();
    make_pool((size_t)1 << 30, false, 20, 0.0095);
    a = alloc_ok(32 * MIB);
    cr_assert_eq(stats().num_map_calls, 16);
    check();
    free_ok(a);
    finish();
}

/* Growth at the top of a range maps ahead of the block, into half the room
 * the allowance leaves: with 8 MiB handles (4 granules) and vmm_slack 1, a
 * (8 MiB) is one handle; b (2 MiB) lifts the live peak to 10 MiB, which allows
 * 10 granules: 5 held with b's, half the 5 left is 2, so b's handle is 3
 * granules. c (4 MiB) then lies on b's unused two: no call. */
Test(vmm_handles, growth_maps_ahead_within_half_the_room_the_allowance_leaves)
{
    make_pool(0, false, 8, 1.0);
    void *a = alloc_ok(8 * MIB);
    void *b = alloc_ok(2 * MIB);
    cr_assert_eq((char *)b - (char *)a, (ptrdiff_t)(8 * MIB));
    stow_stats_t s = stats();
    cr_assert_eq(s.num_map_calls, 2);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 14 * MIB, "b's handle: 3 granules");
    cr_assert_eq(s.free_reserved_bytes, 4 * MIB, "two granules mapped ahead, unused");
    check();
    void *c = alloc_ok(4 * MIB);
    cr_assert_eq((char *)c - (char *)b, (ptrdiff_t)(2 * MIB));
    s = stats();
    cr_assert_eq(s.num_map_calls, 2, "c takes the granules mapped ahead");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 14 * MIB);
    check();
    free_ok(c);
    free_ok(b);
    free_ok(a);
    finish();
}
