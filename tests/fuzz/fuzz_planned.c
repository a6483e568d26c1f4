/*
 * tests/fuzz/fuzz_planned.c: libFuzzer target for the planned layer
 * (planned_steps; allocator/planned_*.c, docs/planned.md,
 * docs/reliability.md).
 *
 * The input decodes into a program with step markers, of the shape of a
 * training loop or of inference calls, run for up to thousands of steps on a
 * classic or a page-mapped pool:
 * - a pool that once held more (a first batch, one input in two); weights
 *   that stay; one to three keys, each with slots (a size and a
 *   stream each: up to four streams) and a step program over them (an entry
 *   allocates its slot's size, or frees the slot's block when it holds one;
 *   some entries record a slot's block on another stream, replace it, or
 *   complete a stream's work); a schedule of keys (alternating keys), and
 *   steps ended by the next marker or by stow_pool_step(NULL);
 * - random mutations, at a rate the input sets, drawn step by step from a
 *   generator the input seeds: a request inserted (a size no step makes), an
 *   entry deleted, done twice, or late (its effect postponed by some entries,
 *   into the next step too), a size a little larger, empty_cache, a fault
 *   injected on a backend call, a smaller device, a marker with a key that
 *   comes once, a step that ends early.
 *
 * Checks (tests/fuzz/pool_harness.h): every call's result and no block
 * overlapping a live one, in the arena or not; the device-work oracle (no
 * block, planned slots included, handed to a stream while another stream's
 * queued work may use its bytes; no unmap under live blocks or queued work);
 * the books against the shadow model after every call, and stow_pool_check
 * (which walks the planned slots: inside the arena, never overlapping, the
 * layer's counts) after every call in one input in two and after every step
 * in the others; a clean teardown. And: a pool without planned_steps or
 * planned_auto plans nothing; hits + fallbacks <= allocations. Inputs with
 * planned_auto run the same programs without markers (the pool finds the
 * step by itself).
 *
 * FUZZ_PLANNED_MIN_HITS=N (set by ctest for the corpus replay): the run fails
 * at exit unless the inputs, together, served at least N allocations from an
 * arena, so the committed corpus keeps reaching the layer.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stowage.h"
#include "stowage/sim.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/pool_harness.h"

#define FZ_MAX_WEIGHTS 8
#define FZ_MAX_SLOTS 12
#define FZ_MAX_PROGRAM 48
#define FZ_MAX_KEYS 3
#define FZ_MAX_SCHEDULE 8
#define FZ_MAX_OPS 60000     /* operations of one input, at most */
#define FZ_MAX_DELAYED 8     /* entries postponed at once */

typedef struct fz_totals {
    unsigned long long inputs, ops, steps, hits, fallbacks, plans, realignments, injected;
} fz_totals_t;
static fz_totals_t fz_totals;
static unsigned long long fz_min_hits;
static int fz_verbose; /* FUZZ_PLANNED_VERBOSE=1: each call (reproducing a crash) */

typedef struct fz_key {
    unsigned n_slots, n_program;
    size_t slot_bytes[FZ_MAX_SLOTS];
    unsigned slot_stream[FZ_MAX_SLOTS];
    uint8_t program[FZ_MAX_PROGRAM];
    uintptr_t slot[FZ_MAX_SLOTS]; /* the block each slot holds, 0: none */
} fz_key_t;

typedef struct fz_delayed {
    unsigned key;
    uint8_t entry;
    unsigned after; /* entries to go before it runs */
} fz_delayed_t;

typedef struct fz_run {
    fz_state_t *s;
    fz_key_t keys[FZ_MAX_KEYS];
    unsigned n_keys, n_schedule;
    uint8_t schedule[FZ_MAX_SCHEDULE]; /* key of each step, in turn; bit 7: end with NULL */
    unsigned n_steps, rate;            /* mutations per 256 entries */
    bool check_every;
    bool no_markers;                   /* planned_auto: the schedule's markers are left out */
    uint64_t rng;
    fz_delayed_t delayed[FZ_MAX_DELAYED];
    unsigned n_delayed;
    uint64_t ops, markers;
    uint8_t inject[8];
} fz_run_t;

