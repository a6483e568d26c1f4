/*
 * tests/unit/test_vmm.c: page-mapped segments (allocator/vmm.c and the
 * vmm_*.c files beside it, tested together through the public API): physical
 * granules only under live blocks, remapping of unused granules instead of
 * growth, stream safety of remaps (vmm_epochs.c), placement (vmm_place.c),
 * the adaptive allowance (vmm_allowance.c), capacity limits, empty_cache,
 * faults, with stow_pool_check (vmm_check.c) along the way. Every pool here
 * maps a handle per granule (vmm_handle_mb:2), so that each scenario's calls
 * and remaps are those of single granules; handles of several granules are
 * tested in test_vmm_handles.c.
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "test_support.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define G (2 * MIB)

static stow_backend_t *sim;
static stow_pool_t *pool;
/* Set: the pool's backend is the simulated device without event_synchronize,
 * so that a remap synchronizes where it would wait on events. */
static bool no_event_waits;
static stow_backend_t without_event_waits;

/* The default constants but a physical handle per granule (vmm_handle_mb 2). */
static stow_tuning_t per_granule(void)
{
    stow_tuning_t t;
    stow_tuning_default(&t);
    t.vmm_handle_mb = 2;
    return t;
}

/* A vmm pool on a fresh simulated device, the defaults but for vmm_slack,
 * vmm_slack_max, a handle per granule and no learned step. */
static void make_vmm_slacks(size_t capacity, bool manual_events, double slack, double slack_max)
{
    sim = ts_sim(capacity, false, manual_events);
    cr_assert_not_null(sim);
    without_event_waits = *sim;
    without_event_waits.event_synchronize = NULL;
    stow_config_t c;
    stow_config_default(&c);
    c.policy = STOW_POLICY_VMM;
    stow_tuning_t tuning = per_granule(); /* a handle per granule */
    tuning.vmm_learn_step = false; /* the allowance alone (test_vmm_learn.c: the learned step) */
    tuning.vmm_slack = slack;
    tuning.vmm_slack_max = slack_max;
    cr_assert_eq(stow_pool_create_tuned(&c, &tuning, no_event_waits ? &without_event_waits : sim,
                                        &pool),
                 STOW_OK);
}

/* A vmm pool on a fresh simulated device; `no_slack` sets vmm_slack to 0. */
static void make_vmm_pool(size_t capacity, bool manual_events, bool no_slack)
{
    stow_tuning_t d;
    stow_tuning_default(&d);
    make_vmm_slacks(capacity, manual_events, no_slack ? 0 : d.vmm_slack, d.vmm_slack_max);
}

static void make_vmm(size_t capacity, bool manual_events)
{
    make_vmm_pool(capacity, manual_events, false);
}

/* Events completed by hand (blocks freed on one stream stay out of another's
 * reach) and no slack: every granule beyond the live bytes is remapped. */
static void make_vmm_tight(void) { make_vmm_pool(0, true, true); }

static void check(void) { ts_pool_check(pool); }

static stow_stats_t stats(void) { return ts_pool_stats(pool); }

/* How a pool waited for queued work before unmapping: device synchronizes,
 * and waits on single events (event_synchronize). */
typedef struct waits {
    uint64_t syncs, events;
} waits_t;

static waits_t waits_now(void)
{
    stow_stats_t s = stats();
    return (waits_t){s.num_sync_all_streams, s.num_event_waits};
}

static waits_t waits_since(waits_t before)
{
    waits_t now = waits_now();
    return (waits_t){now.syncs - before.syncs, now.events - before.events};
}

/* Remaps that waited n times, as the backend lets them: on events alone,
 * without a synchronize, or (no_event_waits) by synchronizing. */
static void assert_waits(waits_t added, uint64_t n, const char *why)
{
    cr_assert_eq(added.syncs, no_event_waits ? n : 0, "%s: synchronizes", why);
    cr_assert_eq(added.events, no_event_waits ? 0 : n, "%s: event waits", why);
}

static void assert_remap_waits(waits_t before, uint64_t n, const char *why)
{
    assert_waits(waits_since(before), n, why);
}

static void *alloc_ok(size_t size)
{
    void *p = NULL;
    cr_assert_eq(stow_pool_alloc(pool, size, NULL, &p), STOW_OK, "alloc %zu", size);
    return p;
}

static void finish(void)
{
    check();
    cr_assert_eq(stow_pool_destroy(pool), STOW_OK);
    ts_sim_assert_released_then_destroy(sim);
}

Test(vmm, physical_memory_only_under_live_blocks)
{
    make_vmm(0, false);
    void *a = alloc_ok(3 * MIB); /* 2 granules */
    stow_stats_t s = stats();
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 2 * G);
    cr_assert_eq(s.num_map_calls, 2);
    cr_assert_eq(s.segment[STOW_POOL_LARGE].current, 1, "one virtual range");
    void *b = alloc_ok(1 * MIB + 4 * KIB); /* large pool, continues in granule 2 */
    cr_assert_eq((char *)b - (char *)a, (ptrdiff_t)(3 * MIB));
    s = stats();
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 3 * G);
    check();
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    s = stats();
    /* Unused granules stay mapped (cached) until needed elsewhere. */
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 3 * G);
    cr_assert_eq(s.free_reserved_bytes, 3 * G);
    cr_assert_eq(s.fragmentation, 0.0, "physical memory is fungible");
    finish();
}

/* A vmm pool whose requests all share one range (vmm_small_kb:0). */
static void make_vmm_one_range(void)
{
    sim = ts_sim(0, false, false);
    cr_assert_not_null(sim);
    stow_config_t c;
    stow_config_default(&c);
    c.policy = STOW_POLICY_VMM;
    stow_tuning_t tuning = per_granule(); /* a handle per granule */
    tuning.vmm_small_kb = 0;
    cr_assert_eq(stow_pool_create_tuned(&c, &tuning, sim, &pool), STOW_OK);
}

Test(vmm, small_requests_share_granules_in_a_range_of_their_own)
{
    make_vmm(0, false);
    void *p[100];
    for (int i = 0; i < 100; i++)
        p[i] = alloc_ok(10 * KIB);
    stow_stats_t s = stats();
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, G, "1000 KiB in one granule");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_SMALL].current, G, "in the small range");
    cr_assert_eq(s.segment[STOW_POOL_SMALL].current, 1);
    cr_assert_eq(s.segment[STOW_POOL_LARGE].current, 0, "no large range yet");
    cr_assert_eq(s.allocated_bytes[STOW_POOL_SMALL].current, 100 * 10 * KIB);
    /* The first request over vmm_small_kb (128 KiB) opens the large range:
     * the two never share a granule. */
    void *big = alloc_ok(128 * KIB + 512);
    s = stats();
    cr_assert_eq(s.segment[STOW_POOL_LARGE].current, 1);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_LARGE].current, G);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 2 * G);
    void *edge = alloc_ok(128 * KIB); /* at the limit: small */
    s = stats();
    cr_assert_eq(s.allocated_bytes[STOW_POOL_SMALL].current, 100 * 10 * KIB + 128 * KIB);
    check();
    for (int i = 0; i < 100; i++)
        cr_assert_eq(stow_pool_free(pool, p[i]), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, big), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, edge), STOW_OK);
    finish();
}

Test(vmm, with_vmm_small_kb_0_small_requests_share_the_large_range)
{
    make_vmm_one_range();
    void *p[100];
    for (int i = 0; i < 100; i++)
        p[i] = alloc_ok(10 * KIB);
    stow_stats_t s = stats();
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, G, "1000 KiB in one granule");
    /* One range for every request: small ones count in the large pool. */
    cr_assert_eq(s.reserved_bytes[STOW_POOL_SMALL].current, 0);
    cr_assert_eq(s.segment[STOW_POOL_ALL].current, 1);
    cr_assert_eq(s.allocated_bytes[STOW_POOL_LARGE].current, 100 * 10 * KIB);
    /* No small range, so no quick lists: a freed block merges at once. */
    cr_assert_eq(stow_pool_free(pool, p[0]), STOW_OK);
    p[0] = alloc_ok(10 * KIB);
    cr_assert_eq(stats().num_quick_hits, 0);
    check();
    for (int i = 0; i < 100; i++)
        cr_assert_eq(stow_pool_free(pool, p[i]), STOW_OK);
    finish();
}

/* The small range keeps freed blocks of at most 64 KiB whole on quick lists,
 * still mapped: taken again, they map nothing and search no index. */
Test(vmm, small_range_blocks_are_kept_on_quick_lists)
{
    make_vmm(0, false);
    void *a = alloc_ok(4 * KIB), *b = alloc_ok(64 * KIB), *c = alloc_ok(100 * KIB);
    stow_stats_t before = stats();
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, c), STOW_OK); /* over 64 KiB: merged at once */
    check(); /* kept blocks still hold their granule (vmm_check counts them) */
    stow_stats_t s = stats();
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, G);
    cr_assert_eq(s.allocated_bytes[STOW_POOL_ALL].current, 0);
    cr_assert_eq(alloc_ok(64 * KIB), b);
    cr_assert_eq(alloc_ok(4 * KIB), a);
    s = stats();
    cr_assert_eq(s.num_quick_hits, 2);
    cr_assert_eq(s.num_map_calls, before.num_map_calls);
    cr_assert_eq(s.num_unmap_calls, before.num_unmap_calls);
    check();
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    /* empty_cache merges kept blocks and gives their granule back. */
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    s = stats();
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 0);
    check();
    finish();
}

/* A page-mapped pool's quick lists are at most STOW_VMM_QUICK_DEPTH_MAX (16)
 * deep, whatever quick_depth says (64 by default): a kept block holds its
 * granules. Twenty 4 KiB blocks freed on one stream: the first 16 are kept,
 * the last 4 merge. Twenty requested again: 16 come off the list, 4 from the
 * free index (64 deep, all 20 would be hits). */
Test(vmm, quick_lists_of_a_page_mapped_pool_are_at_most_16_deep)
{
    stow_tuning_t d;
    stow_tuning_default(&d);
    cr_assert_gt(d.quick_depth, STOW_VMM_QUICK_DEPTH_MAX, "the default is deeper than the cap");
    cr_assert_eq(STOW_VMM_QUICK_DEPTH_MAX, 16);
    make_vmm(0, false);
    void *p[20];
    for (int i = 0; i < 20; i++)
        p[i] = alloc_ok(4 * KIB);
    for (int i = 0; i < 20; i++)
        cr_assert_eq(stow_pool_free(pool, p[i]), STOW_OK);
    check();
    uint64_t hits = stats().num_quick_hits;
    for (int i = 0; i < 20; i++)
        p[i] = alloc_ok(4 * KIB);
    stow_stats_t s = stats();
    cr_assert_eq(s.num_quick_hits - hits, STOW_VMM_QUICK_DEPTH_MAX, "%llu quick hits",
                 (unsigned long long)(s.num_quick_hits - hits));
    cr_assert_eq(s.num_quick_flushes, 0);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, G);
    check();
    for (int i = 0; i < 20; i++)
        cr_assert_eq(stow_pool_free(pool, p[i]), STOW_OK);
    finish();
}

