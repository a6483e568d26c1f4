/*
 * tests/unit/test_planned.c: the planned layer (allocator/planned_*.c,
 * docs/planned.md) on classic and page-mapped pools.
 *
 * Every call goes through a checked harness: a shadow of the live blocks
 * (address, size), against which each new block must not overlap any live
 * one (in the arena or not), and stow_pool_check after every call (it checks
 * the planned slots too). Steps are made of a program of requests; a test
 * changes a step (a late free, a missing or an extra request, other sizes,
 * another stream) and checks what the layer did with its counters.
 */
#include <criterion/criterion.h>

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stowage.h"
#include "test_support.h"

#define KIB ((size_t)1 << 10)
#define MIB ((size_t)1 << 20)
#define MAX_LIVE 4096
#define SPIKE_BYTES (512 * MIB)

typedef struct live {
    uintptr_t ptr;
    size_t size;
} live_t;

static stow_backend_t *sim;
static stow_pool_t *pool;
static live_t shadow[MAX_LIVE];
static size_t n_shadow;

/* A pool with the planned layer (conf over planned_steps:true and inline
 * plans), and no history. */
static void make_bare(const char *conf, bool manual_events)
{
    sim = ts_sim(0, false, manual_events);
    char text[256];
    snprintf(text, sizeof text, "policy:classic,planned_steps:true,planned_async:false,%s",
             conf ? conf : "");
    pool = ts_pool(text, sim);
    n_shadow = 0;
}

static void make(const char *conf, bool manual_events)
{
    make_bare(conf, manual_events);
    /* The pool alone once held 512 MiB (a first batch, autotuning), given back
     * since: the budget (what the arena may cost) admits an arena up to that,
     * so that these tests see the layer serve; the budget's own tests start
     * without it (make_bare). */
    void *p = NULL;
    cr_assert_eq(stow_pool_alloc(pool, SPIKE_BYTES, NULL, &p), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, p), STOW_OK);
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    cr_assert_eq(ts_pool_stats(pool).reserved_bytes[STOW_POOL_ALL].current, 0);
}

static void finish(void)
{
    ts_pool_check(pool);
    cr_assert_eq(stow_pool_destroy(pool), STOW_OK);
    ts_sim_assert_released_then_destroy(sim);
}

/* A checked allocation: no overlap with any live block. */
static void *alloc_on(size_t size, stow_stream_t stream)
{
    void *p = NULL;
    cr_assert_eq(stow_pool_alloc(pool, size, stream, &p), STOW_OK, "alloc %zu", size);
    size_t block = 0;
    cr_assert_eq(stow_pool_block_size(pool, p, &block, NULL), STOW_OK);
    cr_assert_geq(block, size);
    uintptr_t a = (uintptr_t)p;
    for (size_t i = 0; i < n_shadow; i++)
        cr_assert(a + block <= shadow[i].ptr || shadow[i].ptr + shadow[i].size <= a,
                  "block %#lx (%zu) overlaps live %#lx (%zu)", (unsigned long)a, block,
                  (unsigned long)shadow[i].ptr, shadow[i].size);
    cr_assert_lt(n_shadow, MAX_LIVE);
    shadow[n_shadow++] = (live_t){a, block};
    ts_pool_check(pool);
    return p;
}

static void *alloc(size_t size) { return alloc_on(size, NULL); }

static void release(void *p)
{
    cr_assert_eq(stow_pool_free(pool, p), STOW_OK);
    for (size_t i = 0; i < n_shadow; i++)
        if (shadow[i].ptr == (uintptr_t)p) {
            shadow[i] = shadow[--n_shadow];
            break;
        }
    ts_pool_check(pool);
}

static void step(const char *key)
{
    cr_assert_eq(stow_pool_step(pool, key), STOW_OK);
    ts_pool_check(pool);
}

/* The step program: sizes allocated in order; frees[i] = the allocation index
 * freed right before allocation i (or -1). What is live at the end is freed
 * in allocation order (or, with `carry`, left for the caller). */
#define STEP_ALLOCS 12
static const size_t step_sizes[STEP_ALLOCS] = {
    64 * MIB, 3 * MIB, 4 * KIB, 100 * KIB, 64 * MIB, 512, 7 * MIB, 40 * MIB, 1 * MIB, 96, 30 * MIB, 8 * KIB};
static const int step_frees[STEP_ALLOCS] = {-1, -1, -1, 1, -1, 2, 0, 4, -1, 8, 6, 3};

static void *blocks[STEP_ALLOCS];

/* Before allocation i: frees what the step frees there (but `late`, or -1). */
static void free_before(int i, int late)
{
    int f = step_frees[i];
    if (f >= 0 && f != late && blocks[f]) {
        release(blocks[f]);
        blocks[f] = NULL;
    }
}

/* Frees what is live at the step's end, in allocation order. */
static void free_the_rest(void)
{
    for (int i = 0; i < STEP_ALLOCS; i++)
        if (blocks[i]) {
            release(blocks[i]);
            blocks[i] = NULL;
        }
}

/* One step; `late` (an allocation index, or -1) is freed at the end rather
 * than when the program frees it; `skip` is not requested at all; `extra`
 * adds a request of that many bytes before allocation `extra_at`. */
static void run_step_at(const char *key, int late, int skip, size_t extra, int extra_at,
                        bool end_with_null)
{
    if (key)
        step(key);
    void *extra_block = NULL;
    for (int i = 0; i < STEP_ALLOCS; i++) {
        free_before(i, late);
        if (i == extra_at && extra)
            extra_block = alloc(extra);
        blocks[i] = i == skip ? NULL : alloc(step_sizes[i]);
    }
    free_the_rest();
    if (extra_block)
        release(extra_block);
    if (end_with_null)
        step(NULL);
}

