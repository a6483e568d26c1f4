/*
 * tests/fuzz/fuzz_step.c: libFuzzer target for a page-mapped pool that learns
 * its loop's step (vmm_learn_step, allocator/vmm_step.c; docs/reliability.md).
 *
 * fuzz_api's random sequences never repeat long enough for the pool to find a
 * step, so its plan (planned addresses, anchors, merged spans, the drop on a
 * mismatch) is never fuzzed there. Here the input decodes into a training
 * loop of bench/random_loops.py's shape, run for thousands of operations:
 * - weights that stay;
 * - slots (a size and a stream each) and a step program: each entry allocates
 *   its slot's size or, when the slot holds a block, frees it; some entries
 *   record a slot's block on another stream, complete a stream's work, or
 *   replace a slot's block (a new one, then the old one freed, as a loop
 *   replaces its input batch: a block that lives a little over a step);
 * - at a step's end, what it left is freed oldest first (but for replaced
 *   blocks), or (a bit) carried into the next step, whose program frees it:
 *   blocks that outlive their step;
 * - up to eight deviations at chosen steps and entries: an entry skipped or
 *   done twice, an extra request, empty_cache, a fault injected on a backend
 *   call, a smaller device or memory fraction, stream completions.
 *
 * Loops run up to 16,384 operations, or (a configuration bit) 131,072, which
 * the adaptive allowance needs to raise a pool that keeps remapping.
 *
 * On a simulated device of 128 MiB to 1 GiB, with or without manual events,
 * one stream or four, scrubbing or not. Checks are the harness's
 * (tests/fuzz/pool_harness.h): every call's result, no overlap with a live
 * block, the device-work oracle (no reuse or unmap under queued work, no
 * unscrubbed reuse) on every call; the books against the shadow model and
 * stow_pool_check after every deviation, after every step of a loop of fewer
 * than 1,024 steps (of a longer one, every k-th step, at most 1,024 of them,
 * and the last), and (a configuration bit, in loops of up to 16,384
 * operations) after every call; the counts after every step; a clean
 * teardown. And: a pool without the key never plans.
 *
 * FUZZ_STEP_MIN_PLANS=N (set by ctest for the corpus replay): the run fails at
 * exit unless the inputs, together, took at least N plans, so the committed
 * corpus keeps reaching the planner.
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

#define FZ_MAX_WEIGHTS 24
#define FZ_MAX_SLOTS 16
#define FZ_MAX_PROGRAM 96
#define FZ_MAX_DEVIATIONS 8
#define FZ_MAX_STEP_OPS 16384 /* operations a loop runs, at most */
/* With configuration bit 128: long enough for the adaptive allowance, which
 * raises a pool that remaps through 65,536 operations in a row. */
#define FZ_MAX_STEP_OPS_LONG 131072
/* Whole-pool checks (stow_pool_check) at step ends in a loop, at most about
 * this many (each walks the pool: up to ms under ASan in a big one); the
 * counts are checked after every step. */
#define FZ_WHOLE_CHECKS 1024
/* Map and unmap calls a loop may make before it stops (fz_over_budget). */
#define FZ_MAX_MAP_CALLS 1000000

typedef struct fz_step_totals {
    unsigned long long inputs, ops, steps, injected_faults;
    unsigned long long plans, planned_allocations, remaps, raises;
    unsigned long long cut; /* loops stopped by the map-call budget */
} fz_step_totals_t;
static fz_step_totals_t fz_totals;
static int fz_verbose; /* FUZZ_STEP_VERBOSE=1: print each step's figures */
static unsigned long long fz_min_plans;

typedef struct fz_deviation {
    unsigned step, entry;
    uint8_t action, arg;
    uint8_t inject[8]; /* a fault injection, decoded by fz_inject */
} fz_deviation_t;

typedef struct fz_loop {
    unsigned n_weights, n_slots, n_program, n_steps, n_deviations;
    size_t weight_bytes[FZ_MAX_WEIGHTS];
    size_t slot_bytes[FZ_MAX_SLOTS];
    unsigned slot_stream[FZ_MAX_SLOTS];
    uint8_t program[FZ_MAX_PROGRAM];
    bool carry;       /* what a step leaves goes into the next one */
    bool check_every; /* the books after every call, not every step */
    unsigned whole_check_stride; /* stow_pool_check after every this many steps */
    fz_deviation_t deviations[FZ_MAX_DEVIATIONS];
} fz_loop_t;

