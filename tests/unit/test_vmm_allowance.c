/*
 * tests/unit/test_vmm_allowance.c: the figures that bound what a page-mapped
 * pool (policy vmm) holds, each pinned where no test in test_vmm.c reached
 * it: the placement budget of big blocks that move to mapped granules
 * (vmm_place.c), the live peak that empty_cache restarts (vmm.c), the cap on
 * a warm run's raise and the whole granule a live peak is always allowed
 * (vmm_allowance.c). Through the public API on the simulated device, with
 * stow_pool_check (vmm_check.c) along the way. A handle per granule
 * (vmm_handle_mb:2), as in test_vmm.c.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "test_support.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define G (2 * MIB) /* the simulated device's granule */

static stow_backend_t *sim;
static stow_pool_t *pool;

/* A vmm pool on a fresh unlimited simulated device (events complete when
 * recorded), the defaults but for the two slacks, a handle per granule and
 * no learned step. `backend` NULL: the device
 * itself; else a copy of it that the test wraps. */
static void make_pool_on(stow_backend_t *backend, double slack, double slack_max)
{
    stow_config_t c;
    stow_config_default(&c);
    c.policy = STOW_POLICY_VMM;
    stow_tuning_t t;
    stow_tuning_default(&t);
    t.vmm_handle_mb = 2; /* a handle per granule */
    t.vmm_learn_step = false; /* the allowance alone (test_vmm_learn.c: the learned step) */
    t.vmm_slack = slack;
    t.vmm_slack_max = slack_max;
    cr_assert_eq(stow_pool_create_tuned(&c, &t, backend ? backend : sim, &pool), STOW_OK);
}

static void make_sim(void)
{
    sim = ts_sim(0, false, false);
    cr_assert_not_null(sim);
}

static void make_pool(double slack, double slack_max)
{
    make_sim();
    make_pool_on(NULL, slack, slack_max);
}

static void make_default_pool(void)
{
    stow_tuning_t d;
    stow_tuning_default(&d);
    make_pool(d.vmm_slack, d.vmm_slack_max);
}

static void check(void) { ts_pool_check(pool); }

static stow_stats_t stats(void) { return ts_pool_stats(pool); }

static void *alloc_ok(size_t size)
{
    void *p = NULL;
    cr_assert_eq(stow_pool_alloc(pool, size, NULL, &p), STOW_OK, "alloc %zu", size);
    return p;
}

static void free_ok(void *p) { cr_assert_eq(stow_pool_free(pool, p), STOW_OK); }

static void free_all(void **blocks, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free_ok(blocks[i]);
}

/* Checks the pool, destroys it and the device: nothing left behind. */
static void finish(void)
{
    check();
    cr_assert_eq(stow_pool_destroy(pool), STOW_OK);
    ts_sim_assert_released_then_destroy(sim);
}

static ptrdiff_t granules_between(const void *from, const void *to)
{
    return ((const char *)to - (const char *)from) / (ptrdiff_t)G;
}

/* ---- the placement budget (vmm_place.c) ---- */

/* Holes for a big request, in the large range (addresses in MiB from its
 * base; granule i is [2i, 2i + 2)):
 *   [L1 1][y: y_bytes][L2 up to 260][x1 258][L3 2][x2 258][L4 2][ballast 20]
 * y is freed and empty_cache unmaps its inner granules; x1 and x2 are freed
 * after it, so their 129 granules each (130-258, 260-388) stay mapped,
 * unused. L1 shares granule 0 with y's hole. The ballast only raises the live
 * peak: after empty_cache it is 543 (or 543.5) MiB, 271 whole granules, and
 * the budget floor(271 x 0.00375) = 1 extra granule (the default vmm_slack,
 * 0.0095, halves to 0.00475, above STOW_VMM_PLACE_BUDGET). Fills hole[0] with
 * y, hole[1] with x1, hole[2] with x2, and *live with the blocks that stay. */