/* The same, an extra request going before allocation 5. */
static void run_step(const char *key, int late, int skip, size_t extra, bool end_with_null)
{
    run_step_at(key, late, skip, extra, 5, end_with_null);
}

static void loop_of(const char *conf)
{
    make(conf, false);
    void *w = alloc(200 * MIB); /* weights: before any step, never freed here */
    for (int s = 0; s < 3; s++)
        run_step("train", -1, -1, 0, false);
    /* Warm-up 1, two steps recorded: the plan is made when the fourth begins. */
    stow_stats_t before = ts_pool_stats(pool);
    cr_assert_eq(before.num_plans, 0);
    cr_assert_eq(before.num_planned_hits, 0);
    /* The plan serves the next steps entirely, at the same addresses. */
    uintptr_t first[STEP_ALLOCS];
    for (int s = 0; s < 6; s++) {
        step("train"); /* the end of the first planned step trims the pool, once */
        stow_stats_t a = ts_pool_stats(pool);
        for (int i = 0; i < STEP_ALLOCS; i++) {
            free_before(i, -1);
            blocks[i] = alloc(step_sizes[i]);
            if (s == 0)
                first[i] = (uintptr_t)blocks[i];
            else
                cr_assert_eq((uintptr_t)blocks[i], first[i], "step %d, allocation %d moved", s,
                             i);
        }
        free_the_rest();
        stow_stats_t b = ts_pool_stats(pool);
        cr_assert_eq(b.num_planned_hits - a.num_planned_hits, STEP_ALLOCS, "step %d", s);
        cr_assert_eq(b.num_planned_fallbacks, a.num_planned_fallbacks);
        if (s >= 1) /* after the first planned step (the pool's trim): no backend call */
            cr_assert_eq(b.num_backend_calls, a.num_backend_calls, "step %d", s);
    }
    stow_stats_t s = ts_pool_stats(pool);
    cr_assert_gt(s.arena_bytes, 0);
    cr_assert_geq(s.arena_bytes, s.arena_peak_bytes);
    cr_assert_gt(s.arena_peak_bytes, 0);
    cr_assert_eq(s.num_planned_misses, 0);
    release(w);
    step(NULL);
    finish();
}

Test(planned, steps_are_recorded_planned_and_served_classic) { loop_of(NULL); }
Test(planned, steps_are_recorded_planned_and_served_vmm) { loop_of("policy:vmm"); }

/* Without the key nothing is planned, and markers change no block. */
Test(planned, off_by_default_markers_change_nothing)
{
    sim = ts_sim(0, false, false);
    cr_assert_eq(stow_pool_create(NULL, sim, &pool), STOW_OK);
    n_shadow = 0;
    for (int s = 0; s < 8; s++)
        run_step("train", -1, -1, 0, false);
    stow_stats_t st = ts_pool_stats(pool);
    cr_assert_eq(st.num_plans + st.num_planned_hits + st.num_planned_fallbacks, 0);
    cr_assert_eq(st.arena_bytes, 0);
    finish();
}

/* Warm into a planned state (plan in use from the fifth step on). */
static void warm(const char *conf, bool manual_events)
{
    make(conf, manual_events);
    for (int s = 0; s < 4; s++)
        run_step("train", -1, -1, 0, false);
    cr_assert_eq(ts_pool_stats(pool).num_plans, 1);
}

/* A block freed later than recorded: the slots that share its bytes go to
 * the pool until it is freed; nothing ever overlaps (the harness checks). */
static void late_free(const char *conf)
{
    warm(conf, false);
    stow_stats_t a = ts_pool_stats(pool);
    for (int late = 0; late < STEP_ALLOCS; late++)
        run_step("train", late, -1, 0, false);
    stow_stats_t b = ts_pool_stats(pool);
    cr_assert_gt(b.num_planned_fallbacks, a.num_planned_fallbacks, "some slots waited");
    cr_assert_gt(b.num_planned_hits, a.num_planned_hits);
    /* Back to the recorded order: every request from its slot again. */
    run_step("train", -1, -1, 0, false);
    a = ts_pool_stats(pool);
    run_step("train", -1, -1, 0, false);
    b = ts_pool_stats(pool);
    cr_assert_eq(b.num_planned_hits - a.num_planned_hits, STEP_ALLOCS);
    step(NULL);
    finish();
}

Test(planned, a_late_free_sends_what_shares_its_bytes_to_the_pool_classic) { late_free(NULL); }
Test(planned, a_late_free_sends_what_shares_its_bytes_to_the_pool_vmm)
{
    late_free("policy:vmm");
}

/* Whether the slots of two allocations of the step, at the addresses a
 * planned step gave them, share a byte (slots are sizes rounded to 512). */
static bool slots_share(const uintptr_t *at, int i, int j)
{
    size_t si = (step_sizes[i] + 511) / 512 * 512, sj = (step_sizes[j] + 511) / 512 * 512;
    return at[i] < at[j] + sj && at[j] < at[i] + si;
}

/* While a block is freed late, exactly the slots that share its bytes go to
 * the pool; every other request of the step keeps its planned address. */
