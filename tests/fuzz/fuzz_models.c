/*
 * tests/fuzz/fuzz_models.c: libFuzzer target for the replay policies that run
 * on the simulated device (classic, vmm, pytorch, pytorch-expandable, naive,
 * and the ideal-remap reference),
 * driven through their replay-engine vtables as `stowage replay` drives them,
 * on any trace the parser accepts (docs/reliability.md).
 *
 * `stowage replay` runs users' traces: sizes up to 2^62 bytes, several
 * streams, a device of 2 MiB. fuzz_trace checks the parser; this
 * target checks what runs the parsed trace, which unit tests and the shared
 * traces alone reach only in part (a 2^62-byte request, for one:
 * corpus/models/regress_2e62_*).
 *
 * Input: byte 0 picks the device capacity, byte 1 the settings and measured
 * constants (a string from the table below, what --conf and --tuning give
 * together), the rest is the trace: its text when byte 1's
 * top bit is clear, else three bytes per event decoded into a trace that is
 * always valid (fm_decode; mutated text mostly fails to parse, and the parser
 * has fuzz_trace). For each policy:
 * create, replay every event, free what is live, replay again (the warm cache
 * of a timed pass), then destroy with the second pass's leftovers live.
 * Checked:
 *   - alloc returns STOW_OK, STOW_ENOMEM or STOW_EOVERFLOW, nothing else;
 *   - no two live blocks overlap (device policies hand out device addresses);
 *   - classic and vmm: after each pass, the statistics count exactly the live
 *     requests (allocation count and requested bytes), and reserved >=
 *     allocated (the pool's own checks run inside, STOW_DEBUG); the pytorch
 *     models: stow__ptm_check holds and the model's requested bytes are the
 *     live ones;
 *   - ideal-remap: after each pass, its live pages (map minus unmap calls)
 *     are exactly the 2 MiB pages that the live blocks, rounded up to 512
 *     bytes, overlap;
 *   - peak reserved >= the trace's peak live bytes when nothing failed, and
 *     never above a set capacity;
 *   - no leak once destroyed (LeakSanitizer).
 * Devices stay small enough to replay in milliseconds (PAGED_MAX_REQUEST).
 */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "replay/pytorch_model.h"
#include "replay/replay_engine.h"
#include "stowage.h"
#include "stowage/trace.h"
#include "tests/fuzz/fuzz_check.h"

#define STEP STOW_REPLAY_CAPACITY_STEP_BYTES
/* The page-mapped policies (vmm, pytorch-expandable) map a request one page
 * per call: a 64 GiB request is 32,768 granules. With no capacity limit they
 * get a device of MAX_CAPACITY bytes instead when a request lies in
 * (PAGED_MAX_REQUEST, PAGED_HOPELESS_REQUEST]: that keeps an input in
 * milliseconds, where the pool's logic is, not its scale. Larger requests
 * exceed every page-mapped range (and the simulated device's 64 TiB) and fail
 * at once, so they stay unlimited: that is the path a 2^62-byte request
 * crashed on. The other policies reserve one segment per request whatever
 * its size and always run unlimited in that mode. */
#define PAGED_MAX_REQUEST ((uint64_t)1 << 30)
#define PAGED_HOPELESS_REQUEST ((uint64_t)1 << 50)
#define MAX_CAPACITY ((uint64_t)4 << 30)

static const char *const fm_confs[] = {
    "",
    "max_split_size_mb:20",
    "roundup_power2_divisions:4",
    "garbage_collection_threshold:0.6,per_process_memory_fraction:0.8",
    "max_split_size_mb:64,max_non_split_rounding_mb:40,roundup_power2_divisions:8",
    "release_idle_on_grow:false,quick_depth:0,reuse_other_streams_on_miss:true",
    "vmm_small_kb:0,vmm_slack:0.02",
    "vmm_small_kb:1024,vmm_slack:0,vmm_slack_max:0,quick_mid_slots:0",
};
#define FM_CONFS (sizeof fm_confs / sizeof fm_confs[0])

static const stow_replay_policy_t *const fm_policies[] = {
    &stow__replay_policy_classic, &stow__replay_policy_vmm, &stow__replay_policy_pytorch,
    &stow__replay_policy_pytorch_expandable, &stow__replay_policy_naive,
    &stow__replay_policy_ideal_remap,
};
#define FM_POLICIES (sizeof fm_policies / sizeof fm_policies[0])