static void make_holes(size_t y_bytes, void *hole[3], void *live[5])
{
    live[0] = alloc_ok(1 * MIB);
    hole[0] = alloc_ok(y_bytes);
    live[1] = alloc_ok(259 * MIB - y_bytes); /* ends at 260 MiB, granule 130 */
    hole[1] = alloc_ok(258 * MIB);
    live[2] = alloc_ok(2 * MIB);
    hole[2] = alloc_ok(258 * MIB);
    live[3] = alloc_ok(2 * MIB);
    live[4] = alloc_ok(20 * MIB);
    cr_assert_eq(granules_between(live[0], hole[1]), 130);
    free_ok(hole[0]);
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    free_ok(hole[1]);
    free_ok(hole[2]);
    check();
}

/* The budget caps the extra fresh granules of a move. A 256.5 MiB request's
 * best fit is y's hole of exactly that size, [1, 257.5) MiB: granules 0-128,
 * of which 0 (L1) and 128 (L2) are held by live neighbours, so best fit
 * takes 127 fresh granules, all to map. In x1 it would map none, but its
 * 129 granules are all fresh: 2 extra, above the budget of 1, though it would
 * save 127 maps (more than 16 per extra granule). So it stays at best fit. */
Test(vmm_allowance, a_move_beyond_the_budget_stays_at_best_fit)
{
    make_default_pool();
    void *hole[3], *live[5];
    make_holes(256 * MIB + 512 * KIB, hole, live);
    stow_stats_t before = stats();
    void *c = alloc_ok(256 * MIB + 512 * KIB);
    cr_assert_eq(c, hole[0], "moved %td granules past best fit, 2 extra granules for a budget of 1",
                 granules_between(hole[0], c));
    cr_assert_eq(stats().num_map_calls, before.num_map_calls + 127, "best fit maps its 127");
    check();
    free_ok(c);
    free_all(live, 5);
    finish();
}

/* The same holes, y 257 MiB, L2 2 MiB: a 257 MiB request at y spans granules
 * 0-128, 128 fresh (granule 0 is L1's); in x1 granules 130-258, 129 fresh.
 * One extra granule, within the budget of 1: it moves to x1 and maps
 * nothing. The extra granule it holds is counted while it lives, so the
 * budget is spent: the same request again (best fit y, x2 as good a room as
 * x1 was; the live peak is now 800 MiB, 400 granules, a budget of
 * floor(1.5) = 1) stays at best fit. */
Test(vmm_allowance, a_move_within_the_budget_is_counted_and_spends_it)
{
    make_default_pool();
    void *hole[3], *live[5];
    make_holes(257 * MIB, hole, live);
    stow_stats_t before = stats();
    void *moved = alloc_ok(257 * MIB);
    cr_assert_eq(moved, hole[1], "to x1's mapped granules, not %td granules from y",
                 granules_between(hole[0], moved));
    cr_assert_eq(stats().num_map_calls, before.num_map_calls, "no granule mapped");
    check();
    void *second = alloc_ok(257 * MIB);
    cr_assert_eq(second, hole[0], "the budget is spent: best fit, not %td granules past y",
                 granules_between(hole[0], second));
    check();
    free_ok(second);
    free_ok(moved);
    free_all(live, 5);
    finish();
}

/* ---- empty_cache and the live peak (vmm.c) ---- */

/* empty_cache gives back every unused granule, and the live peak restarts at
 * what is live then: the allowance follows the workload that comes after, not
 * a peak long gone. A 200 MiB block (100 granules) is freed and the cache
 * emptied; then P 20 MiB (granules 0-9) and S 2 MiB (granule 10), P freed,
 * and Q 30 MiB (too big for P's hole: granules 11-25, 15 to map). The live
 * peak is then 32 MiB, an allowance of floor(16 x 1.0095) = 16 granules:
 * P and S take 11 new handles, Q 5 more and P's 10 unused granules,
 * remapped. Measured against the old 200 MiB peak Q would have created all
 * 15 (26 in all). */
Test(vmm_allowance, after_empty_cache_the_allowance_follows_the_new_live_peak)
{
    make_default_pool();
    free_ok(alloc_ok(200 * MIB));
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    stow_stats_t emptied = stats();
    cr_assert_eq(emptied.reserved_bytes[STOW_POOL_ALL].current, 0);
    void *p = alloc_ok(20 * MIB), *s = alloc_ok(2 * MIB);
    free_ok(p);
    void *q = alloc_ok(30 * MIB);
    stow_stats_t after = stats();
    cr_assert_eq(after.num_device_alloc - emptied.num_device_alloc, 16,
                 "handles created up to the new peak's allowance (16), not %llu",
                 (unsigned long long)(after.num_device_alloc - emptied.num_device_alloc));
    cr_assert_eq(after.num_unmap_calls - emptied.num_unmap_calls, 10, "P's granules remapped");
    cr_assert_eq(after.reserved_bytes[STOW_POOL_ALL].current, 16 * G);
    check();
    free_ok(q);
    free_ok(s);
    finish();
}