/* A slot's request: small (the small range's slabs), up to 64 MiB, up to
 * 256 MiB, or whole granules. */
static size_t fz_slot_size(uint8_t mode, uint8_t b)
{
    switch (mode % 4) {
    case 0: return ((size_t)b + 1) * 4096;
    case 1: return ((size_t)b + 1) * 256 * 1024;
    case 2: return ((size_t)b + 1) * FZ_MIB;
    default: return ((size_t)(b % 64) + 1) * 2 * FZ_MIB;
    }
}

static void fz_decode_loop(fz_in_t *in, uint8_t conf, fz_loop_t *l)
{
    memset(l, 0, sizeof *l);
    l->carry = (conf >> 2) & 1;
    l->check_every = (conf >> 3) & 1;
    l->n_weights = fz_u8(in) % (FZ_MAX_WEIGHTS + 1);
    for (unsigned i = 0; i < l->n_weights; i++) {
        uint8_t mode = fz_u8(in);
        l->weight_bytes[i] = fz_slot_size(mode, fz_u8(in));
    }
    l->n_slots = 1 + fz_u8(in) % FZ_MAX_SLOTS;
    for (unsigned i = 0; i < l->n_slots; i++) {
        uint8_t mode = fz_u8(in);
        l->slot_bytes[i] = fz_slot_size(mode, fz_u8(in));
        l->slot_stream[i] = (mode >> 2) % FZ_STREAMS;
    }
    l->n_program = 1 + fz_u8(in) % FZ_MAX_PROGRAM;
    for (unsigned k = 0; k < l->n_program; k++)
        l->program[k] = fz_u8(in);
    /* A check after every operation keeps to the short loops (each costs a walk
     * of the pool: up to 50 us under ASan, so that an input stays in seconds). */
    bool long_loop = (conf & 128) && !l->check_every;
    unsigned max_steps = (long_loop ? FZ_MAX_STEP_OPS_LONG : FZ_MAX_STEP_OPS) / l->n_program;
    l->n_steps = 1 + (unsigned)(fz_bytes(in, 2) % max_steps);
    l->whole_check_stride = 1 + l->n_steps / FZ_WHOLE_CHECKS;
    l->n_deviations = fz_u8(in) % (FZ_MAX_DEVIATIONS + 1);
    for (unsigned d = 0; d < l->n_deviations; d++) {
        fz_deviation_t *v = &l->deviations[d];
        v->step = (unsigned)(fz_bytes(in, 2) % l->n_steps);
        v->entry = fz_u8(in) % l->n_program;
        v->action = fz_u8(in);
        v->arg = fz_u8(in);
        for (unsigned i = 0; i < sizeof v->inject; i++)
            v->inject[i] = fz_u8(in);
    }
}

/* ---- running it ---- */
typedef struct fz_run {
    fz_state_t *s;
    const fz_loop_t *l;
    uintptr_t slot[FZ_MAX_SLOTS]; /* the block each slot holds, 0: none */
    uint64_t born[FZ_MAX_SLOTS];  /* the operation that allocated it */
    bool replaced[FZ_MAX_SLOTS];  /* its block came from a replacement: not a leftover */
    uint64_t op;                  /* operations so far */
} fz_run_t;

/* The books against the shadow model; with `whole`, stow_pool_check too. */
static void fz_books(fz_run_t *r, const char *after, bool whole)
{
    if (whole)
        fz_check_books(r->s, after);
    else
        fz_check_counts(r->s, after);
}

static void fz_after_op(fz_run_t *r)
{
    r->op++;
    if (r->l->check_every)
        fz_books(r, "a loop operation", true);
}

/* Toggles slot i: frees its block, or allocates its size. A block whose free
 * the device refused stays in its slot, as it stays live in the pool. */