static unsigned long long fm_inputs, fm_traces, fm_events, fm_ooms;

static void fm_report(void)
{
    fprintf(stderr, "fuzz_models totals: inputs=%llu traces=%llu events=%llu ooms=%llu\n",
            fm_inputs, fm_traces, fm_events, fm_ooms);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    atexit(fm_report);
    return 0;
}

/* What one replay of a trace on one instance keeps per id. */
typedef struct fm_state {
    const stow_trace_t *t;
    const stow_replay_policy_t *p;
    void *ctx;
    uint64_t *handle;
    uint8_t *live;
    uint64_t live_count, live_requested, ooms;
} fm_state_t;

typedef struct fm_span {
    uint64_t start, end; /* [start, end) */
    uint32_t id;
} fm_span_t;

static int fm_span_cmp(const void *a, const void *b)
{
    const fm_span_t *x = a, *y = b;
    return x->start < y->start ? -1 : x->start > y->start;
}

/* The device bytes an id's block spans: its address and requested size (a
 * block is at least that large, so requested spans must not overlap). */
static fm_span_t fm_span_of(const fm_state_t *s, uint32_t id, uint64_t size_bytes)
{
    uint64_t addr = s->handle[id];
    if (s->p == &stow__replay_policy_pytorch || s->p == &stow__replay_policy_pytorch_expandable)
        addr = stow__ptm_block_address(stow__replay_ptm_model(s->ctx), s->handle[id]);
    if (s->p == &stow__replay_policy_ideal_remap)
        addr = s->handle[id] - 1; /* its handles are addresses plus one */
    fm_span_t sp = {addr, addr + size_bytes, id};
    FUZZ_CHECK(sp.end > sp.start, "%s: id %u wraps the address space", s->p->name, id);
    return sp;
}

static void fm_check_no_overlap(const fm_state_t *s, const uint64_t *size_of)
{
    if (!s->live_count)
        return;
    fm_span_t *spans = malloc(s->live_count * sizeof *spans);
    FUZZ_CHECK(spans != NULL, "host memory");
    size_t n = 0;
    for (uint32_t id = 0; id < s->t->id_count; id++)
        if (s->live[id])
            spans[n++] = fm_span_of(s, id, size_of[id]);
    FUZZ_CHECK(n == s->live_count, "%s: %zu live, counted %llu", s->p->name, n,
               (unsigned long long)s->live_count);
    qsort(spans, n, sizeof *spans, fm_span_cmp);
    for (size_t i = 1; i < n; i++)
        FUZZ_CHECK(spans[i].start >= spans[i - 1].end, "%s: ids %u and %u overlap", s->p->name,
                   spans[i - 1].id, spans[i].id);
    free(spans);
}

static int fm_u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* ideal-remap: its live pages are the pages the live blocks overlap, counted
 * here from scratch (each block's first and last page, sorted, and the pages
 * strictly between them, which no other block can touch). */
static void fm_check_ideal_pages(const fm_state_t *s, const uint64_t *size_of)
{
    const uint64_t page = STEP;
    uint64_t *edge = malloc((2 * s->live_count + 1) * sizeof *edge), pages = 0;
    FUZZ_CHECK(edge != NULL, "host memory");
    size_t n = 0;
    for (uint32_t id = 0; id < s->t->id_count; id++) {
        if (!s->live[id])
            continue;
        uint64_t addr = s->handle[id] - 1, size = size_of[id] <= 512 ? 512 : size_of[id];
        uint64_t first = addr / page, last = (addr + (size + 511) / 512 * 512 - 1) / page;
        edge[n++] = first;
        if (last != first)
            edge[n++] = last;
        pages += last > first + 1 ? last - first - 1 : 0;
    }
    qsort(edge, n, sizeof *edge, fm_u64_cmp);
    for (size_t i = 0; i < n; i++)
        pages += i == 0 || edge[i] != edge[i - 1];
    free(edge);
    stow_replay_report_t r;
    memset(&r, 0, sizeof r);
    s->p->report(s->ctx, &r);
    FUZZ_CHECK(r.map_calls - r.unmap_calls == pages, "%s: %llu pages live, the blocks overlap %llu",
               s->p->name, (unsigned long long)(r.map_calls - r.unmap_calls),
               (unsigned long long)pages);
}