static void late_free_blocks_only_its_bytes(const char *conf)
{
    warm(conf, false);
    uintptr_t planned[STEP_ALLOCS];
    run_step("train", -1, -1, 0, false);
    step("train");
    for (int i = 0; i < STEP_ALLOCS; i++) {
        free_before(i, -1);
        blocks[i] = alloc(step_sizes[i]);
        planned[i] = (uintptr_t)blocks[i];
    }
    free_the_rest();
    unsigned sent = 0, kept = 0;
    for (int late = 0; late < STEP_ALLOCS; late++) {
        int due = -1;
        for (int i = 0; i < STEP_ALLOCS; i++)
            if (step_frees[i] == late)
                due = i;
        if (due < 0)
            continue;
        step("train");
        for (int i = 0; i < STEP_ALLOCS; i++) {
            free_before(i, late);
            blocks[i] = alloc(step_sizes[i]);
            bool to_pool = i >= due && slots_share(planned, i, late);
            if (to_pool)
                cr_assert_neq((uintptr_t)blocks[i], planned[i], "late %d: %d shares its bytes",
                              late, i);
            else
                cr_assert_eq((uintptr_t)blocks[i], planned[i], "late %d: %d moved", late, i);
            sent += to_pool;
            kept += i >= due && !to_pool;
        }
        free_the_rest();
    }
    cr_assert_gt(sent, 0);
    cr_assert_gt(kept, 0, "a late free held slots that do not share its bytes");
    step(NULL);
    finish();
}

Test(planned, a_late_free_holds_only_the_slots_over_its_bytes_classic)
{
    late_free_blocks_only_its_bytes(NULL);
}
Test(planned, a_late_free_holds_only_the_slots_over_its_bytes_vmm)
{
    late_free_blocks_only_its_bytes("policy:vmm");
}

/* One step of three requests, the first two of the sizes given. */
static void varying_step(size_t first, size_t second)
{
    step("vary");
    void *a = alloc(first), *b = alloc(second), *c = alloc(8 * MIB);
    release(a);
    release(b);
    release(c);
}

/* A request smaller than any seen at its position keeps that position, even
 * when its size lies in the range of a later one (a shape that varies): the
 * rest of the step stays aligned. */
Test(planned, a_smaller_request_keeps_its_position)
{
    make(NULL, false);
    varying_step(40 * MIB, 20 * MIB); /* warm-up */
    varying_step(40 * MIB, 20 * MIB); /* recorded: 40-48 MiB, then 20-24 MiB */
    varying_step(48 * MIB, 24 * MIB);
    varying_step(44 * MIB, 22 * MIB); /* planned */
    stow_stats_t a = ts_pool_stats(pool);
    cr_assert_eq(a.num_plans, 1);
    varying_step(22 * MIB, 20 * MIB);
    stow_stats_t b = ts_pool_stats(pool);
    cr_assert_eq(b.num_planned_hits - a.num_planned_hits, 3);
    cr_assert_eq(b.num_planned_realignments, a.num_planned_realignments);
    cr_assert_eq(b.num_planned_misses, a.num_planned_misses);
    step(NULL);
    finish();
}

/* A position whose size varied over the recorded steps gets a slot with
 * that spread again on top: a step a little larger than any seen still fits. */
Test(planned, a_size_that_varied_gets_a_slot_with_its_spread)
{
    make(NULL, false);
    varying_step(40 * MIB, 20 * MIB); /* warm-up */
    varying_step(40 * MIB, 20 * MIB); /* recorded: 40-44 MiB, then 20-22 MiB */
    varying_step(44 * MIB, 22 * MIB);
    varying_step(42 * MIB, 21 * MIB); /* planned */
    stow_stats_t a = ts_pool_stats(pool);
    cr_assert_eq(a.num_plans, 1);
    varying_step(47 * MIB, 23 * MIB + 512 * KIB); /* above what was seen, within the spread */
    stow_stats_t b = ts_pool_stats(pool);
    cr_assert_eq(b.num_planned_hits - a.num_planned_hits, 3);
    cr_assert_eq(b.num_planned_misses, a.num_planned_misses);
    varying_step(49 * MIB, 21 * MIB); /* beyond the slot: a miss */
    stow_stats_t c = ts_pool_stats(pool);
    cr_assert_eq(c.num_planned_misses - b.num_planned_misses, 1);
    step(NULL);
    finish();
}

/* A request larger than any seen at a position whose size varies is that
 * position's request, grown: it goes to the pool, and the next request
 * takes the next position (the slot it had before), not the grown one's. */
Test(planned, a_grown_request_keeps_the_step_aligned)
{
    make(NULL, false);
    varying_step(40 * MIB, 20 * MIB);
    varying_step(40 * MIB, 20 * MIB);
    varying_step(44 * MIB, 22 * MIB);
    step("vary");
    void *a = alloc(42 * MIB), *b = alloc(21 * MIB), *c = alloc(8 * MIB);
    uintptr_t second_at = (uintptr_t)b;
    release(a);
    release(b);
    release(c);
    stow_stats_t before = ts_pool_stats(pool);
    cr_assert_eq(before.num_plans, 1);
    cr_assert_eq(before.num_planned_misses, 0);
    step("vary");
    a = alloc(64 * MIB); /* grown past its slot */
    b = alloc(21 * MIB);
    c = alloc(8 * MIB);
    cr_assert_eq((uintptr_t)b, second_at, "the second request keeps its slot");
    release(a);
    release(b);
    release(c);
    stow_stats_t after = ts_pool_stats(pool);
    cr_assert_eq(after.num_planned_misses - before.num_planned_misses, 1);
    cr_assert_eq(after.num_planned_hits - before.num_planned_hits, 2);
    cr_assert_eq(after.num_planned_realignments, before.num_planned_realignments);
    step(NULL);
    finish();
}

/* A request inserted before a position whose size never varied, smaller
 * than that position's, goes to the pool: taking the position would leave
 * its own request, and every one after it, a position behind. */
