/*
 * allocator/vmm_step.c: a layout learned from a loop's step (policy vmm,
 * config vmm_learn_step; docs/design.md, a layout learned from the step).
 *
 * Once a loop's step repeats, each of the step's large blocks can keep one
 * address, the same every step, planned from a step already seen: such a
 * layout repeats by construction, so once mapped it makes no backend call.
 * From a remap on, each operation's signature is logged and searched for a
 * period (as bench/long_run.py finds a step); the large blocks of one steady
 * step are then laid out around the blocks that stay, and the plan is taken
 * only when its granules fit what the pool may hold before it remaps (the
 * allowance, or the most it has held). A stretch that leaves large blocks
 * live beyond two periods is not a step: nothing is planned. While the
 * operations match the plan, each planned request takes its address; the
 * first that does not, or three cycles in a row with a taken address, drop
 * it. At each step's end under the plan the pool stops recording events for
 * remaps to come. The log goes on under a plan, so that an outer loop around
 * a planned inner one shows. empty_cache drops the plan and the log (the free
 * blocks change hands).
 *
 * Owns pool->step (vmm_step.h); keeps each allocated block's operation
 * number in its free_seq (only free blocks use that field otherwise). Reads
 * the free index, the range's blocks and the mapped bitmaps; changes nothing
 * else but the free block a planned request is cut out of
 * (stow__pool_split_free_at). Called with the pool lock held.
 */
#include <stdlib.h>
#include <string.h>

#include "allocator/block_store.h"
#include "allocator/free_index.h"
#include "allocator/period.h"
#include "allocator/pool.h"
#include "allocator/ptr_map.h"
#include "allocator/types.h"
#include "allocator/vmm_allowance.h"
#include "allocator/vmm_epochs.h"
#include "allocator/vmm_granules.h"
#include "allocator/vmm_step.h"
#include "stowage/plan.h"

#define STEP_LOG_MAX ((size_t)1 << 17)   /* operations logged while looking */
#define STEP_CHECK_GROWTH_SHIFT 3        /* and again each time the log grows by an eighth */
#define STEP_IDLE_LOG_MIN 4096           /* a log this long without remaps stops looking */
#define STEP_MIN_PERIOD 50               /* as bench/long_run.py */
#define STEP_CHECK_FIRST (3 * STEP_MIN_PERIOD) /* the shortest log a period shows in */
#define STEP_MAX_BLOCKS 4096             /* planned blocks per cycle (first fit is quadratic) */
#define STEP_BACKOFF_FIRST ((uint64_t)1 << 16) /* operations before looking again */
#define STEP_BACKOFF_MAX ((uint64_t)1 << 26)
#define STEP_MISSED_CYCLES_MAX 3         /* cycles in a row with misses drop a plan */

static uint64_t alloc_sig(size_t rounded, const stow_stream_state_t *ss)
{
    return stow__sig_alloc(rounded, ss->index);
}

static bool is_alloc(uint64_t sig)
{
    return stow__sig_is_alloc(sig);
}

static size_t sig_bytes(uint64_t sig)
{
    return stow__sig_bytes(sig);
}

static void stop_looking(stow_vmm_step_t *s)
{
    free(s->log_sigs);
    free(s->log_lives);
    s->log_sigs = NULL;
    s->log_lives = NULL;
    s->log_count = 0;
    s->looking = false;
}

static void drop_plan(stow_vmm_step_t *s)
{
    free(s->plan_sigs);
    free(s->plan_addrs);
    free(s->plan_anchors);
    s->plan_sigs = NULL;
    s->plan_addrs = NULL;
    s->plan_anchors = NULL;
    s->active = false;
}

/* No looking for the next backoff_ops operations, and twice as long after the
 * next refusal: a loop whose plan does not fit is not planned again and again
 * (planning is quadratic in the step's blocks). */
static void back_off(stow_pool_t *pool)
{
    stow_vmm_step_t *s = &pool->step;
    if (s->backoff_ops == 0)
        s->backoff_ops = STEP_BACKOFF_FIRST;
    s->look_after_op = pool->step.ops + s->backoff_ops;
    if (s->backoff_ops < STEP_BACKOFF_MAX)
        s->backoff_ops *= 2;
}

void stow__vmm_step_destroy(stow_pool_t *pool)
{
    stop_looking(&pool->step);
    drop_plan(&pool->step);
}

void stow__vmm_step_forget(stow_pool_t *pool)
{
    stow__vmm_step_destroy(pool);
    pool->step.look_after_op = 0; /* looks again at the next remap */
}

void stow__vmm_step_note_remap(stow_pool_t *pool)
{
    stow_vmm_step_t *s = &pool->step;
    s->last_remap_op = pool->step.ops;
    if (s->looking || s->active || pool->step.ops < s->look_after_op)
        return;
    s->log_sigs = malloc(STEP_LOG_MAX * sizeof *s->log_sigs);
    s->log_lives = calloc(STEP_LOG_MAX, sizeof *s->log_lives);
    if (!s->log_sigs || !s->log_lives) {
        stop_looking(s); /* host memory: learning is an optimisation, the pool goes on */
        back_off(pool);
        return;
    }
    s->log_count = 0;
    s->next_check = STEP_CHECK_FIRST;
    s->log_first_op = pool->step.ops;
    s->looking = true;
}

