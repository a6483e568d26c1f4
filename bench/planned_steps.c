/*
 * bench/planned_steps.c: what a pool does step by step through a long run
 * (docs/planned.md, the figures). Replays each trace once on a fresh pool
 * (simulated device, the trace's streams, the settings of --conf over
 * STOWAGE_CONF; --conf also takes the constants of stowage/tuning.h),
 * handing it the trace's step markers, and reads the pool's statistics at
 * every step boundary: a marker, or, for a trace without
 * markers, each of --parts equal slices of its events (whose boundaries the
 * pool is not told).
 *
 * Per trace, one JSON object:
 *   steps                  boundaries seen
 *   peak_live_bytes        the trace's (the lower bound)
 *   peak_reserved_over_live   the pool's reserved peak over the whole run
 *   last_reserved_over_live   the highest reserved in the last --last steps
 *   plan_step              the first step in which the arena served a request
 *                          (-1: none)
 *   calls_after_plan       backend calls (every kind) in the steps after that
 *   max_calls_per_step_after_plan
 *   calls_last, maps_last  backend calls, and map + unmap calls, in the last steps
 *   calls_settled, maps_settled, steps_calling_settled   the same after the first
 *                          --settle steps (5), and how many of those steps made any
 *   calls_settled_below_peak, steps_calling_settled_below_peak   the same of
 *                          those steps that took the live peak no higher (a step
 *                          that does must grow under any allocator)
 *   hits_after_plan, pool_after_plan   allocations of the steps after plan_step
 *                          served by the arena, and by the pool
 *   hit_rate_after_plan    hits / (hits + pool)
 *   plans, misses, realignments
 * With --steps, one line per step too: reserved, calls, maps, hits, pool.
 * With --hide-markers the markers still cut the run into steps, but the pool
 * is not told of them: the same run without markers, step by step.
 *
 *   build/planned_steps [--conf KEY:VALUE,...] [--last K (10)] [--parts P (40)]
 *                       [--settle S (5)] [--hide-markers] [--steps] TRACE...
 */
#include <inttypes.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stowage.h"
#include "stowage/sim.h"
#include "stowage/trace.h"

#define MAX_STEPS 100000

typedef struct step_fig {
    uint64_t reserved_max, calls, maps, hits, pool;
    bool live_peak_rose; /* the step allocated past every earlier step's live peak */
} step_fig_t;

typedef struct run {
    stow_pool_t *pool;
    stow_stats_t last;
    uint64_t reserved_max; /* since the last boundary */
    step_fig_t *steps;
    size_t n_steps;
} run_t;

/* Closes the step in progress: its figures from the statistics' deltas. */
static void boundary(run_t *r)
{
    stow_stats_t s;
    if (stow_pool_stats(r->pool, &s) != STOW_OK || r->n_steps == MAX_STEPS)
        return;
    step_fig_t *f = &r->steps[r->n_steps++];
    f->reserved_max = r->reserved_max;
    f->calls = s.num_backend_calls - r->last.num_backend_calls;
    f->maps = s.num_map_calls + s.num_unmap_calls - r->last.num_map_calls -
              r->last.num_unmap_calls;
    f->hits = s.num_planned_hits - r->last.num_planned_hits;
    uint64_t allocs = s.allocation[STOW_POOL_ALL].allocated -
                      r->last.allocation[STOW_POOL_ALL].allocated;
    f->pool = allocs - f->hits;
    f->live_peak_rose = s.allocated_bytes[STOW_POOL_ALL].peak >
                        r->last.allocated_bytes[STOW_POOL_ALL].peak;
    r->last = s;
    r->reserved_max = s.reserved_bytes[STOW_POOL_ALL].current;
}

static void note_reserved(run_t *r)
{
    /* The current figure, cheaply: a snapshot per event would dominate. */
    stow_stats_t s;
    if (stow_pool_stats(r->pool, &s) == STOW_OK &&
        s.reserved_bytes[STOW_POOL_ALL].current > r->reserved_max)
        r->reserved_max = s.reserved_bytes[STOW_POOL_ALL].current;
}

typedef struct opts {
    unsigned last, parts, settle;
    bool per_step, hide_markers;
} opts_t;