Test(planned, an_inserted_smaller_request_leaves_the_step_in_place)
{
    warm(NULL, false);
    stow_stats_t a = ts_pool_stats(pool);
    run_step_at("train", -1, -1, 10 * MIB, 4, false); /* before a 64 MiB request */
    stow_stats_t b = ts_pool_stats(pool);
    cr_assert_eq(b.num_planned_hits - a.num_planned_hits, STEP_ALLOCS);
    cr_assert_eq(b.num_planned_misses - a.num_planned_misses, 1);
    step(NULL);
    finish();
}

/* A key's block freed in the next key's step (another phase of the loop)
 * does not stop the next key's plan: its slot blocks only the slots that
 * share its bytes. */
Test(planned, another_keys_late_block_blocks_only_its_bytes)
{
    make(NULL, false);
    void *kept = NULL;
    for (int s = 0; s < 10; s++) {
        step("a");
        void *x = alloc(64 * MIB);
        kept = alloc(512); /* freed in b's step */
        release(x);
        step("b");
        stow_stats_t before = ts_pool_stats(pool);
        void *q[5];
        for (int i = 0; i < 5; i++)
            q[i] = alloc(MIB);
        stow_stats_t during = ts_pool_stats(pool);
        release(kept);
        for (int i = 0; i < 5; i++)
            release(q[i]);
        if (s >= 6) {
            cr_assert_eq(during.num_plans, 2);
            /* Disjoint slots: the 512 bytes share bytes with one of them at most. */
            cr_assert_geq(during.num_planned_hits - before.num_planned_hits, 4, "step %d", s);
        }
    }
    step(NULL);
    finish();
}

/* A missing request is skipped by looking ahead; an extra one goes to the
 * pool and the next ones find their positions. */
Test(planned, missing_and_extra_requests_realign)
{
    warm(NULL, false);
    stow_stats_t a = ts_pool_stats(pool);
    run_step("train", -1, 4, 0, false); /* allocation 4 missing */
    stow_stats_t b = ts_pool_stats(pool);
    cr_assert_eq(b.num_planned_hits - a.num_planned_hits, STEP_ALLOCS - 1);
    cr_assert_geq(b.num_planned_realignments - a.num_planned_realignments, 1);
    run_step("train", -1, -1, 12345, false); /* an extra request of a new size */
    stow_stats_t c = ts_pool_stats(pool);
    cr_assert_eq(c.num_planned_hits - b.num_planned_hits, STEP_ALLOCS);
    cr_assert_eq(c.num_planned_misses - b.num_planned_misses, 1);
    step(NULL);
    finish();
}

/* Requests larger than their slot miss; when steps keep missing, the key is
 * recorded and planned again, with slots for the larger sizes. */
Test(planned, steps_that_keep_missing_are_planned_again)
{
    warm(NULL, false);
    stow_stats_t a = ts_pool_stats(pool);
    for (int s = 0; s < 12; s++) {
        step("train");
        void *p[STEP_ALLOCS];
        for (int i = 0; i < STEP_ALLOCS; i++)
            p[i] = alloc(step_sizes[i] + (i % 3 == 0 ? 5 * KIB : 0));
        for (int i = 0; i < STEP_ALLOCS; i++)
            release(p[i]);
    }
    stow_stats_t b = ts_pool_stats(pool);
    cr_assert_gt(b.num_planned_misses, a.num_planned_misses);
    cr_assert_eq(b.num_plans, 2, "planned again");
    cr_assert_eq(b.num_plans_dropped, 1);
    /* The new plan's slots hold the larger sizes: a whole step from the arena. */
    step("train");
    void *p[STEP_ALLOCS];
    for (int i = 0; i < STEP_ALLOCS; i++)
        p[i] = alloc(step_sizes[i] + (i % 3 == 0 ? 5 * KIB : 0));
    for (int i = 0; i < STEP_ALLOCS; i++)
        release(p[i]);
    stow_stats_t c = ts_pool_stats(pool);
    cr_assert_eq(c.num_planned_hits - b.num_planned_hits, STEP_ALLOCS);
    cr_assert_eq(c.num_planned_misses, b.num_planned_misses);
    step(NULL);
    finish();
}

/* Two keys with other programs share one arena, sized to the larger plan. */
Test(planned, alternating_keys_share_one_arena)
{
    make(NULL, false);
    for (int s = 0; s < 10; s++) {
        run_step("train", -1, -1, 0, false);
        step("eval");
        void *a = alloc(300 * MIB), *b = alloc(2 * MIB);
        release(a);
        void *c = alloc(5 * KIB);
        release(b);
        release(c);
    }
    stow_stats_t st = ts_pool_stats(pool);
    cr_assert_eq(st.num_plans, 2);
    /* eval's plan (300 + 2 MiB live at once) is the larger: the arena is its
     * height, not the sum of both plans. */
    cr_assert_geq(st.arena_bytes, 302 * MIB);
    cr_assert_lt(st.arena_bytes, 310 * MIB);
    cr_assert_gt(st.num_planned_hits, 0);
    step(NULL);
    finish();
}

/* Key "train" planned, past its first planned steps and the trim after them. */
static void warm_and_trimmed(const char *conf)
{
    warm(conf, false);
    for (int s = 0; s < 2; s++)
        run_step("train", -1, -1, 0, false);
}

/* A step of key "short" (another shape bucket): 98 MiB live at its peak. */
static void short_step(void)
{
    step("short");
    void *x = alloc(90 * MIB), *y = alloc(8 * MIB);
    release(x);
    release(y);
}

