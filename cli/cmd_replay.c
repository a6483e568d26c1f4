/*
 * cli/cmd_replay.c: `stowage replay`: replays allocation traces on the
 * simulated device under a policy and reports peak live bytes (the lower
 * bound), peak reserved bytes, their ratio, fragmentation at the reserved peak,
 * backend calls, OOM errors and host nanoseconds per event.
 *
 * Timing: the first replay populates the cache and gives every figure but the
 * time; then the remaining live allocations are freed and the trace is
 * replayed `repeats` more times on the same warm pool, and ns/event is the
 * median of those. This is how the README's PyTorch figures were taken.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "models/pytorch_model.h"
#include "stowage.h"
#include "stowage/sim.h"
#include "stowage/trace.h"

typedef enum { POLICY_CLASSIC, POLICY_PYTORCH, POLICY_PYTORCH_EXPANDABLE, POLICY_COUNT } policy_t;

static const char *const policy_names[POLICY_COUNT] = {"classic", "pytorch",
                                                       "pytorch-expandable"};

typedef struct replay_opts {
    size_t capacity_bytes; /* 0 = unlimited */
    unsigned repeats;      /* warm timed repeats */
    bool json;
    bool summary;
    const char *conf;      /* STOWAGE_CONF-syntax overrides for every policy */
} replay_opts_t;

typedef struct replay_result {
    policy_t policy;
    size_t events;
    uint64_t peak_live_bytes;
    uint64_t peak_reserved_bytes;
    double fragmentation_at_peak;
    uint64_t backend_calls;
    uint64_t ooms;
    double ns_per_event;
    unsigned repeats; /* warm repeats behind ns_per_event */
    stow_stats_t stats; /* classic only */
    bool has_stats;
} replay_result_t;

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

static double median_ns_per_event(uint64_t *times, unsigned n, size_t events)
{
    if (!n || !events)
        return 0.0;
    qsort(times, n, sizeof *times, cmp_u64);
    double mid = n % 2 ? (double)times[n / 2] : ((double)times[n / 2 - 1] + times[n / 2]) / 2.0;
    return mid / (double)events;
}

/* ---- classic: the Stowage pool on the simulated device ---- */

static stow_stream_t stream_handle(uint16_t index)
{
    /* Distinct non-NULL handles; index 0 is the default stream. */
    return (stow_stream_t)(uintptr_t)(index + 1u);
}

/* One pass over the trace. Allocations that fail are remembered as NULL and
 * their frees skipped. Returns the number of OOMs. */
static uint64_t classic_pass(stow_pool_t *pool, const stow_trace_t *t, void **ptrs)
{
    uint64_t ooms = 0;
    for (size_t i = 0; i < t->event_count; i++) {
        const stow_trace_event_t *e = &t->events[i];
        if (e->kind == STOW_TRACE_ALLOC) {
            if (stow_pool_alloc(pool, e->size_bytes, stream_handle(e->stream), &ptrs[e->id]) !=
                STOW_OK) {
                ptrs[e->id] = NULL;
                ooms++;
            }
        } else if (ptrs[e->id]) {
            (void)stow_pool_free(pool, ptrs[e->id]);
            ptrs[e->id] = NULL;
        }
    }
    return ooms;
}

static void free_leftovers(stow_pool_t *pool, const stow_trace_t *t, void **ptrs)
{
    for (uint32_t id = 0; id < t->id_count; id++)
        if (ptrs[id]) {
            (void)stow_pool_free(pool, ptrs[id]);
            ptrs[id] = NULL;
        }
}