/* Kept blocks hold granules: before the small range maps another, they are
 * merged (as a classic pool merges them before it grows), and the request
 * takes the room they leave. */
Test(vmm, quick_lists_are_merged_before_the_small_range_maps_a_granule)
{
    make_vmm(0, false);
    void *p[32];
    for (int i = 0; i < 32; i++)
        p[i] = alloc_ok(64 * KIB); /* granule 0 of the small range, full */
    cr_assert_eq(stow_pool_free(pool, p[10]), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, p[11]), STOW_OK); /* both kept */
    stow_stats_t before = stats();
    cr_assert_eq(before.num_quick_flushes, 0);
    /* 96 KiB fits no kept block; best fit would be the range's unmapped top. */
    void *q = alloc_ok(96 * KIB);
    stow_stats_t s = stats();
    cr_assert_eq(s.num_quick_flushes, 1);
    cr_assert_eq(q, p[10], "the 128 KiB the two kept blocks left, merged");
    cr_assert_eq(s.num_map_calls, before.num_map_calls, "no granule mapped");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, G);
    check();
    /* A request that a held granule serves does not flush. */
    cr_assert_eq(stow_pool_free(pool, p[0]), STOW_OK);
    void *r = alloc_ok(32 * KIB);
    cr_assert_eq(stats().num_quick_flushes, 1);
    check();
    for (int i = 1; i < 32; i++)
        if (i != 10 && i != 11)
            cr_assert_eq(stow_pool_free(pool, p[i]), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, q), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, r), STOW_OK);
    finish();
}

/* A best fit that counts as mapping nothing lies inside ONE granule a live
 * block holds; one that starts in such a granule but runs into the next
 * would map that one, so the kept blocks are merged first. 31 blocks of
 * 64 KiB fill the small range's granule 0 up to 1984 KiB; p[10] and p[11]
 * freed are kept. 96 KiB fits no kept block; best fit is the free top of
 * the range, [1984, 2080) KiB: granule 0 (held) and granule 1 (unmapped).
 * Merged, p[10] and p[11] leave 128 KiB in granule 0, which takes it: one
 * flush, no granule mapped. (Judged by its first granule alone, the request
 * went to the top without a flush and mapped granule 1: 4 MiB reserved.) */
Test(vmm, quick_lists_are_merged_before_a_small_fit_runs_into_the_next_granule)
{
    make_vmm(0, false);
    void *p[31];
    for (int i = 0; i < 31; i++)
        p[i] = alloc_ok(64 * KIB);
    cr_assert_eq(stow_pool_free(pool, p[10]), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, p[11]), STOW_OK); /* both kept */
    stow_stats_t before = stats();
    cr_assert_eq(before.num_quick_flushes, 0);
    cr_assert_eq(before.reserved_bytes[STOW_POOL_ALL].current, G, "granule 0 alone");
    void *q = alloc_ok(96 * KIB);
    stow_stats_t s = stats();
    cr_assert_eq(s.num_quick_flushes, 1, "the fit at the top crossed into granule 1");
    cr_assert_eq(q, p[10], "the 128 KiB the two kept blocks left, merged");
    cr_assert_eq(s.num_map_calls, before.num_map_calls, "no granule mapped");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, G);
    check();
    for (int i = 0; i < 31; i++)
        if (i != 10 && i != 11)
            cr_assert_eq(stow_pool_free(pool, p[i]), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, q), STOW_OK);
    finish();
}

/* Kept blocks are merged before a page-mapped range grows too, and the
 * granules they held are unused then: under the allowance, the new range
 * remaps them instead of creating more. Slack 0, so the allowance is the
 * live peak, one granule. s1's 64 KiB block, freed, is kept on s1's list
 * and holds s1's small range's granule; s2's first small request fits none
 * of s2's free blocks (s1's kept one is s1's): the flush makes s1's granule
 * unused and s2's new range takes it, one unmap, 2 MiB reserved. (Growing
 * with the block still kept, no granule was unused: a second handle, 4 MiB,
 * no flush, no unmap.) */
Test(vmm, quick_lists_are_merged_before_a_range_grows)
{
    stow_stream_t s1 = (stow_stream_t)0x11, s2 = (stow_stream_t)0x22;
    make_vmm_pool(0, false, true);
    void *a, *b;
    cr_assert_eq(stow_pool_alloc(pool, 64 * KIB, s1, &a), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK); /* kept */
    stow_stats_t before = stats();
    cr_assert_eq(before.reserved_bytes[STOW_POOL_ALL].current, G);
    cr_assert_eq(before.num_quick_flushes, 0);
    cr_assert_eq(stow_pool_alloc(pool, 64 * KIB, s2, &b), STOW_OK);
    stow_stats_t s = stats();
    cr_assert_eq(s.segment[STOW_POOL_SMALL].current, 2, "s2's small range was built");
    cr_assert_eq(s.num_quick_flushes, 1, "s1's kept block merged before the range grew");
    cr_assert_eq(s.num_unmap_calls, 1, "s1's granule, remapped");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, G, "no second handle");
    cr_assert_eq(s.num_device_alloc, 1);
    check();
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    finish();
}

/* Requests of the large range smaller than a granule (here 256 and 512 KiB,
 * above vmm_small_kb) fill the partly used last granule of a large block, and
 * the edge of a hole in a granule live blocks hold, instead of granules of
 * their own (the classic pool gives them a 2 MiB small segment). */
Test(vmm, small_requests_fill_partly_used_granules)
{
    make_vmm(0, false);
    void *big = alloc_ok(3 * MIB); /* granules 0-1, 1 MiB of granule 1 free */
    void *small[2];
    for (int i = 0; i < 2; i++)
        small[i] = alloc_ok(256 * KIB);
    stow_stats_t s = stats();
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 2 * G, "no granule of their own");
    cr_assert_eq(s.num_map_calls, 2);
    cr_assert_eq((char *)small[0] - (char *)big, (ptrdiff_t)(3 * MIB), "right after the big block");
    /* A hole from 3.5 MiB to 6.5 MiB between live blocks: its low edge lies in
     * granule 1, which big and the small blocks hold. */
    void *mid = alloc_ok(3 * MIB);   /* granules 1-3 */
    void *after = alloc_ok(2 * MIB); /* granules 3-4 */
    cr_assert_eq(stow_pool_free(pool, mid), STOW_OK);
    void *edge = alloc_ok(512 * KIB);
    cr_assert_eq((char *)edge - (char *)big, (ptrdiff_t)(3 * MIB + 512 * KIB),
                 "best fit: the low edge of the hole");
    s = stats();
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 5 * G);
    cr_assert_eq(s.num_map_calls, 5, "no granule mapped for it");
    check();
    cr_assert_eq(stow_pool_free(pool, edge), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, after), STOW_OK);
    for (int i = 0; i < 2; i++)
        cr_assert_eq(stow_pool_free(pool, small[i]), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, big), STOW_OK);
    finish();
}

/* Non-releasable memory of a page-mapped pool is physical: the free bytes of
 * granules that also hold live data, not the free virtual address space of
 * the range (which once read 64 GiB on a pool holding 5.65). Free blocks
 * between live blocks still count (inactive_split). */
Test(vmm, inactive_split_bytes_are_memory_beside_live_data)
{
    make_vmm(0, false);
    void *big = alloc_ok(3 * MIB); /* granules 0-1: 1 MiB of granule 1 beside it */
    stow_stats_t s = stats();
    cr_assert_eq(s.inactive_split_bytes[STOW_POOL_ALL].current, 1 * MIB);
    cr_assert_eq(s.inactive_split_bytes[STOW_POOL_LARGE].current, 1 * MIB);
    cr_assert_eq(s.inactive_split_bytes[STOW_POOL_SMALL].current, 0);
    void *small = alloc_ok(256 * KIB); /* in granule 1, right after big */
    s = stats();
    cr_assert_eq(s.inactive_split_bytes[STOW_POOL_ALL].current, 768 * KIB);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 2 * G);
    /* Then a hole between live blocks. */
    void *mid = alloc_ok(4 * MIB);   /* 3.25 MiB to 7.25: granules 1-3 */
    void *after = alloc_ok(1 * MIB); /* 7.25 to 8.25: granules 3-4 */
    s = stats();
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 5 * G);
    cr_assert_eq(s.inactive_split_bytes[STOW_POOL_ALL].current, 1 * MIB + 768 * KIB);
    cr_assert_eq(stow_pool_free(pool, mid), STOW_OK);
    s = stats();
    cr_assert_eq(s.inactive_split[STOW_POOL_ALL].current, 2, "the hole and the top of the range");
    /* Granule 2 alone lies wholly in the hole (idle now); granule 1 holds big
     * and small, granule 3 holds after: 10 MiB held - 4.25 live - 2 idle. */
    cr_assert_eq(s.inactive_split_bytes[STOW_POOL_ALL].current, 3 * MIB + 768 * KIB);
    check();
    cr_assert_eq(stow_pool_free(pool, after), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, small), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, big), STOW_OK);
    s = stats();
    cr_assert_eq(s.inactive_split_bytes[STOW_POOL_ALL].current, 0, "no live data");
    cr_assert_eq(s.inactive_split_bytes[STOW_POOL_ALL].peak, 3 * MIB + 768 * KIB);
    cr_assert_eq(s.inactive_split[STOW_POOL_ALL].current, 0, "one free block: the whole range");
    finish();
}

/* Each range kind books its own memory beside live data: booked whole under
 * large_pool, the figure could read more non-releasable memory than that kind
 * reserved. 100 blocks of 10 KiB in the
 * small range: 1000 KiB of its 2 MiB granule live; a 3 MiB block in the
 * large range leaves 1 MiB of its second granule beside it. */
Test(vmm, inactive_split_bytes_are_booked_per_range_kind)
{
    make_vmm(0, false);
    void *p[100];
    for (int i = 0; i < 100; i++)
        p[i] = alloc_ok(10 * KIB);
    void *big = alloc_ok(3 * MIB);
    stow_stats_t s = stats();
    cr_assert_eq(s.reserved_bytes[STOW_POOL_SMALL].current, G);
    cr_assert_eq(s.inactive_split_bytes[STOW_POOL_SMALL].current, G - 100 * 10 * KIB);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_LARGE].current, 2 * G);
    cr_assert_eq(s.inactive_split_bytes[STOW_POOL_LARGE].current, 1 * MIB);
    cr_assert_eq(s.inactive_split_bytes[STOW_POOL_ALL].current, G - 100 * 10 * KIB + 1 * MIB);
    check();
    /* Freed, the small blocks stay on quick lists up to their depth and hold
     * their granule as live data; the rest merge. The books stay exact. */
    for (int i = 0; i < 100; i++)
        cr_assert_eq(stow_pool_free(pool, p[i]), STOW_OK);
    check();
    cr_assert_eq(stow_pool_free(pool, big), STOW_OK);
    s = stats();
    cr_assert_eq(s.inactive_split_bytes[STOW_POOL_LARGE].current, 0, "no live data there");
    cr_assert_eq(s.inactive_split_bytes[STOW_POOL_LARGE].peak, 1 * MIB);
    cr_assert(s.inactive_split_bytes[STOW_POOL_SMALL].peak >= G - 100 * 10 * KIB);
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    s = stats();
    cr_assert_eq(s.inactive_split_bytes[STOW_POOL_ALL].current, 0, "kept blocks merged");
    finish();
}

