/*
 * tests/unit/test_ideal_remap.c: the `ideal-remap` replay policy
 * (replay/ideal_remap.c): best-fit addresses, physical 2 MiB pages exactly
 * under live data. Traces small enough to work out by hand, then the model
 * against a brute-force oracle written here (a linear scan for best fit and a
 * count per page), after every event of random traces and of the bundled real
 * trace: the same address for every block and the same live pages.
 */
#include <criterion/criterion.h>

#include <stdlib.h>
#include <string.h>

#include "replay/replay_engine.h"
#include "stowage.h"
#include "stowage/trace.h"

#define MIB ((uint64_t)1048576)
#define PAGE (2 * MIB)

static const stow_replay_policy_t *model(void)
{
    const stow_replay_policy_t *p = stow__replay_policy_find("ideal-remap");
    cr_assert_not_null(p);
    return p;
}

static void *create(size_t capacity_bytes)
{
    stow_config_t c;
    stow_config_default(&c);
    stow_replay_setup_t setup = {&c, capacity_bytes};
    void *ctx = NULL;
    cr_assert_eq(model()->create(&setup, &ctx), STOW_OK);
    return ctx;
}

static uint64_t alloc_at(void *ctx, uint64_t size_bytes)
{
    uint64_t h = 0;
    cr_assert_eq(model()->alloc(ctx, size_bytes, 0, &h), STOW_OK, "alloc %llu",
                 (unsigned long long)size_bytes);
    return h - 1; /* the model's handle is the address plus one */
}

static stow_replay_report_t report(void *ctx)
{
    stow_replay_report_t r;
    memset(&r, 0, sizeof r);
    model()->report(ctx, &r);
    return r;
}

static uint64_t live_pages(void *ctx)
{
    stow_replay_report_t r = report(ctx);
    return r.map_calls - r.unmap_calls;
}

Test(ideal_remap, is_a_device_policy_chosen_by_name_only)
{
    cr_assert(model()->device);
    cr_assert(model()->not_in_all);
}

/* 3 MiB at 0 and 1 MiB at 3 MiB: pages 0 and 1. a0 freed: page 1 alone. 5 MiB
 * fits no hole (the 3 MiB one is too small) and goes to the top at 4 MiB:
 * pages 1-4, the peak (8 MiB for 6 MiB live). */
Test(ideal_remap, pages_by_hand)
{
    void *m = create(0);
    cr_assert_eq(alloc_at(m, 3 * MIB), 0);
    uint64_t a1 = alloc_at(m, 1 * MIB);
    cr_assert_eq(a1, 3 * MIB);
    cr_assert_eq(live_pages(m), 2);
    model()->free(m, 0 + 1, 3 * MIB);
    cr_assert_eq(live_pages(m), 1);
    cr_assert_eq(alloc_at(m, 5 * MIB), 4 * MIB);
    cr_assert_eq(live_pages(m), 4);
    stow_replay_report_t r = report(m);
    cr_assert_eq(r.peak_reserved_bytes, 4 * PAGE);
    cr_assert_eq(r.map_calls, 2 + 3);
    cr_assert_eq(r.unmap_calls, 1);
    cr_assert_eq(r.backend_calls, 6);
    cr_assert(r.has_map_calls && r.has_backend_calls);
    model()->destroy(m);
}

/* Blocks of 1, 2, 1, 1, 1, 1 and 1 MiB from 0 up; those at 1 MiB (2 MiB), 4 MiB
 * and 6 MiB freed. 1 MiB takes the lower of the two smallest fitting holes,
 * 1.5 MiB the 2 MiB one, and the 0.5 MiB left of it is then the best fit for
 * small requests, rounded up to 512 bytes (1 byte takes 512, 513 takes 1024). */