static uint64_t fz_next(fz_run_t *r)
{
    uint64_t x = r->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return r->rng = x;
}

/* A slot's request: small (quick lists, the small range), medium, large,
 * or whole granules. */
static size_t fz_slot_size(uint8_t mode, uint8_t b)
{
    switch (mode % 4) {
    case 0: return (size_t)b * 96 + 1;
    case 1: return ((size_t)b + 1) * 64 * 1024;
    case 2: return ((size_t)b + 1) * FZ_MIB / 4;
    default: return ((size_t)(b % 32) + 1) * 2 * FZ_MIB;
    }
}

static void fz_after_op(fz_run_t *r)
{
    r->ops++;
    if (r->check_every)
        fz_check_books(r->s, "an operation");
    else
        fz_check_counts(r->s, "an operation");
}

static void fz_toggle(fz_run_t *r, fz_key_t *k, unsigned i, size_t grow)
{
    if (fz_verbose)
        fprintf(stderr, "  %s slot %u (%zu bytes, stream %u)%s\n", k->slot[i] ? "free" : "alloc",
                i, k->slot_bytes[i] + grow, k->slot_stream[i],
                k->slot[i] ? "" : "");
    if (k->slot[i]) {
        int at = fz_find(r->s, k->slot[i]);
        FUZZ_CHECK(at >= 0, "slot %u's block is not live", i);
        if (fz_free_live(r->s, (unsigned)at))
            k->slot[i] = 0;
    } else {
        unsigned long long hits = fz_verbose ? fz_stats(r->s).num_planned_hits : 0;
        int at = fz_alloc_sized(r->s, k->slot_bytes[i] + grow, fz_streams[k->slot_stream[i]]);
        if (at >= 0)
            k->slot[i] = r->s->live[at].ptr;
        if (fz_verbose && at >= 0)
            fprintf(stderr, "    -> %#lx%s\n", (unsigned long)k->slot[i],
                    fz_stats(r->s).num_planned_hits > hits ? " (arena)" : "");
    }
    fz_after_op(r);
}

/* Entry e of a key's program. Top bit clear: a toggle of slot e & 15. Set:
 * with 0x40 a record_stream of the slot's block on stream (e >> 4) & 3; with
 * 0x20 a replacement (a new block, then the old one freed); else stream
 * e & 3's work completes. */
static void fz_entry(fz_run_t *r, fz_key_t *k, uint8_t e, size_t grow)
{
    unsigned i = (e & 0x0f) % k->n_slots;
    if (!(e & 0x80)) {
        fz_toggle(r, k, i, grow);
        return;
    }
    if (e & 0x40) {
        unsigned stream = (e >> 4) & 3;
        if (k->slot[i]) {
            int at = fz_find(r->s, k->slot[i]);
            FUZZ_CHECK(at >= 0, "slot %u's block is not live", i);
            stow_status_t st = stow_record_stream(r->s->pool, (void *)k->slot[i],
                                                  fz_streams[stream]);
            FUZZ_CHECK(st == STOW_OK || st == STOW_EHOSTMEM, "record_stream: %s",
                       stow_strerror(st));
            if (st == STOW_OK)
                r->s->live[at].users |= 1u << stream;
        }
    } else if (e & 0x20) {
        uintptr_t old = k->slot[i];
        int at = fz_alloc_sized(r->s, k->slot_bytes[i] + grow, fz_streams[k->slot_stream[i]]);
        if (at >= 0) {
            k->slot[i] = r->s->live[at].ptr;
            if (old) {
                fz_after_op(r);
                int old_at = fz_find(r->s, old);
                FUZZ_CHECK(old_at >= 0, "slot %u's old block is not live", i);
                (void)fz_free_live(r->s, (unsigned)old_at);
            }
        }
    } else {
        stow_sim_complete_stream(fz_sim, fz_streams[e & 3]);
        fz_streams_done(1u << (e & 3));
    }
    fz_after_op(r);
}

static void fz_run_delayed(fz_run_t *r)
{
    for (unsigned d = 0; d < r->n_delayed;) {
        if (r->delayed[d].after-- == 0) {
            fz_delayed_t x = r->delayed[d];
            r->delayed[d] = r->delayed[--r->n_delayed];
            fz_entry(r, &r->keys[x.key], x.entry, 0);
        } else {
            d++;
        }
    }
}