/* The constants of --conf (stowage/tuning.h), beside its settings. */
static stow_tuning_t tuning;

static int replay(const char *path, const stow_config_t *cfg, const opts_t *o)
{
    unsigned last = o->last, parts = o->parts;
    bool per_step = o->per_step;
    stow_trace_t *t = NULL;
    char err[512];
    if (stow_trace_load(path, &t, err, sizeof err) != STOW_OK) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    stow_sim_config_t sc;
    stow_sim_config_default(&sc);
    stow_backend_t *sim = NULL;
    run_t r = {0};
    r.steps = calloc(MAX_STEPS, sizeof *r.steps);
    void **ptrs = calloc(t->id_count ? t->id_count : 1, sizeof *ptrs);
    if (!r.steps || !ptrs || stow_sim_create(&sc, &sim) != STOW_OK ||
        stow_pool_create_tuned(cfg, &tuning, sim, &r.pool) != STOW_OK) {
        fprintf(stderr, "planned_steps: cannot create the pool\n");
        return 1;
    }
    stow_pool_stats(r.pool, &r.last);
    bool marked = t->marker_count > 0;
    size_t slice = parts ? (t->event_count + parts - 1) / parts : t->event_count;
    size_t m = 0;
    uint64_t ooms = 0;
    for (size_t i = 0; i < t->event_count; i++) {
        for (; marked && m < t->marker_count && t->markers[m].before_event == i; m++) {
            boundary(&r);
            uint32_t k = t->markers[m].key;
            if (!o->hide_markers)
                (void)stow_pool_step(r.pool, k == STOW_TRACE_STEP_END ? NULL : t->keys[k]);
        }
        if (!marked && slice && i && i % slice == 0)
            boundary(&r);
        const stow_trace_event_t *e = &t->events[i];
        if (e->kind == STOW_TRACE_ALLOC) {
            stow_stream_t st = (stow_stream_t)(uintptr_t)(e->stream + 1u);
            if (stow_pool_alloc(r.pool, (size_t)e->size_bytes, st, &ptrs[e->id]) != STOW_OK) {
                ptrs[e->id] = NULL;
                ooms++;
            } else {
                note_reserved(&r);
            }
        } else if (ptrs[e->id]) {
            (void)stow_pool_free(r.pool, ptrs[e->id]);
        }
    }
    boundary(&r);
    stow_stats_t s = r.last;
    /* The first boundary of a marked trace closes what came before the first
     * marker: not a step. */
    size_t first = marked && t->markers[0].before_event > 0 ? 1 : 0;
    int plan_step = -1;
    for (size_t k = first; k < r.n_steps && plan_step < 0; k++)
        if (r.steps[k].hits)
            plan_step = (int)(k - first);
    uint64_t calls_after = 0, max_calls = 0, hits_after = 0, pool_after = 0;
    for (size_t k = plan_step < 0 ? r.n_steps : first + (size_t)plan_step + 1; k < r.n_steps;
         k++) {
        calls_after += r.steps[k].calls;
        max_calls = r.steps[k].calls > max_calls ? r.steps[k].calls : max_calls;
        hits_after += r.steps[k].hits;
        pool_after += r.steps[k].pool;
    }
    uint64_t calls_settled = 0, maps_settled = 0, steps_calling = 0, calls_below = 0,
             steps_calling_below = 0;
    for (size_t k = first + o->settle; k < r.n_steps; k++) {
        calls_settled += r.steps[k].calls;
        maps_settled += r.steps[k].maps;
        steps_calling += r.steps[k].calls > 0;
        if (!r.steps[k].live_peak_rose) {
            calls_below += r.steps[k].calls;
            steps_calling_below += r.steps[k].calls > 0;
        }
    }
    uint64_t calls_last = 0, maps_last = 0, reserved_last = 0;
    for (size_t k = r.n_steps > last ? r.n_steps - last : 0; k < r.n_steps; k++) {
        calls_last += r.steps[k].calls;
        maps_last += r.steps[k].maps;
        if (r.steps[k].reserved_max > reserved_last)
            reserved_last = r.steps[k].reserved_max;
    }
    double live = (double)t->peak_live_bytes;
    printf("{\"trace\": \"%s\", \"steps\": %zu, \"peak_live_bytes\": %" PRIu64
           ", \"peak_reserved_over_live\": %.6f, \"last_reserved_over_live\": %.6f"
           ", \"plan_step\": %d, \"calls_after_plan\": %" PRIu64
           ", \"max_calls_per_step_after_plan\": %" PRIu64 ", \"calls_last\": %" PRIu64
           ", \"maps_last\": %" PRIu64 ", \"calls_settled\": %" PRIu64
           ", \"maps_settled\": %" PRIu64 ", \"steps_calling_settled\": %" PRIu64
           ", \"calls_settled_below_peak\": %" PRIu64
           ", \"steps_calling_settled_below_peak\": %" PRIu64
           ", \"hits_after_plan\": %" PRIu64
           ", \"pool_after_plan\": %" PRIu64 ", \"hit_rate_after_plan\": %.6f"
           ", \"plans\": %" PRIu64 ", \"misses\": %" PRIu64 ", \"realignments\": %" PRIu64
           ", \"arena_bytes\": %" PRIu64 ", \"ooms\": %" PRIu64 "}\n",
           path, r.n_steps - first, t->peak_live_bytes,
           (double)s.reserved_bytes[STOW_POOL_ALL].peak / live, (double)reserved_last / live,
           plan_step, calls_after, max_calls, calls_last, maps_last, calls_settled, maps_settled,
           steps_calling, calls_below, steps_calling_below, hits_after, pool_after,
           hits_after + pool_after ? (double)hits_after / (double)(hits_after + pool_after) : 0.0,
           s.num_plans, s.num_planned_misses, s.num_planned_realignments, s.arena_bytes, ooms);
    if (per_step)
        for (size_t k = first; k < r.n_steps; k++)
            printf("  step %zu: reserved %.6f x live, calls %" PRIu64 ", maps %" PRIu64
                   ", hits %" PRIu64 ", pool %" PRIu64 "%s\n",
                   k - first, (double)r.steps[k].reserved_max / live, r.steps[k].calls,
                   r.steps[k].maps, r.steps[k].hits, r.steps[k].pool,
                   r.steps[k].live_peak_rose ? ", new live peak" : "");
    stow_pool_destroy_force(r.pool);
    stow_sim_destroy(sim);
    free(ptrs);
    free(r.steps);
    stow_trace_free(t);
    return 0;
}

