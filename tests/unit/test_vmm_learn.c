/*
 * tests/unit/test_vmm_learn.c: a page-mapped pool that learns its loop's step
 * (the constant vmm_learn_step, vmm_step.c; docs/design.md, a layout learned from
 * the step). Through the public API on the simulated device, with
 * stow_pool_check (vmm_check.c) along the way: a planned allocation is a block
 * of the large range like any other, so every invariant of the range holds.
 * A handle per granule (vmm_handle_mb:2): the plans are measured in granules,
 * and a loop plans only once it remaps.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "test_support.h"

#define MIB ((size_t)1 << 20)
#define G (2 * MIB) /* the simulated device's granule */
#define STREAM ((stow_stream_t)1)

static const ts_loop_t loop4 = TS_LOOP4, loop12 = TS_LOOP12, loop33 = TS_LOOP33;

static stow_backend_t *sim;
static stow_pool_t *pool;

/* A vmm pool on a fresh unlimited simulated device, the defaults but for
 * vmm_learn_step. */
static void make_pool(bool learn)
{
    sim = ts_sim(0, false, false);
    cr_assert_not_null(sim);
    stow_config_t c;
    stow_config_default(&c);
    c.policy = STOW_POLICY_VMM;
    stow_tuning_t t;
    stow_tuning_default(&t);
    t.vmm_handle_mb = 2; /* a handle per granule */
    t.vmm_learn_step = learn;
    cr_assert_eq(stow_pool_create_tuned(&c, &t, sim, &pool), STOW_OK);
}

static void check(void) { ts_pool_check(pool); }

static stow_stats_t stats(void) { return ts_pool_stats(pool); }

static uint64_t calls(void)
{
    stow_stats_t s = stats();
    return s.num_map_calls + s.num_unmap_calls;
}

static void finish(void)
{
    check();
    cr_assert_eq(stow_pool_destroy(pool), STOW_OK);
    ts_sim_assert_released_then_destroy(sim);
    pool = NULL;
    sim = NULL;
}

/* Steps of the loop with the pool checked every `check_every` steps. */
static void run_steps(const ts_loop_t *loop, unsigned steps, unsigned check_every)
{
    for (unsigned step = 0; step < steps; step++) {
        ts_loop_step(pool, loop, STREAM);
        if (step % check_every == 0)
            check();
    }
}

/* Allocations one step of the loop makes (ts_loop_step: an entry allocates
 * when its slot is empty). */
static uint64_t allocations_per_step(const ts_loop_t *loop)
{
    bool held[TS_LOOP_SLOTS_MAX] = {false};
    uint64_t n = 0;
    for (size_t k = 0; k < loop->program_len; k++) {
        unsigned i = loop->program[k];
        n += !held[i];
        held[i] = !held[i];
    }
    return n;
}

static void assert_reserved_within(double slack)
{
    ts_assert_reserved_within(pool, slack, G);
}

/* Loop 33's step touches about 1.032 x its live peak under the online
 * placement: without a plan the pool is raised to that footprint
 * (test_vmm.c). With one, its step fits the default allowance. */
Test(learn, a_loop_that_learns_its_step_stops_remapping_within_the_allowance)
{
    make_pool(true);
    void *weights[8];
    ts_loop_weights_alloc(pool, &loop33, STREAM, weights);
    run_steps(&loop33, 400, 25);
    stow_stats_t s = stats();
    cr_assert_eq(s.num_vmm_step_plans, 1);
    cr_assert_gt(s.num_vmm_planned_allocations, 0);
    uint64_t before = calls(), planned = s.num_vmm_planned_allocations;
    run_steps(&loop33, 200, 25);
    s = stats();
    cr_assert_eq(calls(), before, "the last 200 steps mapped or unmapped %llu times",
                 (unsigned long long)(calls() - before));
    /* Every request of those steps took its planned address: all are large
     * (above vmm_small_kb), the smallest slot 4.5 MiB. */
    cr_assert_eq(s.num_vmm_planned_allocations - planned, 200 * allocations_per_step(&loop33),
                 "%llu planned allocations in 200 steps",
                 (unsigned long long)(s.num_vmm_planned_allocations - planned));
    cr_assert_eq(s.num_vmm_allowance_raises, 0);
    assert_reserved_within(0.0095); /* the default vmm_slack: no raise needed */
    ts_loop_weights_free(pool, &loop33, weights);
    finish();
}