/* After a marker (where plans are taken and the arena changes hands):
 * stow_pool_check when checking every call, every 16th marker, or when the
 * pool took a plan or changed its arena; the counts otherwise. */
static void fz_marker(fz_run_t *r, const char *key)
{
    stow_stats_t before = fz_stats(r->s);
    if (fz_verbose) {
        stow_stats_t v = fz_stats(r->s);
        fprintf(stderr, "marker %s (hits %llu, fallbacks %llu, plans %llu, arena %llu)\n",
                key ? key : "(end)", (unsigned long long)v.num_planned_hits,
                (unsigned long long)v.num_planned_fallbacks, (unsigned long long)v.num_plans,
                (unsigned long long)v.arena_bytes);
    }
    stow_status_t st = stow_pool_step(r->s->pool, key);
    FUZZ_CHECK(st == STOW_OK, "stow_pool_step: %s", stow_strerror(st));
    stow_stats_t after = fz_stats(r->s);
    if (r->check_every || ++r->markers % 16 == 0 || after.num_plans != before.num_plans ||
        after.arena_bytes != before.arena_bytes || after.num_plan_trims != before.num_plan_trims)
        fz_check_books(r->s, "a marker");
    else
        fz_check_counts(r->s, "a marker");
}

/* One mutation before entry `entry` of key ki; returns whether the entry is
 * deleted. */
static bool fz_mutate(fz_run_t *r, unsigned ki, uint8_t entry, size_t *grow)
{
    uint64_t x = fz_next(r);
    if (fz_verbose)
        fprintf(stderr, "  mutation %u\n", (unsigned)(x % 11));
    switch (x % 11) {
    case 0: return true; /* deleted */
    case 1: fz_entry(r, &r->keys[ki], entry, 0); return false; /* done twice */
    case 2: case 3:                                          /* late */
        if (r->n_delayed < FZ_MAX_DELAYED) {
            r->delayed[r->n_delayed++] = (fz_delayed_t){ki, entry, (unsigned)(x >> 8) % 40};
            return true;
        }
        return false;
    case 4: { /* an inserted request, freed at once or left to the teardown */
        int at = fz_alloc_sized(r->s, fz_slot_size((uint8_t)(x >> 8), (uint8_t)(x >> 16)),
                                fz_streams[(x >> 24) & 3]);
        if (at >= 0 && ((x >> 26) & 3))
            (void)fz_free_live(r->s, (unsigned)at);
        fz_after_op(r);
        return false;
    }
    case 5: *grow = 512 * (1 + (x >> 8) % 64); return false; /* a larger size */
    case 6: {
        stow_status_t st = stow_empty_cache(r->s->pool);
        FUZZ_CHECK(st == STOW_OK || st == STOW_EBACKEND, "empty_cache: %s", stow_strerror(st));
        fz_check_books(r->s, "empty_cache");
        return false;
    }
    case 7: { /* a fault on some kind of backend call, from here on */
        uint8_t inj[8];
        for (unsigned i = 0; i < 8; i++)
            inj[i] = (uint8_t)(r->inject[i] ^ (x >> (8 * (i % 8))));
        fz_in_t in = {inj, inj + sizeof inj};
        fz_inject(&in);
        return false;
    }
    case 8: { /* a smaller device */
        size_t cap = ((size_t)((x >> 8) % 256) + 48) * 4 * FZ_MIB;
        stow_sim_set_capacity(fz_sim, cap);
        fz_capacity = cap;
        return false;
    }
    case 9: { /* a key that comes once (a cache of keys to churn) */
        char key[24];
        snprintf(key, sizeof key, "once-%llu", (unsigned long long)(x >> 8) % 1000);
        fz_marker(r, key);
        return false;
    }
    default: /* every stream's work done */
        for (unsigned u = 0; u < FZ_STREAMS; u++)
            stow_sim_complete_stream(fz_sim, fz_streams[u]);
        fz_streams_done((1u << FZ_STREAMS) - 1);
        return false;
    }
}

static const char *const fz_key_names[FZ_MAX_KEYS] = {"train", "eval/len:128", "infer-bs8"};