/* ---- the period ---- */

/* The period: the distances between allocations of the largest size that the
 * log's second half allocates (allocator/period.c); 0: none. */
static size_t find_period(const stow_vmm_step_t *s)
{
    return stow__period_of_largest(s->log_sigs, s->log_count, STEP_MIN_PERIOD);
}

/* ---- the plan: cyclic first fit around the blocks that stay ---- */

typedef struct step_block {
    size_t size_bytes;
    uint32_t phase, life;     /* lives over [phase, phase + life) on the cycle */
    size_t offset;            /* from the range's base */
    size_t anchor;            /* 1 + the offset of the highest block below it live when it
                                 is allocated (a block that stays, or a planned one);
                                 0: none */
} step_block_t;

typedef struct span {
    size_t lo, hi;            /* [lo, hi) from the range's base */
    const step_block_t *block; /* NULL: a block that stays, over the whole cycle */
    uint64_t when;            /* the block's arc_mask (a block that stays: all ones) */
} span_t;

static int by_area(const void *a, const void *b)
{
    const step_block_t *x = a, *y = b;
    double ax = (double)x->size_bytes * x->life, ay = (double)y->size_bytes * y->life;
    if (ax != ay)
        return ax > ay ? -1 : 1;
    return (x->phase > y->phase) - (x->phase < y->phase);
}

static int by_life_then_size(const void *a, const void *b)
{
    const step_block_t *x = a, *y = b;
    if (x->life != y->life)
        return x->life > y->life ? -1 : 1;
    if (x->size_bytes != y->size_bytes)
        return x->size_bytes > y->size_bytes ? -1 : 1;
    return (x->phase > y->phase) - (x->phase < y->phase);
}

static int by_size_then_life(const void *a, const void *b)
{
    const step_block_t *x = a, *y = b;
    if (x->size_bytes != y->size_bytes)
        return x->size_bytes > y->size_bytes ? -1 : 1;
    if (x->life != y->life)
        return x->life > y->life ? -1 : 1;
    return (x->phase > y->phase) - (x->phase < y->phase);
}

/* Whether two arcs of a cycle overlap (each shorter than the cycle): one
 * starts while the other is live. */
static bool arcs_overlap(const step_block_t *a, const step_block_t *b, uint32_t cycle)
{
    uint32_t b_after_a = b->phase >= a->phase ? b->phase - a->phase : b->phase + cycle - a->phase;
    return b_after_a < a->life || (b_after_a != 0 && cycle - b_after_a < b->life) ||
           b_after_a == 0;
}

/* The 64ths of the cycle that the arc [phase, phase + life) touches, as bits:
 * two arcs whose masks share no bit do not overlap, which the planner tests
 * first (most of a step's blocks are not live while a given one is). */
static uint64_t arc_mask(uint32_t phase, uint32_t life, uint32_t cycle)
{
    if (life >= cycle)
        return ~(uint64_t)0;
    unsigned first = (unsigned)((uint64_t)phase * 64 / cycle);
    uint32_t last_phase = phase + life - 1; /* life >= 1 */
    bool wraps = last_phase >= cycle;
    unsigned last = (unsigned)((uint64_t)(wraps ? last_phase - cycle : last_phase) * 64 / cycle);
    uint64_t from_first = ~(uint64_t)0 << first;
    uint64_t to_last = last == 63 ? ~(uint64_t)0 : ((uint64_t)1 << (last + 1)) - 1;
    return wraps ? from_first | to_last : from_first & to_last;
}

/* Granules touched so far, with counts over ranges (a Fenwick tree): the
 * planner's measure of where a block costs the fewest new granules. */
typedef struct touched {
    size_t count, g;
    uint8_t *is_touched;
    uint32_t *tree;
} touched_t;

static bool touched_init(touched_t *t, size_t granules, size_t g)
{
    t->count = granules;
    t->g = g;
    t->is_touched = calloc(granules ? granules : 1, 1);
    t->tree = calloc(granules + 1, sizeof *t->tree);
    return t->is_touched && t->tree;
}

static void touched_free(touched_t *t)
{
    free(t->is_touched);
    free(t->tree);
}

static void touch(touched_t *t, size_t lo, size_t hi)
{
    for (size_t q = lo / t->g; q < (hi + t->g - 1) / t->g && q < t->count; q++)
        if (!t->is_touched[q]) {
            t->is_touched[q] = 1;
            for (size_t i = q + 1; i <= t->count; i += i & (~i + 1))
                t->tree[i]++;
        }
}

static size_t touched_below(const touched_t *t, size_t q)
{
    size_t n = 0;
    for (size_t i = q < t->count ? q : t->count; i > 0; i -= i & (~i + 1))
        n += t->tree[i];
    return n;
}

