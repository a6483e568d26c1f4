/*
 * tests/fuzz/fuzz_api.c: libFuzzer target for the pool API (docs/reliability.md).
 *
 * Decodes the input into a sequence of API calls on a simulated device: alloc
 * (sizes from 0 to SIZE_MAX), free (live, foreign, interior, double, NULL),
 * record_stream, empty_cache, stats/summary/JSON, peak resets, scopes, several
 * streams, manual event completion, fault injection (stow_sim_fail_nth /
 * stow_sim_fail_random on every backend call kind: a wait on one event fails
 * as a synchronize does; va_release only at teardown, where none is injected),
 * capacity changes and memory-fraction changes (stow_pool_set_memory_fraction),
 * on the classic pool (quick lists at their default depth, or a configuration
 * bit picks 0-8) or (a configuration bit) the page-mapped one (with its small
 * range and quick lists, or, a setup bit, one range for every request; with
 * physical handles of several granules where its limit lies far beyond the
 * device's memory, as when other users took it), on a
 * backend with events or (a setup bit) a single-stream one without them, and
 * (a setup bit) with every freed block scrubbed.
 *
 * The harness (pool_harness.c, shared with fuzz_step.c) keeps a shadow model of the live (ptr, block, requested) set is compared with
 * stow_pool_stats after every call; stow_pool_check must pass; a returned
 * block never overlaps a live one; a rejected call changes no book. At the end
 * everything is freed, stow_pool_destroy returns STOW_OK and the device holds
 * no byte. Any violation aborts (a libFuzzer crash).
 *
 * The device is host-backed: each block's contents are written after its
 * allocation and checked before its free, as work queued on its stream
 * (pool_harness.h), so that data lost, shared or left unscrubbed fails too.
 *
 * A second model, of the device's own work (the oracle below), checks what
 * the books cannot show: that no block is handed to a stream while another
 * stream's queued work may still use its bytes, that no granule is unmapped
 * under a live block or under work still queued, and that with scrub_on_free
 * no block is handed out before a scrub covered it.
 *
 * The backend seen by the pool is a thin wrapper around the simulated device
 * that counts injected faults (failed calls that capacity does not explain) and
 * aborts if the pool ever misuses the backend (EINVAL from the device).
 *
 * Built with clang -fsanitize=fuzzer (STOW_FUZZ, tests/check/fuzz.sh); ctest
 * also links it with tests/support/fuzz_replay_main.c (replay_fuzz_api), which
 * replays the committed corpus with gcc in every build.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stowage.h"
#include "stowage/sim.h"
#include "tests/fuzz/fuzz_check.h"
#include "tests/fuzz/pool_harness.h"

#define FZ_MAX_OPS 400

/* Totals over the process, printed at exit (docs/reliability.md figures). */
typedef struct fz_totals {
    unsigned long long inputs, ops, injected_faults;
    unsigned long long vmm_ops; /* of ops, those on page-mapped pools */
    unsigned long long event_waits; /* events the pools waited on (event_synchronize calls) */
    unsigned long long event_wait_failures; /* of those, waits that failed (injected) */
    unsigned long long allocs_again;        /* stow_pool_alloc_at calls that took the bytes */
} fz_totals_t;
static fz_totals_t fz_totals;
static int fz_verbose; /* FUZZ_API_VERBOSE=1: print each decoded call (reproducing a crash) */


static size_t fz_size(fz_in_t *in)
{
    static const size_t special[] = {
        0, 1, 511, 512, 513, 8192, FZ_MIB - 1, FZ_MIB, FZ_MIB + 1, 2 * FZ_MIB, 20 * FZ_MIB,
        20 * FZ_MIB + 1, (size_t)1 << 40, (size_t)1 << 46, ((size_t)1 << 46) + 1,
        SIZE_MAX / 2, (size_t)1 << 63, SIZE_MAX - ((size_t)1 << 30) - 1,
        SIZE_MAX - ((size_t)1 << 30), SIZE_MAX - ((size_t)1 << 30) + 1, SIZE_MAX - 4096,
        SIZE_MAX - 511, SIZE_MAX - 1, SIZE_MAX};
    uint8_t mode = fz_u8(in);
    switch (mode % 8) {
    case 0: return (size_t)fz_u8(in) * 8;
    case 1: case 2: return (size_t)fz_bytes(in, 2);
    case 3: return (size_t)(fz_bytes(in, 3) % (16 * FZ_MIB));
    case 4: return (size_t)(fz_bytes(in, 4) % (640 * FZ_MIB)); /* vmm moves from 256 MiB */
    case 5: return special[fz_u8(in) % (sizeof special / sizeof special[0])];
    case 6: return (size_t)fz_bytes(in, 8);
    default: return (size_t)fz_u8(in) * 512;
    }
}