/* The policy's own view of what is live agrees with the trace's; returns the
 * peak reserved bytes it reports. */
static uint64_t fm_check_policy_state(const fm_state_t *s, uint64_t capacity_bytes)
{
    stow_replay_report_t r;
    memset(&r, 0, sizeof r);
    s->p->report(s->ctx, &r);
    if (capacity_bytes)
        FUZZ_CHECK(r.peak_reserved_bytes <= capacity_bytes,
                   "%s: peak reserved %llu > capacity %llu", s->p->name,
                   (unsigned long long)r.peak_reserved_bytes, (unsigned long long)capacity_bytes);
    if (r.stats) { /* classic, vmm */
        const stow_stats_t *st = r.stats;
        FUZZ_CHECK(st->allocation[STOW_POOL_ALL].current == s->live_count,
                   "%s: %llu allocations counted, %llu live", s->p->name,
                   (unsigned long long)st->allocation[STOW_POOL_ALL].current,
                   (unsigned long long)s->live_count);
        FUZZ_CHECK(st->requested_bytes[STOW_POOL_ALL].current == s->live_requested,
                   "%s: %llu requested bytes counted, %llu live", s->p->name,
                   (unsigned long long)st->requested_bytes[STOW_POOL_ALL].current,
                   (unsigned long long)s->live_requested);
        FUZZ_CHECK(st->reserved_bytes[STOW_POOL_ALL].current >=
                       st->allocated_bytes[STOW_POOL_ALL].current,
                   "%s: reserved below allocated", s->p->name);
    } else if (s->p == &stow__replay_policy_pytorch ||
               s->p == &stow__replay_policy_pytorch_expandable) {
        FUZZ_CHECK(stow__ptm_check(stow__replay_ptm_model(s->ctx)) == STOW_OK,
                   "%s: model invariants", s->p->name);
        stow_ptm_stats_t ms;
        stow__ptm_stats(stow__replay_ptm_model(s->ctx), &ms);
        FUZZ_CHECK(ms.requested_bytes_current == s->live_requested,
                   "%s: %zu requested bytes counted, %llu live", s->p->name,
                   ms.requested_bytes_current, (unsigned long long)s->live_requested);
        FUZZ_CHECK(ms.reserved_bytes_current >= ms.allocated_bytes_current,
                   "%s: reserved below allocated", s->p->name);
    }
    return r.peak_reserved_bytes;
}

/* One replay of every event; returns the peak reserved bytes it reports. */
static uint64_t fm_pass(fm_state_t *s, const uint64_t *size_of, uint64_t capacity_bytes)
{
    const stow_trace_t *t = s->t;
    s->ooms = 0;
    for (size_t i = 0; i < t->event_count; i++) {
        const stow_trace_event_t *e = &t->events[i];
        fm_events++;
        if (e->kind == STOW_TRACE_ALLOC) {
            stow_status_t st = s->p->alloc(s->ctx, e->size_bytes, e->stream, &s->handle[e->id]);
            FUZZ_CHECK(st == STOW_OK || st == STOW_ENOMEM || st == STOW_EOVERFLOW,
                       "%s: event %zu: alloc of %llu bytes returned %s", s->p->name, i,
                       (unsigned long long)e->size_bytes, stow_strerror(st));
            if (st == STOW_OK) {
                s->live[e->id] = 1;
                s->live_count++;
                s->live_requested += e->size_bytes;
            } else {
                s->ooms++;
                fm_ooms++;
            }
        } else if (s->live[e->id]) {
            s->p->free(s->ctx, s->handle[e->id], e->size_bytes);
            s->live[e->id] = 0;
            s->live_count--;
            s->live_requested -= e->size_bytes;
        }
        /* The whole-set check is O(n log n): after every event of a short
         * trace, else every 64 events and at the live peak. */
        if (t->event_count <= 256 || i % 64 == 0 || i == t->peak_live_event)
            fm_check_no_overlap(s, size_of);
    }
    fm_check_no_overlap(s, size_of);
    if (s->p == &stow__replay_policy_ideal_remap)
        fm_check_ideal_pages(s, size_of);
    return fm_check_policy_state(s, capacity_bytes);
}