/* Loop 12's step: no placement block by block fits the allowance (the best
 * touches 1.066 x the live peak), so the plan is the offline planner's layout
 * of the step above the weights. Without it the pool remapped on every step,
 * raised to 1.05 x live. */
Test(learn, a_step_no_placement_fits_takes_the_offline_planners_layout)
{
    make_pool(true);
    void *weights[19];
    ts_loop_weights_alloc(pool, &loop12, STREAM, weights);
    run_steps(&loop12, 200, 25);
    stow_stats_t s = stats();
    cr_assert_eq(s.num_vmm_step_plans, 1);
    uint64_t before = calls(), planned = s.num_vmm_planned_allocations;
    run_steps(&loop12, 100, 25);
    s = stats();
    cr_assert_eq(calls(), before, "the last 100 steps mapped or unmapped %llu times",
                 (unsigned long long)(calls() - before));
    cr_assert_eq(s.num_vmm_planned_allocations - planned, 100 * allocations_per_step(&loop12));
    cr_assert_eq(s.num_vmm_allowance_raises, 0);
    assert_reserved_within(0.0095);
    ts_loop_weights_free(pool, &loop12, weights);
    finish();
}

/* An input batch replaced every other step of loop 33 (the new one made, then
 * the old one freed, as a training loop's data loader does) lives a little
 * over the loop's period (two loop steps and the batch's two operations): the
 * plan's cycle is two periods long, each copy of the batch at an address of
 * its own. When placing starts, the new batch finds its address held by the
 * batch from before the plan; it goes above the plan, so that it takes no
 * address a later planned block needs. Placed online, it did, and the misses
 * chained from cycle to cycle until the plan was dropped (22,500 map and unmap
 * calls in the last 100 periods instead of none). */
static void batch_and_two_steps(void **batch)
{
    void *next = NULL;
    cr_assert_eq(stow_pool_alloc(pool, 8 * MIB, STREAM, &next), STOW_OK);
    if (*batch)
        cr_assert_eq(stow_pool_free(pool, *batch), STOW_OK);
    *batch = next;
    ts_loop_step(pool, &loop33, STREAM);
    ts_loop_step(pool, &loop33, STREAM);
}

Test(learn, a_block_that_outlives_its_step_is_planned_on_a_cycle_of_two)
{
    make_pool(true);
    void *weights[8], *batch = NULL;
    ts_loop_weights_alloc(pool, &loop33, STREAM, weights);
    for (unsigned i = 0; i < 200; i++) {
        batch_and_two_steps(&batch);
        if (i % 25 == 0)
            check();
    }
    stow_stats_t s = stats();
    cr_assert_eq(s.num_vmm_step_plans, 1);
    uint64_t before = calls(), planned = s.num_vmm_planned_allocations;
    for (unsigned i = 0; i < 100; i++)
        batch_and_two_steps(&batch);
    s = stats();
    cr_assert_eq(calls(), before, "the last 100 periods mapped or unmapped %llu times",
                 (unsigned long long)(calls() - before));
    cr_assert_eq(s.num_vmm_planned_allocations - planned,
                 100 * (1 + 2 * allocations_per_step(&loop33)),
                 "%llu planned allocations in 100 periods",
                 (unsigned long long)(s.num_vmm_planned_allocations - planned));
    cr_assert_eq(s.num_vmm_allowance_raises, 0);
    assert_reserved_within(0.0095);
    cr_assert_eq(stow_pool_free(pool, batch), STOW_OK);
    ts_loop_weights_free(pool, &loop33, weights);
    finish();
}

