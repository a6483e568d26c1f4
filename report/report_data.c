/*
 * report/report_data.c: the timeline replay, stranded memory, the allocations
 * alive at a point, and iteration boundaries with leak detection (contract:
 * report/report.h). It samples the policies it can observe per event (the
 * Stowage pool through its public stats and snapshots, the PyTorch model
 * through its own) and asks the replay engine for the headline figures of the
 * others.
 */
#include "report/report.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "replay/pytorch_model.h"
#include "stowage/sim.h"
#include "stowage/snapshot.h"

unsigned stow__report_size_class(uint64_t size_bytes)
{
    unsigned k = 0;
    while (k + 1 < STOW_REPORT_CLASSES && (size_bytes >> (k + 1)))
        k++;
    return k;
}

void stow__report_free(stow_report_t *r)
{
    free(r->live_bytes);
    free(r->reserved_bytes);
    free(r->frag_event);
    free(r->stranded_bytes);
    free(r->free_bytes);
    free(r->stranded_growth);
    free(r->allocs);
    memset(r, 0, sizeof *r);
}

/* Live bytes and lifetimes straight from the trace. */
static stow_status_t scan_trace(const stow_trace_t *t, stow_report_t *r)
{
    size_t n = t->event_count;
    r->live_bytes = malloc((n ? n : 1) * sizeof *r->live_bytes);
    r->alloc_count = t->id_count;
    r->allocs = calloc(t->id_count ? t->id_count : 1, sizeof *r->allocs);
    if (!r->live_bytes || !r->allocs)
        return STOW_EHOSTMEM;
    for (uint32_t id = 0; id < t->id_count; id++)
        r->allocs[id] = (stow_report_alloc_t){id, 0, SIZE_MAX, SIZE_MAX};
    uint64_t live = 0;
    for (size_t i = 0; i < n; i++) {
        const stow_trace_event_t *e = &t->events[i];
        if (e->kind == STOW_TRACE_ALLOC) {
            live += e->size_bytes;
            r->allocs[e->id].size_bytes = e->size_bytes;
            r->allocs[e->id].alloc_event = i;
        } else {
            live -= e->size_bytes;
            r->allocs[e->id].free_event = i;
        }
        r->live_bytes[i] = live;
        if (live > r->peak_live_bytes) {
            r->peak_live_bytes = live;
            r->peak_live_event = i;
        }
    }
    return STOW_OK;
}

/* ---- per-event sampling of the observable policies ---- */

typedef struct sampler {
    bool is_pool;         /* classic or vmm: pool on sim; else the PyTorch model */
    stow_backend_t *sim;
    stow_pool_t *pool;
    stow_ptm_t *ptm;
} sampler_t;

static void sampler_destroy(sampler_t *s)
{
    if (s->pool)
        stow_pool_destroy_force(s->pool);
    if (s->sim)
        stow_sim_destroy(s->sim);
    if (s->ptm)
        stow__ptm_destroy(s->ptm);
}

static stow_status_t sampler_create(const char *policy, const stow_config_t *config,
                                    size_t capacity_bytes, sampler_t *s)
{
    memset(s, 0, sizeof *s);
    if (!strcmp(policy, "classic") || !strcmp(policy, "vmm")) {
        stow_config_t c = *config;
        c.policy = !strcmp(policy, "vmm") ? STOW_POLICY_VMM : STOW_POLICY_CLASSIC;
        stow_sim_config_t sc;
        stow_sim_config_default(&sc);
        sc.capacity_bytes = capacity_bytes;
        s->is_pool = true;
        stow_status_t st = stow_sim_create(&sc, &s->sim);
        if (st == STOW_OK)
            st = stow_pool_create(&c, s->sim, &s->pool);
        return st;
    }
    /* pytorch, pytorch-expandable: the settings mapping of replay_policies.c */
    stow_ptm_config_t mc;
    stow__ptm_config_default(&mc);
    mc.capacity_bytes = capacity_bytes;
    mc.expandable = !strcmp(policy, "pytorch-expandable");
    mc.max_split_size_bytes = config->max_split_size_bytes;
    mc.max_non_split_rounding_bytes = config->max_non_split_rounding_bytes;
    for (unsigned i = 0; i < STOW_PTM_ROUNDUP_INTERVALS && i < STOW_ROUNDUP_INTERVALS; i++)
        mc.roundup_power2_divisions[i] = config->roundup_power2_divisions[i];
    mc.garbage_collection_threshold = config->garbage_collection_threshold;
    mc.memory_fraction = config->memory_fraction < 1.0 ? config->memory_fraction : 0.0;
    return stow__ptm_create(&mc, &s->ptm);
}