static void fz_toggle(fz_run_t *r, unsigned i)
{
    if (r->slot[i]) {
        int at = fz_find(r->s, r->slot[i]);
        FUZZ_CHECK(at >= 0, "slot %u's block %#lx is not live", i, (unsigned long)r->slot[i]);
        if (fz_free_live(r->s, (unsigned)at))
            r->slot[i] = 0;
    } else {
        r->replaced[i] = false;
        int at = fz_alloc_sized(r->s, r->l->slot_bytes[i], fz_streams[r->l->slot_stream[i]]);
        if (at >= 0) {
            r->slot[i] = r->s->live[at].ptr;
            r->born[i] = r->op;
        }
    }
    fz_after_op(r);
}

/* Replaces slot i's block: a new one first, then the old one freed, as a
 * training loop replaces its input batch. The new block is no leftover of its
 * step: repeated every step, each lives a little more than a step (the
 * planner's cycle of two steps). */
static void fz_replace(fz_run_t *r, unsigned i)
{
    uintptr_t old = r->slot[i];
    int at = fz_alloc_sized(r->s, r->l->slot_bytes[i], fz_streams[r->l->slot_stream[i]]);
    if (at < 0) {
        fz_after_op(r);
        return; /* refused: the old block stays in its slot */
    }
    r->slot[i] = r->s->live[at].ptr;
    r->born[i] = r->op;
    r->replaced[i] = true;
    fz_after_op(r);
    if (old) {
        int old_at = fz_find(r->s, old);
        FUZZ_CHECK(old_at >= 0, "slot %u's old block %#lx is not live", i, (unsigned long)old);
        (void)fz_free_live(r->s, (unsigned)old_at); /* a refused free leaves it to the teardown */
        fz_after_op(r);
    }
}

/* Entry e of the program. Top bit clear: a toggle of slot e & 15. Set: with
 * 0x40 a record_stream of the slot's block on stream (e >> 4) & 3; else with
 * 0x20 a replacement of the slot's block; else stream e & 3's work completes. */
static void fz_entry(fz_run_t *r, uint8_t e)
{
    unsigned i = (e & 0x0f) % r->l->n_slots;
    if (!(e & 0x80)) {
        fz_toggle(r, i);
        return;
    }
    if (e & 0x40) {
        unsigned stream = (e >> 4) & 3;
        if (r->slot[i]) {
            int at = fz_find(r->s, r->slot[i]);
            FUZZ_CHECK(at >= 0, "slot %u's block is not live", i);
            stow_status_t st =
                stow_record_stream(r->s->pool, (void *)r->slot[i], fz_streams[stream]);
            FUZZ_CHECK(st == STOW_OK || st == STOW_EHOSTMEM, "record_stream: %s",
                       stow_strerror(st));
            if (st == STOW_OK)
                r->s->live[at].users |= 1u << stream;
        }
    } else if (e & 0x20) {
        fz_replace(r, i);
        return;
    } else {
        stow_sim_complete_stream(fz_sim, fz_streams[e & 3]);
        fz_streams_done(1u << (e & 3));
    }
    fz_after_op(r);
}

/* What a step left, oldest first (a failed free leaves its block in place),
 * but for the blocks of replacements, which the next replacement frees. */
static void fz_free_leftovers(fz_run_t *r)
{
    for (;;) {
        unsigned oldest = FZ_MAX_SLOTS;
        for (unsigned i = 0; i < r->l->n_slots; i++)
            if (r->slot[i] && !r->replaced[i] &&
                (oldest == FZ_MAX_SLOTS || r->born[i] < r->born[oldest]))
                oldest = i;
        if (oldest == FZ_MAX_SLOTS)
            return;
        int at = fz_find(r->s, r->slot[oldest]);
        FUZZ_CHECK(at >= 0, "slot %u's block is not live", oldest);
        r->slot[oldest] = 0; /* freed, or left live for the teardown */
        (void)fz_free_live(r->s, (unsigned)at);
        fz_after_op(r);
    }
}