/* A handle whose map was refused waits on the free stack, booked under the
 * range it was meant for, and moves its reserved bytes to whichever range
 * maps it next. Device of 2 granules: big holds one (large range), a 100 KiB
 * block (small range, too big for its quick lists) the other. Freed, its
 * granule is remapped for a 2 MiB request above big, whose map is refused:
 * the handle waits, booked large. The next small request takes it. */
Test(vmm, a_free_handle_moves_its_reserved_bytes_to_the_range_that_maps_it)
{
    make_vmm(2 * G, false);
    void *big = alloc_ok(2 * MIB);
    cr_assert_eq(stow_pool_free(pool, alloc_ok(100 * KIB)), STOW_OK);
    stow_stats_t s = stats();
    cr_assert_eq(s.reserved_bytes[STOW_POOL_SMALL].current, G);
    stow_sim_fail_nth(sim, STOW_SIM_MAP, 1, STOW_EBACKEND);
    void *out;
    cr_assert_eq(stow_pool_alloc(pool, 2 * MIB, NULL, &out), STOW_EBACKEND);
    s = stats();
    cr_assert_eq(s.num_unmap_calls, 1, "the small range's granule, taken for the request");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_SMALL].current, 0);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_LARGE].current, 2 * G, "big's and the waiting one");
    check();
    void *small = alloc_ok(100 * KIB);
    s = stats();
    cr_assert_eq(s.num_device_alloc, 2, "the waiting handle, not a new one");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_SMALL].current, G);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_LARGE].current, G);
    check();
    cr_assert_eq(stow_pool_free(pool, small), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, big), STOW_OK);
    finish();
}

/* At the device's limit the out-of-memory retry merges kept blocks too, so
 * the granule they held goes to the request that needs it. */
Test(vmm, kept_blocks_give_their_granule_back_at_the_device_limit)
{
    make_vmm(4 * G, false);
    /* The large range exists, so the request below does not grow the pool
     * (which would merge kept blocks first); its unused granule is remapped
     * for the small range under the allowance. */
    cr_assert_eq(stow_pool_free(pool, alloc_ok(256 * KIB)), STOW_OK);
    void *p[32];
    for (int i = 0; i < 32; i++)
        p[i] = alloc_ok(64 * KIB); /* the small range's granule, full */
    for (int i = 0; i < 32; i++)
        cr_assert_eq(stow_pool_free(pool, p[i]), STOW_OK);
    stow_stats_t s = stats();
    cr_assert_eq(s.reserved_bytes[STOW_POOL_SMALL].current, G, "kept blocks hold it");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, G);
    check();
    void *big = alloc_ok(4 * G); /* every granule of the device */
    s = stats();
    cr_assert_eq(s.num_alloc_retries, 1, "the out-of-memory retry");
    cr_assert_eq(s.num_quick_flushes, 1);
    cr_assert_eq(s.num_ooms, 0);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_SMALL].current, 0);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 4 * G);
    check();
    cr_assert_eq(stow_pool_free(pool, big), STOW_OK);
    finish();
}

/* max_split_size_mb does not apply to page-mapped pools: under it, no request
 * below the limit could take the free end of the range, and each would get a
 * range of its own. */
Test(vmm, max_split_size_leaves_one_range)
{
    sim = ts_sim(0, false, false);
    cr_assert_not_null(sim);
    stow_config_t c;
    stow_config_default(&c);
    c.policy = STOW_POLICY_VMM;
    stow_tuning_t tuning = per_granule(); /* a handle per granule */
    c.max_split_size_bytes = 20 * MIB;
    cr_assert_eq(stow_pool_create_tuned(&c, &tuning, sim, &pool), STOW_OK);
    void *p[6];
    size_t sizes[6] = {4 * KIB, 3 * MIB, 100 * KIB, 30 * MIB, 5 * MIB, 512};
    for (int i = 0; i < 6; i++)
        p[i] = alloc_ok(sizes[i]);
    stow_stats_t s = stats();
    cr_assert_eq(s.segment[STOW_POOL_LARGE].current, 1, "one large virtual range");
    cr_assert_eq(s.segment[STOW_POOL_SMALL].current, 1, "and the small one");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_LARGE].current, 19 * G, "38 MiB packed in 19 granules");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_SMALL].current, G, "104.5 KiB in one");
    check();
    for (int i = 0; i < 6; i++)
        cr_assert_eq(stow_pool_free(pool, p[i]), STOW_OK);
    finish();
}

/* A's free is the only one: the remap closes the open epoch with an event on
 * its stream and waits on it (or synchronizes, without event_synchronize). */
static void remap_instead_of_growing(void)
{
    make_vmm(0, false);
    void *a = alloc_ok(4 * MIB);
    void *b = alloc_ok(4 * MIB);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    /* 6 MiB does not fit a's 4 MiB hole: new addresses, 3 granules. The live
     * high-water becomes 10 MiB, 5 granules: one new handle, then a's two
     * granules are unmapped and mapped under the new block. */
    waits_t before = waits_now();
    void *c = alloc_ok(6 * MIB);
    stow_stats_t s = stats();
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 5 * G);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].peak, 5 * G);
    cr_assert_eq(s.num_unmap_calls, 2);
    assert_remap_waits(before, 1, "unmapping waits for queued work");
    cr_assert_eq(s.num_event_records, no_event_waits ? 0 : 1, "one event, on a's stream");
    check();
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, c), STOW_OK);
    finish();
}

Test(vmm, unused_granules_are_remapped_instead_of_growing)
{
    remap_instead_of_growing();
    no_event_waits = true;
    remap_instead_of_growing();
}

/* At the device's capacity a request that fits no free room takes the unused
 * granules of other rooms: 8 MiB device, four 2 MiB blocks a b d e fill it;
 * a and d freed leave two 1-granule rooms, so a 4 MiB request goes above e
 * and its 2 granules are a's and d's, unmapped and mapped again, with no new
 * handle. No out-of-memory retry may be needed to get there: a retry gives the
 * granules back to the device, and a pool without remapping would pass. */
Test(vmm, device_capacity_is_reached_by_remapping)
{
    make_vmm(8 * MIB, false);
    void *a = alloc_ok(2 * MIB), *b = alloc_ok(2 * MIB), *d = alloc_ok(2 * MIB);
    void *e = alloc_ok(2 * MIB);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, d), STOW_OK);
    stow_stats_t before = stats();
    cr_assert_eq(before.num_device_alloc, 4);
    void *c = alloc_ok(4 * MIB);
    cr_assert((uintptr_t)c > (uintptr_t)e, "no free room holds 4 MiB: c goes above e");
    stow_stats_t s = stats();
    cr_assert_eq(s.num_device_alloc, 4, "no handle beyond the device's 4 granules");
    cr_assert_eq(s.num_unmap_calls - before.num_unmap_calls, 2, "a's and d's granules");
    cr_assert_eq(s.num_map_calls - before.num_map_calls, 2);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].peak, 8 * MIB);
    cr_assert_eq(s.num_ooms, 0);
    check();
    /* Now every granule is live: 2 MiB more cannot be had. */
    void *out;
    cr_assert_eq(stow_pool_alloc(pool, 2 * MIB, NULL, &out), STOW_ENOMEM);
    s = stats();
    cr_assert_eq(s.num_ooms, 1);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 8 * MIB);
    char msg[768];
    cr_assert(stow_pool_oom_message(pool, msg, sizeof msg) > 0);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, c), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, e), STOW_OK);
    finish();
}

/* Unmapping is not stream-ordered, so a backend's single stream (no event
 * methods) is waited for too: before a remap, before empty_cache unmaps, and
 * at destroy. */
Test(vmm, without_events_granules_are_unmapped_only_after_a_synchronize)
{
    static stow_backend_t single_stream;
    sim = ts_sim(0, false, true);
    cr_assert_not_null(sim);
    single_stream = ts_single_stream(sim);
    stow_config_t cfg;
    stow_config_default(&cfg);
    cfg.policy = STOW_POLICY_VMM;
    stow_tuning_t tuning = per_granule(); /* a handle per granule */
    cr_assert_eq(stow_pool_create_tuned(&cfg, &tuning, &single_stream, &pool), STOW_OK);
    void *a = alloc_ok(4 * MIB);
    void *b = alloc_ok(4 * MIB);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    void *c = alloc_ok(6 * MIB); /* a's two granules move under it (as above) */
    stow_stats_t s = stats();
    cr_assert_eq(s.num_unmap_calls, 2);
    cr_assert_eq(s.num_sync_all_streams, 1, "the remap waited for the stream");
    cr_assert_eq(stow_pool_free(pool, c), STOW_OK);
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    s = stats();
    cr_assert_eq(s.num_unmap_calls, 5, "c's three granules");
    cr_assert_eq(s.num_sync_all_streams, 2, "empty_cache waited before unmapping them");
    check();
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    stow_sim_counters_t before;
    stow_sim_counters(sim, &before);
    cr_assert_eq(stow_pool_destroy(pool), STOW_OK);
    stow_sim_counters_t after;
    stow_sim_counters(sim, &after);
    cr_assert_eq(after.calls[STOW_SIM_SYNCHRONIZE], before.calls[STOW_SIM_SYNCHRONIZE] + 1,
                 "destroy waited before unmapping b's granules");
    cr_assert_eq(after.reserved_bytes, 0);
    cr_assert_eq(stow_sim_destroy(sim), STOW_OK);
}

/* A synchronize leaves no queued work on any granule unused so far: later
 * remaps of those granules need no second one. Single-stream backend (no
 * events: a synchronize is its only way to know), slack 0 and never raised,
 * so the allowance is the live peak. a b c d (4 MiB each) hold granules 0-7;
 * a and c freed leave 0-1 and 4-5 unused. e (6 MiB) fits neither hole and
 * goes above d: 3 granules, the live peak stays 16 MiB (8 granules), so it
 * remaps 0, 1 and 4 after one synchronize. f (2 MiB), best fit a's unmapped
 * room (the lower of two 4 MiB holes), remaps granule 5, freed before that
 * synchronize: no second one. */