Test(learn, on_by_default_and_without_it_the_same_loop_is_raised_to_its_footprint)
{
    stow_tuning_t d;
    stow_tuning_default(&d);
    cr_assert(d.vmm_learn_step);
    make_pool(false);
    void *weights[8];
    ts_loop_weights_alloc(pool, &loop33, STREAM, weights);
    run_steps(&loop33, 1500, 250);
    stow_stats_t s = stats();
    cr_assert_eq(s.num_vmm_step_plans, 0);
    cr_assert_eq(s.num_vmm_planned_allocations, 0);
    cr_assert_eq(s.num_vmm_allowance_raises, 1);
    ts_loop_weights_free(pool, &loop33, weights);
    finish();
}

/* The loop changes (another program on the same weights): its first request
 * that the plan does not expect drops the plan, and nothing is placed by it
 * from there on. Loop 4 fits the granules loop 33 left mapped, so it never
 * remaps, and no other plan is needed. */
Test(learn, a_changed_step_drops_the_plan)
{
    make_pool(true);
    void *weights[8];
    ts_loop_weights_alloc(pool, &loop33, STREAM, weights);
    run_steps(&loop33, 300, 50);
    cr_assert_eq(stats().num_vmm_step_plans, 1);
    uint64_t planned = stats().num_vmm_planned_allocations, before = calls();
    run_steps(&loop4, 3000, 100);
    stow_stats_t s = stats();
    cr_assert_eq(s.num_vmm_planned_allocations, planned, "placed by a dropped plan");
    cr_assert_eq(s.num_vmm_step_plans, 1);
    cr_assert_eq(calls(), before);
    ts_loop_weights_free(pool, &loop33, weights);
    finish();
}

/* empty_cache moves the free blocks to the index every stream shares, and
 * unmaps what the plan's blocks left unused: the plan and the log go, and the
 * pool learns the step again once it remaps. A planned address may then
 * straddle a shared free block and one freed on the stream since; both are
 * the stream's to use, and the place merges them (without that, the second
 * plan placed 6 of the step's 24 requests and remapped 172 granules a step). */
Test(learn, after_empty_cache_the_step_is_learned_again_and_settles)
{
    make_pool(true);
    void *weights[8];
    ts_loop_weights_alloc(pool, &loop33, STREAM, weights);
    run_steps(&loop33, 300, 50);
    cr_assert_eq(stats().num_vmm_step_plans, 1);
    cr_assert_eq(stow_empty_cache(pool), STOW_OK);
    check();
    uint64_t planned = stats().num_vmm_planned_allocations;
    ts_loop_step(pool, &loop33, STREAM);
    cr_assert_eq(stats().num_vmm_planned_allocations, planned, "placed by a forgotten plan");
    run_steps(&loop33, 200, 5);
    cr_assert_eq(stats().num_vmm_step_plans, 2);
    uint64_t before = calls();
    planned = stats().num_vmm_planned_allocations;
    run_steps(&loop33, 100, 10);
    cr_assert_eq(calls(), before);
    cr_assert_eq(stats().num_vmm_planned_allocations - planned,
                 100 * allocations_per_step(&loop33));
    ts_loop_weights_free(pool, &loop33, weights);
    finish();
}

/* A loop that settles by itself (no remap in its last two periods when the
 * step is found) keeps the layout it has: a plan would move every block. */
Test(learn, a_loop_that_settles_by_itself_is_not_planned)
{
    static const unsigned weights_mib[] = {64};
    static const size_t slot_kib[] = {8192, 16384, 4096};
    static const unsigned char program[] = {0, 1, 2, 0, 1, 2, 0, 1, 0, 1, 2, 2, 0, 1, 2,
                                            0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2,
                                            0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2,
                                            0, 1, 2, 0, 1, 2, 0, 1, 2};
    static const ts_loop_t quiet = TS_LOOP(weights_mib, slot_kib, program);
    make_pool(true);
    void *weights[1];
    ts_loop_weights_alloc(pool, &quiet, STREAM, weights);
    run_steps(&quiet, 2000, 100);
    stow_stats_t s = stats();
    cr_assert_eq(s.num_map_calls + s.num_unmap_calls, s.num_map_calls,
                 "the loop never unmapped: it never remapped");
    cr_assert_eq(s.num_vmm_step_plans, 0);
    ts_loop_weights_free(pool, &quiet, weights);
    finish();
}