Test(ideal_remap, best_fit_smallest_then_lowest_address)
{
    void *m = create(0);
    uint64_t sizes[] = {1, 2, 1, 1, 1, 1, 1}; /* MiB, at 0, 1, 3, 4, 5, 6, 7 */
    uint64_t at[7];
    for (int i = 0; i < 7; i++)
        at[i] = alloc_at(m, sizes[i] * MIB);
    cr_assert_eq(at[6], 7 * MIB);
    model()->free(m, at[1] + 1, 2 * MIB);
    model()->free(m, at[3] + 1, 1 * MIB);
    model()->free(m, at[5] + 1, 1 * MIB);
    cr_assert_eq(alloc_at(m, 1 * MIB), 4 * MIB);
    cr_assert_eq(alloc_at(m, 1 * MIB + MIB / 2), 1 * MIB);
    cr_assert_eq(alloc_at(m, 1), 2 * MIB + MIB / 2);
    cr_assert_eq(alloc_at(m, 511), 2 * MIB + MIB / 2 + 512);
    cr_assert_eq(alloc_at(m, 513), 2 * MIB + MIB / 2 + 1024);
    cr_assert_eq(alloc_at(m, MIB / 2), 6 * MIB); /* the 0.5 MiB hole is too small now */
    model()->destroy(m);
}

/* A freed block merges with both free neighbours, and with the free top. */
Test(ideal_remap, frees_merge_with_neighbours_and_the_top)
{
    void *m = create(0);
    uint64_t a = alloc_at(m, MIB), b = alloc_at(m, MIB), c = alloc_at(m, MIB);
    uint64_t d = alloc_at(m, MIB);
    model()->free(m, a + 1, MIB);
    model()->free(m, c + 1, MIB);
    model()->free(m, b + 1, MIB); /* a, b and c: one hole of 3 MiB */
    cr_assert_eq(alloc_at(m, 3 * MIB), 0);
    model()->free(m, 0 + 1, 3 * MIB);
    model()->free(m, d + 1, MIB); /* everything merges into the top */
    cr_assert_eq(live_pages(m), 0);
    cr_assert_eq(alloc_at(m, 4 * MIB + 1), 0); /* the range is all free again: from 0 */
    cr_assert_eq(live_pages(m), 3);
    model()->destroy(m);
}

/* On a 4 MiB device a block that would make a third page live fails with
 * STOW_ENOMEM and changes nothing: a smaller one then takes the same place. */
Test(ideal_remap, capacity_counts_pages_and_a_refusal_changes_nothing)
{
    void *m = create(4 * MIB);
    uint64_t a = alloc_at(m, 3 * MIB);
    uint64_t h = 0;
    cr_assert_eq(model()->alloc(m, 2 * MIB, 0, &h), STOW_ENOMEM); /* pages 1 and 2 */
    cr_assert_eq(live_pages(m), 2);
    cr_assert_eq(alloc_at(m, 1 * MIB), 3 * MIB); /* page 1 only */
    model()->free(m, a + 1, 3 * MIB);
    cr_assert_eq(alloc_at(m, 2 * MIB), 0);
    cr_assert_eq(report(m).peak_reserved_bytes, 2 * PAGE);
    model()->destroy(m);
    void *tiny = create(MIB); /* below one page: nothing fits */
    cr_assert_eq(model()->alloc(tiny, 1, 0, &h), STOW_ENOMEM);
    model()->destroy(tiny);
}

Test(ideal_remap, sizes_near_the_top_overflow_cleanly)
{
    void *m = create(0);
    uint64_t h = 0;
    cr_assert_eq(model()->alloc(m, UINT64_MAX, 0, &h), STOW_EOVERFLOW);
    cr_assert_eq(model()->alloc(m, UINT64_MAX / 2 + 1, 0, &h), STOW_EOVERFLOW);
    cr_assert_eq(live_pages(m), 0);
    cr_assert_eq(alloc_at(m, 1), 0);
    /* The largest request a trace may hold (2^62 bytes): 2^41 pages, two of
     * them edges; the next one of that size would pass 2^63 and overflows. */
    uint64_t big = STOW_TRACE_MAX_SIZE_BYTES;
    cr_assert_eq(alloc_at(m, big), 512);
    cr_assert_eq(live_pages(m), (big + 512 + PAGE - 1) / PAGE);
    cr_assert_eq(model()->alloc(m, big, 0, &h), STOW_EOVERFLOW);
    model()->free(m, 512 + 1, big);
    cr_assert_eq(live_pages(m), 1);
    model()->destroy(m);
}