/* Granules [lo, hi) would touch that nothing touched yet. */
static size_t new_granules(const touched_t *t, size_t lo, size_t hi)
{
    size_t first = lo / t->g, end = (hi + t->g - 1) / t->g;
    size_t known = end <= t->count ? touched_below(t, end) - touched_below(t, first)
                                   : touched_below(t, t->count) - touched_below(t, first);
    return (end - first) - known;
}

typedef struct spot {
    size_t offset, fresh;
} spot_t;

static void consider(spot_t *best, const touched_t *t, size_t offset, size_t size_bytes)
{
    size_t fresh = new_granules(t, offset, offset + size_bytes);
    if (fresh < best->fresh || (fresh == best->fresh && offset < best->offset))
        *best = (spot_t){offset, fresh};
}

/* The index of the first of spans[0, n) (sorted by offset) that starts above offset. */
static size_t spans_above(const span_t *spans, size_t n, size_t offset)
{
    size_t lo = 0, hi = n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (spans[mid].lo <= offset)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Places each block, largest first, where it touches the fewest granules no
 * placed block (at any time of the cycle) or block that stays touched: at
 * either end of each gap that no block overlapping it in time holds, lowest
 * offset first among equals. spans[0, *n_spans) holds the blocks that stay,
 * sorted by offset, with room for every block; each placed block is inserted
 * in order. Returns false without host memory. */
static bool place_blocks(step_block_t *blocks, size_t n, uint32_t cycle, span_t *spans,
                         size_t *n_spans, touched_t *t, int (*order)(const void *, const void *))
{
    qsort(blocks, n, sizeof *blocks, order);
    for (size_t i = 0; i < *n_spans; i++)
        touch(t, spans[i].lo, spans[i].hi);
    for (size_t i = 0; i < n; i++) {
        step_block_t *b = &blocks[i];
        uint64_t when = arc_mask(b->phase, b->life, cycle);
        spot_t best = {SIZE_MAX, SIZE_MAX};
        size_t cursor = 0;
        for (size_t k = 0; k < *n_spans; k++) {
            const span_t *s = &spans[k];
            if (s->block && (!(s->when & when) || !arcs_overlap(b, s->block, cycle)))
                continue;
            if (s->lo >= cursor + b->size_bytes) { /* a gap [cursor, s->lo) that fits */
                consider(&best, t, cursor, b->size_bytes);
                consider(&best, t, s->lo - b->size_bytes, b->size_bytes);
            }
            if (s->hi > cursor)
                cursor = s->hi;
        }
        consider(&best, t, cursor, b->size_bytes); /* above everything it overlaps */
        b->offset = best.offset;
        size_t at = spans_above(spans, *n_spans, b->offset);
        memmove(&spans[at + 1], &spans[at], (*n_spans - at) * sizeof *spans);
        spans[at] = (span_t){b->offset, b->offset + b->size_bytes, b, when};
        (*n_spans)++;
        touch(t, b->offset, b->offset + b->size_bytes);
    }
    return true;
}

/* Whether block b (placed) is live at phase p of the cycle. */
static bool live_at(const step_block_t *b, uint32_t p, uint32_t cycle)
{
    uint32_t since = p >= b->phase ? p - b->phase : p + cycle - b->phase;
    return since < b->life;
}

/* Each block's anchor: the highest span below it whose block is live when it
 * is allocated (a block that stays always is). The place finds the free block
 * at the planned address by walking up from the anchor's live block, instead
 * of searching the free index. The spans live at one phase are disjoint (the
 * plan overlaps no two blocks live at once), so the first found walking down
 * from the block is the highest. */
static void set_anchors(step_block_t *blocks, size_t n, uint32_t cycle, const span_t *spans,
                        size_t n_spans)
{
    for (size_t i = 0; i < n; i++) {
        step_block_t *b = &blocks[i];
        b->anchor = 0;
        for (size_t k = spans_above(spans, n_spans, b->offset); k-- > 0;) {
            const span_t *s = &spans[k];
            if (s->lo >= b->offset || s->hi > b->offset || s->block == b ||
                (s->block && (s->block->phase == b->phase || !live_at(s->block, b->phase, cycle))))
                continue;
            b->anchor = 1 + s->lo;
            break;
        }
    }
}

typedef struct top_search {
    stow_block_t *top;
} top_search_t;

static bool keep_highest(void *arg, stow_block_t *f)
{
    top_search_t *t = arg;
    if (f->segment->granules &&
        (!t->top || f->addr + f->size_bytes > t->top->addr + t->top->size_bytes))
        t->top = f;
    return true;
}

/* The large range of stream ss: the range of its highest free block. */
static stow_segment_t *large_range_of(stow_pool_t *pool, stow_stream_state_t *ss)
{
    top_search_t t = {NULL};
    stow__free_index_visit_fitting(&ss->free[STOW_POOL_LARGE], 1, keep_highest, &t);
    if (!t.top && ss != pool->any)
        stow__free_index_visit_fitting(&pool->any->free[STOW_POOL_LARGE], 1, keep_highest, &t);
    return t.top ? t.top->segment : NULL;
}

/* The granules ranges other than seg hold mapped. */
static uint64_t other_ranges_granules(const stow_pool_t *pool, const stow_segment_t *seg)
{
    uint64_t granules = 0;
    for (const stow_segment_t *o = pool->segments; o; o = o->next)
        if (o != seg && o->granules)
            for (size_t w = 0; w < (o->granules_touched + 63) / 64; w++)
                granules += popcount64(o->mapped_bits[w]);
    return granules;
}

/* Whether logged operation j allocated a large block (one a plan places). */
static bool is_large_alloc(const stow_pool_t *pool, const stow_vmm_step_t *s, size_t j)
{
    return is_alloc(s->log_sigs[j]) && sig_bytes(s->log_sigs[j]) > pool->vmm_small_bytes;
}

/* The lifetime of logged operation j when it allocated a large block freed
 * less than two periods later (a block the plan places); 0 otherwise. */
static uint32_t planned_life(const stow_pool_t *pool, const stow_vmm_step_t *s, size_t j,
                             size_t period)
{
    uint32_t life = s->log_lives[j];
    if (!is_large_alloc(pool, s, j) || life >= 2 * period)
        return 0;
    return life;
}

/* The step's large blocks of the log's window [s0, s0 + period) whose frees
 * the log holds, and the cycle they need (1 or 2 steps); 0 blocks: none to
 * plan, or too many. */
static size_t collect_blocks(const stow_pool_t *pool, const stow_vmm_step_t *s, size_t s0,
                             size_t period, step_block_t **out, unsigned *steps,
                             bool *not_a_step)
{
    size_t n = 0;
    *steps = 1;
    *not_a_step = false;
    for (size_t j = s0; j < s0 + period; j++) {
        uint32_t life = planned_life(pool, s, j, period);
        if (!life) {
            /* A large block still live two periods on: a loop's step frees
             * what it allocates (gradients by the next step), where a layer
             * of a pass that keeps its activations for later (a training
             * forward pass, a cache) does not, though its operations repeat
             * as a step's do. */
            if (is_large_alloc(pool, s, j)) {
                *not_a_step = true;
                return 0;
            }
            continue;
        }
        if (life >= period)
            *steps = 2;
        n++;
    }
    if (n == 0 || n * *steps > STEP_MAX_BLOCKS)
        return 0;
    step_block_t *blocks = malloc(n * *steps * sizeof *blocks);
    if (!blocks)
        return 0;
    size_t k = 0;
    for (size_t j = s0; j < s0 + period; j++) {
        uint32_t life = planned_life(pool, s, j, period);
        for (unsigned c = 0; life && c < *steps; c++)
            blocks[k++] = (step_block_t){sig_bytes(s->log_sigs[j]),
                                         (uint32_t)(j - s0 + c * period), life, 0, 0};
    }
    *out = blocks;
    return k;
}

/* The phase of the cycle where the planned blocks hold the fewest bytes:
 * placing starts there, so that the fewest blocks of the layout before the
 * plan are still live while the planned one fills in (their granules and the
 * plan's add up until they are freed). */
static uint32_t least_loaded_phase(const step_block_t *blocks, size_t n, uint32_t cycle)
{
    int64_t *delta = calloc((size_t)cycle + 1, sizeof *delta);
    if (!delta)
        return 0;
    for (size_t i = 0; i < n; i++) {
        uint32_t lo = blocks[i].phase, hi = lo + blocks[i].life;
        delta[lo] += (int64_t)blocks[i].size_bytes;
        if (hi <= cycle) {
            delta[hi] -= (int64_t)blocks[i].size_bytes;
        } else { /* wraps: [lo, cycle) and [0, hi - cycle) */
            delta[0] += (int64_t)blocks[i].size_bytes;
            delta[hi - cycle] -= (int64_t)blocks[i].size_bytes;
        }
    }
    int64_t load = 0, least = INT64_MAX;
    uint32_t at = 0;
    for (uint32_t p = 0; p < cycle; p++) {
        load += delta[p];
        if (load < least) {
            least = load;
            at = p;
        }
    }
    free(delta);
    return at;
}

static int spans_by_offset(const void *a, const void *b)
{
    const span_t *x = a, *y = b;
    return (x->lo > y->lo) - (x->lo < y->lo);
}

/* The fourth layout: the offline planner's greedy passes (planner/plan.c,
 * stow_plan_solve without a search: deterministic, a few passes over the
 * blocks each) on the cycle cut where the blocks hold the fewest bytes (a
 * block live across the cut takes the whole cycle), above every block that
 * stays. It cannot use the holes between those blocks, as the layouts above
 * can, but lays the step out far tighter where they are out of the way: on
 * random loop 12 at 1.0045 x its live peak where placing block by block took
 * 1.066 (bench/step_plan_bound.py, docs/design.md). spans[0, *n_spans) holds
 * the blocks that stay, sorted by offset, with room for every block; returns
 * false (spans unchanged) without host memory or a plan. */
static bool plan_above(step_block_t *blocks, size_t n, uint32_t cycle, span_t *spans,
                       size_t *n_spans, touched_t *t, size_t alignment_bytes)
{
    size_t base = 0;
    for (size_t i = 0; i < *n_spans; i++)
        if (spans[i].hi > base)
            base = spans[i].hi;
    base = (base + alignment_bytes - 1) / alignment_bytes * alignment_bytes;
    uint32_t cut = least_loaded_phase(blocks, n, cycle);
    stow_plan_problem_t problem;
    if (stow_plan_problem_init(&problem, n) != STOW_OK)
        return false;
    for (size_t i = 0; i < n; i++) {
        uint32_t start = blocks[i].phase >= cut ? blocks[i].phase - cut
                                                : blocks[i].phase + cycle - cut;
        bool crosses = start + blocks[i].life > cycle;
        stow_plan_buffer_t *pb = &problem.buffers[i];
        pb->lower = crosses ? 0 : start;
        pb->upper = crosses ? cycle : start + blocks[i].life;
        pb->size = blocks[i].size_bytes;
        pb->alignment = alignment_bytes;
    }
    stow_plan_options_t opts = stow_plan_options_default();
    opts.time_limit_seconds = 0; /* greedy only: the same plan on every machine */
    stow_plan_result_t result;
    bool planned = stow_plan_solve(&problem, &opts, &result) == STOW_OK;
    stow_plan_problem_free(&problem);
    if (!planned)
        return false;
    for (size_t i = 0; i < *n_spans; i++)
        touch(t, spans[i].lo, spans[i].hi);
    for (size_t i = 0; i < n; i++) {
        step_block_t *b = &blocks[i];
        b->offset = base + (size_t)result.offsets[i];
        spans[(*n_spans)++] = (span_t){b->offset, b->offset + b->size_bytes, b,
                                       arc_mask(b->phase, b->life, cycle)};
        touch(t, b->offset, b->offset + b->size_bytes);
    }
    stow_plan_result_free(&result);
    qsort(spans, *n_spans, sizeof *spans, spans_by_offset);
    return true;
}

typedef enum plan_outcome {
    PLAN_TAKEN,
    PLAN_REFUSED,   /* nothing to plan, no room, no host memory, or too many granules */
    PLAN_NOT_A_STEP /* the stretch leaves blocks live beyond two periods */
} plan_outcome_t;

/* Builds and takes the plan of the step of `period` operations ending two
 * periods before the log's end (so that the frees of its blocks are logged).
 * Takes nothing when the stretch is no step, or there is nothing to plan, no
 * room, no host memory, or the plan's granules would not fit what the pool
 * may hold before it remaps: the allowance, or the most it has held when
 * that is more (a plan within that raises no peak). */
static plan_outcome_t take_plan(stow_pool_t *pool, stow_stream_state_t *ss, size_t period)
{
    stow_vmm_step_t *s = &pool->step;
    size_t n = s->log_count, s0 = n - 3 * period;
    stow_segment_t *seg = large_range_of(pool, ss);
    if (!seg)
        return PLAN_REFUSED;
    unsigned steps;
    bool not_a_step;
    step_block_t *blocks = NULL;
    size_t n_blocks = collect_blocks(pool, s, s0, period, &blocks, &steps, &not_a_step);
    if (!n_blocks)
        return not_a_step ? PLAN_NOT_A_STEP : PLAN_REFUSED;
    uint32_t cycle = (uint32_t)(steps * period);
    /* The blocks that stay: live and allocated more than two periods ago
     * (a step's blocks live less than two), or waiting for streams. */
    size_t n_stay = 0;
    for (stow_block_t *x = seg->first; x; x = x->next)
        n_stay += x->state != BLOCK_FREE;
    span_t *spans = malloc((n_stay + n_blocks + 1) * sizeof *spans);
    uint64_t *sigs = malloc(cycle * sizeof *sigs);
    uintptr_t *addrs = calloc(cycle, sizeof *addrs);
    uintptr_t *anchors = calloc(cycle, sizeof *anchors);
    bool taken = false;
    size_t height = 0; /* of the layout kept, blocks that stay included */
    if (spans && sigs && addrs && anchors) {
        uint64_t old_op = pool->step.ops - 2 * period;
        size_t n_spans = 0;
        for (stow_block_t *x = seg->first; x; x = x->next) /* in address order */
            if (x->state == BLOCK_PENDING || x->state == BLOCK_QUICK ||
                (x->state == BLOCK_ALLOCATED && x->free_seq < old_op))
                spans[n_spans++] = (span_t){x->addr - seg->base,
                                            x->addr - seg->base + x->size_bytes, NULL,
                                            ~(uint64_t)0};
        /* Three orders of placement; the layout that touches the fewest
         * granules is kept. When none fits, the offline
         * planner's layout is tried too (plan_above), which costs about as
         * much as the three (docs/design.md, a layout learned from the step). */
        int (*const orders[])(const void *, const void *) = {by_size_then_life, by_area,
                                                             by_life_then_size};
        size_t n_obst = n_spans, best_n_spans = 0;
        uint64_t best_granules = UINT64_MAX;
        span_t *obst = malloc((n_obst + 1) * sizeof *obst);
        span_t *best_spans = malloc((n_stay + n_blocks + 1) * sizeof *best_spans);
        step_block_t *best_blocks = malloc(n_blocks * sizeof *best_blocks);
        touched_t t = {0, 0, NULL, NULL};
        bool ok = obst && best_spans && best_blocks &&
                  touched_init(&t, seg->size_bytes / pool->granularity_bytes,
                               pool->granularity_bytes);
        if (ok)
            memcpy(obst, spans, n_obst * sizeof *obst);
        size_t n_orders = sizeof orders / sizeof orders[0];
        uint64_t others = other_ranges_granules(pool, seg),
                 allowed = stow__vmm_remap_floor_for(pool, pool->live_bytes_high_water);
        for (size_t o = 0; ok && o <= n_orders; o++) {
            if (o == n_orders && best_granules + others <= allowed)
                break; /* a layout of the three fits */
            memcpy(spans, obst, n_obst * sizeof *spans);
            n_spans = n_obst;
            memset(t.is_touched, 0, t.count);
            memset(t.tree, 0, (t.count + 1) * sizeof *t.tree);
            if (o < n_orders)
                place_blocks(blocks, n_blocks, cycle, spans, &n_spans, &t, orders[o]);
            else if (!plan_above(blocks, n_blocks, cycle, spans, &n_spans, &t, STOW_MIN_BLOCK_BYTES))
                continue;
            uint64_t granules = touched_below(&t, t.count);
            if (granules < best_granules) {
                best_granules = granules;
                memcpy(best_blocks, blocks, n_blocks * sizeof *blocks);
                /* The spans point at the blocks they hold: at the copies. */
                for (size_t i = 0; i < n_spans; i++) {
                    best_spans[i] = spans[i];
                    if (spans[i].block)
                        best_spans[i].block = best_blocks + (spans[i].block - blocks);
                }
                best_n_spans = n_spans;
            }
        }
        if (ok) {
            for (size_t i = 0; i < best_n_spans; i++)
                if (best_spans[i].hi > height)
                    height = best_spans[i].hi;
            taken = height <= seg->size_bytes && best_granules + others <= allowed;
            if (taken)
                set_anchors(best_blocks, n_blocks, cycle, best_spans, best_n_spans);
            memcpy(blocks, best_blocks, n_blocks * sizeof *blocks);
        }
        touched_free(&t);
        free(obst);
        free(best_spans);
        free(best_blocks);
    }
    if (taken) {
        s->start_phase = least_loaded_phase(blocks, n_blocks, cycle);
        for (uint32_t p = 0; p < cycle; p++)
            sigs[p] = s->log_sigs[s0 + p % period];
        for (size_t i = 0; i < n_blocks; i++) {
            addrs[blocks[i].phase] = seg->base + blocks[i].offset;
            anchors[blocks[i].phase] = blocks[i].anchor ? seg->base + blocks[i].anchor - 1 : 0;
        }
        s->plan_sigs = sigs;
        s->plan_addrs = addrs;
        s->plan_anchors = anchors;
        s->cycle = cycle;
        s->period = period;
        s->phase = (n - s0) % cycle;
        /* Steps end where the planned blocks hold the fewest bytes. */
        s->ops_to_step_end = (s->start_phase + cycle - s->phase) % period;
        if (!s->ops_to_step_end)
            s->ops_to_step_end = period;
        s->stream = ss;
        s->range = seg;
        s->plan_top = seg->base + (height + pool->granularity_bytes - 1) / pool->granularity_bytes *
                                      pool->granularity_bytes;
        s->active = true;
        s->placing = false;
        s->cycle_misses = s->missed_cycles = 0;
        pool->acct.s.num_vmm_step_plans++;
    } else {
        free(sigs);
        free(addrs);
        free(anchors);
    }
    free(spans);
    free(blocks);
    return taken ? PLAN_TAKEN : PLAN_REFUSED;
}

/* Out of line: note() runs on every operation, and a search inlined into it
 * would make every call pay the search's register saves. */
static __attribute__((noinline)) void look(stow_pool_t *pool, stow_stream_state_t *ss)
{
    stow_vmm_step_t *s = &pool->step;
    /* A loop that has stopped remapping has a layout that fits: keep it (a
     * plan would move every block once, and may hold more granules). A period
     * is at most a third of the log: a pool that has not remapped over two
     * thirds of it is not remapping whatever the period, and needs no search.
     * A short log says nothing yet: a step of thousands of operations may
     * remap once. */
    if (s->log_count >= STEP_IDLE_LOG_MIN &&
        s->last_remap_op + 2 * (s->log_count / 3) < pool->step.ops) {
        stop_looking(s);
        back_off(pool);
        return;
    }
    size_t period = find_period(s);
    if (!period)
        return;
    if (s->last_remap_op + 2 * period < pool->step.ops) {
        /* No remap in the last two periods: the loop has settled by itself,
         * so no event for remaps to come, or the period is a stretch inside
         * a longer step (layers alike), so the log goes on; a log of 4,096
         * operations two thirds of which made no remap stops it (above). */
        stow__vmm_epochs_stop_closing(&pool->epochs, pool->op_count);
        return;
    }
    if (s->active) {
        if (period == s->period)
            return; /* the plan in force: its remaps are its first cycle's */
        /* Remapping under a plan for another period: a longer step (an
         * outer loop whose inner one was planned) or a changed one. */
        drop_plan(s);
    }
    /* The log goes on under the plan, so that a longer step around it shows
     * too (the plan of an inner loop drops where each outer step leaves it),
     * and past a stretch that is no step (the layers of a forward pass): the
     * step around it may show in a longer log. A plan refused backs off:
     * planning is quadratic in the step's blocks. */
    plan_outcome_t outcome = take_plan(pool, ss, period);
    if (outcome == PLAN_REFUSED) {
        stop_looking(s);
        back_off(pool);
    }
}

/* ---- each operation ---- */

/* A step's end under the plan: where its blocks hold the fewest bytes,
 * between two steps of the loop. The layout needs no remap, so the pool
 * records no more events for remaps to come; a remap (a planned address
 * taken) records them again until the next step's end. */
static void end_of_step(stow_pool_t *pool)
{
    stow_vmm_step_t *s = &pool->step;
    s->ops_to_step_end = s->period;
    if (s->placing)
        stow__vmm_epochs_stop_closing(&pool->epochs, pool->op_count);
}

/* A plan whose addresses stay taken (by blocks placed around it) cycle after
 * cycle only moves blocks: the first cycle may miss (blocks from before the
 * plan), three in a row drop it. */
static void end_of_cycle(stow_pool_t *pool)
{
    stow_vmm_step_t *s = &pool->step;
    s->phase = 0;
    s->missed_cycles = s->cycle_misses ? s->missed_cycles + 1 : 0;
    s->cycle_misses = 0;
    if (s->missed_cycles == STEP_MISSED_CYCLES_MAX) {
        drop_plan(s);
        back_off(pool);
    }
}

static void note(stow_pool_t *pool, stow_stream_state_t *ss, uint64_t sig)
{
    stow_vmm_step_t *s = &pool->step;
    if (s->active) {
        if (s->phase == s->start_phase)
            s->placing = true;
        if (s->plan_sigs[s->phase] != sig) {
            drop_plan(s); /* the loop changed (or ended) */
            back_off(pool);
        } else {
            if (--s->ops_to_step_end == 0)
                end_of_step(pool);
            if (++s->phase == s->cycle)
                end_of_cycle(pool);
        }
    }
    if (s->looking) {
        if (s->log_count == STEP_LOG_MAX) {
            stop_looking(s); /* no step in that many operations */
            back_off(pool);
        } else {
            s->log_sigs[s->log_count++] = sig;
            /* From the shortest log a period shows in, then each time the
             * log grows by an eighth: a period shows once the log holds three
             * of its steps alike, and the search sees it within an eighth
             * more, so that a loop logged from its first step is planned in
             * its fourth or fifth. A search scans the log, so all of them
             * together cost about nine scans. */
            if (s->log_count == s->next_check) {
                s->next_check += s->next_check >> STEP_CHECK_GROWTH_SHIFT;
                look(pool, ss);
            }
        }
    }
    pool->step.ops++;
}

void stow__vmm_step_log_alloc(stow_pool_t *pool, stow_block_t *b, stow_stream_state_t *ss,
                              size_t rounded)
{
    b->free_seq = pool->step.ops;
    note(pool, ss, alloc_sig(rounded, ss));
}

void stow__vmm_step_log_free(stow_pool_t *pool, stow_block_t *b)
{
    stow_vmm_step_t *s = &pool->step;
    uint64_t distance = pool->step.ops - b->free_seq;
    if (s->looking && b->free_seq >= s->log_first_op && b->free_seq - s->log_first_op < s->log_count)
        s->log_lives[b->free_seq - s->log_first_op] =
            distance < UINT32_MAX ? (uint32_t)distance : 0;
    note(pool, b->owner, stow__sig_free(distance));
}

typedef struct containing {
    uintptr_t lo, hi;
    stow_block_t *found;
} containing_t;

static bool find_containing(void *arg, stow_block_t *f)
{
    containing_t *c = arg;
    if (f->addr <= c->lo && c->hi <= f->addr + f->size_bytes) {
        c->found = f;
        return false;
    }
    return true;
}

static bool usable_by(const stow_block_t *b, const stow_stream_state_t *ss, const stow_pool_t *pool)
{
    return b->state == BLOCK_FREE && (b->owner == ss || b->owner == pool->any);
}

/* From the live block at `anchor` (below addr), the free block that holds
 * [addr, addr + size), if it is within a few blocks up; NULL otherwise. */
static stow_block_t *walk_up(stow_pool_t *pool, const stow_stream_state_t *ss, uintptr_t anchor,
                             uintptr_t addr, size_t size)
{
    if (!anchor)
        return NULL;
    stow_block_t *b = stow__ptr_map_get(&pool->live, anchor);
    for (int hops = 0; b && hops < 8; hops++, b = b->next) {
        if (b->addr > addr)
            return NULL;
        if (b->addr + b->size_bytes > addr)
            return usable_by(b, ss, pool) && b->addr + b->size_bytes >= addr + size &&
                           b->segment == pool->step.range
                       ? b
                       : NULL;
    }
    return NULL;
}


/* The free blocks that cover [addr, addr + size) in the plan's range, when
 * they are all usable by ss, merged into one of ss's: after empty_cache the
 * free blocks are the streams' shared ones (`any`), and those freed on ss
 * since do not merge with them, so a planned address can straddle the two.
 * The merged block counts as freed on ss now (its free_seq a new one of ss),
 * which orders it after ss's work, as each part was. NULL: not all free. */
static stow_block_t *merge_free_span(stow_pool_t *pool, stow_stream_state_t *ss, uintptr_t addr,
                                     size_t size)
{
    stow_segment_t *seg = pool->step.range;
    stow_block_t *first = seg->first;
    while (first && first->addr + first->size_bytes <= addr)
        first = first->next;
    if (!first || !usable_by(first, ss, pool))
        return NULL;
    stow_block_t *last = first;
    while (last->addr + last->size_bytes < addr + size) {
        last = last->next;
        if (!last || !usable_by(last, ss, pool))
            return NULL;
    }
    if (last == first)
        return NULL; /* one block: the index search would have found it */
    stow_block_t *after = last->next;
    stow__pool_index_remove(pool, first);
    while (first->next != after) {
        stow_block_t *x = first->next;
        stow__pool_index_remove(pool, x);
        first->size_bytes += x->size_bytes;
        first->next = x->next;
        if (x->next)
            x->next->prev = first;
        stow__block_delete(&pool->blocks, x);
    }
    first->owner = ss;
    first->free_seq = ++ss->free_seq;
    /* Its neighbours freed on ss merge with it, as at any free. */
    first = stow__pool_coalesce(pool, first);
    stow__pool_index_insert(pool, first);
    return first;
}

/* The lowest free block of the plan's range with room for `size` at or above
 * `top` (a visitor of the free index). */
typedef struct lowest_above {
    uintptr_t top;
    size_t size;
    const stow_segment_t *seg;
    stow_block_t *found;
} lowest_above_t;

static bool keep_lowest_above(void *arg, stow_block_t *f)
{
    lowest_above_t *a = arg;
    uintptr_t start = f->addr > a->top ? f->addr : a->top;
    if (f->segment == a->seg && start < f->addr + f->size_bytes &&
        f->addr + f->size_bytes - start >= a->size && (!a->found || f->addr < a->found->addr))
        a->found = f;
    return true;
}

/* A planned request whose address is taken goes above the plan (every planned
 * block and block that stays), at the lowest free place there. Placed online
 * instead, it would land where later planned blocks go, and they would miss in
 * turn: on a cycle of two steps, whose blocks live over a period, one miss
 * chains from cycle to cycle. Above the plan a miss costs granules of its own
 * for one life and takes no planned address. NULL: no room there (the caller
 * places it online). */
static stow_block_t *place_above(stow_pool_t *pool, stow_stream_state_t *ss, size_t rounded)
{
    stow_vmm_step_t *s = &pool->step;
    lowest_above_t a = {s->plan_top, rounded, s->range, NULL};
    stow__free_index_visit_fitting(&ss->free[STOW_POOL_LARGE], rounded, keep_lowest_above, &a);
    if (ss != pool->any)
        stow__free_index_visit_fitting(&pool->any->free[STOW_POOL_LARGE], rounded,
                                       keep_lowest_above, &a);
    if (!a.found)
        return NULL;
    return a.found->addr >= a.top ? a.found
                                  : stow__pool_split_free_at(pool, a.found, a.top - a.found->addr);
}

stow_block_t *stow__vmm_step_place(stow_pool_t *pool, stow_stream_state_t *ss, size_t rounded)
{
    stow_vmm_step_t *s = &pool->step;
    uintptr_t addr = s->plan_addrs[s->phase];
    if (!s->placing || ss != s->stream || !addr || s->plan_sigs[s->phase] != alloc_sig(rounded, ss))
        return NULL;
    containing_t c = {addr, addr + rounded, walk_up(pool, ss, s->plan_anchors[s->phase], addr, rounded)};
    if (!c.found)
        stow__free_index_visit_fitting(&ss->free[STOW_POOL_LARGE], rounded, find_containing, &c);
    if (!c.found && ss != pool->any)
        stow__free_index_visit_fitting(&pool->any->free[STOW_POOL_LARGE], rounded,
                                       find_containing, &c);
    if (!c.found && pool->has_events)
        c.found = merge_free_span(pool, ss, addr, rounded);
    if (!c.found) {
        s->cycle_misses++; /* still held by a block placed before the plan, or elsewhere */
        return place_above(pool, ss, rounded);
    }
    pool->acct.s.num_vmm_planned_allocations++;
    return c.found->addr == addr ? c.found
                                 : stow__pool_split_free_at(pool, c.found, addr - c.found->addr);
}