Test(vmm, granules_unused_at_a_synchronize_are_remapped_later_without_another)
{
    static stow_backend_t single_stream;
    sim = ts_sim(0, false, false);
    cr_assert_not_null(sim);
    single_stream = ts_single_stream(sim);
    stow_config_t cfg;
    stow_config_default(&cfg);
    cfg.policy = STOW_POLICY_VMM;
    stow_tuning_t tuning = per_granule(); /* a handle per granule */
    tuning.vmm_slack = 0;
    tuning.vmm_slack_max = 0;
    cr_assert_eq(stow_pool_create_tuned(&cfg, &tuning, &single_stream, &pool), STOW_OK);
    void *a = alloc_ok(4 * MIB), *b = alloc_ok(4 * MIB), *c = alloc_ok(4 * MIB);
    void *d = alloc_ok(4 * MIB);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, c), STOW_OK);
    void *e = alloc_ok(6 * MIB);
    stow_stats_t s = stats();
    cr_assert_eq(s.num_unmap_calls, 3, "a's two granules and c's first");
    cr_assert_eq(s.num_sync_all_streams, 1, "before the first of them");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 8 * G);
    check();
    void *f = alloc_ok(2 * MIB);
    cr_assert_eq(f, a, "best fit: a's room");
    s = stats();
    cr_assert_eq(s.num_unmap_calls, 4, "c's second granule, remapped under f");
    cr_assert_eq(s.num_sync_all_streams, 1, "unused before the synchronize: no second one");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 8 * G);
    check();
    void *kept[] = {b, d, e, f};
    for (int i = 0; i < 4; i++)
        cr_assert_eq(stow_pool_free(pool, kept[i]), STOW_OK);
    finish();
}

/* The events first_remap recorded: the one its wait closed the epoch with. */
static uint64_t first_remap_records(void) { return no_event_waits ? 0 : 1; }

/* The first remap of the stream-safety tests below, on `stream`: a (4 MiB)
 * freed beside b (4 MiB), then c (6 MiB) takes a's two granules after a wait
 * (no epoch is closed before a remap: the remap closes the open one and waits
 * on its event, or synchronizes). */
static void first_remap_on(stow_stream_t stream, void **b, void **c, uint64_t waits)
{
    void *a;
    cr_assert_eq(stow_pool_alloc(pool, 4 * MIB, stream, &a), STOW_OK);
    cr_assert_eq(stow_pool_alloc(pool, 4 * MIB, stream, b), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    waits_t before = waits_now();
    cr_assert_eq(stow_pool_alloc(pool, 6 * MIB, stream, c), STOW_OK);
    cr_assert_eq(stats().num_unmap_calls, 2, "c took a's granules");
    assert_remap_waits(before, waits, "the first remap waited");
}

static void first_remap(stow_stream_t stream, void **b, void **c)
{
    first_remap_on(stream, b, c, 1);
}

/* The end of the two-stream tests below: s1's work completes (and s2's when
 * complete_s2), a block of `bytes` on s1 remaps `remapped` granules without
 * creating any (the pool stays at `granules`), and every block left goes.
 * Returns the waits that block added. */
static waits_t remap_when_streams_done(stow_stream_t s1, stow_stream_t s2, bool complete_s2,
                                       size_t bytes, uint64_t remapped, uint64_t granules,
                                       void *b, void *c, void *fence)
{
    stow_stats_t st = stats();
    waits_t before = waits_now();
    uint64_t unmaps = st.num_unmap_calls;
    stow_sim_complete_stream(sim, s1);
    if (complete_s2)
        stow_sim_complete_stream(sim, s2);
    void *z;
    cr_assert_eq(stow_pool_alloc(pool, bytes, s1, &z), STOW_OK);
    st = stats();
    cr_assert_eq(st.num_unmap_calls, unmaps + remapped, "%llu granules remapped",
                 (unsigned long long)remapped);
    cr_assert_eq(st.reserved_bytes[STOW_POOL_ALL].current, granules * G, "no handle created");
    check();
    waits_t added = waits_since(before);
    void *kept[] = {b, c, fence, z};
    for (size_t i = 0; i < 4; i++)
        cr_assert_eq(stow_pool_free(pool, kept[i]), STOW_OK);
    finish();
    return added;
}

/* Stream safety of remaps with events (vmm_epochs.c): after a first remap, which
 * waits, the pool closes an unmap epoch every 8 frees that leave granules
 * unused, with an event on each stream that freed since its own last
 * closure. The layout: after first_remap (a, b and c), 9 blocks x of 4 MiB
 * above them, then a fence. All xs but x[4] are freed: two holes of 16 MiB,
 * 16 granules unused in the epoch that the 8th free closed. Then a 20 MiB
 * block, which fits neither hole, goes above the fence: it needs 10 granules
 * and may not create any (slack 0), so it remaps the oldest 10.
 * `fail_record` makes every event fail to record. Returns the pool's waits
 * before that block; kept[] gets the 5 blocks left live. */
static waits_t remap_after_closed_epoch(bool complete_the_stream, bool fail_record, void **kept)
{
    make_vmm_tight();
    first_remap(NULL, &kept[0], &kept[1]);
    void *x[9];
    for (int i = 0; i < 9; i++)
        x[i] = alloc_ok(4 * MIB);
    kept[2] = alloc_ok(2 * MIB);
    kept[3] = x[4];
    if (fail_record)
        stow_sim_fail_random(sim, STOW_SIM_EVENT_RECORD, 1, 1);
    for (int i = 0; i < 9; i++)
        if (i != 4)
            cr_assert_eq(stow_pool_free(pool, x[i]), STOW_OK);
    stow_stats_t s = stats();
    cr_assert_eq(s.num_event_records, first_remap_records() + 1,
                 "the 8th free closed the epoch, on the one stream used");
    waits_t before = waits_now();
    if (complete_the_stream)
        stow_sim_complete_stream(sim, NULL);
    kept[4] = alloc_ok(20 * MIB);
    s = stats();
    cr_assert_eq(s.num_unmap_calls, 12, "10 granules remapped");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 24 * G, "no handle created");
    check();
    return before;
}

static void free_kept(void **kept, size_t n)
{
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(stow_pool_free(pool, kept[i]), STOW_OK);
    finish();
}

Test(vmm, a_remap_whose_granules_a_completed_event_covers_does_not_wait)
{
    for (int without = 0; without < 2; without++) {
        no_event_waits = without;
        void *kept[5];
        waits_t before = remap_after_closed_epoch(true, false, kept);
        assert_remap_waits(before, 0, "the epoch's event had completed");
        free_kept(kept, 5);
    }
}

Test(vmm, a_remap_whose_granules_may_still_be_in_use_waits_for_them)
{
    for (int without = 0; without < 2; without++) {
        no_event_waits = without;
        void *kept[5];
        waits_t before = remap_after_closed_epoch(false, false, kept);
        assert_remap_waits(before, 1, "the stream had not finished");
        stow_sim_counters_t c;
        stow_sim_counters(sim, &c);
        cr_assert_eq(c.pending_events, 0, "the epoch's event completed");
        free_kept(kept, 5);
    }
}

/* A granule that blocks of two streams shared waits for both: p (3 MiB, s1)
 * and q (1 MiB, s2) fill a's old room and share its second granule, once
 * empty_cache made the free blocks every stream's. With seven blocks y of
 * 4 MiB (s1) and a fence above c, freeing q, p and the ys closes an epoch on
 * both streams (q's free left its granule p's: none became unused there); a
 * 30 MiB block (s1) then fits no hole and remaps 15 granules, the first two
 * p's and q's. Returns the waits that block added. */
static waits_t remap_of_a_granule_two_streams_shared(bool complete_s2)
{
    stow_stream_t s1 = (stow_stream_t)0x11, s2 = (stow_stream_t)0x22;
    make_vmm_tight();
    void *b, *c, *p, *q, *y[7], *fence;
    first_remap(s1, &b, &c);
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    cr_assert_eq(stow_pool_alloc(pool, 3 * MIB, s1, &p), STOW_OK);
    cr_assert_eq(stow_pool_alloc(pool, 1 * MIB, s2, &q), STOW_OK);
    cr_assert_eq((char *)q, (char *)p + 3 * MIB, "q follows p in the same granule");
    for (int i = 0; i < 7; i++)
        cr_assert_eq(stow_pool_alloc(pool, 4 * MIB, s1, &y[i]), STOW_OK);
    cr_assert_eq(stow_pool_alloc(pool, 2 * MIB, s1, &fence), STOW_OK);
    /* q first: its granule stays p's; it becomes unused at p's free, on s1. */
    cr_assert_eq(stow_pool_free(pool, q), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, p), STOW_OK);
    for (int i = 0; i < 7; i++)
        cr_assert_eq(stow_pool_free(pool, y[i]), STOW_OK);
    cr_assert_eq(stats().num_event_records, first_remap_records() + 2,
                 "the 8th free that left granules unused closed the epoch, on s1 and s2");
    cr_assert_eq(stats().num_unmap_calls, 2);
    return remap_when_streams_done(s1, s2, complete_s2, 30 * MIB, 15, 22, b, c, fence);
}

Test(vmm, a_granule_two_streams_shared_is_remapped_after_both_finished)
{
    for (int without = 0; without < 2; without++) {
        no_event_waits = without;
        assert_waits(remap_of_a_granule_two_streams_shared(false), 1, "s2 had not finished");
        assert_waits(remap_of_a_granule_two_streams_shared(true), 0, "both had finished");
    }
}

/* The free that closes an epoch may be its stream's first since that
 * stream's last closure: the epoch's events include that stream too. After the
 * first remap (s1), s2 takes w (4 MiB, in a range of its own) and s1 fifteen
 * blocks x of 4 MiB and a fence. Freeing x0..x7 closes a first epoch, on both
 * streams (s2 grew a range), and s2 then completes its work. Freeing x8..x14
 * and then w, s2's only free, closes a second. With s1's work complete too, a
 * 64 MiB block (s1) above the fence remaps all 32 unused granules: the first
 * epoch's without a wait; the second epoch's, w's among them, only after one
 * (on s2's event, or a synchronize) unless s2 completed again. Returns the
 * waits it added. */
static waits_t remap_after_a_closing_free_on_another_stream(bool complete_s2)
{
    stow_stream_t s1 = (stow_stream_t)0x11, s2 = (stow_stream_t)0x22;
    make_vmm_tight();
    void *b, *c, *x[15], *w, *fence;
    first_remap(s1, &b, &c);
    cr_assert_eq(stow_pool_alloc(pool, 4 * MIB, s2, &w), STOW_OK);
    for (int i = 0; i < 15; i++)
        cr_assert_eq(stow_pool_alloc(pool, 4 * MIB, s1, &x[i]), STOW_OK);
    cr_assert_eq(stow_pool_alloc(pool, 2 * MIB, s1, &fence), STOW_OK);
    for (int i = 0; i < 8; i++)
        cr_assert_eq(stow_pool_free(pool, x[i]), STOW_OK);
    cr_assert_eq(stats().num_event_records, first_remap_records() + 2,
                 "the first epoch closed on s1 and s2");
    stow_sim_complete_stream(sim, s2);
    for (int i = 8; i < 15; i++)
        cr_assert_eq(stow_pool_free(pool, x[i]), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, w), STOW_OK);
    cr_assert_eq(stats().num_event_records, first_remap_records() + 4,
                 "w's free closed the second epoch, on s1 and s2");
    cr_assert_eq(stats().num_unmap_calls, 2);
    /* All 32 unused granules, w's among them. */
    return remap_when_streams_done(s1, s2, complete_s2, 64 * MIB, 32, 38, b, c, fence);
}