static void fz_run_step(fz_run_t *r, unsigned step)
{
    uint8_t sched = r->schedule[step % r->n_schedule];
    unsigned ki = (sched & 0x7f) % r->n_keys;
    fz_key_t *k = &r->keys[ki];
    if (!r->no_markers)
        fz_marker(r, fz_key_names[ki]);
    unsigned stop = k->n_program;
    if (r->rate && fz_next(r) % 256 < r->rate / 4)
        stop = (unsigned)(fz_next(r) % k->n_program); /* a step that ends early */
    for (unsigned e = 0; e < stop && r->ops < FZ_MAX_OPS; e++) {
        size_t grow = 0;
        bool deleted = false;
        if (r->rate && fz_next(r) % 256 < r->rate)
            deleted = fz_mutate(r, ki, k->program[e], &grow);
        if (!deleted)
            fz_entry(r, k, k->program[e], grow);
        fz_run_delayed(r);
    }
    if ((sched & 0x80) && !r->no_markers)
        fz_marker(r, NULL);
    else if (r->no_markers && !r->check_every && step % 16 == 15)
        fz_check_books(r->s, "a step without markers");
}

static void fz_decode_key(fz_in_t *in, fz_key_t *k)
{
    memset(k, 0, sizeof *k);
    k->n_slots = 1 + fz_u8(in) % FZ_MAX_SLOTS;
    for (unsigned i = 0; i < k->n_slots; i++) {
        uint8_t mode = fz_u8(in);
        k->slot_bytes[i] = fz_slot_size(mode, fz_u8(in));
        k->slot_stream[i] = (mode >> 5) % FZ_STREAMS == 3 ? (mode >> 2) % FZ_STREAMS : 0;
    }
    k->n_program = 1 + fz_u8(in) % FZ_MAX_PROGRAM;
    for (unsigned e = 0; e < k->n_program; e++)
        k->program[e] = fz_u8(in);
}

