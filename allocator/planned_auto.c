/*
 * allocator/planned_auto.c: steps found without markers (config
 * planned_auto; allocator/planned.h, docs/planned.md).
 *
 * A program that never calls stow_pool_step still repeats its loop. From its
 * first operation on, each is logged as a signature (allocator/period.h: an
 * allocation's rounded size and stream, a free's distance back to its
 * allocation) and the log is searched for its period (allocator/period.c,
 * the search vmm_step.c uses, on its own schedule) at 4,096 operations and
 * each time it doubles.
 * Sizes that change from step to step (a sequence length) change the
 * signatures: the log is searched a second time with the sizes left out,
 * anchored on the frees of the longest lives.
 *
 * Once a period is found, the step is taken to begin where the fewest bytes
 * of the step's own allocations are live; its positions (each slot the
 * largest size seen there over the periods logged, and the largest of
 * earlier plans), streams and lives in allocations come from the log, and
 * the layout is made as for a key with markers (planned_plan.c). It serves
 * as a key without markers: a step ends when its last position is passed,
 * or, near its end, when a request matches its first one. Steps that keep
 * missing make the pool look again (the layout serves meanwhile); a loop in
 * which no period is found is looked at again after a back-off that doubles
 * each time. A marker ends all this: markers say where the steps are.
 *
 * Owns pl->autom (the log and the map of live blocks' operation numbers);
 * called with the pool lock held.
 */
#include <string.h>

#include "allocator/period.h"
#include "allocator/planned.h"
#include "allocator/pool.h"
#include "allocator/ptr_map.h"
#include "allocator/types.h"

#define AUTO_LOG_MAX ((size_t)1 << 17)    /* operations logged while looking */
#define AUTO_CHECK_FIRST 4096             /* searched from this many on */
#define AUTO_MIN_PERIOD 24                /* operations a step makes, at least */
#define AUTO_BACKOFF_FIRST ((uint64_t)1 << 16)
#define AUTO_BACKOFF_MAX ((uint64_t)1 << 26)
#define AUTO_ANCHORS 4                    /* free signatures tried as anchors, sizes left out */

static void stop_looking(stow_planned_auto_t *a)
{
    free(a->sigs);
    free(a->coarse);
    free(a->lives);
    a->sigs = a->coarse = NULL;
    a->lives = NULL;
    a->count = 0;
    a->looking = false;
    stow__ptr_map_destroy(&a->born);
}

void stow__planned_auto_destroy(stow_planned_t *pl) { stop_looking(&pl->autom); }

static void back_off(stow_planned_auto_t *a)
{
    a->backoff_ops = a->backoff_ops ? 2 * a->backoff_ops : AUTO_BACKOFF_FIRST;
    if (a->backoff_ops > AUTO_BACKOFF_MAX)
        a->backoff_ops = AUTO_BACKOFF_MAX;
    a->look_after_op = a->ops + a->backoff_ops;
}

static bool start_looking(stow_planned_auto_t *a)
{
    a->sigs = malloc(AUTO_LOG_MAX * sizeof *a->sigs);
    a->coarse = malloc(AUTO_LOG_MAX * sizeof *a->coarse);
    a->lives = calloc(AUTO_LOG_MAX, sizeof *a->lives);
    if (!a->sigs || !a->coarse || !a->lives || stow__ptr_map_init(&a->born) != STOW_OK) {
        free(a->sigs);
        free(a->coarse);
        free(a->lives);
        a->sigs = a->coarse = NULL;
        a->lives = NULL;
        back_off(a); /* host memory: the pool goes on without */
        return false;
    }
    a->count = 0;
    a->first_op = a->ops;
    a->looking = true;
    return true;
}

/* ---- the period ---- */

/* The exact search: anchored on the largest allocation of the log's second half. */
static size_t period_exact(const stow_planned_auto_t *a)
{
    return stow__period_of_largest(a->sigs, a->count, AUTO_MIN_PERIOD);
}

/* Sizes left out: anchored on the frees of the longest lives of the second
 * half, a few of them, longest first. */