Test(vmm, the_free_that_closes_an_epoch_is_waited_for_on_its_stream)
{
    for (int without = 0; without < 2; without++) {
        no_event_waits = without;
        assert_waits(remap_after_a_closing_free_on_another_stream(false), 1,
                     "s2 had not finished");
        assert_waits(remap_after_a_closing_free_on_another_stream(true), 0, "both had finished");
    }
}

/* An epoch whose event cannot be recorded stays open: its granules are
 * remapped after a synchronize, as before events were used (the remap's own
 * attempt to close it fails the same way). */
Test(vmm, a_remap_synchronizes_when_the_epochs_event_could_not_be_recorded)
{
    for (int without = 0; without < 2; without++) {
        no_event_waits = without;
        void *kept[5];
        waits_t added = waits_since(remap_after_closed_epoch(true, true, kept));
        cr_assert_eq(added.syncs, 1, "no event covered the granules");
        cr_assert_eq(added.events, 0);
        free_kept(kept, 5);
    }
}

/* A remap waits on the events of the epochs it takes granules from, and on
 * no later ones: work queued after them keeps running. After the first remap
 * (which waits), 9 blocks x of 4 MiB, a fence, 9 blocks y of 4 MiB and a
 * second fence; freeing every x but x[4] closes a first epoch (16 granules),
 * every y but y[4] a second (16 more), each with an event on the one stream,
 * both pending. A 20 MiB block then fits no hole: it remaps the oldest 10
 * granules, all of the first epoch, and waits on its event alone. */
Test(vmm, a_remap_waits_for_its_epochs_events_and_not_for_later_work)
{
    make_vmm_tight();
    void *b, *c, *x[9], *y[9], *fence[2];
    first_remap(NULL, &b, &c);
    for (int i = 0; i < 9; i++)
        x[i] = alloc_ok(4 * MIB);
    fence[0] = alloc_ok(2 * MIB);
    for (int i = 0; i < 9; i++)
        y[i] = alloc_ok(4 * MIB);
    fence[1] = alloc_ok(2 * MIB);
    for (int i = 0; i < 9; i++)
        if (i != 4)
            cr_assert_eq(stow_pool_free(pool, x[i]), STOW_OK);
    cr_assert_eq(stats().num_event_records, 2, "the first remap's event and the first epoch's");
    for (int i = 0; i < 9; i++)
        if (i != 4)
            cr_assert_eq(stow_pool_free(pool, y[i]), STOW_OK);
    cr_assert_eq(stats().num_event_records, 3, "the second epoch's");
    stow_sim_counters_t dev;
    stow_sim_counters(sim, &dev);
    cr_assert_eq(dev.pending_events, 2, "both epochs' events pending");
    waits_t before = waits_now();
    void *z = alloc_ok(20 * MIB);
    stow_stats_t s = stats();
    cr_assert_eq(s.num_unmap_calls, 2 + 10, "10 granules remapped");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 43 * G, "no handle created");
    assert_remap_waits(before, 1, "on the first epoch's event");
    stow_sim_counters(sim, &dev);
    cr_assert_eq(dev.pending_events, 1, "the second epoch's event is still pending");
    check();
    void *kept[] = {b, c, x[4], y[4], fence[0], fence[1], z};
    free_kept(kept, 7);
}

/* A remap that takes a granule of the open epoch closes it on the streams
 * that freed since their last closure, and waits on those events alone:
 * another stream's queued work is not waited for. k (4 MiB, s2) gives s2 a
 * range; a first remap on s1 closes an epoch on both streams. Then block m
 * (4 MiB, s1, in a's old room) is used on s2 too (record_stream): its free waits for s2's clearance
 * event, which stays pending. Then e (4 MiB, s1, under a fence) is freed and
 * d (6 MiB, s1) remaps e's two granules: one event, on s1, and m still waits
 * for s2. A synchronize would have completed both. */
Test(vmm, a_remap_of_the_open_epoch_waits_for_the_streams_that_freed_alone)
{
    for (int without = 0; without < 2; without++) {
        no_event_waits = without;
        stow_stream_t s1 = (stow_stream_t)0x11, s2 = (stow_stream_t)0x22;
        make_vmm_tight();
        void *k, *b, *c, *m, *e, *fence, *d;
        cr_assert_eq(stow_pool_alloc(pool, 4 * MIB, s2, &k), STOW_OK);
        first_remap_on(s1, &b, &c, no_event_waits ? 1 : 2);
        cr_assert_eq(stow_pool_alloc(pool, 4 * MIB, s1, &m), STOW_OK);
        cr_assert_eq(stow_record_stream(pool, m, s2), STOW_OK);
        cr_assert_eq(stow_pool_free(pool, m), STOW_OK);
        stow_stats_t s = stats();
        uint64_t records = s.num_event_records, unmaps = s.num_unmap_calls;
        cr_assert_eq(stow_pool_alloc(pool, 4 * MIB, s1, &e), STOW_OK);
        cr_assert_eq(stow_pool_alloc(pool, 2 * MIB, s1, &fence), STOW_OK);
        cr_assert_eq(stow_pool_free(pool, e), STOW_OK);
        waits_t before = waits_now();
        cr_assert_eq(stow_pool_alloc(pool, 6 * MIB, s1, &d), STOW_OK);
        s = stats();
        cr_assert_eq(s.num_unmap_calls, unmaps + 2, "d took e's granules");
        assert_remap_waits(before, 1, "on s1's work");
        stow_sim_counters_t dev;
        stow_sim_counters(sim, &dev);
        if (no_event_waits) {
            cr_assert_eq(dev.pending_events, 0, "the synchronize completed s2's work too");
        } else {
            cr_assert_eq(s.num_event_records, records + 1, "the remap's event, on s1 alone");
            cr_assert_eq(dev.pending_events, 1, "s2's clearance event is still pending");
            cr_assert_eq(s.active_bytes[STOW_POOL_ALL].current, 26 * MIB, "m still waits for s2");
        }
        check();
        stow_sim_complete_stream(sim, s2);
        void *kept[] = {k, b, c, fence, d};
        free_kept(kept, 5);
    }
}

/* A wait on an event that fails leaves the granules as unsafe as before: the
 * remap synchronizes the device instead, and the failed wait's event goes
 * with the synchronize (no event is left pending or leaked). The first remap
 * of first_remap, with every event wait failing: one wait tried (counted, as
 * a synchronize is counted when tried), one synchronize, the same two
 * granules remapped. */
Test(vmm, a_failed_event_wait_falls_back_to_a_synchronize)
{
    make_vmm_tight();
    void *a = alloc_ok(4 * MIB), *b = alloc_ok(4 * MIB);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    stow_sim_fail_random(sim, STOW_SIM_EVENT_SYNCHRONIZE, 1, 3); /* every wait fails */
    waits_t before = waits_now();
    void *c = alloc_ok(6 * MIB);
    waits_t added = waits_since(before);
    cr_assert_eq(added.events, 1, "the wait was tried");
    cr_assert_eq(added.syncs, 1, "then the device synchronized");
    stow_stats_t s = stats();
    cr_assert_eq(s.num_unmap_calls, 2, "c took a's granules");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 5 * G, "no handle created");
    stow_sim_counters_t dev;
    stow_sim_counters(sim, &dev);
    cr_assert_eq(dev.failures[STOW_SIM_EVENT_SYNCHRONIZE], 1);
    cr_assert_eq(dev.pending_events, 0, "the synchronize completed the epoch's event");
    check();
    stow_sim_fail_random(sim, STOW_SIM_EVENT_SYNCHRONIZE, 0, 0);
    void *kept[] = {b, c};
    free_kept(kept, 2);
}

/* The page-mapping methods a page-mapped pool calls, by name, and a copy of
 * `device` without the i-th of them. */
static const char *const page_mapping_methods[] = {"va_reserve",   "va_release", "phys_create",
                                                   "phys_release", "map",        "unmap"};
#define PAGE_MAPPING_METHODS (sizeof page_mapping_methods / sizeof page_mapping_methods[0])

static stow_backend_t without_page_mapping_method(const stow_backend_t *device, size_t i)
{
    stow_backend_t b = *device;
    switch (i) {
    case 0: b.va_reserve = NULL; break;
    case 1: b.va_release = NULL; break;
    case 2: b.phys_create = NULL; break;
    case 3: b.phys_release = NULL; break;
    case 4: b.map = NULL; break;
    default: b.unmap = NULL; break;
    }
    return b;
}

/* Policy vmm needs every page-mapping method (stowage.h: else STOW_ENOSYS):
 * a pool created without one would call a NULL pointer at its first remap
 * (unmap), range (va_reserve) or destroy (va_release, phys_release). Each is
 * taken away in turn from a copy of the simulated device, which is otherwise
 * complete (the unchanged copy is accepted at the end); test_pool.c tried
 * map alone, so a check that forgot unmap passed the suite. */
Test(vmm, policy_vmm_is_refused_on_a_backend_without_any_page_mapping_method)
{
    static stow_backend_t lacking, complete;
    sim = ts_sim(0, false, false);
    cr_assert_not_null(sim);
    stow_config_t cfg;
    stow_config_default(&cfg);
    cfg.policy = STOW_POLICY_VMM;
    stow_tuning_t tuning = per_granule(); /* a handle per granule */
    for (size_t i = 0; i < PAGE_MAPPING_METHODS; i++) {
        lacking = without_page_mapping_method(sim, i);
        pool = (stow_pool_t *)0x1;
        cr_assert_eq(stow_pool_create_tuned(&cfg, &tuning, &lacking, &pool), STOW_ENOSYS,
                     "without %s", page_mapping_methods[i]);
        cr_assert_eq(pool, (stow_pool_t *)0x1, "without %s: out untouched",
                     page_mapping_methods[i]);
    }
    complete = *sim;
    cr_assert_eq(stow_pool_create_tuned(&cfg, &tuning, &complete, &pool), STOW_OK);
    check();
    finish();
}

/* A version-1 backend's struct ends before event_synchronize: what lies
 * there is not the pool's to read, so its remaps synchronize. */
static stow_status_t event_synchronize_past_the_struct(void *ctx, stow_event_t ev)
{
    (void)ctx;
    (void)ev;
    cr_assert_fail("the pool read event_synchronize of a version-1 backend");
    return STOW_EBACKEND;
}

Test(vmm, a_version_1_backend_is_taken_and_its_remaps_synchronize)
{
    static stow_backend_t v1;
    sim = ts_sim(0, false, false);
    cr_assert_not_null(sim);
    v1 = *sim;
    v1.abi_version = 1;
    v1.event_synchronize = event_synchronize_past_the_struct;
    stow_config_t cfg;
    stow_config_default(&cfg);
    cfg.policy = STOW_POLICY_VMM;
    stow_tuning_t tuning = per_granule(); /* a handle per granule */
    cr_assert_eq(stow_pool_create_tuned(&cfg, &tuning, &v1, &pool), STOW_OK);
    no_event_waits = true; /* what the pool must do with it */
    void *b, *c;
    first_remap(NULL, &b, &c);
    void *kept[] = {b, c};
    free_kept(kept, 2);
}