static void fz_report(void)
{
    fprintf(stderr,
            "fuzz_planned totals: inputs=%llu api_ops=%llu steps=%llu planned_hits=%llu "
            "fallbacks=%llu plans=%llu realignments=%llu injected_faults=%llu\n",
            fz_totals.inputs, fz_totals.ops, fz_totals.steps, fz_totals.hits, fz_totals.fallbacks,
            fz_totals.plans, fz_totals.realignments, fz_totals.injected);
    if (fz_totals.hits < fz_min_hits) {
        fprintf(stderr, "fuzz_planned: %llu planned hits, fewer than FUZZ_PLANNED_MIN_HITS=%llu\n",
                fz_totals.hits, fz_min_hits);
        _exit(1);
    }
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_verbose = getenv("FUZZ_PLANNED_VERBOSE") != NULL;
    const char *min = getenv("FUZZ_PLANNED_MIN_HITS");
    fz_min_hits = min ? strtoull(min, NULL, 10) : 0;
    atexit(fz_report);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in_t in = {data, data + size};
    static const size_t capacities[] = {512 * FZ_MIB, 1024 * FZ_MIB, 0, 256 * FZ_MIB};
    uint8_t setup = fz_u8(&in), conf = fz_u8(&in);
    fz_totals.inputs++;
    /* Host-backed: every block's contents are checked, so that a planned
     * slot that overlaps a live block loses data and fails the input. */
    fz_device_open(setup, capacities, true);

    stow_config_t cfg;
    stow_config_default(&cfg);
    stow_tuning_t tun; /* the measured constants, set from the same bits */
    stow_tuning_default(&tun);
    /* The layer, but one input in eight runs without it (such a pool never
     * plans) and one in eight finds its steps without markers (planned_auto:
     * the schedule's markers are left out; a mutation's marker ends it). */
    cfg.planned_steps = (conf & 7) < 6;
    tun.planned_auto = (conf & 7) == 6;
    cfg.planned_async = false; /* the same run every time */
    cfg.policy = (conf & 8) ? STOW_POLICY_VMM : STOW_POLICY_CLASSIC;
    tun.planned_warmup_steps = (conf >> 4) & 3;
    tun.planned_headroom = (conf & 64) ? 0.25 : 0.0;
    cfg.scrub_on_free = (setup >> 7) & 1;
    tun.reuse_other_streams_on_miss = (setup >> 4) & 1;
    if ((setup >> 5) & 1)
        tun.vmm_small_kb = 0;

    fz_run_t *r = calloc(1, sizeof *r);
    fz_state_t *s = calloc(1, sizeof *s);
    FUZZ_CHECK(r && s, "host memory");
    r->s = s;
    r->check_every = conf & 128;
    r->no_markers = tun.planned_auto;
    r->n_keys = 1 + fz_u8(&in) % FZ_MAX_KEYS;
    for (unsigned k = 0; k < r->n_keys; k++)
        fz_decode_key(&in, &r->keys[k]);
    r->n_schedule = 1 + fz_u8(&in) % FZ_MAX_SCHEDULE;
    for (unsigned i = 0; i < r->n_schedule; i++)
        r->schedule[i] = fz_u8(&in);
    r->rate = fz_u8(&in) % 64;
    r->rng = fz_bytes(&in, 8) | 1;
    for (unsigned i = 0; i < 8; i++)
        r->inject[i] = fz_u8(&in);
    unsigned per_step = 0;
    for (unsigned k = 0; k < r->n_keys; k++)
        per_step += r->keys[k].n_program;
    unsigned max_steps = (r->check_every ? 4000u : FZ_MAX_OPS) / (per_step / r->n_keys + 1);
    r->n_steps = 1 + (unsigned)(fz_bytes(&in, 2) % (max_steps ? max_steps : 1));
    unsigned n_weights = fz_u8(&in) % (FZ_MAX_WEIGHTS + 1);

    fz_or.state = s;
    stow_status_t st = stow_pool_create_tuned(&cfg, &tun, &fz_backend, &s->pool);
    FUZZ_CHECK(st == STOW_OK, "create returned %s", stow_strerror(st));
    /* One input in two starts from a pool that once held more (a first batch,
     * given back): the budget of what an arena may cost (docs/planned.md)
     * then admits plans the steps alone would not pay for, and its dissolving
     * comes later, or not at all. The size comes from the generator's seed,
     * so the committed inputs keep their meaning. */
    if (r->rng & 2) {
        int at = fz_alloc_sized(s, (size_t)(256 * FZ_MIB) << ((r->rng >> 3) % 4), fz_streams[0]);
        if (at >= 0)
            (void)fz_free_live(s, (unsigned)at);
        st = stow_empty_cache(s->pool);
        FUZZ_CHECK(st == STOW_OK || st == STOW_EBACKEND, "empty_cache: %s", stow_strerror(st));
        fz_check_books(s, "the first batch");
    }
    for (unsigned i = 0; i < n_weights; i++) {
        uint8_t mode = fz_u8(&in);
        (void)fz_alloc_sized(s, fz_slot_size(mode, fz_u8(&in)), fz_streams[0]);
        fz_after_op(r);
    }
    unsigned step = 0;
    for (; step < r->n_steps && r->ops < FZ_MAX_OPS; step++)
        fz_run_step(r, step);
    while (r->n_delayed)
        fz_run_delayed(r);
    fz_check_books(s, "the last step");
    stow_stats_t end = fz_stats(s);
    FUZZ_CHECK(cfg.planned_steps || tun.planned_auto ||
                   (end.num_plans == 0 && end.num_planned_hits == 0 && end.arena_bytes == 0),
               "a pool without planned_steps planned");
    FUZZ_CHECK(end.num_planned_hits + end.num_planned_fallbacks <=
                   end.allocation[STOW_POOL_ALL].allocated,
               "more planned hits and fallbacks than allocations: %llu %llu %llu", (unsigned long long)end.num_planned_hits, (unsigned long long)end.num_planned_fallbacks, (unsigned long long)end.allocation[STOW_POOL_ALL].allocated);
    (void)fz_teardown(s, !(setup & 8));
    fz_totals.ops += r->ops;
    fz_totals.steps += step;
    fz_totals.hits += end.num_planned_hits;
    fz_totals.fallbacks += end.num_planned_fallbacks;
    fz_totals.plans += end.num_plans;
    fz_totals.realignments += end.num_planned_realignments;
    fz_totals.injected += fz_injected;
    free(s);
    free(r);
    return 0;
}