static void fz_alloc(fz_state_t *s, fz_in_t *in)
{
    size_t size = fz_size(in);
    stow_stream_t stream = fz_streams[fz_u8(in) % FZ_STREAMS];
    (void)fz_alloc_sized(s, size, stream);
}

/* stow_pool_alloc_at at a recently freed address (a checkpoint restored), or
 * a few 512-byte steps past it, or at a live block. */
static void fz_alloc_again(fz_state_t *s, fz_in_t *in)
{
    uint8_t pick = fz_u8(in), step = fz_u8(in);
    size_t size = fz_size(in);
    stow_stream_t stream = fz_streams[fz_u8(in) % FZ_STREAMS];
    uintptr_t at;
    if (s->n_freed && step < 224)
        at = s->freed[pick % (s->n_freed < 16 ? s->n_freed : 16)] + (size_t)(step % 8) * 512;
    else if (s->n_live)
        at = s->live[pick % s->n_live].ptr;
    else
        return;
    fz_totals.allocs_again += fz_alloc_at(s, at, size, stream) >= 0;
}

static void fz_free(fz_state_t *s, fz_in_t *in)
{
    uint8_t how = fz_u8(in), pick = fz_u8(in);
    switch (how % 8) {
    default: /* a live block */
        if (s->n_live)
            (void)fz_free_live(s, pick % s->n_live);
        return;
    case 0: { /* interior pointer */
        if (!s->n_live)
            return;
        fz_live_t b = s->live[pick % s->n_live];
        size_t off = 1 + (size_t)fz_bytes(in, 3) % (b.block - 1);
        fz_bad_free(s, (void *)(b.ptr + off));
        return;
    }
    case 1: { /* double free (unless the address was handed out again) */
        if (!s->n_freed)
            return;
        uintptr_t p = s->freed[pick % (s->n_freed < 16 ? s->n_freed : 16)];
        if (fz_find(s, p) < 0)
            fz_bad_free(s, (void *)p);
        return;
    }
    case 2: { /* foreign pointer */
        uintptr_t p = (uintptr_t)fz_bytes(in, 8);
        if (p && fz_find(s, p) < 0)
            fz_bad_free(s, (void *)p);
        return;
    }
    case 3: fz_bad_free(s, NULL); return;
    }
}

static void fz_scope(fz_state_t *s, fz_in_t *in)
{
    if (fz_u8(in) % 2) {
        unsigned depth = 0;
        stow_status_t st = stow_scope_push(s->pool, &depth);
        if (s->scope_depth == STOW_SCOPE_MAX_DEPTH) {
            FUZZ_CHECK(st == STOW_EBUSY, "push at max depth returned %s", stow_strerror(st));
        } else {
            FUZZ_CHECK(st == STOW_OK && depth == s->scope_depth + 1, "push: %s depth %u",
                     stow_strerror(st), depth);
            s->scope_depth++;
        }
    } else {
        stow_scope_result_t r;
        stow_status_t st = stow_scope_pop(s->pool, &r);
        if (!s->scope_depth) {
            FUZZ_CHECK(st == STOW_EINVAL, "pop with no scope returned %s", stow_strerror(st));
        } else {
            FUZZ_CHECK(st == STOW_OK, "pop: %s", stow_strerror(st));
            s->scope_depth--;
            FUZZ_CHECK(r.allocated_bytes_peak >= r.allocated_bytes_at_push &&
                         r.allocated_bytes_peak >= r.allocated_bytes_at_pop &&
                         r.reserved_bytes_peak >= r.reserved_bytes_at_push &&
                         r.reserved_bytes_peak >= r.reserved_bytes_at_pop,
                     "scope peaks below their ends");
            FUZZ_CHECK(r.allocated_bytes_at_pop == s->alloc_bytes, "scope at_pop");
        }
    }
}