/* A deviation from the step; returns whether the entry itself is skipped. */
static bool fz_deviate(fz_run_t *r, const fz_deviation_t *v, uint8_t entry)
{
    bool skip = false;
    switch (v->action % 10) {
    case 0: skip = true; break;             /* an entry missed */
    case 1: fz_entry(r, entry); break;      /* an entry done twice */
    case 2: {                               /* a request the step never makes */
        int at = fz_alloc_sized(r->s, fz_slot_size(v->arg, v->inject[0]),
                                fz_streams[v->arg >> 6 & 3]);
        if (at >= 0 && (v->inject[1] & 1)) /* and, half the time, gone at once */
            (void)fz_free_live(r->s, (unsigned)at);
        break;
    }
    case 3: {
        stow_status_t st = stow_empty_cache(r->s->pool);
        FUZZ_CHECK(st == STOW_OK || st == STOW_EBACKEND, "empty_cache: %s", stow_strerror(st));
        break;
    }
    case 4: case 5: { /* a fault on some kind of backend call, from here on */
        fz_in_t in = {v->inject, v->inject + sizeof v->inject};
        fz_inject(&in);
        break;
    }
    case 6: { /* a smaller (or larger) device */
        size_t cap = ((size_t)v->arg + 32) * 4 * FZ_MIB;
        stow_sim_set_capacity(fz_sim, cap);
        fz_capacity = cap;
        break;
    }
    case 7: fz_memory_fraction(r->s, (v->arg % 100 + 1) / 100.0); break;
    case 8: /* every stream's work done */
        for (unsigned u = 0; u < FZ_STREAMS; u++)
            stow_sim_complete_stream(fz_sim, fz_streams[u]);
        fz_streams_done((1u << FZ_STREAMS) - 1);
        break;
    default: stow_stats_reset_peak(r->s->pool); break;
    }
    fz_books(r, "a deviation", true);
    return skip;
}

static void fz_run_step(fz_run_t *r, unsigned step)
{
    const fz_loop_t *l = r->l;
    for (unsigned k = 0; k < l->n_program; k++) {
        bool skip = false;
        for (unsigned d = 0; d < l->n_deviations; d++)
            if (l->deviations[d].step == step && l->deviations[d].entry == k)
                skip |= fz_deviate(r, &l->deviations[d], l->program[k]);
        if (!skip)
            fz_entry(r, l->program[k]);
    }
    if (!l->carry)
        fz_free_leftovers(r);
    fz_books(r, "a step", step % l->whole_check_stride == 0 || step + 1 == l->n_steps);
}

static void fz_report(void)
{
    fprintf(stderr,
            "fuzz_step totals: inputs=%llu api_ops=%llu steps=%llu injected_faults=%llu "
            "step_plans=%llu planned_allocations=%llu map_calls=%llu allowance_raises=%llu "
            "cut=%llu handle_maps=%llu\n",
            fz_totals.inputs, fz_totals.ops, fz_totals.steps, fz_totals.injected_faults,
            fz_totals.plans, fz_totals.planned_allocations, fz_totals.remaps, fz_totals.raises,
            fz_totals.cut, (unsigned long long)fz_handle_maps);
    if (fz_totals.plans < fz_min_plans) {
        fprintf(stderr, "fuzz_step: %llu step plans, fewer than FUZZ_STEP_MIN_PLANS=%llu\n",
                fz_totals.plans, fz_min_plans);
        _exit(1);
    }
}

/* Whether the loop has made FZ_MAX_MAP_CALLS map and unmap calls: it stops at
 * that step's end. A loop of large blocks that remaps at every operation
 * would otherwise make millions (about 2 us each under ASan). */