/* empty_cache completes a block that waited for another stream and scrubs
 * it: that memset is queued work on granules it then unmaps, so it waits for
 * the device a second time. */
Test(vmm, a_block_scrubbed_at_empty_cache_is_unmapped_after_its_scrub)
{
    sim = ts_sim(0, false, true); /* manual events; the scrub is counted, not done */
    cr_assert_not_null(sim);
    stow_config_t cfg;
    stow_config_default(&cfg);
    cfg.policy = STOW_POLICY_VMM;
    stow_tuning_t tuning = per_granule(); /* a handle per granule */
    cfg.scrub_on_free = true;
    cr_assert_eq(stow_pool_create_tuned(&cfg, &tuning, sim, &pool), STOW_OK);
    stow_stream_t s1 = (stow_stream_t)0x11, s2 = (stow_stream_t)0x22;
    void *a = NULL, *keep = alloc_ok(4 * MIB);
    cr_assert_eq(stow_pool_alloc(pool, 8 * MIB, s1, &a), STOW_OK);
    cr_assert_eq(stow_record_stream(pool, a, s2), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK); /* waits for s2 */
    stow_stats_t before = stats();
    cr_assert_eq(before.num_scrubs, 0);
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    stow_stats_t after = stats();
    cr_assert_eq(after.num_scrubs, 1, "a became free at the synchronize and was scrubbed");
    cr_assert_eq(after.num_unmap_calls, before.num_unmap_calls + 4, "then its granules went");
    cr_assert_eq(after.num_sync_all_streams, before.num_sync_all_streams + 2,
                 "once for the streams, once more for the scrub before the unmaps");
    check();
    /* With nothing scrubbed on the way, one synchronize is enough. */
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    cr_assert_eq(stats().num_sync_all_streams, after.num_sync_all_streams + 1);
    cr_assert_eq(stow_pool_free(pool, keep), STOW_OK);
    finish();
}

/* The out-of-memory retry unmaps unused granules only once the device
 * synchronized: if that fails, queued work may still use them. */
Test(vmm, a_failed_synchronize_at_the_retry_unmaps_nothing)
{
    make_vmm(8 * MIB, true);
    void *a = alloc_ok(6 * MIB);
    void *b = alloc_ok(2 * MIB);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK); /* three granules unused */
    stow_sim_fail_random(sim, STOW_SIM_SYNCHRONIZE, 1, 7); /* every synchronize fails */
    void *out = NULL;
    stow_status_t st = stow_pool_alloc(pool, 8 * MIB, NULL, &out);
    cr_assert(st == STOW_ENOMEM || st == STOW_EBACKEND, "%s", stow_strerror(st));
    stow_stats_t s = stats();
    cr_assert_eq(s.num_unmap_calls, 0, "nothing unmapped without a synchronize");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 8 * MIB);
    check();
    stow_sim_fail_random(sim, STOW_SIM_SYNCHRONIZE, 0, 0);
    void *c = alloc_ok(6 * MIB); /* now a's granules can move */
    cr_assert_eq(stow_pool_free(pool, c), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    finish();
}

Test(vmm, empty_cache_returns_unused_physical_memory)
{
    make_vmm(0, false);
    void *a = alloc_ok(10 * MIB), *b = alloc_ok(4 * MIB);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    stow_stats_t s = stats();
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 2 * G, "only b's granules remain");
    stow_sim_counters_t c;
    stow_sim_counters(sim, &c);
    cr_assert_eq(c.reserved_bytes, 2 * G);
    check();
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    finish();
}

Test(vmm, record_stream_keeps_granules_mapped_until_the_stream_finished)
{
    make_vmm(0, true);
    stow_stream_t s1 = (stow_stream_t)0x11, s2 = (stow_stream_t)0x22;
    void *a;
    cr_assert_eq(stow_pool_alloc(pool, 4 * MIB, s1, &a), STOW_OK);
    cr_assert_eq(stow_record_stream(pool, a, s2), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    void *b;
    cr_assert_eq(stow_pool_alloc(pool, 4 * MIB, s1, &b), STOW_OK);
    cr_assert_neq(b, a);
    stow_stats_t st = stats();
    cr_assert_eq(st.reserved_bytes[STOW_POOL_ALL].current, 4 * G, "a is still mapped");
    check();
    stow_sim_complete_stream(sim, s2);
    void *c;
    cr_assert_eq(stow_pool_alloc(pool, 4 * MIB, s1, &c), STOW_OK);
    cr_assert_eq(c, a);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, c), STOW_OK);
    finish();
}

/* Reserved bytes, the pool's and the device's, after each refused request. */
static void assert_reserved(uint64_t pool_bytes, uint64_t device_bytes, const char *when)
{
    stow_stats_t s = stats();
    stow_sim_counters_t c;
    stow_sim_counters(sim, &c);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, pool_bytes, "%s: pool reserves %llu",
                 when, (unsigned long long)s.reserved_bytes[STOW_POOL_ALL].current);
    cr_assert_eq(c.reserved_bytes, device_bytes, "%s: device holds %llu", when,
                 (unsigned long long)c.reserved_bytes);
}

/* A request whose backing fails gives back what it created: the pool and the
 * device hold what they held before. x (2 granules) freed, y (1) live: a
 * 6 MiB request fits no free room, goes above y, creates one handle (the live
 * peak it would reach allows 4 granules, the pool holds 3), then remaps x's
 * first granule, whose map is refused. The created handle goes back; x's
 * handle waits in the free stack. */
Test(vmm, mapping_failures_leave_the_books_exact)
{
    make_vmm(0, false);
    void *x = alloc_ok(4 * MIB), *y = alloc_ok(2 * MIB);
    cr_assert_eq(stow_pool_free(pool, x), STOW_OK);
    assert_reserved(6 * MIB, 6 * MIB, "before");
    void *out = NULL;
    stow_sim_fail_nth(sim, STOW_SIM_MAP, 2, STOW_EBACKEND);
    cr_assert_eq(stow_pool_alloc(pool, 6 * MIB, NULL, &out), STOW_EBACKEND);
    stow_stats_t s = stats();
    cr_assert_eq(s.allocated_bytes[STOW_POOL_ALL].current, 2 * MIB);
    cr_assert_eq(s.num_device_alloc, 4, "one handle created...");
    cr_assert_eq(s.num_device_free, 1, "...and given back");
    cr_assert_eq(s.num_unmap_calls, 1, "x's first granule, for the refused map");
    assert_reserved(6 * MIB, 6 * MIB, "after a refused map");
    check();
    stow_sim_fail_nth(sim, STOW_SIM_PHYS_CREATE, 1, STOW_EBACKEND);
    cr_assert_eq(stow_pool_alloc(pool, 20 * MIB, NULL, &out), STOW_EBACKEND);
    assert_reserved(6 * MIB, 6 * MIB, "after a refused create");
    check();
    void *a = alloc_ok(6 * MIB);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, y), STOW_OK);
    finish();
}

Test(vmm, destroy_with_live_blocks_is_busy_and_force_releases_everything)
{
    make_vmm(0, false);
    void *a = alloc_ok(5 * MIB);
    (void)a;
    cr_assert_eq(stow_pool_destroy(pool), STOW_EBUSY);
    stow_pool_destroy_force(pool);
    stow_sim_counters_t c;
    stow_sim_counters(sim, &c);
    cr_assert_eq(c.reserved_bytes, 0);
    cr_assert_eq(stow_sim_destroy(sim), STOW_OK);
}

/* Destroy gives back the handles on the free stack too, not only the
 * granules mapped in its ranges. a (2 MiB) freed leaves its granule unused;
 * empty_cache unmaps it and tries to release its handle, which the device
 * refuses once: the handle waits, unmapped, on the free stack (the pool and
 * the device still hold 2 MiB). Destroy must release it: finish() asserts
 * the device holds nothing. */
Test(vmm, destroy_releases_the_handles_left_on_the_free_stack)
{
    make_vmm(0, false);
    cr_assert_eq(stow_pool_free(pool, alloc_ok(2 * MIB)), STOW_OK);
    stow_sim_fail_nth(sim, STOW_SIM_PHYS_RELEASE, 1, STOW_EBACKEND);
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    stow_stats_t s = stats();
    cr_assert_eq(s.num_unmap_calls, 1, "a's granule was unmapped");
    cr_assert_eq(s.num_device_free, 0, "its release was refused");
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, G, "the handle is still the pool's");
    cr_assert_eq(s.allocated_bytes[STOW_POOL_ALL].current, 0);
    stow_sim_counters_t dev;
    stow_sim_counters(sim, &dev);
    cr_assert_eq(dev.failures[STOW_SIM_PHYS_RELEASE], 1);
    cr_assert_eq(dev.reserved_bytes, G, "the device still counts it");
    check();
    finish();
}

/* A big request whose best fit lies on unmapped addresses goes where unused
 * granules are still mapped (no map call); a small one keeps best fit. */
Test(vmm, big_blocks_go_where_granules_are_mapped)
{
    make_vmm(0, false);
    /* [y 264 MiB][s2][x 400 MiB][s3]; y freed and unmapped by empty_cache: an
     * unmapped 264 MiB hole; x freed afterwards: a mapped 400 MiB hole whose
     * 200 granules sit unused. */
    void *y = alloc_ok(264 * MIB);
    void *s2 = alloc_ok(2 * MIB);
    void *x = alloc_ok(400 * MIB);
    void *s3 = alloc_ok(2 * MIB);
    cr_assert_eq(stow_pool_free(pool, y), STOW_OK);
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, x), STOW_OK);
    check();
    stow_stats_t before = stats();
    /* Best fit is y's hole (264 < 400 MiB) but all of it is unmapped. 256 MiB
     * is 128 granules, the smallest block that moves. */
    void *c = alloc_ok(256 * MIB);
    stow_stats_t after = stats();
    cr_assert_eq(c, x, "placed on the mapped hole, at its start");
    cr_assert_eq(after.num_map_calls, before.num_map_calls, "no granule mapped");
    cr_assert_eq(after.reserved_bytes[STOW_POOL_ALL].current,
                 before.reserved_bytes[STOW_POOL_ALL].current);
    check();
    /* 160 MiB (80 granules) is below the size that moves: best fit, y's
     * hole (x's 144 MiB remainder is too small), mapped anew. */
    void *d = alloc_ok(160 * MIB);
    cr_assert_eq(d, y);
    cr_assert_eq(stats().num_map_calls, after.num_map_calls + 80);
    check();
    void *all[] = {s2, s3, c, d};
    for (int i = 0; i < 4; i++)
        cr_assert_eq(stow_pool_free(pool, all[i]), STOW_OK);
    finish();
}

/* A mapped run inside an unmapped hole: a big block that covers the whole run
 * either way extends below it rather than above it (the lowest address among
 * equal costs), so that a room whose lowest granules were remapped away does
 * not creep upwards from one training step to the next. */