static void fz_report(void)
{
    fprintf(stderr, "fuzz_api totals: inputs=%llu api_ops=%llu (classic %llu, vmm %llu) "
                    "injected_faults=%llu event_waits=%llu (failed %llu) handle_maps=%llu "
                    "content_words_written=%llu content_words_checked=%llu allocs_again=%llu\n",
            fz_totals.inputs, fz_totals.ops, fz_totals.ops - fz_totals.vmm_ops,
            fz_totals.vmm_ops, fz_totals.injected_faults, fz_totals.event_waits,
            fz_totals.event_wait_failures, (unsigned long long)fz_handle_maps,
            (unsigned long long)fz_words_written, (unsigned long long)fz_words_checked,
            fz_totals.allocs_again);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    fz_verbose = getenv("FUZZ_API_VERBOSE") != NULL;
    atexit(fz_report);
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fz_in_t in = {data, data + size};
    static const size_t capacities[] = {0, 64 * FZ_MIB, 256 * FZ_MIB, 1024 * FZ_MIB};
    uint8_t setup = fz_u8(&in), conf = fz_u8(&in);
    fz_totals.inputs++;

    fz_device_open(setup, capacities, true);

    stow_config_t cfg;
    stow_config_default(&cfg);
    cfg.policy = STOW_POLICY_CLASSIC; /* a configuration bit below picks the page-mapped pool */
    stow_tuning_t tun; /* the measured constants, set from the same bits */
    stow_tuning_default(&tun);
    bool vmm_large_view = false; /* below: a page-mapped pool's limit beyond its device */
    if (conf & 1)
        cfg.max_split_size_bytes = (20 + (size_t)fz_u8(&in)) * FZ_MIB;
    if (conf & 2)
        for (int i = 0; i < STOW_ROUNDUP_INTERVALS; i++)
            cfg.roundup_power2_divisions[i] = 1u << (fz_u8(&in) % 5);
    if (conf & 4)
        cfg.garbage_collection_threshold = 0.5 + (fz_u8(&in) % 40) / 100.0;
    if (conf & 8)
        cfg.memory_fraction = (1 + fz_u8(&in) % 100) / 100.0;
    cfg.release_idle_on_grow = !(conf & 16);
    tun.reuse_other_streams_on_miss = (setup >> 4) & 1;
    cfg.scrub_on_free = (setup >> 7) & 1; /* a refused scrub keeps its block out of reach */
    if (conf & 128) { /* quick lists and mid ring: off, or short enough to fill and flush often */
        tun.quick_depth = fz_u8(&in) % 9;
        tun.quick_mid_slots = fz_u8(&in) % (STOW_QUICK_MID_SLOTS_MAX + 1);
    }
    if (conf & 64) { /* page-mapped segments: granules, remapping, placement */
        cfg.policy = STOW_POLICY_VMM;
        /* (release_idle_on_grow, bit 16, is the classic pool's alone.) A remap
         * synchronizes instead of waiting on events. */
        if (conf & 16)
            fz_backend.event_synchronize = NULL;
        if ((setup >> 5) & 1) /* one range for every request, no quick lists */
            tun.vmm_small_kb = 0;
        /* Learning the step (vmm_step.c): two bits that mean other things
         * too, so that it meets each of them both ways. Random sequences
         * rarely repeat long enough to be planned; the log, the signatures
         * and empty_cache's forgetting run all the same. */
        tun.vmm_learn_step = ((conf >> 3) ^ (setup >> 3)) & 1;
        /* At most 1 GiB: the "unlimited" 64 TiB device would let one request
         * map 32 M granules, which only measures the simulator's patience.
         * Without a memory fraction of its own, such a pool is created on the
         * 64 TiB device with a fraction of 1/1024 (a 64 GiB limit), and the
         * device shrinks after: other users took its memory. Handles then
         * span several granules (each at most 1/4096 of the pool's headroom:
         * 16 MiB), where a pool that sees a small device maps single ones. */
        if (!capacities[setup % 4]) {
            vmm_large_view = !(conf & 8);
            if (vmm_large_view)
                cfg.memory_fraction = 1.0 / 1024;
            else {
                fz_capacity = capacities[1 + setup % 3];
                stow_sim_set_capacity(fz_sim, fz_capacity);
            }
        }
    }
    if (conf & 32) /* mem_info fails at creation */
        stow_sim_fail_nth(fz_sim, STOW_SIM_MEM_INFO, 1, STOW_EBACKEND);

    fz_state_t *s = calloc(1, sizeof *s);
    FUZZ_CHECK(s != NULL, "host memory");
    s->rounding = (conf & 2) != 0;
    fz_or.state = s;
    stow_status_t st = stow_pool_create_tuned(&cfg, &tun, &fz_backend, &s->pool);
    if (st != STOW_OK) {
        /* A memory fraction leaving less than one 2 MiB granule is refused. */
        double limit = cfg.memory_fraction >= 1.0 ? (double)fz_capacity
                                                  : cfg.memory_fraction * (double)fz_capacity;
        FUZZ_CHECK((st == STOW_EBACKEND && (conf & 32)) ||
                     (st == STOW_EINVAL && (size_t)limit < 2 * FZ_MIB),
                 "create returned %s", stow_strerror(st));
        fz_totals.injected_faults += fz_injected;
        stow_sim_counters_t c;
        stow_sim_counters(fz_sim, &c);
        FUZZ_CHECK(c.reserved_bytes == 0, "failed create reserved memory");
        FUZZ_CHECK(stow_sim_destroy(fz_sim) == STOW_OK, "sim destroy");
        free(s);
        return 0;
    }
    stow_sim_fail_nth(fz_sim, STOW_SIM_MEM_INFO, 0, STOW_OK);
    if (vmm_large_view) {
        fz_capacity = capacities[1 + setup % 3];
        stow_sim_set_capacity(fz_sim, fz_capacity);
    }

    for (unsigned op = 0; op < FZ_MAX_OPS && in.p < in.end; op++) {
        uint8_t code = fz_u8(&in);
        const char *what = "?";
        switch (code % 16) {
        case 0: case 1: case 2: what = "alloc"; fz_alloc(s, &in); break;
        case 3: what = "alloc_at"; fz_alloc_again(s, &in); break;
        case 4: case 5: case 6: what = "free"; fz_free(s, &in); break;
        case 7: {
            what = "record_stream";
            uint8_t pick = fz_u8(&in);
            stow_stream_t stream = fz_streams[fz_u8(&in) % FZ_STREAMS];
            if (s->n_live) {
                fz_live_t *b = &s->live[pick % s->n_live];
                st = stow_record_stream(s->pool, (void *)b->ptr, stream);
                FUZZ_CHECK(st == STOW_OK || st == STOW_EHOSTMEM, "record_stream: %s",
                         stow_strerror(st));
                if (st == STOW_OK)
                    b->users |= 1u << fz_stream_index(stream);
            } else {
                FUZZ_CHECK(stow_record_stream(s->pool, (void *)(uintptr_t)0x1000, stream) ==
                             STOW_ENOTOWNED,
                         "record_stream of a foreign pointer");
            }
            break;
        }
        case 8:
            what = "empty_cache";
            st = stow_empty_cache(s->pool);
            FUZZ_CHECK(st == STOW_OK || st == STOW_EBACKEND, "empty_cache: %s", stow_strerror(st));
            break;
        case 9: {
            what = "stats";
            stow_stats_t snap = fz_stats(s);
            char buf[256];
            size_t need = (fz_u8(&in) % 2) ? stow_stats_json(&snap, buf, sizeof buf)
                                           : stow_stats_summary(&snap, buf, sizeof buf);
            FUZZ_CHECK(need > 0 && strlen(buf) < sizeof buf, "summary/json truncation");
            break;
        }
        case 10:
            what = "reset";
            if (fz_u8(&in) % 2)
                stow_stats_reset_peak(s->pool);
            else {
                stow_stats_reset_accumulated(s->pool);
                s->accumulated_reset = true;
            }
            break;
        case 11: what = "scope"; fz_scope(s, &in); break;
        case 12: {
            what = "complete_stream";
            unsigned i = fz_u8(&in) % FZ_STREAMS;
            stow_sim_complete_stream(fz_sim, fz_streams[i]);
            fz_streams_done(1u << i);
            break;
        }
        case 13: what = "inject"; fz_inject(&in); break;
        case 14: {
            uint8_t b = fz_u8(&in);
            if (b >= 240) { /* the last sixteen values: the pool's limit instead */
                what = "memory_fraction";
                fz_memory_fraction(s, fz_u8(&in) / 200.0);
                break;
            }
            what = "capacity";
            size_t cap = (size_t)(1 + b) * 4 * FZ_MIB;
            stow_sim_set_capacity(fz_sim, cap);
            fz_capacity = cap;
            break;
        }
        default: {
            what = "block_size";
            uintptr_t p = (uintptr_t)fz_bytes(&in, 8);
            size_t b = 0;
            st = stow_pool_block_size(s->pool, (void *)p, &b, NULL);
            int i = fz_find(s, p);
            FUZZ_CHECK((st == STOW_OK) == (i >= 0), "block_size of %#lx: %s", (unsigned long)p,
                     stow_strerror(st));
            break;
        }
        }
        fz_totals.ops++;
        fz_totals.vmm_ops += cfg.policy == STOW_POLICY_VMM;
        if (fz_verbose) {
            stow_stats_t v = fz_stats(s);
            fprintf(stderr, "op %u: %s -> live %u, allocated %llu, reserved %llu\n", op, what,
                    s->n_live, (unsigned long long)v.allocated_bytes[STOW_POOL_ALL].current,
                    (unsigned long long)v.reserved_bytes[STOW_POOL_ALL].current);
        }
        fz_check_books(s, what);
    }

    /* Tear down: no more faults, everything freed, nothing left on the device. */
    stow_sim_counters_t c = fz_teardown(s, !(setup & 8));
    fz_totals.injected_faults += fz_injected;
    fz_totals.event_waits += c.calls[STOW_SIM_EVENT_SYNCHRONIZE];
    fz_totals.event_wait_failures += c.failures[STOW_SIM_EVENT_SYNCHRONIZE];
    free(s);
    return 0;
}