static size_t period_coarse(const stow_planned_auto_t *a)
{
    size_t n = a->count;
    uint64_t tried[AUTO_ANCHORS];
    unsigned n_tried = 0;
    while (n_tried < AUTO_ANCHORS) {
        uint64_t best = 0;
        for (size_t i = n / 2; i < n; i++) {
            uint64_t s = a->coarse[i];
            if (stow__sig_is_alloc(s) || s <= best || s / 2 > n / 3)
                continue;
            bool seen = false;
            for (unsigned t = 0; t < n_tried; t++)
                seen |= tried[t] == s;
            if (!seen)
                best = s;
        }
        if (!best)
            return 0;
        tried[n_tried++] = best;
        size_t p = stow__period_find(a->coarse, n, best, AUTO_MIN_PERIOD);
        if (p)
            return p;
    }
    return 0;
}

/* ---- the profile of the step the log found ---- */

/* The log index where the step begins: in the period before the last, where
 * the fewest bytes of the period's allocations that live less than a period
 * are live; moved back a period or two so that the lives of the step's
 * allocations end inside the log. */
static size_t step_start(const stow_planned_auto_t *a, size_t period, size_t tail)
{
    size_t n = a->count, r0 = n - 2 * period;
    int64_t *delta = calloc(2 * period + 2, sizeof *delta);
    size_t phase = 0;
    if (delta) {
        for (size_t i = r0; i < r0 + period; i++) {
            uint32_t life = a->lives[i];
            if (!stow__sig_is_alloc(a->sigs[i]) || life == 0 || life >= period)
                continue;
            /* live before ops [i + 1, i + life]: phases from - to, folded below */
            int64_t b = (int64_t)stow__sig_bytes(a->sigs[i]);
            delta[i - r0 + 1] += b;
            delta[i - r0 + life + 1] -= b;
        }
        int64_t live = 0, best = INT64_MAX;
        /* load[t] = prefix(t) + prefix(t + period): a life that crosses the
         * period's end counts at the phases after it too. */
        for (size_t t = 1; t <= 2 * period; t++)
            delta[t] += delta[t - 1];
        for (size_t t = 0; t < period; t++) {
            live = delta[t] + delta[t + period];
            if (live < best) {
                best = live;
                phase = t;
            }
        }
        free(delta);
    }
    size_t s0 = r0 + phase;
    while (s0 >= period && s0 - period >= n - tail && s0 + 3 * period > n)
        s0 -= period;
    return s0;
}

static stow_stream_state_t *stream_of(stow_pool_t *pool, unsigned index)
{
    return index && index <= pool->stream_count ? pool->streams[index - 1] : pool->any;
}

/* The profile of the step [s0, s0 + period) of the log; the position of the
 * log's end in it into *cursor. False when nothing can be planned. */
static bool auto_profile(stow_pool_t *pool, const stow_planned_key_t *k,
                         const stow_planned_auto_t *a, size_t period, size_t tail, size_t s0,
                         stow_plan_profile_t *out, size_t *cursor)
{
    size_t n_log = a->count;
    uint32_t *allocs_before = malloc((n_log + 1) * sizeof *allocs_before);
    if (!allocs_before)
        return false;
    allocs_before[0] = 0;
    for (size_t i = 0; i < n_log; i++)
        allocs_before[i + 1] = allocs_before[i] + stow__sig_is_alloc(a->sigs[i]);
    size_t n = allocs_before[s0 + period] - allocs_before[s0];
    stow_plan_pos_t *pos = n ? calloc(n, sizeof *pos) : NULL;
    if (!pos || n >= STOW_PLANNED_MAX_POSITIONS) {
        free(pos);
        free(allocs_before);
        return false;
    }
    bool merge = k->sizes.pos && k->sizes.n == n;
    size_t p = 0;
    for (size_t i = s0; i < s0 + period; i++) {
        uint64_t sig = a->sigs[i];
        if (!stow__sig_is_alloc(sig))
            continue;
        stow_plan_pos_t *q = &pos[p];
        q->stream = stream_of(pool, stow__sig_stream(sig));
        q->max_bytes = q->min_bytes = stow__sig_bytes(sig);
        /* Every period the log repeats over: the largest and smallest size here. */
        for (size_t j = n_log - tail + (i - (n_log - tail)) % period; j < n_log; j += period) {
            size_t b = stow__sig_bytes(a->sigs[j]);
            q->max_bytes = b > q->max_bytes ? b : q->max_bytes;
            q->min_bytes = b < q->min_bytes ? b : q->min_bytes;
        }
        uint32_t life_ops = a->lives[i];
        size_t life = life_ops && i + life_ops <= n_log
                          ? allocs_before[i + life_ops] - allocs_before[i]
                          : 0;
        q->life = life && life < 2 * n ? (uint32_t)life : 0;
        if (merge && k->sizes.pos[p].stream == q->stream) {
            if (k->sizes.pos[p].max_bytes > q->max_bytes)
                q->max_bytes = k->sizes.pos[p].max_bytes;
            if (k->sizes.pos[p].min_bytes < q->min_bytes)
                q->min_bytes = k->sizes.pos[p].min_bytes;
        }
        p++;
    }
    size_t steps_after = (n_log - s0) / period;
    *cursor = allocs_before[n_log] - allocs_before[s0 + steps_after * period];
    free(allocs_before);
    out->n = n;
    out->pos = pos;
    return true;
}