static int replay_classic(const stow_trace_t *t, const stow_config_t *config,
                          const replay_opts_t *o, replay_result_t *r)
{
    stow_sim_config_t sc;
    stow_sim_config_default(&sc);
    sc.capacity_bytes = o->capacity_bytes;
    stow_backend_t *sim = NULL;
    stow_pool_t *pool = NULL;
    void **ptrs = calloc(t->id_count ? t->id_count : 1, sizeof *ptrs);
    uint64_t *times = calloc(o->repeats ? o->repeats : 1, sizeof *times);
    if (!ptrs || !times || stow_sim_create(&sc, &sim) != STOW_OK ||
        stow_pool_create(config, sim, &pool) != STOW_OK) {
        fprintf(stderr, "stowage replay: cannot create the simulated device or pool\n");
        free(ptrs);
        free(times);
        stow_sim_destroy(sim);
        return 1;
    }
    r->ooms = classic_pass(pool, t, ptrs);
    stow_pool_stats(pool, &r->stats);
    r->has_stats = true;
    r->peak_reserved_bytes = r->stats.reserved_bytes[STOW_POOL_ALL].peak;
    r->fragmentation_at_peak = r->stats.waste_at_peak.fragmentation;
    r->backend_calls = r->stats.num_backend_calls;
    for (unsigned rep = 0; rep < o->repeats; rep++) {
        free_leftovers(pool, t, ptrs);
        uint64_t t0 = now_ns();
        classic_pass(pool, t, ptrs);
        times[rep] = now_ns() - t0;
    }
    r->ns_per_event = median_ns_per_event(times, o->repeats, t->event_count);
    free_leftovers(pool, t, ptrs);
    stow_pool_destroy(pool);
    stow_sim_destroy(sim);
    free(ptrs);
    free(times);
    return 0;
}

/* ---- pytorch, pytorch-expandable: models/pytorch_model.h ---- */

static uint64_t model_pass(stow_ptm_t *m, const stow_trace_t *t, uint64_t *handles,
                           unsigned char *live)
{
    uint64_t ooms = 0;
    for (size_t i = 0; i < t->event_count; i++) {
        const stow_trace_event_t *e = &t->events[i];
        if (e->kind == STOW_TRACE_ALLOC) {
            live[e->id] = stow__ptm_alloc(m, e->size_bytes, e->stream, &handles[e->id]) ==
                          STOW_OK;
            ooms += !live[e->id];
        } else if (live[e->id]) {
            (void)stow__ptm_free(m, handles[e->id]);
            live[e->id] = 0;
        }
    }
    return ooms;
}

static void model_free_leftovers(stow_ptm_t *m, const stow_trace_t *t, uint64_t *handles,
                                 unsigned char *live)
{
    for (uint32_t id = 0; id < t->id_count; id++)
        if (live[id]) {
            (void)stow__ptm_free(m, handles[id]);
            live[id] = 0;
        }
}

static void model_config_from(const stow_config_t *c, bool expandable, size_t capacity,
                              stow_ptm_config_t *out)
{
    stow__ptm_config_default(out);
    out->capacity_bytes = capacity;
    out->expandable = expandable;
    out->max_split_size_bytes = c->max_split_size_bytes;
    out->max_non_split_rounding_bytes = c->max_non_split_rounding_bytes;
    for (unsigned i = 0; i < STOW_PTM_ROUNDUP_INTERVALS && i < STOW_ROUNDUP_INTERVALS; i++)
        out->roundup_power2_divisions[i] = c->roundup_power2_divisions[i];
    out->garbage_collection_threshold = c->garbage_collection_threshold;
    out->memory_fraction = c->memory_fraction < 1.0 ? c->memory_fraction : 0.0;
}

static int replay_model(const stow_trace_t *t, const stow_config_t *config, bool expandable,
                        const replay_opts_t *o, replay_result_t *r)
{
    stow_ptm_config_t mc;
    model_config_from(config, expandable, o->capacity_bytes, &mc);
    stow_ptm_t *m = NULL;
    uint64_t *handles = calloc(t->id_count ? t->id_count : 1, sizeof *handles);
    unsigned char *live = calloc(t->id_count ? t->id_count : 1, 1);
    uint64_t *times = calloc(o->repeats ? o->repeats : 1, sizeof *times);
    if (!handles || !live || !times || stow__ptm_create(&mc, &m) != STOW_OK) {
        fprintf(stderr, "stowage replay: cannot create the PyTorch model\n");
        free(handles);
        free(live);
        free(times);
        return 1;
    }
    r->ooms = model_pass(m, t, handles, live);
    stow_ptm_stats_t s;
    stow__ptm_stats(m, &s);
    r->peak_reserved_bytes = s.reserved_bytes_peak;
    r->backend_calls = s.device_alloc_calls + s.device_free_calls;
    r->fragmentation_at_peak = -1.0; /* not tracked by the model */
    for (unsigned rep = 0; rep < o->repeats; rep++) {
        model_free_leftovers(m, t, handles, live);
        uint64_t t0 = now_ns();
        model_pass(m, t, handles, live);
        times[rep] = now_ns() - t0;
    }
    r->ns_per_event = median_ns_per_event(times, o->repeats, t->event_count);
    stow__ptm_destroy(m);
    free(handles);
    free(live);
    free(times);
    return 0;
}