/* ---- the cap on a warm run's raise (vmm_allowance.c) ---- */

/* A loop whose one moving block lands in two places by turns, on a pool with
 * vmm_slack 0.02 and vmm_slack_max 0.5 (far above: only the 2 x vmm_slack
 * cap of a warm run can stop a raise). Live, in the large range:
 * [weights (198 - k) granules][hole k][pin 1], and 64 KiB in the small
 * range's one granule. A step allocates and frees the moving block, k
 * granules (even steps: best fit is the hole) or k + 1 (odd steps: past the
 * pin), then 255 pairs of 64 KiB (quick-list hits, no granule): 512
 * operations. The live peak is 200 granules and 128 KiB (the filler block
 * kept on its quick list counts), an allowance of floor(200.06 x 1.02) = 204
 * granules, while the step touches 199 - k + k + (k + 1) + 1 = 201 + k: with
 * k = 4 one remap a step, with k = 8 five. Either way one remap per 512 or
 * per 102 operations: every window (8192 operations) is warm (at least one
 * per 1024), none hot (one per 64). Returns the remaps of the last `tail`
 * steps; *remaps and *ops get the run's. */
static uint64_t run_two_room_loop(size_t k, unsigned steps, unsigned tail, uint64_t *remaps,
                                  uint64_t *ops)
{
    void *small = alloc_ok(64 * KIB);
    void *weights = alloc_ok((198 - k) * G);
    void *hole = alloc_ok(k * G);
    void *pin = alloc_ok(G);
    free_ok(hole);
    stow_stats_t first = stats();
    uint64_t tail_start = 0;
    for (unsigned step = 0; step < steps; step++) {
        if (step == steps - tail)
            tail_start = stats().num_unmap_calls;
        void *moving = alloc_ok((step % 2 ? k + 1 : k) * G);
        cr_assert_eq(moving == hole, step % 2 == 0, "step %u: the moving block's room", step);
        free_ok(moving);
        for (int i = 0; i < 255; i++)
            free_ok(alloc_ok(64 * KIB));
        if (step % 64 == 0)
            check();
    }
    stow_stats_t last = stats();
    *remaps = last.num_unmap_calls - first.num_unmap_calls;
    *ops = 512 * (uint64_t)steps;
    check();
    free_ok(pin);
    free_ok(weights);
    free_ok(small);
    return last.num_unmap_calls - tail_start;
}

static void assert_warm(uint64_t remaps, uint64_t ops)
{
    cr_assert_geq(remaps * 1024, ops, "%llu remaps in %llu operations: not warm",
                  (unsigned long long)remaps, (unsigned long long)ops);
    cr_assert_lt(remaps * 64, ops, "%llu remaps in %llu operations: hot",
                 (unsigned long long)remaps, (unsigned long long)ops);
}

/* k = 8: the footprint, 209 granules and the one rounding can cost, needs a
 * slack of 210 / 200.06 - 1 = 0.0497, above 2 x 0.02: 300 steps (153,600
 * operations, two runs of eight warm windows) and no raise, the loop still
 * remapping at the end. */
Test(vmm_allowance, a_warm_loop_whose_footprint_needs_more_than_twice_the_slack_is_not_raised)
{
    make_pool(0.02, 0.5);
    uint64_t remaps = 0, ops = 0;
    uint64_t tail = run_two_room_loop(8, 300, 50, &remaps, &ops);
    assert_warm(remaps, ops);
    cr_assert_eq(stats().num_vmm_allowance_raises, 0, "raised %llu times",
                 (unsigned long long)stats().num_vmm_allowance_raises);
    cr_assert_eq(tail, 5 * 50, "five remaps a step to the end, not %llu in 50 steps",
                 (unsigned long long)tail);
    finish();
}