/* A period was found: the step's profile becomes the auto key's layout. */
static void take_period(stow_pool_t *pool, stow_planned_t *pl, size_t period, bool exact)
{
    stow_planned_auto_t *a = &pl->autom;
    const uint64_t *sigs = exact ? a->sigs : a->coarse;
    size_t tail = stow__period_tail(sigs, a->count, period);
    size_t s0 = step_start(a, period, tail);
    stow_planned_key_t *k = stow__planned_auto_key(pool, pl);
    stow_plan_profile_t profile;
    size_t cursor = 0;
    if (!k || !auto_profile(pool, k, a, period, tail, s0, &profile, &cursor)) {
        stop_looking(a);
        back_off(a);
        return;
    }
    stop_looking(a);
    stow__planned_auto_plan(pool, pl, k, &profile, cursor);
}

static void look(stow_pool_t *pool, stow_planned_t *pl)
{
    stow_planned_auto_t *a = &pl->autom;
    size_t period = period_exact(a);
    bool exact = period != 0;
    if (!period)
        period = period_coarse(a);
    if (period)
        take_period(pool, pl, period, exact);
}

/* ---- each operation ---- */

static void note(stow_pool_t *pool, stow_planned_t *pl, uint64_t sig, uint64_t coarse)
{
    stow_planned_auto_t *a = &pl->autom;
    if (a->looking) {
        if (a->count == AUTO_LOG_MAX) {
            stop_looking(a); /* no period in that many operations */
            back_off(a);
        } else {
            a->sigs[a->count] = sig;
            a->coarse[a->count] = coarse;
            a->count++;
            if (a->count >= AUTO_CHECK_FIRST && (a->count & (a->count - 1)) == 0)
                look(pool, pl);
        }
    }
    a->ops++;
}

void stow__planned_auto_alloc(stow_pool_t *pool, uintptr_t addr, size_t rounded,
                              const stow_stream_state_t *ss)
{
    stow_planned_t *pl = pool->planned;
    stow_planned_auto_t *a = &pl->autom;
    if (!a->looking && a->ops >= a->look_after_op && stow__planned_auto_wants_look(pl))
        (void)start_looking(a);
    if (a->looking && stow__ptr_map_reserve_one(&a->born) == STOW_OK)
        stow__ptr_map_put(&a->born, addr, (void *)(uintptr_t)(a->ops + 1));
    uint64_t sig = stow__sig_alloc(rounded, ss->index);
    note(pool, pl, sig, sig & ~STOW_SIG_SIZE_MASK);
}

void stow__planned_auto_free(stow_pool_t *pool, uintptr_t addr)
{
    stow_planned_t *pl = pool->planned;
    stow_planned_auto_t *a = &pl->autom;
    uint64_t distance = 0;
    if (a->looking) {
        uintptr_t v = (uintptr_t)stow__ptr_map_remove(&a->born, addr);
        if (v) {
            uint64_t born = (uint64_t)v - 1;
            distance = a->ops - born;
            if (born >= a->first_op && born - a->first_op < a->count)
                a->lives[born - a->first_op] =
                    distance < UINT32_MAX ? (uint32_t)distance : 0;
        }
    }
    note(pool, pl, stow__sig_free(distance), stow__sig_free(distance));
}

void stow__planned_auto_relook(stow_planned_t *pl)
{
    stow_planned_auto_t *a = &pl->autom;
    if (!a->looking)
        a->look_after_op = a->ops; /* at the next allocation */
}