/* ---- stranded free memory (classic pools; contract: report/report.h) ---- */

/* Classic's small pool serves requests of at most 1 MiB (allocator/types.h). */
#define SMALL_REQUEST_MAX_BYTES ((uint64_t)1 << 20)

typedef struct stranded_scan {
    uint64_t *later_min[2];     /* [0 small, 1 large][i]: smallest request of that kind
                                   at event i or later; UINT64_MAX: none */
    stow_snap_segment_t *segs;  /* stow_pool_snapshot's arrays, grown on demand */
    size_t seg_cap;
    stow_snap_block_t *blocks;
    size_t block_cap;
} stranded_scan_t;

static void stranded_scan_free(stranded_scan_t *s)
{
    free(s->later_min[0]);
    free(s->later_min[1]);
    free(s->segs);
    free(s->blocks);
}

/* The smallest request of each kind from every event on: one backward pass. */
static stow_status_t stranded_scan_init(const stow_trace_t *t, stranded_scan_t *s)
{
    memset(s, 0, sizeof *s);
    size_t n = t->event_count;
    s->later_min[0] = malloc((n ? n : 1) * sizeof *s->later_min[0]);
    s->later_min[1] = malloc((n ? n : 1) * sizeof *s->later_min[1]);
    if (!s->later_min[0] || !s->later_min[1])
        return STOW_EHOSTMEM;
    uint64_t min[2] = {UINT64_MAX, UINT64_MAX};
    for (size_t i = n; i-- > 0;) {
        const stow_trace_event_t *e = &t->events[i];
        if (e->kind == STOW_TRACE_ALLOC) {
            unsigned k = e->size_bytes > SMALL_REQUEST_MAX_BYTES;
            if (e->size_bytes < min[k])
                min[k] = e->size_bytes;
        }
        s->later_min[0][i] = min[0];
        s->later_min[1][i] = min[1];
    }
    return STOW_OK;
}

/* What a snapshot after event i says about fragmentation. */
typedef struct stranded_view {
    uint64_t stranded;       /* stranded bytes (report/report.h) */
    uint64_t free_bytes;     /* free (cached) bytes in all segments */
} stranded_view_t;

static stow_status_t stranded_at(stranded_scan_t *s, stow_pool_t *pool, size_t i,
                                 stranded_view_t *out)
{
    stow_snap_totals_t tot;
    for (;;) {
        stow_status_t st =
            stow_pool_snapshot(pool, s->segs, s->seg_cap, s->blocks, s->block_cap, &tot);
        if (st != STOW_OK)
            return st;
        if (tot.segment_count <= s->seg_cap && tot.block_count <= s->block_cap)
            break;
        size_t sc = 2 * tot.segment_count + 16, bc = 2 * tot.block_count + 64;
        free(s->segs);
        free(s->blocks);
        s->segs = malloc(sc * sizeof *s->segs);
        s->blocks = malloc(bc * sizeof *s->blocks);
        s->seg_cap = s->segs ? sc : 0;
        s->block_cap = s->blocks ? bc : 0;
        if (!s->segs || !s->blocks)
            return STOW_EHOSTMEM;
    }
    memset(out, 0, sizeof *out);
    for (size_t k = 0; k < tot.segment_count; k++) {
        const stow_snap_segment_t *seg = &s->segs[k];
        uint64_t later = s->later_min[seg->pool_kind != STOW_POOL_SMALL][i];
        uint64_t run = 0, short_runs = 0, seg_free = 0;
        bool used = false;
        for (uint64_t b = seg->first_block; b < seg->first_block + seg->block_count; b++) {
            const stow_snap_block_t *blk = &s->blocks[b];
            if (blk->state == STOW_SNAP_INACTIVE) {
                run += blk->size_bytes;
                seg_free += blk->size_bytes;
                continue;
            }
            used = true;
            if (run < later)
                short_runs += run;
            run = 0;
        }
        if (run < later)
            short_runs += run;
        if (used && later != UINT64_MAX)
            out->stranded += short_runs;
        out->free_bytes += seg_free;
    }
    return STOW_OK;
}

/* Appends one stranded-memory sample and keeps the figures drawn from them;
 * `growth`: the event raised reserved bytes to a new high. */