static bool fz_over_budget(void)
{
    stow_sim_counters_t c;
    stow_sim_counters(fz_sim, &c);
    if (c.calls[STOW_SIM_MAP] + c.calls[STOW_SIM_UNMAP] < FZ_MAX_MAP_CALLS)
        return false;
    fz_totals.cut++;
    return true;
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_verbose = getenv("FUZZ_STEP_VERBOSE") != NULL;
    const char *min = getenv("FUZZ_STEP_MIN_PLANS");
    fz_min_plans = min ? strtoull(min, NULL, 10) : 0;
    atexit(fz_report);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in_t in = {data, data + size};
    static const size_t capacities[] = {256 * FZ_MIB, 512 * FZ_MIB, 1024 * FZ_MIB, 128 * FZ_MIB};
    uint8_t setup = fz_u8(&in), conf = fz_u8(&in);
    fz_totals.inputs++;

    /* Fake addresses, no block contents: these loops remap up to a million
     * times, and with real mappings (a host-backed device) the corpus replay
     * (build/replay_fuzz_step tests/fuzz/corpus/step) takes 40 s of CPU time
     * instead of 1.3 (17 with contents in loops of at most 16,384 operations).
     * tests/stress/stress_integrity.c checks a learned step's data. */
    fz_device_open(setup, capacities, false);

    stow_config_t cfg;
    stow_config_default(&cfg);
    cfg.policy = STOW_POLICY_VMM;
    stow_tuning_t tun; /* the measured constants, set from the same bits */
    stow_tuning_default(&tun);
    /* Learning the step, but one input in four runs without it: such a pool
     * never plans. */
    tun.vmm_learn_step = (conf & 3) != 3;
    tun.reuse_other_streams_on_miss = (setup >> 4) & 1;
    cfg.scrub_on_free = (setup >> 7) & 1;
    if ((setup >> 5) & 1) /* one range for every request, no quick lists */
        tun.vmm_small_kb = 0;
    if (conf & 16) /* a remap synchronizes instead of waiting on events */
        fz_backend.event_synchronize = NULL;
    if (conf & 32)
        cfg.memory_fraction = (40 + fz_u8(&in) % 61) / 100.0;
    if (conf & 64) {
        tun.quick_depth = fz_u8(&in) % 9;
        tun.quick_mid_slots = fz_u8(&in) % (STOW_QUICK_MID_SLOTS_MAX + 1);
    }
    fz_loop_t loop;
    fz_decode_loop(&in, conf, &loop);

    fz_state_t *s = calloc(1, sizeof *s);
    FUZZ_CHECK(s != NULL, "host memory");
    fz_or.state = s;
    stow_status_t st = stow_pool_create_tuned(&cfg, &tun, &fz_backend, &s->pool);
    FUZZ_CHECK(st == STOW_OK, "create returned %s", stow_strerror(st));

    fz_run_t r = {.s = s, .l = &loop};
    for (unsigned i = 0; i < loop.n_weights; i++) {
        (void)fz_alloc_sized(s, loop.weight_bytes[i], fz_streams[0]);
        fz_after_op(&r);
    }
    unsigned step = 0;
    for (; step < loop.n_steps && !fz_over_budget(); step++) {
        fz_run_step(&r, step);
        if (fz_verbose) {
            stow_stats_t v = fz_stats(s);
            fprintf(stderr, "step %u: live %u, allocated %llu, reserved %llu, plans %llu, "
                            "planned %llu\n",
                    step, s->n_live, (unsigned long long)v.allocated_bytes[STOW_POOL_ALL].current,
                    (unsigned long long)v.reserved_bytes[STOW_POOL_ALL].current,
                    (unsigned long long)v.num_vmm_step_plans,
                    (unsigned long long)v.num_vmm_planned_allocations);
        }
    }
    stow_stats_t end = fz_stats(s);
    FUZZ_CHECK(tun.vmm_learn_step || (end.num_vmm_step_plans == 0 &&
                                      end.num_vmm_planned_allocations == 0),
               "a pool without vmm_learn_step planned %llu times",
               (unsigned long long)end.num_vmm_step_plans);
    FUZZ_CHECK(end.num_vmm_planned_allocations <= end.allocation[STOW_POOL_ALL].allocated,
               "more planned allocations (%llu) than allocations (%llu)",
               (unsigned long long)end.num_vmm_planned_allocations,
               (unsigned long long)end.allocation[STOW_POOL_ALL].allocated);

    stow_sim_counters_t c = fz_teardown(s, !(setup & 8));
    fz_totals.ops += r.op;
    fz_totals.steps += step;
    fz_totals.injected_faults += fz_injected;
    fz_totals.plans += end.num_vmm_step_plans;
    fz_totals.planned_allocations += end.num_vmm_planned_allocations;
    fz_totals.remaps += c.calls[STOW_SIM_MAP];
    fz_totals.raises += end.num_vmm_allowance_raises;
    free(s);
    return 0;
}