/* ---- against a brute-force oracle ---- */

typedef struct oracle_hole {
    uint64_t addr, size_bytes;
} oracle_hole_t;

typedef struct oracle {
    oracle_hole_t *holes; /* unsorted */
    size_t hole_count;
    uint64_t top;
    uint32_t *page_blocks; /* live blocks overlapping each page */
    size_t page_cap;
    uint64_t pages;
} oracle_t;

static uint64_t round512(uint64_t size_bytes)
{
    return size_bytes <= 512 ? 512 : (size_bytes + 511) / 512 * 512;
}

static void oracle_count(oracle_t *o, uint64_t addr, uint64_t size_bytes, int delta)
{
    uint64_t last = (addr + size_bytes - 1) / PAGE;
    if (last >= o->page_cap) {
        size_t cap = (size_t)last * 2 + 16;
        o->page_blocks = realloc(o->page_blocks, cap * sizeof *o->page_blocks);
        cr_assert_not_null(o->page_blocks);
        memset(o->page_blocks + o->page_cap, 0, (cap - o->page_cap) * sizeof *o->page_blocks);
        o->page_cap = cap;
    }
    for (uint64_t p = addr / PAGE; p <= last; p++) {
        if (delta > 0 && o->page_blocks[p]++ == 0)
            o->pages++;
        if (delta < 0 && --o->page_blocks[p] == 0)
            o->pages--;
    }
}

static uint64_t oracle_alloc(oracle_t *o, uint64_t size_bytes)
{
    uint64_t r = round512(size_bytes);
    size_t best = o->hole_count;
    for (size_t i = 0; i < o->hole_count; i++) {
        const oracle_hole_t *h = &o->holes[i];
        if (h->size_bytes >= r &&
            (best == o->hole_count || h->size_bytes < o->holes[best].size_bytes ||
             (h->size_bytes == o->holes[best].size_bytes && h->addr < o->holes[best].addr)))
            best = i;
    }
    uint64_t addr;
    if (best == o->hole_count) {
        addr = o->top;
        o->top += r;
    } else {
        addr = o->holes[best].addr;
        o->holes[best].addr += r;
        o->holes[best].size_bytes -= r;
        if (!o->holes[best].size_bytes)
            o->holes[best] = o->holes[--o->hole_count];
    }
    oracle_count(o, addr, r, +1);
    return addr;
}

static void oracle_free(oracle_t *o, uint64_t addr, uint64_t size_bytes)
{
    uint64_t r = round512(size_bytes), lo = addr, hi = addr + r;
    oracle_count(o, addr, r, -1);
    for (size_t i = 0; i < o->hole_count;) {
        oracle_hole_t *h = &o->holes[i];
        if (h->addr + h->size_bytes == lo || h->addr == hi) {
            if (h->addr + h->size_bytes == lo)
                lo = h->addr;
            else
                hi = h->addr + h->size_bytes;
            o->holes[i] = o->holes[--o->hole_count];
            continue;
        }
        i++;
    }
    if (hi == o->top) {
        o->top = lo;
        return;
    }
    o->holes = realloc(o->holes, (o->hole_count + 1) * sizeof *o->holes);
    cr_assert_not_null(o->holes);
    o->holes[o->hole_count++] = (oracle_hole_t){lo, hi - lo};
}

/* Replays the trace through the model and the oracle side by side; after every
 * event the same address and the same live pages. Returns the peak pages. */