static stow_status_t stranded_sample(stow_report_t *r, size_t *cap, size_t event,
                                     uint64_t stranded, uint64_t free_bytes, bool growth)
{
    if (r->frag_count == *cap) {
        size_t c = *cap ? 2 * *cap : 256;
        size_t *ev = realloc(r->frag_event, c * sizeof *ev);
        if (ev)
            r->frag_event = ev;
        uint64_t *sb = realloc(r->stranded_bytes, c * sizeof *sb);
        if (sb)
            r->stranded_bytes = sb;
        uint64_t *fb = realloc(r->free_bytes, c * sizeof *fb);
        if (fb)
            r->free_bytes = fb;
        unsigned char *gr = realloc(r->stranded_growth, c);
        if (gr)
            r->stranded_growth = gr;
        if (!ev || !sb || !fb || !gr)
            return STOW_EHOSTMEM;
        *cap = c;
    }
    r->frag_event[r->frag_count] = event;
    r->stranded_bytes[r->frag_count] = stranded;
    r->free_bytes[r->frag_count] = free_bytes;
    r->stranded_growth[r->frag_count] = growth;
    r->frag_count++;
    if (stranded > r->stranded_max_bytes || r->frag_count == 1) {
        r->stranded_max_bytes = stranded;
        r->stranded_max_event = event;
    }
    if (growth) {
        r->stranded_at_peak_bytes = stranded; /* the last new high is the peak */
        r->free_at_peak_bytes = free_bytes;
        if (stranded > r->stranded_growth_max_bytes || !r->has_growth_sample) {
            r->stranded_growth_max_bytes = stranded;
            r->stranded_growth_max_event = event;
            r->has_growth_sample = true;
        }
    }
    return STOW_OK;
}

static bool policy_observable(const char *p)
{
    return !strcmp(p, "classic") || !strcmp(p, "vmm") || !strcmp(p, "pytorch") ||
           !strcmp(p, "pytorch-expandable");
}

static stow_status_t sample_replay(const stow_trace_t *t, const char *policy,
                                   const stow_config_t *config, size_t capacity_bytes,
                                   size_t frag_samples, stow_report_t *r)
{
    size_t n = t->event_count;
    sampler_t s;
    stow_status_t st = sampler_create(policy, config, capacity_bytes, &s);
    uint64_t *handles = calloc(t->id_count ? t->id_count : 1, sizeof *handles);
    unsigned char *ok = calloc(t->id_count ? t->id_count : 1, 1);
    r->reserved_bytes = malloc((n ? n : 1) * sizeof *r->reserved_bytes);
    size_t step = frag_samples && n > frag_samples ? (n + frag_samples - 1) / frag_samples : 1;
    stranded_scan_t scan;
    memset(&scan, 0, sizeof scan);
    size_t frag_cap = 0;
    r->has_stranded = s.is_pool && !strcmp(policy, "classic");
    if (st == STOW_OK && r->has_stranded)
        st = stranded_scan_init(t, &scan);
    if (st == STOW_OK && (!handles || !ok || !r->reserved_bytes))
        st = STOW_EHOSTMEM;
    uint64_t high = 0; /* reserved bytes' high so far */
    for (size_t i = 0; st == STOW_OK && i < n; i++) {
        const stow_trace_event_t *e = &t->events[i];
        if (e->kind == STOW_TRACE_ALLOC) {
            stow_status_t a;
            if (s.is_pool) {
                void *p = NULL;
                a = stow_pool_alloc(s.pool, (size_t)e->size_bytes,
                                    (stow_stream_t)(uintptr_t)(e->stream + 1u), &p);
                handles[e->id] = (uint64_t)(uintptr_t)p;
            } else {
                a = stow__ptm_alloc(s.ptm, (size_t)e->size_bytes, e->stream, &handles[e->id]);
            }
            ok[e->id] = a == STOW_OK;
            r->ooms += a != STOW_OK;
        } else if (ok[e->id]) {
            if (s.is_pool)
                (void)stow_pool_free(s.pool, (void *)(uintptr_t)handles[e->id]);
            else
                (void)stow__ptm_free(s.ptm, handles[e->id]);
            ok[e->id] = 0;
        }
        uint64_t reserved;
        if (s.is_pool) {
            stow_sim_counters_t c;
            stow_sim_counters(s.sim, &c);
            reserved = c.reserved_bytes;
        } else {
            stow_ptm_stats_t ps;
            stow__ptm_stats(s.ptm, &ps);
            reserved = ps.reserved_bytes_current;
        }
        r->reserved_bytes[i] = reserved;
        bool new_high = reserved > high || i == 0;
        if (new_high)
            high = reserved;
        if (reserved > r->peak_reserved_bytes || r->peak_reserved_event == SIZE_MAX) {
            r->peak_reserved_bytes = reserved;
            r->peak_reserved_event = i;
        }
        if (r->has_stranded && (new_high || i % step == 0 || i + 1 == n)) {
            stranded_view_t v;
            st = stranded_at(&scan, s.pool, i, &v);
            if (st == STOW_OK)
                st = stranded_sample(r, &frag_cap, i, v.stranded, v.free_bytes, new_high);
        }
    }
    if (st == STOW_OK) {
        if (s.is_pool) {
            stow_stats_t stats;
            stow_pool_stats(s.pool, &stats);
            r->backend_calls = stats.num_backend_calls;
        } else {
            stow_ptm_stats_t ps;
            stow__ptm_stats(s.ptm, &ps);
            r->backend_calls = ps.device_alloc_calls + ps.device_free_calls;
        }
        r->has_backend_calls = true;
    }
    stranded_scan_free(&scan);
    free(handles);
    free(ok);
    sampler_destroy(&s);
    return st;
}

