/*
 * allocator/vmm_allowance.c: how many physical granules a page-mapped pool
 * may hold (policy vmm): the allowance, (1 + slack) x the high-water mark of
 * live bytes, and the adaptive slack that a pool which keeps remapping in its
 * steady state raises (docs/design.md, adaptive allowance).
 *
 * Owns pool->adapt and the seen-live bitmaps' restarts; reads the granule
 * counts. Makes no backend call and moves no granule: vmm.c asks it for the
 * allowance (stow__vmm_allowance_for) and tells it of each remap
 * (stow__vmm_note_remap). Called with the pool lock held.
 */
#include "allocator/pool.h"
#include "allocator/types.h"
#include "allocator/vmm_allowance.h"
#include "allocator/vmm_granules.h"
#include "allocator/vmm_step.h"

/* The granules the pool may hold while some mapped granule sits unused:
 * (1 + slack) times the high-water mark of live bytes, in whole granules
 * rounded down, and never fewer than that mark needs (rounded up). Measured in
 * bytes, not in live granules, so that granules which live blocks share only
 * partly (at the edges of free holes) do not raise the allowance, and rounded
 * down, so that the allowance alone never takes reserved memory beyond
 * (1 + vmm_slack) x the live peak, however small the pool: only a layout whose
 * live blocks pin more granules can. */
static uint64_t allowed_granules(const stow_pool_t *pool, uint64_t live_bytes_high_water)
{
    uint64_t g = pool->granularity_bytes;
    uint64_t live = live_bytes_high_water / g + (live_bytes_high_water % g != 0);
    double with_slack = (double)live_bytes_high_water * (1.0 + pool->adapt.slack) / (double)g;
    uint64_t allowed = (uint64_t)with_slack;
    allowed = allowed > live ? allowed : live;
    /* The planned layer's budget while it holds its arena (planned_serve.c):
     * beside the arena, idle granules are remapped rather than new ones
     * taken past what the pool alone reached. */
    uint64_t cap = pool->vmm_cap_bytes / g;
    return cap && cap < allowed ? cap : allowed;
}

uint64_t stow__vmm_allowance_for(const stow_pool_t *pool, uint64_t live_bytes_high_water)
{
    return allowed_granules(pool, live_bytes_high_water);
}

uint64_t stow__vmm_remap_floor_for(const stow_pool_t *pool, uint64_t live_bytes_high_water)
{
    uint64_t allowed = allowed_granules(pool, live_bytes_high_water);
    if (allowed < pool->phys_granules_high_water && !pool->vmm_cap_bytes)
        allowed = pool->phys_granules_high_water;
    return allowed;
}

/* The adaptive allowance (docs/design.md, adaptive allowance). A pool whose
 * steady state needs more granules over a step than its allowance (a loop
 * whose big blocks land somewhere else each time) remaps on every step for
 * good. So a pool that keeps remapping keeps more: when ADAPT_HOT_WINDOWS
 * windows of ADAPT_WINDOW_OPS pool operations in a row each remap at least
 * once per ADAPT_HOT_OPS_PER_REMAP operations (hot), the slack grows (up to
 * vmm_slack_max), and again after the next such run, as long as each raise
 * cut the remap rate by ADAPT_MIN_GAIN or more; then it stays. The run is long
 * (65,536 operations) so that a pool settling by itself is not raised. As many
 * windows in a row that each remap at least once per ADAPT_WARM_OPS_PER_REMAP
 * operations, some less than hot (a warm run), raise the slack only to a
 * footprint within ADAPT_WARM_SLACK_FACTOR x vmm_slack, and never settle it:
 * remapping belongs under memory pressure, not in a loop's steady state. */
#define ADAPT_WINDOW_OPS 8192
#define ADAPT_HOT_WINDOWS 8
#define ADAPT_HOT_OPS_PER_REMAP 64
#define ADAPT_WARM_OPS_PER_REMAP 1024
#define ADAPT_WARM_SLACK_FACTOR 2.0
#define ADAPT_GROWTH 1.5
#define ADAPT_MIN_GAIN 0.05
#define ADAPT_MIN_SLACK 0.005

/* The footprint of a run of windows: the granules its live blocks touched.
 * A run may begin where a window begins with none hot before it; from there
 * the seen-live bits are the granules live then, and stow__vmm_back_span adds
 * every span it backs. Cost: a pass over the bitmap words of the granules
 * ever mapped, once per window of a pool that remaps. */
static void seen_live_restart(stow_pool_t *pool)
{
    for (stow_segment_t *seg = pool->segments; seg; seg = seg->next) {
        if (!seg->granules)
            continue;
        size_t words = (seg->granules_touched + 63) / 64;
        for (size_t w = 0; w < words; w++)
            seg->seen_live_bits[w] = seg->mapped_bits[w] & ~seg->unused_bits[w];
    }
}

/* The granules the run's live blocks held: every granule of a mapping any of
 * them touched (a handle is unmapped only whole, so a live block pins all of
 * it), and the seen-live granules that are not mapped. */