/* A step whose key has no plan yet (a new shape bucket), while no slot is
 * busy: the pool serves it in the idle arena's place, not beside it, and the
 * planned key takes the arena back at its next step, mapping nothing. */
static void unplanned_step_in_the_arenas_place(const char *conf)
{
    warm_and_trimmed(conf);
    stow_stats_t a = ts_pool_stats(pool);
    cr_assert_gt(a.arena_bytes, 100 * MIB);
    uint64_t reserved = a.reserved_bytes[STOW_POOL_ALL].current;
    short_step();
    stow_stats_t b = ts_pool_stats(pool);
    cr_assert_leq(b.reserved_bytes[STOW_POOL_ALL].current, reserved,
                  "the unplanned step reserved %" PRIu64 " bytes beside the arena",
                  b.reserved_bytes[STOW_POOL_ALL].current - reserved);
    run_step("train", -1, -1, 0, false);
    stow_stats_t c = ts_pool_stats(pool);
    cr_assert_eq(c.arena_bytes, a.arena_bytes);
    cr_assert_eq(c.num_planned_hits - b.num_planned_hits, STEP_ALLOCS);
    cr_assert_leq(c.reserved_bytes[STOW_POOL_ALL].current, reserved);
    cr_assert_eq(c.num_map_calls, b.num_map_calls, "taking the arena back mapped granules");
    step(NULL);
    finish();
}

Test(planned, a_step_without_a_plan_takes_the_idle_arenas_place_classic)
{
    unplanned_step_in_the_arenas_place(NULL);
}
Test(planned, a_step_without_a_plan_takes_the_idle_arenas_place_vmm)
{
    unplanned_step_in_the_arenas_place("policy:vmm");
}

/* The same, until the second key is planned too: taking the lent arena back
 * for it releases none of the arena's memory (a page-mapped pool would map
 * it again), and the two keys then alternate in it with no map, unmap or
 * reservation. */
static void second_key_planned_in_the_lent_arena(const char *conf)
{
    warm_and_trimmed(conf);
    stow_stats_t a = ts_pool_stats(pool);
    for (int s = 0; s < 8; s++) {
        short_step();
        if (s >= 4)
            run_step("train", -1, -1, 0, false);
    }
    stow_stats_t b = ts_pool_stats(pool);
    cr_assert_eq(b.num_plans, 2);
    cr_assert_eq(b.arena_bytes, a.arena_bytes, "the larger plan sizes the arena");
    cr_assert_leq(b.reserved_bytes[STOW_POOL_ALL].current, a.reserved_bytes[STOW_POOL_ALL].current);
    cr_assert_eq(b.num_map_calls, a.num_map_calls);
    cr_assert_eq(b.num_unmap_calls, a.num_unmap_calls);
    /* The one call: the synchronize of the trim after the new plan's first step. */
    cr_assert_eq(b.num_backend_calls - a.num_backend_calls, 1);
    cr_assert_eq(b.num_sync_all_streams - a.num_sync_all_streams, 1);
    step(NULL);
    finish();
}

Test(planned, a_second_key_is_planned_in_the_lent_arena_classic)
{
    second_key_planned_in_the_lent_arena(NULL);
}
Test(planned, a_second_key_is_planned_in_the_lent_arena_vmm)
{
    second_key_planned_in_the_lent_arena("policy:vmm");
}

/* ---- the budget: an arena never takes reserved memory past what the pool
 * alone reached ---- */

/* Step s of a loop whose requests are the step program's times scale[s] (a
 * sequence length that changes). */
static const double varying_scale[] = {1.3, 1, 1, 1, 1, 1, 1.2, 0.7, 2.0, 1, 2.5, 1, 0.8, 1, 1};
#define VARYING_STEPS (sizeof varying_scale / sizeof varying_scale[0])

/* Runs the loop with markers (or not) on a fresh pool without history and
 * returns its reserved peak; *hits and *dropped get the layer's counts. */
static uint64_t varying_loop(const char *conf, bool markers, uint64_t *hits, uint64_t *dropped)
{
    make_bare(conf, false);
    void *w = alloc(200 * MIB);
    for (size_t s = 0; s < VARYING_STEPS; s++) {
        if (markers)
            step("train");
        for (int i = 0; i < STEP_ALLOCS; i++) {
            free_before(i, -1);
            size_t bytes = (size_t)((double)step_sizes[i] * varying_scale[s]);
            blocks[i] = alloc(bytes ? bytes : 1);
        }
        free_the_rest();
    }
    release(w);
    if (markers)
        step(NULL);
    stow_stats_t st = ts_pool_stats(pool);
    *hits = st.num_planned_hits;
    *dropped = st.num_plans_dropped;
    finish();
    return st.reserved_bytes[STOW_POOL_ALL].peak;
}

static void never_above_the_pool_alone(const char *policy)
{
    char alone_conf[64], planned_conf[64];
    snprintf(alone_conf, sizeof alone_conf, "%s,planned_steps:false", policy);
    snprintf(planned_conf, sizeof planned_conf, "%s", policy);
    uint64_t hits, dropped;
    uint64_t alone = varying_loop(alone_conf, false, &hits, &dropped);
    cr_assert_eq(hits, 0);
    uint64_t planned = varying_loop(planned_conf, true, &hits, &dropped);
    cr_assert_gt(hits, 0, "the plan served steps");
    cr_assert_gt(dropped, 0, "a grown step dropped the plan");
    cr_assert_leq(planned, alone + alone / 100, "peak %" PRIu64 " with the plan, %" PRIu64
                  " alone", planned, alone);
}