stow_status_t stow__report_build(const stow_trace_t *trace, const char *policy,
                                 const stow_config_t *config, size_t capacity_bytes,
                                 bool min_capacity, size_t frag_samples, stow_report_t *out)
{
    const stow_replay_policy_t *p = stow__replay_policy_find(policy);
    if (!p)
        return STOW_EINVAL;
    stow_report_t r;
    memset(&r, 0, sizeof r);
    r.trace = trace;
    r.policy = p->name;
    r.peak_reserved_event = SIZE_MAX;
    stow_status_t st = scan_trace(trace, &r);
    if (st == STOW_OK && policy_observable(r.policy)) {
        st = sample_replay(trace, r.policy, config, capacity_bytes, frag_samples, &r);
    } else if (st == STOW_OK) {
        stow_replay_result_t res;
        st = stow__replay_run(p, trace, config, capacity_bytes, 0, false, NULL, NULL, &res);
        if (st == STOW_OK) {
            r.peak_reserved_bytes = res.peak_reserved_bytes;
            r.backend_calls = res.backend_calls;
            r.has_backend_calls = res.has_backend_calls;
            r.ooms = res.ooms;
        }
    }
    if (st == STOW_OK && min_capacity && p && p->device) {
        unsigned probes;
        st = stow__replay_min_capacity(p, trace, config, r.peak_reserved_bytes,
                                       &r.min_capacity_bytes, &probes);
        r.has_min_capacity = st == STOW_OK;
    }
    if (st != STOW_OK) {
        stow__report_free(&r);
        return st;
    }
    *out = r;
    return STOW_OK;
}

/* ---- the allocations alive at a point ---- */