static void fm_free_live(fm_state_t *s, const uint64_t *size_of)
{
    for (uint32_t id = 0; id < s->t->id_count; id++)
        if (s->live[id]) {
            s->p->free(s->ctx, s->handle[id], size_of[id]);
            s->live[id] = 0;
            s->live_count--;
            s->live_requested -= size_of[id];
        }
    FUZZ_CHECK(s->live_count == 0 && s->live_requested == 0, "%s: leftovers", s->p->name);
}

static bool fm_pages(const stow_replay_policy_t *p)
{
    return p == &stow__replay_policy_vmm || p == &stow__replay_policy_pytorch_expandable;
}

/* 0 = unlimited. paged_slow: the trace has a request in the band above. */
static uint64_t fm_capacity(uint8_t sel, const stow_trace_t *t, const stow_replay_policy_t *p,
                            bool paged_slow)
{
    uint64_t live_steps = (t->peak_live_bytes + STEP - 1) / STEP;
    uint64_t steps;
    switch (sel % 4) {
    case 0: /* unlimited, unless replaying would take seconds */
        return paged_slow && fm_pages(p) ? MAX_CAPACITY : 0;
    case 1: /* just above the live peak */
        steps = live_steps + (sel / 4) % 8;
        break;
    case 2: /* below it: OOMs and the release-and-retry path */
        steps = live_steps / 2 + (sel / 4) % 4;
        break;
    default: /* tiny devices */
        steps = 1 + sel / 16;
        break;
    }
    if (steps < 1)
        steps = 1;
    if (steps > MAX_CAPACITY / STEP)
        steps = MAX_CAPACITY / STEP;
    return steps * STEP;
}

/* Request sizes the decoder draws from, besides its size ranges: powers of
 * two and their neighbours around the pools' boundaries, and the absurd. */
static const uint64_t fm_sizes[] = {
    1, 511, 512, 513, 4096, 65536, 65537, 131072, 131073, 1048575, 1048576, 1048577,
    2097152, 8388607, 8388608, 10485760, 20971520, 20971521, 67108864, 268435456,
    (uint64_t)1 << 30, (uint64_t)1 << 33, (uint64_t)1 << 36, (uint64_t)1 << 40,
    (uint64_t)1 << 50, (uint64_t)1 << 62,
};
#define FM_SIZES (sizeof fm_sizes / sizeof fm_sizes[0])

/* Bytes -> the text of a valid trace, three bytes per event: op = b0 & 3 (3:
 * free the live id b1 picks; else allocate), stream = (b0 >> 2) & 3, and a size
 * from b1, b2 by the range b0 >> 4 picks. */
static char *fm_decode(const uint8_t *data, size_t size, size_t *text_len)
{
    size_t n = size / 3;
    uint32_t *live = malloc((n ? n : 1) * sizeof *live);
    char *body = malloc(n * 48 + 1), *text = malloc(n * 48 + 64);
    FUZZ_CHECK(live && body && text, "host memory");
    size_t len = 0, live_count = 0, events = 0;
    uint32_t ids = 0;
    for (size_t i = 0; i < n; i++) {
        const uint8_t *b = data + 3 * i;
        if ((b[0] & 3) == 3) {
            if (!live_count)
                continue;
            size_t k = b[1] % live_count;
            len += (size_t)sprintf(body + len, "f %u\n", live[k]);
            live[k] = live[--live_count];
        } else {
            uint64_t bytes, x = (uint64_t)b[1] | (uint64_t)b[2] << 8;
            switch (b[0] >> 4) {
            case 0: case 1: case 2: case 3: bytes = 1 + x % 65536; break;          /* small */
            case 4: case 5: case 6: bytes = 1 + x * 512; break;                   /* to 32 MiB */
            case 7: case 8: bytes = 1 + (x % 4096) * 65536 + b[2]; break;         /* to 256 MiB */
            case 9: bytes = (uint64_t)(1 + b[1]) << 20; break;                    /* whole MiB */
            case 10: bytes = (uint64_t)(1 + b[1] % 64) << 21; break;              /* granules */
            default: bytes = fm_sizes[x % FM_SIZES]; break;
            }
            len += (size_t)sprintf(body + len, "a %u %llu %u\n", ids, (unsigned long long)bytes,
                                   (unsigned)(b[0] >> 2) & 3);
            live[live_count++] = ids++;
        }
        events++;
    }
    body[len] = '\0';
    *text_len = (size_t)sprintf(text, "%u %zu\n", ids, events);
    memcpy(text + *text_len, body, len);
    *text_len += len;
    free(live);
    free(body);
    return text;
}