Test(vmm, big_block_extends_below_a_mapped_run_rather_than_above)
{
    make_vmm_tight();
    /* [x 240 MiB][y 240 MiB][z 320 MiB][w 2 MiB], then x and z freed: their
     * 280 granules are the oldest unused, and a 560 MiB block (above w: the
     * holes are too small) remaps all of them. y freed last: one 800 MiB hole
     * (400 granules) whose granules 120-239 (y's) alone are mapped. */
    void *x = alloc_ok(240 * MIB);
    void *y = alloc_ok(240 * MIB);
    void *z = alloc_ok(320 * MIB);
    void *w = alloc_ok(2 * MIB);
    cr_assert_eq(stow_pool_free(pool, x), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, z), STOW_OK);
    void *v = alloc_ok(560 * MIB);
    cr_assert_eq(stats().num_unmap_calls, 280);
    cr_assert_eq(stow_pool_free(pool, y), STOW_OK);
    check();
    stow_stats_t before = stats();
    /* 320 MiB (160 granules) over granules 120-279 or 80-239: 40 to map
     * either way; the lower one. */
    void *c = alloc_ok(320 * MIB);
    cr_assert_eq((char *)c - (char *)x, (ptrdiff_t)(80 * G),
                 "ends where the mapped run ends: at granule %td",
                 ((char *)c - (char *)x) / (ptrdiff_t)G);
    cr_assert_eq(stats().num_map_calls, before.num_map_calls + 40);
    check();
    void *all[] = {c, v, w};
    for (int i = 0; i < 3; i++)
        cr_assert_eq(stow_pool_free(pool, all[i]), STOW_OK);
    finish();
}

/* The room a big block moves to may lie inside a free block: the block is
 * carved there. */
Test(vmm, big_block_carved_out_of_a_free_block)
{
    make_vmm_tight();
    stow_stream_t s1 = (stow_stream_t)0x1, s2 = (stow_stream_t)0x2;
    /* On s1: [a 160 MiB][x 280 MiB][b 2 MiB]; a then x freed: one 440 MiB
     * hole, its 220 granules unused, a's the oldest. */
    void *a, *x, *b, *y, *c, *d;
    cr_assert_eq(stow_pool_alloc(pool, 160 * MIB, s1, &a), STOW_OK);
    cr_assert_eq(stow_pool_alloc(pool, 280 * MIB, s1, &x), STOW_OK);
    cr_assert_eq(stow_pool_alloc(pool, 2 * MIB, s1, &b), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, x), STOW_OK);
    /* s2 cannot reuse s1's hole (no clearance yet): its 160 MiB go to a new
     * range, and with no slack its 80 granules are a's, remapped. */
    cr_assert_eq(stow_pool_alloc(pool, 160 * MIB, s2, &y), STOW_OK);
    stow_stats_t before = stats();
    cr_assert_eq(before.num_unmap_calls, 80);
    check();
    /* Best fit puts 280 MiB on s1 at the hole's start, over a's 80 unmapped
     * granules; x's 140 mapped ones at the hole's end take it with no map. */
    cr_assert_eq(stow_pool_alloc(pool, 280 * MIB, s1, &c), STOW_OK);
    cr_assert_eq(c, x);
    cr_assert_eq(stats().num_map_calls, before.num_map_calls);
    check();
    /* The front, a's 160 MiB, stays a free block of its own. */
    cr_assert_eq(stow_pool_alloc(pool, 160 * MIB, s1, &d), STOW_OK);
    cr_assert_eq(d, a);
    check();
    void *all[] = {b, y, c, d};
    for (int i = 0; i < 4; i++)
        cr_assert_eq(stow_pool_free(pool, all[i]), STOW_OK);
    stow_sim_complete_stream(sim, s1);
    stow_sim_complete_stream(sim, s2);
    finish();
}

/* When mapping under a carved placement fails, the carved-off part merges
 * back: the pool is as before the call (fuzz_api found it left two adjacent
 * free blocks). */
Test(vmm, failed_backing_after_a_carve_merges_back)
{
    make_vmm_tight();
    stow_stream_t s1 = (stow_stream_t)0x1, s2 = (stow_stream_t)0x2;
    void *a, *x, *b, *y, *c;
    cr_assert_eq(stow_pool_alloc(pool, 160 * MIB, s1, &a), STOW_OK);
    cr_assert_eq(stow_pool_alloc(pool, 280 * MIB, s1, &x), STOW_OK);
    cr_assert_eq(stow_pool_alloc(pool, 2 * MIB, s1, &b), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, x), STOW_OK);
    cr_assert_eq(stow_pool_alloc(pool, 160 * MIB, s2, &y), STOW_OK); /* takes a's granules */
    /* 320 MiB: at the hole's start 80 granules to map, at its end only 20. */
    stow_sim_fail_nth(sim, STOW_SIM_MAP, 1, STOW_EBACKEND);
    cr_assert_eq(stow_pool_alloc(pool, 320 * MIB, s1, &c), STOW_EBACKEND);
    check();
    stow_sim_fail_nth(sim, STOW_SIM_MAP, 0, STOW_OK);
    stow_stats_t before = stats();
    cr_assert_eq(stow_pool_alloc(pool, 320 * MIB, s1, &c), STOW_OK);
    cr_assert_eq((char *)c, (char *)a + 120 * MIB, "carved at the hole's end");
    cr_assert_eq(stats().num_map_calls, before.num_map_calls + 20);
    check();
    void *all[] = {b, y, c};
    for (int i = 0; i < 3; i++)
        cr_assert_eq(stow_pool_free(pool, all[i]), STOW_OK);
    stow_sim_complete_stream(sim, s1);
    stow_sim_complete_stream(sim, s2);
    finish();
}

/* ---- adaptive allowance ---- */

static const ts_loop_t loop4 = TS_LOOP4, loop33 = TS_LOOP33;

/* A vmm pool on an unlimited device with the default settings but vmm_slack_max. */
static void make_vmm_slack_max(double slack_max)
{
    stow_tuning_t d;
    stow_tuning_default(&d);
    make_vmm_slacks(0, false, d.vmm_slack, slack_max);
}

static void *loop_alloc(size_t size)
{
    void *p = NULL;
    cr_assert_eq(stow_pool_alloc(pool, size, (stow_stream_t)1, &p), STOW_OK, "alloc %zu", size);
    return p;
}

/* Runs the loop for `steps` steps on stream 1 (weights allocated first, freed
 * last) and returns the map and unmap calls of its last `tail` steps. */
static uint64_t run_loop(const ts_loop_t *loop, unsigned steps, unsigned tail)
{
    void *weights[32];
    cr_assert_leq(loop->weight_count, sizeof weights / sizeof weights[0]);
    ts_loop_weights_alloc(pool, loop, (stow_stream_t)1, weights);
    uint64_t tail_start = 0;
    for (unsigned step = 0; step < steps; step++) {
        if (step == steps - tail) {
            stow_stats_t s = stats();
            tail_start = s.num_map_calls + s.num_unmap_calls;
        }
        if (step % 500 == 0)
            check(); /* the invariants hold while the allowance moves */
        ts_loop_step(pool, loop, (stow_stream_t)1);
    }
    stow_stats_t s = stats();
    check();
    ts_loop_weights_free(pool, loop, weights);
    return s.num_map_calls + s.num_unmap_calls - tail_start;
}

static void assert_reserved_within(double slack_max)
{
    ts_assert_reserved_within(pool, slack_max, G);
}

Test(vmm, a_loop_that_keeps_remapping_raises_its_allowance_until_it_stops)
{
    make_vmm_slack_max(0.05); /* the default */
    uint64_t tail_calls = run_loop(&loop4, 3000, 200);
    stow_stats_t s = stats();
    cr_assert_geq(s.num_vmm_allowance_raises, 1);
    char text[8192], want[96];
    cr_assert_lt(stow_summary(pool, text, sizeof text), sizeof text);
    snprintf(want, sizeof want, "allowance raises %llu",
             (unsigned long long)s.num_vmm_allowance_raises);
    cr_assert(strstr(text, "Page maps ") && strstr(text, want), "summary:\n%s", text);
    cr_assert_gt(s.num_event_waits, 0, "its remaps waited on events");
    snprintf(want, sizeof want, "Device synchronizes %llu, event waits %llu",
             (unsigned long long)s.num_sync_all_streams, (unsigned long long)s.num_event_waits);
    cr_assert(strstr(text, want), "summary:\n%s", text);
    cr_assert_eq(tail_calls, 0, "the last 200 steps still mapped or unmapped %llu times",
                 (unsigned long long)tail_calls);
    assert_reserved_within(0.05); /* no more than the cap */
    finish();
}

Test(vmm, a_loop_far_above_its_allowance_is_raised_once_to_its_footprint)
{
    make_vmm_slack_max(0.05);
    uint64_t tail_calls = run_loop(&loop33, 3000, 200);
    stow_stats_t s = stats();
    cr_assert_eq(s.num_vmm_allowance_raises, 1);
    cr_assert_eq(tail_calls, 0, "the last 200 steps still mapped or unmapped %llu times",
                 (unsigned long long)tail_calls);
    /* The footprint, not the cap: the loop's step touches about 1.032 x. */
    assert_reserved_within(0.035);
    finish();
}

Test(vmm, a_raise_to_the_footprint_stops_at_vmm_slack_max)
{
    make_vmm_slack_max(0.02); /* below what loop 33 touches */
    (void)run_loop(&loop33, 3000, 200);
    cr_assert_geq(stats().num_vmm_allowance_raises, 1);
    assert_reserved_within(0.02);
    finish();
}

Test(vmm, with_no_room_to_raise_the_same_loop_remaps_on_every_step)
{
    make_vmm_slack_max(0.0); /* at or below vmm_slack: never raised */
    uint64_t tail_calls = run_loop(&loop4, 3000, 200);
    cr_assert_eq(stats().num_vmm_allowance_raises, 0);
    cr_assert_geq(tail_calls, 200 * 10, "the loop maps and unmaps 16 granules a step, not %llu",
                  (unsigned long long)tail_calls);
    finish();
}

/* vmm_slack_max AT vmm_slack leaves no room either (stowage.h: "at or below
 * vmm_slack: never raised"): the test above has it below. loop4 remaps on
 * every step at slack 0.0095 (the default, from which it is raised when
 * vmm_slack_max allows) and at 0, so its 1500 steps make a run of hot
 * windows (8 x 8192 operations, about 900 steps); with the pool taken for
 * one that may still raise, that run ended in a raise to the cap (the cap
 * itself: num_vmm_allowance_raises 1). */
Test(vmm, with_vmm_slack_max_equal_to_vmm_slack_the_slack_is_never_raised)
{
    const double slacks[] = {0.0095, 0.0};
    for (size_t i = 0; i < 2; i++) {
        make_vmm_slacks(0, false, slacks[i], slacks[i]);
        uint64_t tail_calls = run_loop(&loop4, 1500, 200);
        cr_assert_geq(tail_calls, 200 * 10, "slack %g: the loop still remaps, not %llu calls",
                      slacks[i], (unsigned long long)tail_calls);
        uint64_t raises = stats().num_vmm_allowance_raises;
        cr_assert_eq(raises, 0, "slack %g: raised %llu times", slacks[i],
                     (unsigned long long)raises);
        finish();
    }
}