int main(int argc, char **argv)
{
    stow_config_t cfg;
    stow_config_default(&cfg);
    stow_tuning_default(&tuning);
    char err[512];
    if (stow_config_from_env(&cfg, err, sizeof err) != STOW_OK) {
        fprintf(stderr, "%s\n", err);
        return 2;
    }
    opts_t o = {10, 40, 5, false, false};
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        if (!strcmp(argv[i], "--conf") && i + 1 < argc) {
            if (stow_tuning_parse(&cfg, &tuning, argv[++i], err, sizeof err) != STOW_OK) {
                fprintf(stderr, "--conf: %s\n", err);
                return 2;
            }
        } else if (!strcmp(argv[i], "--last") && i + 1 < argc) {
            o.last = (unsigned)strtoul(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--parts") && i + 1 < argc) {
            o.parts = (unsigned)strtoul(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--settle") && i + 1 < argc) {
            o.settle = (unsigned)strtoul(argv[++i], NULL, 10);
        } else if (!strcmp(argv[i], "--hide-markers")) {
            o.hide_markers = true;
        } else if (!strcmp(argv[i], "--steps")) {
            o.per_step = true;
        } else {
            fprintf(stderr, "usage: planned_steps [--conf KEY:VALUE,...] [--last K] "
                            "[--parts P] [--settle S] [--hide-markers] [--steps] TRACE...\n");
            return 2;
        }
    }
    /* Deterministic figures: plans made inline, as the replay tool makes them. */
    cfg.planned_async = false;
    int rc = 0;
    for (; i < argc; i++) {
        int r = replay(argv[i], &cfg, &o);
        rc = r > rc ? r : rc;
    }
    return rc;
}