static void fm_run_policy(const stow_replay_policy_t *p, const stow_trace_t *t,
                          const stow_config_t *config, uint64_t capacity_bytes,
                          const uint64_t *size_of)
{
    stow_replay_setup_t setup = {config, (size_t)capacity_bytes};
    fm_state_t s = {t, p, NULL, NULL, NULL, 0, 0, 0};
    stow_status_t st = p->create(&setup, &s.ctx);
    /* A setting a policy refuses (vmm without a page-mapping backend, ...). */
    if (st != STOW_OK) {
        FUZZ_CHECK(st == STOW_EINVAL || st == STOW_ENOSYS, "%s: create returned %s", p->name,
                   stow_strerror(st));
        return;
    }
    size_t ids = t->id_count ? t->id_count : 1;
    s.handle = calloc(ids, sizeof *s.handle);
    s.live = calloc(ids, 1);
    FUZZ_CHECK(s.handle && s.live, "host memory");
    for (int pass = 0; pass < 2; pass++) {
        uint64_t peak = fm_pass(&s, size_of, capacity_bytes);
        if (s.ooms == 0)
            FUZZ_CHECK(peak >= t->peak_live_bytes, "%s: peak reserved %llu below peak live %llu",
                       p->name, (unsigned long long)peak,
                       (unsigned long long)t->peak_live_bytes);
        if (pass == 0)
            fm_free_live(&s, size_of);
    }
    p->destroy(s.ctx); /* with the second pass's leftovers live */
    free(s.handle);
    free(s.live);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fm_inputs++;
    if (size < 2)
        return 0;
    uint8_t capacity_sel = data[0], conf_sel = data[1];
    size_t text_len = size - 2;
    char *text;
    if (conf_sel & 0x80) {
        text = fm_decode(data + 2, size - 2, &text_len);
    } else {
        text = malloc(text_len ? text_len : 1);
        FUZZ_CHECK(text != NULL, "host memory");
        if (text_len)
            memcpy(text, data + 2, text_len);
    }
    stow_trace_t *t = NULL;
    stow_status_t st = stow_trace_parse("fuzz", text, text_len, &t, NULL, 0);
    free(text);
    if (st != STOW_OK)
        return 0;
    /* Keep each input fast: the policies are replayed 2 x 5 times. */
    if (t->event_count > 20000 || t->id_count > 100000 || t->stream_count > 256) {
        stow_trace_free(t);
        return 0;
    }
    fm_traces++;
    stow_config_t config;
    stow_config_default(&config);
    stow_tuning_t tuning;
    stow_tuning_default(&tuning);
    char err[256];
    const char *conf = fm_confs[(conf_sel & 0x7f) % FM_CONFS];
    st = stow_tuning_parse(&config, &tuning, conf, err, sizeof err);
    FUZZ_CHECK(st == STOW_OK, "conf '%s': %s", conf, err);
    stow__replay_set_tuning(&tuning); /* the pools' constants, as --tuning sets them */
    uint64_t *size_of = calloc(t->id_count ? t->id_count : 1, sizeof *size_of);
    FUZZ_CHECK(size_of != NULL, "host memory");
    bool paged_slow = false;
    for (size_t i = 0; i < t->event_count; i++)
        if (t->events[i].kind == STOW_TRACE_ALLOC) {
            uint64_t bytes = t->events[i].size_bytes;
            size_of[t->events[i].id] = bytes;
            paged_slow |= bytes > PAGED_MAX_REQUEST && bytes <= PAGED_HOPELESS_REQUEST;
        }
    for (size_t k = 0; k < FM_POLICIES; k++)
        fm_run_policy(fm_policies[k], t, &config,
                      fm_capacity(capacity_sel, t, fm_policies[k], paged_slow), size_of);
    stow__replay_set_tuning(NULL);
    free(size_of);
    stow_trace_free(t);
    return 0;
}