/* A raise that does not cut the remap rate is the last: on a device that
 * holds exactly what loop4 pins at slack 0 (measured first, on an unlimited
 * device), the first hot run still raises the slack, but no handle can be
 * created under it, the next hot run remaps as often, and the slack stays
 * where it is for good instead of growing run after run up to vmm_slack_max
 * (3000 steps are about six runs of hot windows). */
Test(vmm, a_raise_that_does_not_cut_the_remaps_is_the_last)
{
    make_vmm_slacks(0, false, 0.0, 0.0);
    (void)run_loop(&loop4, 50, 1);
    uint64_t pinned_bytes = stats().reserved_bytes[STOW_POOL_ALL].peak;
    finish();
    make_vmm_slacks(pinned_bytes, false, 0.0, 0.05);
    uint64_t tail_calls = run_loop(&loop4, 3000, 200);
    stow_stats_t s = stats();
    cr_assert_eq(s.num_ooms, 0);
    cr_assert_leq(s.reserved_bytes[STOW_POOL_ALL].peak, pinned_bytes);
    cr_assert_geq(tail_calls, 200 * 10, "the device still makes it remap every step, not %llu",
                  (unsigned long long)tail_calls);
    cr_assert_eq(s.num_vmm_allowance_raises, 1, "raised %llu times",
                 (unsigned long long)s.num_vmm_allowance_raises);
    finish();
}

/* Rounds of loop4's step (its weights allocated and freed with it) followed
 * by `filler` steps that allocate the seven sizes and free them, all on one
 * pool: a loop that remaps in bursts, once a round. Returns the remaps (unmap
 * calls) of the last `tail` rounds; *remaps and *ops get the whole run's. */
static uint64_t run_bursts(unsigned rounds, unsigned filler, unsigned tail, uint64_t *remaps,
                           uint64_t *ops)
{
    uint64_t tail_remaps = 0;
    stow_stats_t first = stats();
    for (unsigned round = 0; round < rounds; round++) {
        stow_stats_t before = stats();
        (void)run_loop(&loop4, 1, 1);
        void *w = loop_alloc(64 * MIB);
        for (unsigned step = 0; step < filler; step++) {
            void *p[TS_LOOP_SLOTS_MAX];
            for (size_t i = 0; i < loop4.slot_count; i++)
                p[i] = loop_alloc(loop4.slot_kib[i] * KIB);
            for (size_t i = 0; i < loop4.slot_count; i++)
                cr_assert_eq(stow_pool_free(pool, p[i]), STOW_OK);
        }
        cr_assert_eq(stow_pool_free(pool, w), STOW_OK);
        if (round >= rounds - tail)
            tail_remaps += stats().num_unmap_calls - before.num_unmap_calls;
    }
    stow_stats_t last = stats();
    *remaps = last.num_unmap_calls - first.num_unmap_calls;
    /* Every allocation is freed again: operations are twice the allocations. */
    *ops = 2 * (last.allocation[STOW_POOL_ALL].allocated -
                first.allocation[STOW_POOL_ALL].allocated);
    return tail_remaps;
}

Test(vmm, a_loop_that_remaps_now_and_then_is_not_raised)
{
    make_vmm_slack_max(0.05);
    /* The loop's step once in every 1,001 steps: fewer remaps than one per
     * 1,024 operations, the rate below which a pool is left as it is. */
    uint64_t remaps = 0, ops = 0;
    (void)run_bursts(12, 1000, 1, &remaps, &ops);
    cr_assert_gt(remaps, 0, "the loop's steps still remap");
    cr_assert_lt(remaps * 1024, ops, "%llu remaps in %llu operations: not rare enough",
                 (unsigned long long)remaps, (unsigned long long)ops);
    cr_assert_gt(ops, 2 * 65536, "long enough for a run of warm windows");
    cr_assert_eq(stats().num_vmm_allowance_raises, 0);
    finish();
}

Test(vmm, a_loop_that_remaps_once_in_31_steps_is_raised_and_stops)
{
    make_vmm_slack_max(0.05);
    /* The same bursts once in every 31 steps: about one remap per 76
     * operations, which the pool left as it was while a window counted as
     * hot from one remap per 64 operations only; now it is raised and the
     * bursts stop remapping. */
    uint64_t remaps = 0, ops = 0;
    uint64_t tail = run_bursts(300, 30, 60, &remaps, &ops);
    cr_assert_gt(remaps * 1024, ops, "%llu remaps in %llu operations",
                 (unsigned long long)remaps, (unsigned long long)ops);
    cr_assert_geq(stats().num_vmm_allowance_raises, 1);
    cr_assert_eq(tail, 0, "the last 60 rounds still remapped %llu times",
                 (unsigned long long)tail);
    assert_reserved_within(0.05);
    finish();
}

/* A request for more granules than the pool may hold fails before mapping
 * any: before, the pool mapped granules up to its limit, failed, unmapped them
 * for the out-of-memory retry, mapped them all again and failed, and was left
 * holding the whole device for a few MiB of live data. */
Test(vmm, a_request_beyond_the_limit_maps_nothing)
{
    make_vmm(64 * MIB, false);
    void *a = alloc_ok(10 * MIB), *b = alloc_ok(8 * MIB);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK); /* 4 granules unused */
    stow_stats_t before = stats();
    void *out = NULL;
    cr_assert_eq(stow_pool_alloc(pool, 100 * MIB, NULL, &out), STOW_ENOMEM);
    cr_assert_eq(stow_pool_alloc(pool, 60 * MIB, NULL, &out), STOW_ENOMEM,
                 "30 granules wanted, 27 obtainable beside a's 5");
    stow_stats_t after = stats();
    cr_assert_eq(after.num_map_calls, before.num_map_calls, "no granule mapped for them");
    cr_assert_leq(after.reserved_bytes[STOW_POOL_ALL].current,
                  before.reserved_bytes[STOW_POOL_ALL].current);
    cr_assert_eq(after.reserved_bytes[STOW_POOL_ALL].peak, before.reserved_bytes[STOW_POOL_ALL].peak);
    cr_assert_eq(after.num_ooms, 2);
    char msg[768];
    cr_assert_gt(stow_pool_oom_message(pool, msg, sizeof msg), 0);
    cr_assert_not_null(strstr(msg, "page-mapped pool"), "%s", msg);
    cr_assert_not_null(strstr(msg, "10.00 MiB of physical memory"), "a's 5 granules: %s", msg);
    cr_assert_null(strstr(msg, "max_split_size_mb"), "does not apply here: %s", msg);
    cr_assert_null(strstr(msg, "larger than the pool limit"), "60 MiB is not: %s", msg);
    cr_assert_eq(stow_pool_alloc(pool, 100 * MIB, NULL, &out), STOW_ENOMEM);
    cr_assert_gt(stow_pool_oom_message(pool, msg, sizeof msg), 0);
    cr_assert_not_null(strstr(msg, "larger than the pool limit"), "%s", msg);
    check();
    void *c = alloc_ok(54 * MIB); /* 27 granules: exactly what is left */
    cr_assert_eq(stow_pool_free(pool, c), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    finish();
}

/* The device refuses before the pool's limit (another pool holds part of it):
 * the granules the failed request had mapped go back to the device, so the
 * pool holds what it held before. */
/* A request larger than the pool may ever hold fails before any range is
 * built or retry made, and says so: counted as an out-of-memory error, with
 * a message that claims no retry. */
Test(vmm, a_request_above_the_limit_is_an_explained_oom_without_a_retry)
{
    make_vmm(64 * MIB, false);
    void *out = NULL;
    cr_assert_eq(stow_pool_alloc(pool, 100 * MIB, NULL, &out), STOW_ENOMEM);
    stow_stats_t s = stats();
    cr_assert_eq(s.num_ooms, 1);
    cr_assert_eq(s.num_alloc_retries, 0);
    cr_assert_eq(s.segment[STOW_POOL_ALL].current, 0, "no range built for it");
    char msg[768];
    cr_assert(stow_pool_oom_message(pool, msg, sizeof msg) > 0);
    cr_assert(strstr(msg, "larger than the pool limit") != NULL, "%s", msg);
    cr_assert(strstr(msg, "retried") == NULL, "%s", msg);
    finish();
}

Test(vmm, a_request_the_device_refuses_midway_leaves_what_the_pool_held)
{
    make_vmm(64 * MIB, false);
    stow_pool_t *other = NULL; /* a classic pool on the same device */
    cr_assert_eq(stow_pool_create(NULL, sim, &other), STOW_OK);
    void *held = NULL;
    cr_assert_eq(stow_pool_alloc(other, 40 * MIB, NULL, &held), STOW_OK);
    void *a = alloc_ok(4 * MIB);
    stow_stats_t before = stats();
    void *out = NULL;
    cr_assert_eq(stow_pool_alloc(pool, 30 * MIB, NULL, &out), STOW_ENOMEM,
                 "15 granules wanted, the device has 10 left");
    stow_stats_t after = stats();
    cr_assert_eq(after.reserved_bytes[STOW_POOL_ALL].current,
                 before.reserved_bytes[STOW_POOL_ALL].current, "what the attempt created went back");
    stow_sim_counters_t c;
    stow_sim_counters(sim, &c);
    cr_assert_eq(c.reserved_bytes, 40 * MIB + before.reserved_bytes[STOW_POOL_ALL].current);
    /* It held them for a moment: the peak, and the waste breakdown taken at
     * it, on the failure path (not left at 4 MiB for the next request to take
     * at 6). */
    const stow_waste_t *w = &after.waste_at_peak;
    cr_assert_eq(after.reserved_bytes[STOW_POOL_ALL].peak, 24 * MIB, "a's 2 granules and 10 more");
    cr_assert_eq(w->reserved_bytes, 24 * MIB);
    cr_assert_eq(w->requested_bytes, 4 * MIB);
    cr_assert_eq(w->idle_cached_bytes, 20 * MIB, "the attempt's granules, mapped, unused");
    cr_assert_eq(w->requested_bytes + w->rounding_bytes + w->split_remainder_bytes +
                     w->idle_cached_bytes + w->pending_bytes,
                 w->reserved_bytes);
    check();
    char msg[768];
    cr_assert(stow_pool_oom_message(pool, msg, sizeof msg) > 0);
    cr_assert_eq(after.num_alloc_retries, 1);
    cr_assert(strstr(msg, "the request retried") != NULL, "%s", msg);
    void *e = alloc_ok(2 * MIB);
    cr_assert_eq(stats().waste_at_peak.reserved_bytes, 24 * MIB, "6 MiB is no peak");
    cr_assert_eq(stow_pool_free(pool, e), STOW_OK);
    cr_assert_eq(stow_pool_free(other, held), STOW_OK);
    cr_assert_eq(stow_pool_destroy(other), STOW_OK); /* its segment goes back */
    void *d = alloc_ok(30 * MIB);
    cr_assert_eq(stow_pool_free(pool, d), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    finish();
}