/* The twin, k = 4: its footprint, 205 granules (+1), needs 206 / 200.06 - 1
 * = 0.0297, within 2 x 0.02: at the end of the first warm run (step 128,
 * 8 windows of 16 steps) the slack goes there, the allowance to
 * floor(200.06 x 1.0297) = 206 granules, and the loop stops remapping,
 * holding the 205 it touches. What
 * stops the k = 8 loop is the cap, not the rate. */
Test(vmm_allowance, a_warm_loop_whose_footprint_is_within_twice_the_slack_is_raised)
{
    make_pool(0.02, 0.5);
    uint64_t remaps = 0, ops = 0;
    uint64_t tail = run_two_room_loop(4, 300, 100, &remaps, &ops);
    assert_warm(remaps, 128 * 512); /* the first warm run: 128 steps */
    cr_assert_geq(remaps, 128);
    cr_assert_eq(stats().num_vmm_allowance_raises, 1);
    cr_assert_eq(tail, 0, "the last 100 steps still remapped %llu times",
                 (unsigned long long)tail);
    uint64_t reserved = stats().reserved_bytes[STOW_POOL_ALL].current;
    cr_assert_eq(reserved, 205 * G, "the 205 granules the step touches, not %llu",
                 (unsigned long long)(reserved / G));
    finish();
}

/* ---- the live peak rounded up (vmm_allowance.c) ---- */

/* The device with its phys_create and unmap calls written down in order
 * ('c', 'u'): which one the pool turns to first for a granule. */
static stow_backend_t logged;
static char call_log[256];
static size_t call_log_len;

static void log_call(char kind)
{
    if (call_log_len + 1 < sizeof call_log)
        call_log[call_log_len++] = kind;
}

static stow_status_t logged_phys_create(void *ctx, size_t size_bytes, stow_phys_t *out)
{
    log_call('c');
    return sim->phys_create(ctx, size_bytes, out);
}

static stow_status_t logged_unmap(void *ctx, void *va, size_t size_bytes)
{
    log_call('u');
    return sim->unmap(ctx, va, size_bytes);
}

static void make_logged_pool(double slack, double slack_max)
{
    make_sim();
    logged = *sim;
    logged.phys_create = logged_phys_create;
    logged.unmap = logged_unmap;
    make_pool_on(&logged, slack, slack_max);
}

/* With vmm_slack 0 the allowance is the live peak itself, in granules
 * rounded up: a peak part way into a granule is allowed that granule. A 2 MiB
 * (granule 0), M 2 MiB (granule 1) and K 1 MiB (granule 2): 3 handles. M
 * freed: granule 1 unused. R 4.5 MiB does not fit M's hole and goes at
 * [5, 9.5) MiB: granules 2 (K's), 3 and 4, two to map. The live peak becomes
 * 7.5 MiB, 3.75 granules: 4 allowed, 3 held, so granule 3 gets a new handle
 * and only granule 4 remaps granule 1. Rounded down (3) the pool would remap
 * first, and create only once no granule was unused. Both end holding the
 * same 4 handles after 1 remap (the live blocks pin ceil(7.5 / 2) granules
 * whatever the order), so the order of the device calls is what shows the
 * rule: it decides what a refused phys_create or a failed map leaves. */
Test(vmm_allowance, a_live_peak_part_way_into_a_granule_is_allowed_that_granule)
{
    make_logged_pool(0.0, 0.0);
    void *a = alloc_ok(2 * MIB), *m = alloc_ok(2 * MIB), *k = alloc_ok(1 * MIB);
    free_ok(m);
    cr_assert_eq(stats().reserved_bytes[STOW_POOL_ALL].current, 3 * G);
    call_log_len = 0;
    void *r = alloc_ok(4 * MIB + 512 * KIB);
    cr_assert_eq(granules_between(a, r), 2, "R starts in K's granule");
    call_log[call_log_len] = '\0';
    cr_assert_str_eq(call_log, "cu", "granule 3 a new handle, then granule 4 a remap: got \"%s\"",
                     call_log);
    stow_stats_t s = stats();
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 4 * G, "ceil(3.75) granules");
    cr_assert_eq(s.num_unmap_calls, 1);
    check();
    free_ok(r);
    free_ok(k);
    free_ok(a);
    finish();
}