/* A loop of short steps (random loops 4 and 12: about 80 operations a step)
 * under the default constants: its step is found from its third repetition
 * on and planned in time for the fifth step (loop 12; loop 4 settles by
 * itself), and from the sixth on the pool makes no backend call of any kind
 * (no map, no unmap, no event). Loop 33's step, 48 operations, is shorter
 * than the shortest period looked for (50): it is found as two steps. */
Test(learn, a_loop_of_short_steps_makes_no_backend_call_after_its_fifth_step)
{
    const ts_loop_t *loops[] = {&loop4, &loop12};
    for (size_t i = 0; i < sizeof loops / sizeof loops[0]; i++) {
        sim = ts_sim(0, false, false);
        cr_assert_not_null(sim);
        pool = ts_pool("policy:vmm", sim);
        void *weights[TS_LOOP_SLOTS_MAX + 8];
        cr_assert_leq(loops[i]->weight_count, sizeof weights / sizeof weights[0]);
        ts_loop_weights_alloc(pool, loops[i], STREAM, weights);
        run_steps(loops[i], 5, 1);
        uint64_t backend_calls = stats().num_backend_calls;
        run_steps(loops[i], 300, 50);
        stow_stats_t s = stats();
        cr_assert_eq(s.num_backend_calls, backend_calls,
                     "loop %zu: %llu backend calls after its fifth step", i,
                     (unsigned long long)(s.num_backend_calls - backend_calls));
        cr_assert_eq(s.num_vmm_step_plans, loops[i] == &loop12 ? 1u : 0u);
        ts_loop_weights_free(pool, loops[i], weights);
        finish();
    }
}

/* A loop around a loop: each outer step runs random loop 4's step ten times,
 * then loop 12's once, on loop 4's weights. The period found first is the
 * inner step (which settles by itself, or is planned and dropped where the
 * outer step leaves it); the log goes on, so the outer step shows in it and
 * is planned, and the pool stops calling the backend. */
Test(learn, an_outer_loop_around_an_inner_one_is_found_and_settles)
{
    sim = ts_sim(0, false, false);
    cr_assert_not_null(sim);
    pool = ts_pool("policy:vmm", sim);
    void *weights[TS_LOOP_SLOTS_MAX + 8];
    ts_loop_weights_alloc(pool, &loop4, STREAM, weights);
    uint64_t backend_calls = 0;
    for (unsigned outer = 0; outer < 60; outer++) {
        if (outer == 30)
            backend_calls = stats().num_backend_calls;
        for (unsigned inner = 0; inner < 10; inner++)
            ts_loop_step(pool, &loop4, STREAM);
        ts_loop_step(pool, &loop12, STREAM);
        if (outer % 10 == 0)
            check();
    }
    stow_stats_t s = stats();
    cr_assert_eq(s.num_backend_calls, backend_calls,
                 "%llu backend calls in the last 30 outer steps",
                 (unsigned long long)(s.num_backend_calls - backend_calls));
    ts_loop_weights_free(pool, &loop4, weights);
    finish();
}

/* A stretch that repeats but keeps what it allocates (the layers of a
 * forward pass of training keep their activations for the backward pass; a
 * decoder keeps its cache) is not a loop's step: nothing is planned, though
 * the pool remaps and the stretch repeats as a step does. The pool is at its
 * allowance first (every other block of a peak freed), so the layers' blocks,
 * too wide for the holes, remap. */