/* The plan serves the steps of the first length; a longer step, which the
 * pool must grow beside the arena for, dissolves it (its busy slots become
 * the pool's blocks, freed as such), and the peak stays within 1 % of the
 * pool's alone (the pool goes on from another layout than it would have). */
Test(planned, a_plan_that_stops_paying_is_dissolved_classic)
{
    never_above_the_pool_alone("policy:classic");
}
Test(planned, a_plan_that_stops_paying_is_dissolved_vmm)
{
    never_above_the_pool_alone("policy:vmm");
}

/* A plan whose arena, with what the pool keeps, would take reserved memory
 * past the pool's own high-water mark is not taken: no arena, no trim, and
 * the pool serves as it does alone (here an arena twice the plan's height). */
static void arena_not_taken(const char *policy)
{
    char conf[64];
    snprintf(conf, sizeof conf, "%s,planned_headroom:1", policy);
    make_bare(conf, false);
    void *w = alloc(200 * MIB);
    for (int s = 0; s < 10; s++)
        run_step("train", -1, -1, 0, false);
    stow_stats_t a = ts_pool_stats(pool);
    cr_assert_gt(a.num_plans, 0);
    cr_assert_eq(a.arena_bytes, 0);
    cr_assert_eq(a.num_planned_hits, 0);
    cr_assert_eq(a.num_plan_trims, 0, "no trim for a plan not taken");
    release(w);
    step(NULL);
    finish();
    uint64_t hits, dropped;
    uint64_t peak = a.reserved_bytes[STOW_POOL_ALL].peak;
    make_bare(policy, false);
    w = alloc(200 * MIB);
    for (int s = 0; s < 10; s++)
        run_step(NULL, -1, -1, 0, false);
    cr_assert_eq(ts_pool_stats(pool).reserved_bytes[STOW_POOL_ALL].peak, peak,
                 "the same peak as without markers");
    release(w);
    finish();
    (void)hits, (void)dropped;
}

Test(planned, an_arena_that_does_not_pay_is_not_taken_classic)
{
    arena_not_taken("policy:classic");
}
Test(planned, an_arena_that_does_not_pay_is_not_taken_vmm) { arena_not_taken("policy:vmm"); }

/* A step ended with stow_pool_step(NULL) is planned at once: the second call
 * of an inference is served from the arena, but for what outlives it. */
Test(planned, an_inference_call_is_served_from_its_second_call)
{
    make(NULL, false);
    void *w = alloc(100 * MIB);
    void *out = NULL;
    for (int call = 0; call < 4; call++) {
        stow_stats_t a = ts_pool_stats(pool);
        step("infer-bs8");
        void *x = alloc(10 * MIB), *h1 = alloc(20 * MIB);
        release(x);
        void *h2 = alloc(20 * MIB);
        release(h1);
        void *o = alloc(1 * MIB); /* the output: outlives the call */
        release(h2);
        step(NULL);
        if (out)
            release(out);
        out = o;
        stow_stats_t b = ts_pool_stats(pool);
        if (call >= 1) {
            cr_assert_eq(b.num_planned_hits - a.num_planned_hits, 3, "call %d", call);
            cr_assert_eq(b.num_planned_fallbacks - a.num_planned_fallbacks, 1, "the output");
        }
    }
    release(out);
    release(w);
    finish();
}

/* empty_cache gives the arena back when no slot is busy; the next planned
 * step takes it again. */
Test(planned, empty_cache_returns_the_arena_when_nothing_is_busy)
{
    warm(NULL, false);
    cr_assert_gt(ts_pool_stats(pool).arena_bytes, 0);
    step("train");
    void *p = alloc(step_sizes[0]);
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    cr_assert_gt(ts_pool_stats(pool).arena_bytes, 0, "a slot is busy: kept");
    release(p);
    step(NULL);
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    stow_stats_t s = ts_pool_stats(pool);
    cr_assert_eq(s.arena_bytes, 0);
    cr_assert_eq(s.reserved_bytes[STOW_POOL_ALL].current, 0);
    stow_stats_t a = ts_pool_stats(pool);
    run_step("train", -1, -1, 0, false);
    stow_stats_t b = ts_pool_stats(pool);
    cr_assert_eq(b.num_planned_hits - a.num_planned_hits, STEP_ALLOCS, "the plan was kept");
    step(NULL);
    finish();
}

/* Bad frees of arena addresses are refused with the books unchanged. */
Test(planned, foreign_interior_and_double_frees_in_the_arena)
{
    warm(NULL, false);
    step("train");
    void *p = alloc(step_sizes[0]);
    stow_stats_t a = ts_pool_stats(pool);
    cr_assert_eq(stow_pool_free(pool, (char *)p + 512), STOW_ENOTOWNED);
    cr_assert_eq(stow_record_stream(pool, (char *)p + 512, (stow_stream_t)0x9), STOW_ENOTOWNED);
    cr_assert_eq(stow_pool_block_size(pool, (char *)p + 512, NULL, NULL), STOW_ENOTOWNED);
    stow_stats_t b = ts_pool_stats(pool);
    cr_assert_eq(b.num_invalid_frees, a.num_invalid_frees + 1);
    cr_assert_eq(b.allocated_bytes[STOW_POOL_ALL].current, a.allocated_bytes[STOW_POOL_ALL].current);
    release(p);
    cr_assert_eq(stow_pool_free(pool, p), STOW_ENOTOWNED, "double free");
    ts_pool_check(pool);
    step(NULL);
    finish();
}

/* A slot named on another stream with record_stream waits for an event on
 * that stream before anything reuses its bytes. */