static uint64_t check_against_oracle(const stow_trace_t *t)
{
    void *m = create(0);
    oracle_t o;
    memset(&o, 0, sizeof o);
    uint64_t *addr = calloc(t->id_count ? t->id_count : 1, sizeof *addr);
    cr_assert_not_null(addr);
    uint64_t peak = 0;
    for (size_t i = 0; i < t->event_count; i++) {
        const stow_trace_event_t *e = &t->events[i];
        if (e->kind == STOW_TRACE_ALLOC) {
            uint64_t want = oracle_alloc(&o, e->size_bytes);
            addr[e->id] = alloc_at(m, e->size_bytes);
            cr_assert_eq(addr[e->id], want, "event %zu: model at %llu, oracle at %llu", i,
                         (unsigned long long)addr[e->id], (unsigned long long)want);
        } else {
            model()->free(m, addr[e->id] + 1, e->size_bytes);
            oracle_free(&o, addr[e->id], e->size_bytes);
        }
        cr_assert_eq(live_pages(m), o.pages, "event %zu: model %llu pages, oracle %llu", i,
                     (unsigned long long)live_pages(m), (unsigned long long)o.pages);
        if (o.pages > peak)
            peak = o.pages;
    }
    cr_assert_eq(report(m).peak_reserved_bytes, peak * PAGE);
    model()->destroy(m);
    free(addr);
    free(o.holes);
    free(o.page_blocks);
    return peak;
}

/* Random traces: sizes from 1 byte to 9 MiB, mostly small, so that holes of
 * every size meet pages at every offset; up to 200 blocks live at once. */
Test(ideal_remap, random_traces_match_the_oracle)
{
    for (unsigned seed = 1; seed <= 40; seed++) {
        srand(seed);
        const uint32_t ids = 3000;
        stow_trace_t t;
        memset(&t, 0, sizeof t);
        t.id_count = ids;
        t.events = calloc(2 * ids, sizeof *t.events);
        cr_assert_not_null(t.events);
        uint64_t *size_of = calloc(ids, sizeof *size_of);
        cr_assert_not_null(size_of);
        uint32_t live[200], live_count = 0, next_id = 0;
        while (next_id < ids || live_count) {
            bool do_alloc = next_id < ids && (live_count == 0 || (live_count < 200 && rand() % 2));
            stow_trace_event_t *e = &t.events[t.event_count++];
            if (do_alloc) {
                uint64_t s = rand() % 4 ? (uint64_t)(rand() % 65536) + 1
                                        : (uint64_t)(rand() % (int)(9 * MIB)) + 1;
                size_of[next_id] = s;
                *e = (stow_trace_event_t){s, next_id, 0, STOW_TRACE_ALLOC, 0};
                live[live_count++] = next_id++;
            } else {
                uint32_t k = (uint32_t)rand() % live_count, id = live[k];
                live[k] = live[--live_count];
                *e = (stow_trace_event_t){size_of[id], id, 0, STOW_TRACE_FREE, 0};
            }
        }
        free(size_of);
        cr_assert_gt(check_against_oracle(&t), 0);
        free(t.events);
    }
}

/* The bundled real trace (ResNet-50 training), whole. */
Test(ideal_remap, bundled_trace_matches_the_oracle)
{
    stow_trace_t *t = NULL;
    char err[256] = "";
    cr_assert_eq(stow_trace_load(STOW_SOURCE_DIR "/bench/traces/resnet50_train.rep", &t, err,
                                 sizeof err),
                 STOW_OK, "%s", err);
    uint64_t peak = check_against_oracle(t);
    /* Within 1.01 x its live peak, as ../shared/traces/README.md says of the
     * perfect page-granular allocator on the real traces (1.001-1.006). */
    cr_assert_geq(peak * PAGE, t->peak_live_bytes);
    cr_assert_leq((double)(peak * PAGE), 1.01 * (double)t->peak_live_bytes);
    /* Through the replay engine: the same peak, and the minimum capacity is
     * that peak (nothing is held that could be given back). */
    stow_config_t c;
    stow_config_default(&c);
    stow_replay_result_t r;
    cr_assert_eq(stow__replay_run(model(), t, &c, 0, 0, true, NULL, NULL, &r), STOW_OK);
    cr_assert_eq(r.peak_reserved_bytes, peak * PAGE);
    cr_assert(r.has_min_capacity);
    cr_assert_eq(r.min_capacity_bytes, peak * PAGE);
    cr_assert_eq(r.ooms, 0);
    stow_trace_free(t);
}