/* ---- output ---- */

static void print_json_string(const char *s)
{
    putchar('"');
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            printf("\\%c", c);
        else if (c < 0x20)
            printf("\\u%04x", c);
        else
            putchar(c);
    }
    putchar('"');
}

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0.0; }

static void print_result_json(const stow_trace_t *t, const replay_result_t *r)
{
    printf("{\"trace\": ");
    print_json_string(t->path);
    printf(", \"policy\": \"%s\", \"events\": %zu, \"peak_live_bytes\": %" PRIu64
           ", \"peak_reserved_bytes\": %" PRIu64 ", \"reserved_over_live\": %.6f"
           ", \"backend_calls\": %" PRIu64 ", \"ns_per_event\": %.1f, \"ooms\": %" PRIu64,
           policy_names[r->policy], r->events, r->peak_live_bytes, r->peak_reserved_bytes,
           ratio(r->peak_reserved_bytes, r->peak_live_bytes), r->backend_calls, r->ns_per_event,
           r->ooms);
    if (r->fragmentation_at_peak >= 0)
        printf(", \"fragmentation_at_peak\": %.6f", r->fragmentation_at_peak);
    if (r->has_stats) {
        const stow_waste_t *w = &r->stats.waste_at_peak;
        printf(", \"waste_at_peak\": {\"requested_bytes\": %" PRIu64 ", \"rounding_bytes\": %" PRIu64
               ", \"split_remainder_bytes\": %" PRIu64 ", \"idle_cached_bytes\": %" PRIu64
               ", \"pending_bytes\": %" PRIu64 "}, \"num_alloc_retries\": %" PRIu64,
               w->requested_bytes, w->rounding_bytes, w->split_remainder_bytes,
               w->idle_cached_bytes, w->pending_bytes, r->stats.num_alloc_retries);
    }
    printf("}\n");
}

static void print_result_text(const stow_trace_t *t, const replay_result_t *r)
{
    printf("%s  (policy %s)\n", t->path, policy_names[r->policy]);
    printf("  events                 %zu\n", r->events);
    printf("  peak live bytes        %" PRIu64 "  (lower bound)\n", r->peak_live_bytes);
    printf("  peak reserved bytes    %" PRIu64 "\n", r->peak_reserved_bytes);
    printf("  reserved / live        %.4f\n", ratio(r->peak_reserved_bytes, r->peak_live_bytes));
    if (r->fragmentation_at_peak >= 0)
        printf("  fragmentation at peak  %.4f\n", r->fragmentation_at_peak);
    printf("  backend calls          %" PRIu64 "\n", r->backend_calls);
    printf("  OOM errors             %" PRIu64 "\n", r->ooms);
    printf("  host ns / event        %.1f  (median of %u warm repeats)\n", r->ns_per_event,
           r->repeats);
}

static void usage(FILE *f)
{
    fprintf(f,
            "usage: stowage replay [--policy P] [--capacity BYTES] [--json] [--repeats N]\n"
            "                      [--conf KEY:VALUE,...] [--summary] TRACE...\n"
            "\n"
            "Replays each .rep trace on the simulated device and prints peak live bytes,\n"
            "peak reserved bytes, their ratio, fragmentation at the reserved peak, backend\n"
            "calls, OOM errors and host ns/event (median of N warm repeats, default 5).\n"
            "  --policy P     classic (default), pytorch, pytorch-expandable, or all\n"
            "  --capacity B   simulated device memory in bytes (suffixes K, M, G, T);\n"
            "                 default unlimited\n"
            "  --conf S       settings in STOWAGE_CONF syntax (also read from STOWAGE_CONF)\n"
            "  --json         one JSON object per trace and policy, one per line\n"
            "  --summary      print the pool's memory summary (classic)\n"
            "Exit status: 0 ok, 1 replay failure, 2 bad usage or malformed trace.\n");
}