Test(planned, record_stream_makes_a_slot_wait_for_its_event)
{
    warm(NULL, true);
    stow_stream_t other = (stow_stream_t)0x77;
    step("train");
    void *p = alloc(step_sizes[0]);
    cr_assert_eq(stow_record_stream(pool, p, other), STOW_OK);
    release(p);
    stow_stats_t s = ts_pool_stats(pool);
    cr_assert_gt(s.active_bytes[STOW_POOL_ALL].current, s.allocated_bytes[STOW_POOL_ALL].current,
                 "pending");
    /* Its next instance (next step, same bytes) must wait: to the pool. */
    step("train");
    stow_stats_t a = ts_pool_stats(pool);
    void *q = alloc(step_sizes[0]);
    stow_stats_t b = ts_pool_stats(pool);
    cr_assert_eq(b.num_planned_hits, a.num_planned_hits, "its slot still waits");
    release(q);
    stow_sim_complete_stream(sim, other);
    step("train");
    a = ts_pool_stats(pool);
    q = alloc(step_sizes[0]);
    b = ts_pool_stats(pool);
    cr_assert_eq(b.num_planned_hits, a.num_planned_hits + 1, "the event completed");
    release(q);
    step(NULL);
    finish();
}

/* Requests on two streams: each stream's slots in a region of its own. The
 * arena was taken on one stream, so the layout waits for that stream's
 * event before the other stream uses its bytes; the work of each step
 * completes before the next. */
Test(planned, two_streams_plan_and_hit)
{
    make(NULL, true);
    stow_stream_t s1 = (stow_stream_t)0x11, s2 = (stow_stream_t)0x22;
    for (int s = 0; s < 8; s++) {
        stow_stats_t a = ts_pool_stats(pool);
        step("train");
        void *x = alloc_on(8 * MIB, s1), *y = alloc_on(8 * MIB, s2);
        release(x);
        void *z = alloc_on(4 * MIB, s1);
        release(y);
        release(z);
        stow_stats_t b = ts_pool_stats(pool);
        if (s >= 4)
            cr_assert_eq(b.num_planned_hits - a.num_planned_hits, 3, "step %d", s);
        stow_sim_complete_stream(sim, s1);
        stow_sim_complete_stream(sim, s2);
    }
    cr_assert_geq(ts_pool_stats(pool).arena_bytes, 16 * MIB, "two regions");
    step(NULL);
    finish();
}

/* A key on another stream takes the arena over only once events on the
 * streams that used it completed. */
Test(planned, another_stream_waits_for_the_clearance)
{
    make(NULL, true);
    stow_stream_t s1 = (stow_stream_t)0x11, s2 = (stow_stream_t)0x22;
    for (int s = 0; s < 5; s++) {
        step("a");
        void *x = alloc_on(8 * MIB, s1);
        release(x);
        step("b");
        void *y = alloc_on(8 * MIB, s2);
        release(y);
    }
    /* Both planned; a's slot ran on s1 last: b waits for s1's event. */
    step("a");
    void *x = alloc_on(8 * MIB, s1);
    release(x);
    step("b");
    stow_stats_t a = ts_pool_stats(pool);
    void *y = alloc_on(8 * MIB, s2);
    stow_stats_t b = ts_pool_stats(pool);
    cr_assert_eq(b.num_planned_hits, a.num_planned_hits, "s1's work may still use the bytes");
    release(y);
    stow_sim_complete_stream(sim, s1);
    stow_sim_complete_stream(sim, s2);
    step("b");
    a = ts_pool_stats(pool);
    y = alloc_on(8 * MIB, s2);
    b = ts_pool_stats(pool);
    cr_assert_eq(b.num_planned_hits, a.num_planned_hits + 1);
    release(y);
    step(NULL);
    finish();
}

/* Steps that never repeat stop being planned, and then cost a lookup. */
Test(planned, a_key_that_never_settles_stops_being_planned)
{
    make(NULL, false);
    uint64_t rng = 7;
    for (int s = 0; s < 40; s++) {
        step("chaos");
        unsigned n = 1 + (unsigned)(ts_xorshift(&rng) % 6);
        void *p[8];
        for (unsigned i = 0; i < n; i++)
            p[i] = alloc(512 * (1 + ts_xorshift(&rng) % 5000));
        for (unsigned i = 0; i < n; i++)
            release(p[i]);
    }
    stow_stats_t st = ts_pool_stats(pool);
    cr_assert_geq(st.num_plans_unsettled, 1);
    step(NULL);
    finish();
}

/* A key left alone (its steps never repeat) does not borrow the arena of a
 * planned key it alternates with: it would hand it back and forth for good. */
Test(planned, a_key_left_alone_leaves_the_arena_in_place)
{
    make(NULL, false);
    uint64_t rng = 7;
    size_t arena = 0;
    for (int s = 0; s < 40; s++) {
        run_step("train", -1, -1, 0, false);
        stow_stats_t a = ts_pool_stats(pool);
        if (s >= 4)
            arena = a.arena_bytes;
        step("chaos");
        unsigned n = 1 + (unsigned)(ts_xorshift(&rng) % 6);
        void *p[8];
        for (unsigned i = 0; i < n; i++)
            p[i] = alloc(512 * (1 + ts_xorshift(&rng) % 5000));
        stow_stats_t b = ts_pool_stats(pool);
        if (b.num_plans_unsettled >= 1)
            cr_assert_eq(b.arena_bytes, arena, "step %d: a key left alone took the arena", s);
        for (unsigned i = 0; i < n; i++)
            release(p[i]);
    }
    cr_assert_geq(ts_pool_stats(pool).num_plans_unsettled, 1);
    cr_assert_gt(arena, 0);
    step(NULL);
    finish();
}