static uint64_t seen_live_count(const stow_pool_t *pool)
{
    uint64_t n = 0;
    for (const stow_segment_t *seg = pool->segments; seg; seg = seg->next) {
        if (!seg->granules)
            continue;
        size_t touched = seg->granules_touched, words = (touched + 63) / 64;
        for (size_t w = 0; w < words; w++)
            n += popcount64(seg->seen_live_bits[w] & ~seg->mapped_bits[w]);
        for (size_t i = next_bit(seg->seen_live_bits, 0, touched, true); i < touched;) {
            if (!bit_at(seg->mapped_bits, i)) {
                i = next_bit(seg->seen_live_bits, i + 1, touched, true);
                continue;
            }
            size_t head = mapping_head(seg, i), end = mapping_end(seg, head);
            n += end - head;
            i = next_bit(seg->seen_live_bits, end, touched, true);
        }
    }
    return n;
}

/* The slack whose allowance holds the run's footprint, plus the granule that
 * rounding the allowance down can cost: what keeps a loop whose layout
 * repeats from remapping at all. */
static double footprint_slack(const stow_pool_t *pool)
{
    double live_hw_granules =
        (double)pool->live_bytes_high_water / (double)pool->granularity_bytes;
    if (live_hw_granules <= 0)
        return 0;
    return ((double)seen_live_count(pool) + 1.0) / live_hw_granules - 1.0;
}

/* The end of a run of hot windows: unless the last raise (if any) failed to
 * cut the remap rate enough (then the slack stays, for good), raise the slack
 * to cover the run's footprint, or by half when the footprint is covered
 * already (the layout itself still moves). Raises by half alone would leave a
 * loop far above its allowance creeping up in raises that each help too
 * little, then stopping there (docs/decisions.md, vmm_slack_max). */
static void end_hot_run(stow_pool_t *pool, stow_vmm_adapt_t *a)
{
    double rate = (double)a->hot_remaps / (double)a->hot_ops;
    if (a->rate_at_last_raise > 0 && rate > a->rate_at_last_raise * (1.0 - ADAPT_MIN_GAIN)) {
        a->settled = true; /* the last raise did not help: keep it, no more */
        return;
    }
    double needed = footprint_slack(pool);
    a->slack = needed > a->slack ? needed : a->slack * ADAPT_GROWTH;
    if (a->slack < ADAPT_MIN_SLACK)
        a->slack = ADAPT_MIN_SLACK; /* from a slack of 0 */
    if (a->slack >= pool->tuning.vmm_slack_max) {
        a->slack = pool->tuning.vmm_slack_max;
        a->settled = true;
    }
    a->rate_at_last_raise = rate;
    pool->acct.s.num_vmm_allowance_raises++;
}

/* The end of a warm run: the slack goes to the footprint since the last
 * window before this one that was not hot (this window at least: the seen-live
 * bits restart after every window that is not hot), when that is above the
 * slack and within ADAPT_WARM_SLACK_FACTOR x vmm_slack (and vmm_slack_max);
 * else nothing changes. Rare remaps buy little memory: warm raises up to
 * vmm_slack_max would hold much more and could leave pools remapping. */
static void end_warm_run(stow_pool_t *pool, stow_vmm_adapt_t *a)
{
    double needed = footprint_slack(pool);
    double limit = ADAPT_WARM_SLACK_FACTOR * pool->tuning.vmm_slack;
    if (limit > pool->tuning.vmm_slack_max)
        limit = pool->tuning.vmm_slack_max;
    if (needed <= a->slack || needed > limit)
        return;
    a->slack = needed;
    pool->acct.s.num_vmm_allowance_raises++;
}

/* Counts a remap of `granules` (a handle's, whole) and closes the window it
 * ends, if any. The rates below count granules, as when every handle was one
 * granule: a loop whose layout keeps moving a few large handles moves as much
 * memory as one that moves many small ones. */
void stow__vmm_note_remap(stow_pool_t *pool, size_t granules)
{
    stow_vmm_adapt_t *a = &pool->adapt;
    if (pool->learn_step)
        stow__vmm_step_note_remap(pool);
    /* Handles of a granule each (the planned layer, vmm.c) are remapped one
     * by one: their count says nothing of a loop's footprint, and a raise
     * made of it would stay once the layer is gone. */
    if (a->settled || pool->fine_handles)
        return;
    uint64_t ops = pool->op_count - a->window_start_op;
    if (ops >= ADAPT_WINDOW_OPS) {
        bool hot = a->window_remaps * ADAPT_HOT_OPS_PER_REMAP >= ops;
        bool warm = a->window_remaps * ADAPT_WARM_OPS_PER_REMAP >= ops;
        if (hot) {
            a->hot_ops += ops;
            a->hot_remaps += a->window_remaps;
            if (++a->hot_windows == ADAPT_HOT_WINDOWS)
                end_hot_run(pool, a);
        }
        if (!hot || a->hot_windows == ADAPT_HOT_WINDOWS) { /* the run ends */
            a->hot_windows = 0;
            a->hot_ops = a->hot_remaps = 0;
        }
        /* Warm windows in a row, hot ones included; a hot run that ended with
         * this window has decided for them. Eight of them end a warm run (not
         * all hot: those would have ended a hot run now). */
        bool hot_run_ended = hot && a->hot_windows == 0;
        a->warm_windows = warm && !hot_run_ended ? a->warm_windows + 1 : 0;
        if (a->warm_windows == ADAPT_HOT_WINDOWS) {
            if (!a->settled)
                end_warm_run(pool, a);
            a->warm_windows = 0;
        }
        a->window_start_op = pool->op_count;
        a->window_remaps = 0;
        if (a->hot_windows == 0)
            seen_live_restart(pool); /* a run may begin with this window */
    }
    a->window_remaps += granules;
}