static bool parse_bytes(const char *s, size_t *out)
{
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || end == s || *s == '-')
        return false;
    unsigned shift = 0;
    switch (*end) {
    case 'K': case 'k': shift = 10; end++; break;
    case 'M': case 'm': shift = 20; end++; break;
    case 'G': case 'g': shift = 30; end++; break;
    case 'T': case 't': shift = 40; end++; break;
    default: break;
    }
    if (*end == 'i' || *end == 'B')
        end += (*end == 'i' && end[1] == 'B') ? 2 : 1;
    if (*end || (shift && v > (SIZE_MAX >> shift)))
        return false;
    *out = (size_t)(v << shift);
    return true;
}

static int replay_one(const stow_trace_t *t, policy_t p, const stow_config_t *config,
                      const replay_opts_t *o)
{
    replay_result_t r = {0};
    r.policy = p;
    r.events = t->event_count;
    r.peak_live_bytes = t->peak_live_bytes;
    r.repeats = o->repeats;
    int rc = p == POLICY_CLASSIC ? replay_classic(t, config, o, &r)
                                 : replay_model(t, config, p == POLICY_PYTORCH_EXPANDABLE, o, &r);
    if (rc)
        return rc;
    if (o->json)
        print_result_json(t, &r);
    else {
        print_result_text(t, &r);
        if (o->summary && r.has_stats) {
            size_t n = stow_stats_summary(&r.stats, NULL, 0);
            char *buf = malloc(n + 1);
            if (buf) {
                stow_stats_summary(&r.stats, buf, n + 1);
                fputs(buf, stdout);
                free(buf);
            }
        }
    }
    return 0;
}

int stow__cli_replay(int argc, char **argv)
{
    replay_opts_t o = {0, 5, false, false, NULL};
    bool all = false;
    policy_t policy = POLICY_CLASSIC;
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            o.json = true;
        } else if (!strcmp(a, "--summary")) {
            o.summary = true;
        } else if (!strcmp(a, "--policy") && v) {
            i++;
            all = !strcmp(v, "all");
            bool known = all;
            for (int p = 0; p < POLICY_COUNT && !known; p++)
                if (!strcmp(v, policy_names[p])) {
                    policy = (policy_t)p;
                    known = true;
                }
            if (!known) {
                fprintf(stderr, "stowage replay: unknown policy '%s'\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--capacity") && v) {
            i++;
            if (!parse_bytes(v, &o.capacity_bytes)) {
                fprintf(stderr, "stowage replay: --capacity: '%s' is not a byte count\n", v);
                return 2;
            }
        } else if (!strcmp(a, "--repeats") && v) {
            i++;
            char *end;
            unsigned long n = strtoul(v, &end, 10);
            if (*end || n > 1000 || *v == '-') {
                fprintf(stderr, "stowage replay: --repeats: '%s' is not 0..1000\n", v);
                return 2;
            }
            o.repeats = (unsigned)n;
        } else if (!strcmp(a, "--conf") && v) {
            i++;
            o.conf = v;
        } else {
            fprintf(stderr, "stowage replay: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    if (i == argc) {
        fprintf(stderr, "stowage replay: no trace given\n");
        usage(stderr);
        return 2;
    }
    stow_config_t config;
    stow_config_default(&config);
    char err[512];
    if (stow_config_from_env(&config, err, sizeof err) != STOW_OK ||
        (o.conf && stow_config_parse(&config, o.conf, err, sizeof err) != STOW_OK)) {
        fprintf(stderr, "stowage replay: %s\n", err);
        return 2;
    }
    int rc = 0;
    for (; i < argc; i++) {
        stow_trace_t *t = NULL;
        stow_status_t st = stow_trace_load(argv[i], &t, err, sizeof err);
        if (st != STOW_OK) {
            fprintf(stderr, "%s\n", err);
            return 2;
        }
        for (int p = all ? 0 : (int)policy; p < (all ? POLICY_COUNT : (int)policy + 1); p++)
            if (replay_one(t, (policy_t)p, &config, &o))
                rc = 1;
        stow_trace_free(t);
    }
    return rc;
}