/* More keys than the layer keeps: the least recently used one goes. */
Test(planned, the_least_recently_used_key_goes)
{
    make(NULL, false);
    char key[16];
    for (int round = 0; round < 5; round++)
        for (int k = 0; k < 10; k++) {
            snprintf(key, sizeof key, "k%d", k);
            step(key);
            void *p = alloc((size_t)(k + 1) * MIB);
            release(p);
        }
    /* Ten keys round robin over eight slots: each is dropped before it plans. */
    cr_assert_eq(ts_pool_stats(pool).num_plans, 0);
    for (int s = 0; s < 6; s++) {
        step("k0");
        void *p = alloc(MIB);
        release(p);
    }
    cr_assert_eq(ts_pool_stats(pool).num_plans, 1);
    step(NULL);
    finish();
}

/* With planned_async (the default), the plan is made on the helper thread
 * and taken at a later step boundary. */
Test(planned, plans_made_on_the_helper_thread_are_taken_later)
{
    sim = ts_sim(0, false, false);
    stow_config_t c;
    ts_config_classic(&c);
    char err[256];
    cr_assert_eq(stow_config_parse(&c, "planned_steps:true", err, sizeof err), STOW_OK);
    cr_assert(c.planned_async);
    cr_assert_eq(stow_pool_create(&c, sim, &pool), STOW_OK);
    n_shadow = 0;
    int s = 0;
    for (; s < 2000 && ts_pool_stats(pool).num_planned_hits == 0; s++)
        run_step("train", -1, -1, 0, false);
    cr_assert_lt(s, 2000);
    cr_assert_eq(ts_pool_stats(pool).num_plans, 1);
    step(NULL);
    finish();
}

/* Configuration: the settings and constants of the planned layer and their
 * bounds. */
Test(planned, configuration_keys)
{
    stow_config_t c;
    stow_config_default(&c);
    stow_tuning_t t;
    stow_tuning_default(&t);
    cr_assert_not(c.planned_steps);
    cr_assert_eq(t.planned_warmup_steps, 1);
    cr_assert_float_eq(t.planned_headroom, 0.0, 1e-12);
    cr_assert_not(t.planned_auto);
    cr_assert(c.planned_async);
    char err[256];
    cr_assert_eq(stow_tuning_parse(&c, &t,
                                   "planned_steps:true,planned_warmup_steps:3,"
                                   "planned_headroom:0.25,planned_async:false",
                                   err, sizeof err),
                 STOW_OK, "%s", err);
    cr_assert(c.planned_steps);
    cr_assert_eq(t.planned_warmup_steps, 3);
    cr_assert_float_eq(t.planned_headroom, 0.25, 1e-12);
    cr_assert_not(c.planned_async);
    cr_assert_eq(stow_tuning_parse(&c, &t, "planned_headroom:1.5", err, sizeof err),
                 STOW_EINVAL);
    cr_assert_str_eq(err, "key 'planned_headroom': '1.5' is not a number in [0, 1]");
    cr_assert_eq(stow_tuning_parse(&c, &t, "planned_warmup_steps:1001", err, sizeof err),
                 STOW_EINVAL);
    cr_assert_eq(stow_tuning_parse(&c, &t, "planned_steps:maybe", err, sizeof err),
                 STOW_EINVAL);
    cr_assert_eq(t.planned_warmup_steps, 3, "unchanged after errors");
    cr_assert(c.planned_steps, "unchanged after errors");
    /* The constants are not settings: STOWAGE_CONF's parser names where they
     * are measured. */
    cr_assert_eq(stow_config_parse(&c, "planned_headroom:0.5", err, sizeof err), STOW_EINVAL);
    cr_assert(strstr(err, "docs/decisions.md") != NULL, "%s", err);
}

/* planned_headroom sizes the arena above the plan. */
Test(planned, headroom_makes_the_arena_larger)
{
    warm("planned_headroom:0.5", false);
    stow_stats_t s = ts_pool_stats(pool);
    cr_assert_geq(s.arena_bytes, s.arena_peak_bytes + s.arena_peak_bytes / 2 - 512);
    step(NULL);
    finish();
}

/* planned_auto: a loop without markers is found and served from the arena;
 * a marker ends it (markers say where the steps are), and nothing of it
 * serves afterwards. */
static void auto_loop(const char *conf)
{
    make(conf, false);
    void *w = alloc(200 * MIB); /* weights, never freed in the loop */
    for (int s = 0; s < 600; s++)
        run_step(NULL, -1, -1, 0, false);
    stow_stats_t a = ts_pool_stats(pool);
    cr_assert_geq(a.num_plans, 1, "the period was found");
    for (int s = 0; s < 10; s++)
        run_step(NULL, -1, -1, 0, false);
    stow_stats_t b = ts_pool_stats(pool);
    cr_assert_eq(b.num_planned_hits - a.num_planned_hits, 10 * STEP_ALLOCS, "every request");
    cr_assert_eq(b.num_backend_calls, a.num_backend_calls, "no backend call");
    step("train");
    for (int s = 0; s < 3; s++)
        run_step(NULL, -1, -1, 0, false);
    stow_stats_t c = ts_pool_stats(pool);
    cr_assert_eq(c.num_planned_hits, b.num_planned_hits, "a marker ends the steps found");
    release(w);
    finish();
}

Test(planned, steps_without_markers_are_found_classic)
{
    auto_loop("planned_steps:false,planned_auto:true");
}
Test(planned, steps_without_markers_are_found_vmm)
{
    auto_loop("planned_steps:false,planned_auto:true,policy:vmm");
}