Test(learn, a_repeating_stretch_that_keeps_its_blocks_is_not_planned)
{
    make_pool(true);
    enum { PEAK = 64, LAYERS = 40, TEMPS = 24 };
    void *peak[PEAK], *kept[LAYERS];
    for (unsigned k = 0; k < PEAK; k++)
        cr_assert_eq(stow_pool_alloc(pool, 10 * MIB, STREAM, &peak[k]), STOW_OK);
    for (unsigned k = 0; k < PEAK; k += 2)
        cr_assert_eq(stow_pool_free(pool, peak[k]), STOW_OK);
    for (unsigned layer = 0; layer < LAYERS; layer++) {
        void *temps[TEMPS];
        for (unsigned k = 0; k < TEMPS; k++)
            cr_assert_eq(stow_pool_alloc(pool, 12 * MIB, STREAM, &temps[k]), STOW_OK);
        cr_assert_eq(stow_pool_alloc(pool, 2 * MIB, STREAM, &kept[layer]), STOW_OK);
        for (unsigned k = 0; k < TEMPS; k++)
            cr_assert_eq(stow_pool_free(pool, temps[k]), STOW_OK);
        if (layer % 8 == 0)
            check();
    }
    stow_stats_t s = stats();
    cr_assert_gt(s.num_unmap_calls, 0, "the layers remapped");
    cr_assert_eq(s.num_vmm_step_plans, 0);
    for (unsigned layer = 0; layer < LAYERS; layer++)
        cr_assert_eq(stow_pool_free(pool, kept[layer]), STOW_OK);
    for (unsigned k = 1; k < PEAK; k += 2)
        cr_assert_eq(stow_pool_free(pool, peak[k]), STOW_OK);
    finish();
}

Test(learn, the_key_is_parsed_and_checked)
{
    stow_config_t c;
    stow_config_default(&c);
    stow_tuning_t t;
    stow_tuning_default(&t);
    char err[128];
    cr_assert_eq(stow_tuning_parse(&c, &t, "policy:vmm,vmm_learn_step:true", err, sizeof err),
                 STOW_OK, "%s", err);
    cr_assert_eq(c.policy, STOW_POLICY_VMM);
    cr_assert(t.vmm_learn_step);
    cr_assert_eq(stow_tuning_parse(NULL, &t, "vmm_learn_step:false", err, sizeof err), STOW_OK);
    cr_assert(!t.vmm_learn_step);
    cr_assert_eq(stow_tuning_parse(NULL, &t, "vmm_learn_step:yes", err, sizeof err),
                 STOW_EINVAL);
    cr_assert(strstr(err, "vmm_learn_step") != NULL, "%s", err);
    cr_assert(!t.vmm_learn_step, "a refused value changes nothing");
    /* A constant, not a setting: STOWAGE_CONF's parser refuses it. */
    cr_assert_eq(stow_config_parse(&c, "vmm_learn_step:false", err, sizeof err), STOW_EINVAL);
    cr_assert(strstr(err, "docs/decisions.md") != NULL, "%s", err);
}

/* Steps that now and then deviate (an extra block held across a step, of a
 * size the loop never asks for, a step of the other loop, or empty_cache),
 * under a plan, while one is being learned and while backing off: the books
 * stay exact after every step, and the pool ends with nothing allocated. */
Test(learn, deviations_at_any_point_leave_the_books_exact)
{
    make_pool(true);
    void *weights[8];
    ts_loop_weights_alloc(pool, &loop33, STREAM, weights);
    uint64_t seed = 12345;
    for (unsigned step = 0; step < 3000; step++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        /* Clean stretches of 300 steps (learned there) between stretches
         * that deviate one step in ten. */
        unsigned roll = (step / 300) % 2 ? (unsigned)(seed >> 33) % 50 : 99;
        void *extra = NULL;
        if (roll < 3) {
            size_t size = ((seed >> 40) % 96 + 1) * MIB + 512;
            cr_assert_eq(stow_pool_alloc(pool, size, STREAM, &extra), STOW_OK);
        }
        ts_loop_step(pool, roll == 3 ? &loop4 : &loop33, STREAM);
        if (extra)
            cr_assert_eq(stow_pool_free(pool, extra), STOW_OK);
        if (roll == 4)
            cr_assert_eq(stow_empty_cache(pool), STOW_OK);
        check();
    }
    stow_stats_t s = stats();
    cr_assert_geq(s.num_vmm_step_plans, 2, "learned, dropped and learned again: %llu plans",
                  (unsigned long long)s.num_vmm_step_plans);
    ts_loop_weights_free(pool, &loop33, weights);
    s = stats();
    cr_assert_eq(s.allocated_bytes[STOW_POOL_ALL].current, 0);
    cr_assert_eq(s.active_bytes[STOW_POOL_ALL].current, 0);
    finish();
}