static int by_size_desc(const void *a, const void *b)
{
    const stow_report_alloc_t *x = a, *y = b;
    if (x->size_bytes != y->size_bytes)
        return x->size_bytes > y->size_bytes ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

size_t stow__report_alive_at(const stow_report_t *r, size_t event, stow_report_alloc_t *out,
                             size_t max)
{
    size_t count = 0;
    stow_report_alloc_t *all = malloc((r->alloc_count ? r->alloc_count : 1) * sizeof *all);
    if (!all)
        return 0;
    for (size_t id = 0; id < r->alloc_count; id++) {
        const stow_report_alloc_t *a = &r->allocs[id];
        if (a->alloc_event <= event && (a->free_event == SIZE_MAX || a->free_event > event))
            all[count++] = *a;
    }
    qsort(all, count, sizeof *all, by_size_desc);
    memcpy(out, all, (count < max ? count : max) * sizeof *out);
    free(all);
    return count;
}

/* ---- iteration boundaries and growth ---- */

/* The event of lowest live bytes in [lo, hi) (the first one on ties). */
static size_t argmin_live(const stow_report_t *r, size_t lo, size_t hi)
{
    size_t best = lo;
    for (size_t i = lo; i < hi; i++)
        if (r->live_bytes[i] < r->live_bytes[best])
            best = i;
    return best;
}

/* The period of the live-bytes curve in events, or 0: the smallest lag whose
 * autocorrelation (linear trend removed, so that a leak does not hide the
 * pattern) is a local maximum within 80% of the best one, and above 0.3. */
#define GROWTH_POINTS 2048
static size_t detect_period(const stow_report_t *r)
{
    size_t n = r->trace->event_count;
    if (n < 4 * 64)
        return 0;
    static double x[GROWTH_POINTS];
    static double ac[GROWTH_POINTS / 2 + 2];
    size_t m = n < GROWTH_POINTS ? n : GROWTH_POINTS;
    for (size_t k = 0; k < m; k++) {
        size_t lo = k * n / m, hi = (k + 1) * n / m;
        double sum = 0;
        for (size_t i = lo; i < hi; i++)
            sum += (double)r->live_bytes[i];
        x[k] = sum / (double)(hi - lo);
    }
    /* least-squares line, removed */
    double sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (size_t k = 0; k < m; k++) {
        sx += (double)k;
        sy += x[k];
        sxx += (double)k * (double)k;
        sxy += (double)k * x[k];
    }
    double slope = ((double)m * sxy - sx * sy) / ((double)m * sxx - sx * sx);
    double icpt = (sy - slope * sx) / (double)m;
    double var = 0;
    for (size_t k = 0; k < m; k++) {
        x[k] -= icpt + slope * (double)k;
        var += x[k] * x[k];
    }
    if (var <= 0)
        return 0;
    var /= (double)m;
    size_t lmin = m / 64, lmax = m / 2;
    double best = -1;
    for (size_t l = lmin; l <= lmax + 1; l++) {
        double s = 0;
        for (size_t k = 0; k + l < m; k++)
            s += x[k] * x[k + l];
        ac[l - lmin] = s / (double)(m - l) / var;
        if (l <= lmax && ac[l - lmin] > best)
            best = ac[l - lmin];
    }
    if (best < 0.3)
        return 0;
    for (size_t l = lmin + 1; l <= lmax; l++) {
        double v = ac[l - lmin];
        if (v >= 0.8 * best && v >= ac[l - lmin - 1] && v >= ac[l - lmin + 1])
            return (size_t)((double)l * (double)n / (double)m);
    }
    return 0;
}

void stow__report_growth(const stow_report_t *r, const size_t *given, unsigned given_count,
                         unsigned iterations, stow_growth_t *out)
{
    memset(out, 0, sizeof *out);
    size_t n = r->trace->event_count;
    out->method = "none";
    if (given_count) {
        out->method = "given";
        for (unsigned i = 0; i < given_count && i < STOW_REPORT_MAX_BOUNDARIES; i++)
            if (given[i] < n)
                out->boundary_event[out->boundary_count++] = given[i];
    } else {
        if (iterations > 1) {
            out->method = "iterations";
        } else {
            size_t period = detect_period(r);
            if (period) {
                iterations = (unsigned)((double)n / (double)period + 0.5);
                out->method = "pattern";
            }
        }
        if (iterations > STOW_REPORT_MAX_BOUNDARIES)
            iterations = STOW_REPORT_MAX_BOUNDARIES;
        for (unsigned k = 1; iterations > 1 && k < iterations; k++) {
            size_t c = (size_t)((double)k * (double)n / iterations);
            size_t w = n / (4 * (size_t)iterations);
            size_t lo = c > w ? c - w : 0, hi = c + w < n ? c + w : n;
            out->boundary_event[out->boundary_count++] = argmin_live(r, lo, hi > lo ? hi : lo + 1);
        }
    }
    for (unsigned i = 0; i < out->boundary_count; i++)
        out->boundary_live[i] = r->live_bytes[out->boundary_event[i]];
    out->iterations = out->boundary_count + 1;
    unsigned b = out->boundary_count;
    if (b >= 2) {
        int64_t total = (int64_t)out->boundary_live[b - 1] - (int64_t)out->boundary_live[0];
        out->growth_per_iteration_bytes = total / (int64_t)(b - 1);
        bool rising = true;
        for (unsigned i = 1; i < b; i++)
            rising &= out->boundary_live[i] > out->boundary_live[i - 1];
        out->leak = b >= 3 && rising && (double)total >= 0.01 * (double)r->peak_live_bytes;
    }
}

void stow__report_growth_print(FILE *f, const stow_report_t *r, const stow_growth_t *g)
{
    fprintf(f, "%s: %u iteration boundaries (%s)\n", r->trace->path ? r->trace->path : "trace",
            g->boundary_count, g->method);
    for (unsigned i = 0; i < g->boundary_count; i++)
        fprintf(f, "  boundary %-4u event %-10zu live %llu bytes\n", i + 1, g->boundary_event[i],
                (unsigned long long)g->boundary_live[i]);
    if (g->boundary_count >= 2)
        fprintf(f, "  mean change per iteration: %lld bytes\n",
                (long long)g->growth_per_iteration_bytes);
    if (g->leak)
        fprintf(f, "warning: live bytes grow at every iteration boundary "
                   "(%lld bytes per iteration): a leak?\n",
                (long long)g->growth_per_iteration_bytes);
    else if (g->boundary_count < 3)
        fprintf(f, "  too few boundaries to judge growth (need 3; try --iterations N)\n");
    else
        fprintf(f, "  no steady growth\n");
}
