/*
 * tests/unit/test_replay_cli.c: the replay engine behind `stowage replay`
 * (replay/replay_engine.h): the policy table, option parsing and its errors,
 * settings reaching the PyTorch model, the minimum-capacity search on traces
 * small enough to work out by hand, the JSON keys, and the built CLI itself.
 * No timing is asserted anywhere.
 */
#include <criterion/criterion.h>

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "replay/replay_engine.h"
#include "stowage.h"
#include "stowage/trace.h"
#include "test_support.h"

#define MIB ((uint64_t)1048576)

static stow_trace_t *parse_trace(const char *text)
{
    stow_trace_t *t = NULL;
    char err[256] = "";
    cr_assert_eq(stow_trace_parse("synthetic", text, strlen(text), &t, err, sizeof err), STOW_OK,
                 "%s", err);
    return t;
}

static stow_replay_result_t run(const char *policy, const stow_trace_t *t, const char *conf,
                                size_t capacity, bool min_capacity)
{
    const stow_replay_policy_t *p = stow__replay_policy_find(policy);
    cr_assert_not_null(p, "policy %s", policy);
    stow_config_t c = ts_config(conf);
    stow_replay_result_t r;
    cr_assert_eq(stow__replay_run(p, t, &c, capacity, 1, min_capacity, NULL, NULL, &r), STOW_OK);
    return r;
}

static bool fits(const char *policy, const stow_trace_t *t, size_t capacity)
{
    stow_config_t c = ts_config(NULL);
    bool ok = false;
    cr_assert_eq(stow__replay_fits(stow__replay_policy_find(policy), t, &c, capacity, &ok),
                 STOW_OK);
    return ok;
}

/* ---- policy table ---- */

Test(replay_policies, table_lists_every_policy_once)
{
    const char *want[] = {"classic",        "vmm",
                          "classic-planned", "vmm-planned",
                          "pytorch",        "pytorch-expandable",
                          "naive",          "jemalloc",
                          "jemalloc-decay", "jemalloc-tcache",
                          "ideal-remap"};
    size_t n = 0;
    while (stow__replay_policies[n])
        n++;
    cr_assert_eq(n, sizeof want / sizeof want[0]);
    for (size_t i = 0; i < n; i++) {
        cr_assert_str_eq(stow__replay_policies[i]->name, want[i]);
        cr_assert_eq(stow__replay_policy_find(want[i]), stow__replay_policies[i]);
    }
    cr_assert_null(stow__replay_policy_find("expandable"));
    cr_assert_null(stow__replay_policy_find(NULL));
    cr_assert_not(stow__replay_policy_jemalloc.device);
    cr_assert_not(stow__replay_policy_jemalloc_decay.device);
    cr_assert_not(stow__replay_policy_jemalloc_tcache.device);
    cr_assert(stow__replay_policy_naive.device);
    cr_assert(stow__replay_policy_ideal_remap.device);
    /* Only the jemalloc variants and the ideal-remap reference stay out of
     * `--policy all`. */
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(stow__replay_policies[i]->not_in_all,
                     stow__replay_policies[i] == &stow__replay_policy_jemalloc_decay ||
                         stow__replay_policies[i] == &stow__replay_policy_jemalloc_tcache ||
                         stow__replay_policies[i] == &stow__replay_policy_ideal_remap,
                     "%s", stow__replay_policies[i]->name);
}

/* ---- naive: one 2 MiB-granular reservation per request ---- */

/* Live: a0 (3 MiB) + a1 (1 MiB) = 4 MiB, then a1 + a2 (5 MiB) = 6 MiB.
 * Naive reservations: 4 + 2 = 6 MiB, then 2 + 6 = 8 MiB: peak 8 MiB. With no
 * cache to release, the minimum capacity is that peak: 8 MiB fits, 6 MiB not. */
static const char naive_trace[] = "3 6\n"
                                  "a 0 3145728 0\n"
                                  "a 1 1048576 0\n"
                                  "f 0\n"
                                  "a 2 5242880 0\n"
                                  "f 1\n"
                                  "f 2\n";

Test(replay_naive, peak_and_calls_by_hand)
{
    stow_trace_t *t = parse_trace(naive_trace);
    stow_replay_result_t r = run("naive", t, NULL, 0, false);
    cr_assert_eq(r.peak_live_bytes, 6 * MIB);
    cr_assert_eq(r.peak_reserved_bytes, 8 * MIB);
    cr_assert_eq(r.backend_calls, 6); /* 3 reserves + 3 releases, measured pass */
    cr_assert_eq(r.ooms, 0);
    cr_assert_not(r.has_min_capacity);
    stow_trace_free(t);
}

Test(replay_naive, min_capacity_by_hand)
{
    stow_trace_t *t = parse_trace(naive_trace);
    stow_replay_result_t r = run("naive", t, NULL, 0, true);
    cr_assert(r.has_min_capacity);
    cr_assert_eq(r.min_capacity_bytes, 8 * MIB);
    cr_assert_gt(r.min_capacity_probes, 0);
    cr_assert(fits("naive", t, 8 * MIB));
    cr_assert_not(fits("naive", t, 8 * MIB - 1));
    cr_assert_not(fits("naive", t, 6 * MIB));
    stow_trace_free(t);
}

Test(replay_naive, capacity_makes_ooms)
{
    stow_trace_t *t = parse_trace(naive_trace);
    stow_replay_result_t r = run("naive", t, NULL, 6 * MIB, false);
    cr_assert_eq(r.ooms, 1); /* a2 needs 6 MiB while a1 holds 2 */
    stow_trace_free(t);
}

/* Sequential requests reuse nothing but never overlap: min = one 4 MiB block. */
Test(replay_naive, sequential_min_capacity)
{
    stow_trace_t *t = parse_trace("2 4\na 0 3145729 0\nf 0\na 1 3145728 0\nf 1\n");
    stow_replay_result_t r = run("naive", t, NULL, 0, true);
    cr_assert_eq(r.min_capacity_bytes, 4 * MIB);
    stow_trace_free(t);
}

Test(replay_min_capacity, empty_trace_needs_nothing)
{
    stow_trace_t *t = parse_trace("0 0\n");
    stow_replay_result_t r = run("classic", t, NULL, 0, true);
    cr_assert(r.has_min_capacity);
    cr_assert_eq(r.min_capacity_bytes, 0);
    stow_trace_free(t);
}

/* The search's answer R is exact for its step on every device policy: R fits,
 * R - 2 MiB does not, and peak live <= R <= peak reserved (rounded up). */
static const char churn_trace[] = "8 14\n"
                                  "a 0 41943040 0\n"
                                  "a 1 3000000 0\n"
                                  "a 2 25165824 0\n"
                                  "f 0\n"
                                  "a 3 62914560 0\n"
                                  "f 2\n"
                                  "a 4 700000 0\n"
                                  "a 5 33554432 0\n"
                                  "f 3\n"
                                  "a 6 83886080 0\n"
                                  "f 5\n"
                                  "a 7 12345 0\n"
                                  "f 6\n"
                                  "f 1\n";

Test(replay_min_capacity, exact_for_step_on_device_policies)
{
    stow_trace_t *t = parse_trace(churn_trace);
    for (size_t i = 0; stow__replay_policies[i]; i++) {
        const stow_replay_policy_t *p = stow__replay_policies[i];
        if (!p->device)
            continue;
        stow_replay_result_t r = run(p->name, t, NULL, 0, true);
        cr_assert(r.has_min_capacity, "%s", p->name);
        uint64_t m = r.min_capacity_bytes;
        cr_assert_eq(m % STOW_REPLAY_CAPACITY_STEP_BYTES, 0, "%s", p->name);
        cr_assert_geq(m, t->peak_live_bytes, "%s", p->name);
        cr_assert_leq(m, (r.peak_reserved_bytes + 2 * MIB - 1) / (2 * MIB) * (2 * MIB), "%s",
                      p->name);
        cr_assert(fits(p->name, t, m), "%s fits at %llu", p->name, (unsigned long long)m);
        cr_assert_not(fits(p->name, t, m - STOW_REPLAY_CAPACITY_STEP_BYTES), "%s", p->name);
    }
    stow_trace_free(t);
}

Test(replay_min_capacity, host_policy_has_none)
{
    stow_trace_t *t = parse_trace(naive_trace);
    stow_config_t c = ts_config(NULL);
    uint64_t m = 0;
    bool ok;
    cr_assert_eq(stow__replay_min_capacity(&stow__replay_policy_jemalloc, t, &c, 8 * MIB, &m, NULL),
                 STOW_ENOSYS);
    cr_assert_eq(stow__replay_fits(&stow__replay_policy_jemalloc, t, &c, 8 * MIB, &ok),
                 STOW_ENOSYS);
    const char *host_policies[] = {"jemalloc", "jemalloc-decay", "jemalloc-tcache"};
    for (size_t i = 0; i < 3; i++) {
        stow_replay_result_t r = run(host_policies[i], t, NULL, 0, true);
        cr_assert_not(r.has_min_capacity, "%s", host_policies[i]);
        cr_assert_not(r.has_backend_calls, "%s", host_policies[i]);
        cr_assert_eq(r.ooms, 0, "%s", host_policies[i]);
        /* active pages >= live */
        cr_assert_geq(r.peak_reserved_bytes, r.peak_live_bytes, "%s", host_policies[i]);
    }
    stow_trace_free(t);
}

/* jemalloc-tcache: a freed small block waits in the policy's own cache and
 * serves the next request of its size class. Destroying an instance with
 * live and cached blocks, and then the process's own malloc, must not touch
 * the destroyed arena's memory. */
Test(replay_jemalloc, tcache_variant_reuses_its_cached_block)
{
    const stow_replay_policy_t *p = &stow__replay_policy_jemalloc_tcache;
    stow_config_t c = ts_config(NULL);
    stow_replay_setup_t setup = {&c, 0};
    void *ctx = NULL;
    cr_assert_eq(p->create(&setup, &ctx), STOW_OK);
    uint64_t a = 0, b = 0, live[64];
    cr_assert_eq(p->alloc(ctx, 4096, 0, &a), STOW_OK);
    memset((void *)(uintptr_t)a, 0x5a, 4096);
    p->free(ctx, a, 4096);
    cr_assert_eq(p->alloc(ctx, 4096, 0, &b), STOW_OK);
    cr_assert_eq(b, a, "the cache hands back the block it just took");
    for (size_t i = 0; i < 64; i++) {
        cr_assert_eq(p->alloc(ctx, 512 * (i + 1), 0, &live[i]), STOW_OK);
        if (i % 2)
            p->free(ctx, live[i], 512 * (i + 1));
    }
    p->destroy(ctx); /* b and the even blocks still live, odd ones cached */
    void *mine[256];
    for (size_t i = 0; i < 256; i++) {
        mine[i] = malloc(512 * (i % 64 + 1));
        cr_assert_not_null(mine[i]);
        memset(mine[i], 0xa5, 512 * (i % 64 + 1));
    }
    for (size_t i = 0; i < 256; i++)
        free(mine[i]);
}

/* ---- --conf settings reach the PyTorch models ---- */

/* 21 MiB is rounded to a 22 MiB segment; with 4 divisions per power of two,
 * [16, 32) MiB is cut in 4 MiB steps: 24 MiB. */
Test(replay_conf, roundup_power2_divisions_reaches_pytorch)
{
    stow_trace_t *t = parse_trace("1 2\na 0 22020097 0\nf 0\n");
    cr_assert_eq(run("pytorch", t, NULL, 0, false).peak_reserved_bytes, 22 * MIB);
    cr_assert_eq(run("pytorch", t, "roundup_power2_divisions:4", 0, false).peak_reserved_bytes,
                 24 * MIB);
    stow_trace_free(t);
}

/* A freed 100 MiB segment serves two 30 MiB requests by splitting; with
 * max_split_size 20 MiB it may not (100 >= 30 + 20 of non-split rounding), so
 * two new segments are reserved. */
Test(replay_conf, max_split_size_reaches_pytorch)
{
    stow_trace_t *t = parse_trace("3 5\na 0 104857600 0\nf 0\na 1 31457280 0\na 2 31457280 0\n"
                                  "f 1\n");
    cr_assert_eq(run("pytorch", t, NULL, 0, false).peak_reserved_bytes, 100 * MIB);
    cr_assert_eq(run("pytorch", t, "max_split_size_mb:20", 0, false).peak_reserved_bytes,
                 160 * MIB);
    stow_trace_free(t);
}

/* Capacity 200 MiB, fraction 0.99, threshold 0.25: before reserving for the
 * 62 MiB request, reserved (60 MiB, cached) is over 0.25 x 198 MiB, so GC
 * releases the cached segment first: peak 62 MiB instead of 122. */
Test(replay_conf, garbage_collection_threshold_reaches_pytorch)
{
    stow_trace_t *t = parse_trace("2 3\na 0 62914560 0\nf 0\na 1 65011712 0\n");
    cr_assert_eq(run("pytorch", t, "per_process_memory_fraction:0.99", 200 * MIB, false)
                     .peak_reserved_bytes,
                 122 * MIB);
    cr_assert_eq(run("pytorch", t,
                     "per_process_memory_fraction:0.99,garbage_collection_threshold:0.25",
                     200 * MIB, false)
                     .peak_reserved_bytes,
                 62 * MIB);
    stow_trace_free(t);
}

/* ---- options ---- */

static stow_status_t parse(stow_replay_opts_t *o, char *err, size_t len, int argc, ...)
{
    char *argv[32];
    va_list ap;
    va_start(ap, argc);
    for (int i = 0; i < argc; i++)
        argv[i] = va_arg(ap, char *);
    va_end(ap);
    argv[argc] = NULL;
    return stow__replay_opts_parse(argc, argv, o, err, len);
}

Test(replay_opts, defaults_and_all)
{
    stow_replay_opts_t o;
    char err[256];
    cr_assert_eq(parse(&o, err, sizeof err, 2, "replay", "x.rep"), STOW_OK);
    cr_assert_eq(o.policy_count, 1);
    cr_assert_eq(o.policies[0], &stow__replay_policy_classic);
    cr_assert_eq(o.repeats, 5);
    cr_assert_eq(o.first_trace, 1);
    cr_assert_eq(parse(&o, err, sizeof err, 8, "replay", "--policy", "all", "--min-capacity",
                       "--json", "--repeats", "0", "a.rep"),
                 STOW_OK);
    cr_assert(o.all && o.min_capacity && o.json);
    cr_assert_eq(o.policy_count, 8);
    for (unsigned k = 0; k < o.policy_count; k++) {
        cr_assert_neq(o.policies[k], &stow__replay_policy_jemalloc_decay);
        cr_assert_neq(o.policies[k], &stow__replay_policy_jemalloc_tcache);
    }
    cr_assert_eq(o.repeats, 0);
    cr_assert_eq(o.first_trace, 7);
    cr_assert_eq(parse(&o, err, sizeof err, 6, "replay", "--policy", "naive", "--policy",
                       "jemalloc", "t"),
                 STOW_OK);
    cr_assert_eq(o.policy_count, 2);
    cr_assert_eq(o.policies[1], &stow__replay_policy_jemalloc);
    cr_assert_eq(parse(&o, err, sizeof err, 4, "replay", "--policy", "jemalloc-decay", "t"),
                 STOW_OK);
    cr_assert_eq(o.policy_count, 1);
    cr_assert_eq(o.policies[0], &stow__replay_policy_jemalloc_decay);
    cr_assert_not(o.all);
    cr_assert_eq(parse(&o, err, sizeof err, 2, "replay", "--help"), STOW_OK);
    cr_assert(o.help);
}

/* A policy named on its own and again through `all` runs once: `all` adds the
 * seven it lists that are not there yet, after vmm. */
Test(replay_opts, repeated_policies_run_once)
{
    stow_replay_opts_t o;
    char err[256];
    const stow_replay_policy_t *want[] = {
        &stow__replay_policy_vmm,
        &stow__replay_policy_classic,
        &stow__replay_policy_classic_planned,
        &stow__replay_policy_vmm_planned,
        &stow__replay_policy_pytorch,
        &stow__replay_policy_pytorch_expandable,
        &stow__replay_policy_naive,
        &stow__replay_policy_jemalloc};
    cr_assert_eq(parse(&o, err, sizeof err, 6, "replay", "--policy", "vmm", "--policy", "all",
                       "t"),
                 STOW_OK, "%s", err);
    cr_assert(o.all);
    cr_assert_eq(o.policy_count, 8);
    for (unsigned k = 0; k < 8; k++)
        cr_assert_eq(o.policies[k], want[k], "policy %u is %s", k, o.policies[k]->name);

    cr_assert_eq(parse(&o, err, sizeof err, 6, "replay", "--policy", "all", "--policy", "vmm",
                       "t"),
                 STOW_OK, "%s", err);
    cr_assert_eq(o.policy_count, 8);
    cr_assert_eq(o.policies[1], &stow__replay_policy_vmm);

    cr_assert_eq(parse(&o, err, sizeof err, 6, "replay", "--policy", "vmm", "--policy", "vmm",
                       "t"),
                 STOW_OK, "%s", err);
    cr_assert_eq(o.policy_count, 1);
    cr_assert_eq(o.policies[0], &stow__replay_policy_vmm);
}

Test(replay_opts, bad_input_is_einval_with_a_message)
{
    stow_replay_opts_t o;
    char err[256];
    struct {
        int argc;
        const char *argv[5];
        const char *msg;
    } cases[] = {
        {3, {"replay", "--policy", "bogus"}, "unknown policy"},
        {4, {"replay", "--policy", "bogus", "t"}, "unknown policy"},
        {2, {"replay", "--policy"}, "needs a value"},
        {4, {"replay", "--capacity", "12Q", "t"}, "not a byte count"},
        {4, {"replay", "--capacity", "-5", "t"}, "not a byte count"},
        {4, {"replay", "--repeats", "1001", "t"}, "not 0..1000"},
        {4, {"replay", "--repeats", "x", "t"}, "not 0..1000"},
        {5, {"replay", "--min-capacity", "--capacity", "1G", "t"}, "--min-capacity"},
        {3, {"replay", "--frobnicate", "t"}, "unknown option"},
        {2, {"replay", "--json"}, "no trace"},
        {1, {"replay"}, "no trace"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *argv[6] = {0};
        for (int k = 0; k < cases[i].argc; k++)
            argv[k] = (char *)cases[i].argv[k];
        err[0] = 0;
        cr_assert_eq(stow__replay_opts_parse(cases[i].argc, argv, &o, err, sizeof err),
                     STOW_EINVAL, "case %zu", i);
        cr_assert_not_null(strstr(err, cases[i].msg), "case %zu: '%s'", i, err);
    }
}

Test(replay_opts, byte_counts)
{
    size_t v = 0;
    cr_assert(stow__replay_parse_bytes("123", &v) && v == 123);
    cr_assert(stow__replay_parse_bytes("4K", &v) && v == 4096);
    cr_assert(stow__replay_parse_bytes("16MiB", &v) && v == 16 * MIB);
    cr_assert(stow__replay_parse_bytes("2G", &v) && v == 2048 * MIB);
    cr_assert(stow__replay_parse_bytes("1T", &v) && v == ((size_t)1 << 40));
    cr_assert(stow__replay_parse_bytes("512B", &v) && v == 512);
    const char *bad[] = {"", "-1", " 1", "1X", "1KiBB", "1Mi", "99999999999999999999",
                         "17179869184T"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        cr_assert_not(stow__replay_parse_bytes(bad[i], &v), "'%s'", bad[i]);
}

/* ---- output ---- */

static char *json_of(const char *trace_path, const stow_replay_result_t *r)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    stow__replay_print_json(f, trace_path, r);
    fclose(f);
    return buf;
}

/* ---- side-by-side timing: a policy that records what the engine asks of it ---- */

/* One letter per call, in order: instance k's create 'C'+k... as "c0", "a1"
 * (an alloc by instance 1), "f0", "d1" (destroy). */
static char timing_log[4096];
static unsigned timing_created;
static int timing_fail_create_at = -1; /* create number that fails, or -1 */

static void timing_note(char what, unsigned instance)
{
    size_t n = strlen(timing_log);
    cr_assert_lt(n + 3, sizeof timing_log);
    timing_log[n] = what;
    timing_log[n + 1] = (char)('0' + instance);
    timing_log[n + 2] = '\0';
}

typedef struct timing_ctx {
    unsigned id;
    unsigned live;
} timing_ctx_t;

static stow_status_t timing_create(const stow_replay_setup_t *setup, void **out)
{
    (void)setup;
    if ((int)timing_created == timing_fail_create_at)
        return STOW_EHOSTMEM;
    timing_ctx_t *c = calloc(1, sizeof *c);
    cr_assert_not_null(c);
    c->id = timing_created++;
    timing_note('c', c->id);
    *out = c;
    return STOW_OK;
}

static stow_status_t timing_alloc(void *ctx, uint64_t size_bytes, uint32_t stream,
                                  uint64_t *handle)
{
    (void)size_bytes, (void)stream;
    timing_ctx_t *c = ctx;
    timing_note('a', c->id);
    c->live++;
    *handle = c->live;
    return STOW_OK;
}

static void timing_free(void *ctx, uint64_t handle, uint64_t size_bytes)
{
    (void)handle, (void)size_bytes;
    timing_ctx_t *c = ctx;
    cr_assert_gt(c->live, 0);
    timing_note('f', c->id);
    c->live--;
}

static void timing_report(void *ctx, stow_replay_report_t *out) { (void)ctx, (void)out; }

static void timing_destroy(void *ctx)
{
    timing_ctx_t *c = ctx;
    timing_note('d', c->id);
    free(c);
}

static const stow_replay_policy_t timing_policy = {
    "recording", "records the engine's calls", true, timing_create, timing_alloc,
    timing_free, NULL, timing_report, timing_destroy, true, NULL, false,
};

/* The same, with step markers: 'm' for a key (then its first letter), 'e' for
 * a step end. */
static void timing_step(void *ctx, const char *key)
{
    (void)ctx;
    size_t n = strlen(timing_log);
    if (n + 2 < sizeof timing_log) {
        timing_log[n] = key ? 'm' : 'e';
        timing_log[n + 1] = key ? key[0] : '.';
        timing_log[n + 2] = '\0';
    }
}

static const stow_replay_policy_t marker_policy = {
    "markers", "records the engine's calls and markers", true, timing_create, timing_alloc,
    timing_free, NULL, timing_report, timing_destroy, true, timing_step, false,
};

static void timing_reset(int fail_create_at)
{
    timing_log[0] = '\0';
    timing_created = 0;
    timing_fail_create_at = fail_create_at;
}

/* Each round: every instance in turn, two passes (untimed, timed) of the trace
 * (alloc 0, free 0: "a", "f" each), with what a pass leaves live freed first. */
Test(replay_time, passes_alternate_between_policies)
{
    stow_trace_t *t = parse_trace("1 2\na 0 512 0\nf 0\n");
    stow_config_t c = ts_config(NULL);
    const stow_replay_policy_t *ps[] = {&timing_policy, &timing_policy};
    double ns[2] = {-1, -1};
    timing_reset(-1);
    cr_assert_eq(stow__replay_time(ps, 2, t, &c, 0, 2, NULL, NULL, ns), STOW_OK);
    cr_assert_str_eq(timing_log, "c0c1"
                                 "a0f0a0f0a1f1a1f1" /* round 1 */
                                 "a0f0a0f0a1f1a1f1" /* round 2 */
                                 "d0d1");
    cr_assert_geq(ns[0], 0.0);
    cr_assert_geq(ns[1], 0.0);
    stow_trace_free(t);
}

/* Markers reach the policy before the event they precede, in every pass (and
 * those after the last event at the pass's end); a policy without a step
 * method never sees them. */
Test(replay_time, markers_reach_the_policy_in_every_pass)
{
    stow_trace_t *t = parse_trace("2 3\nm train\na 0 512 0\nm eval\na 1 512 0\ne\nf 0\nm x\n");
    stow_config_t c = ts_config(NULL);
    const stow_replay_policy_t *ps[] = {&marker_policy};
    double ns[1];
    timing_reset(-1);
    cr_assert_eq(stow__replay_time(ps, 1, t, &c, 0, 1, NULL, NULL, ns), STOW_OK);
    cr_assert_str_eq(timing_log, "c0"
                                 "mta0mea0e.f0mx" /* untimed pass */
                                 "f0" "mta0mea0e.f0mx" /* leftovers, timed pass */
                                 "f0d0");
    ps[0] = &timing_policy;
    timing_reset(-1);
    cr_assert_eq(stow__replay_time(ps, 1, t, &c, 0, 1, NULL, NULL, ns), STOW_OK);
    cr_assert_str_eq(timing_log, "c0" "a0a0f0" "f0" "a0a0f0" "f0d0");
    stow_trace_free(t);
}

/* A trace that ends with a block live: freed before every pass and at the end. */
Test(replay_time, leftovers_freed_before_each_pass)
{
    stow_trace_t *t = parse_trace("1 1\na 0 512 0\n");
    stow_config_t c = ts_config(NULL);
    const stow_replay_policy_t *ps[] = {&timing_policy};
    double ns[1];
    timing_reset(-1);
    cr_assert_eq(stow__replay_time(ps, 1, t, &c, 0, 2, NULL, NULL, ns), STOW_OK);
    cr_assert_str_eq(timing_log, "c0" "a0f0a0" "f0a0f0a0" "f0d0");
    stow_trace_free(t);
}

Test(replay_time, zero_repeats_time_nothing)
{
    stow_trace_t *t = parse_trace("1 2\na 0 512 0\nf 0\n");
    stow_config_t c = ts_config(NULL);
    const stow_replay_policy_t *ps[] = {&timing_policy};
    double ns[1] = {-1};
    timing_reset(-1);
    cr_assert_eq(stow__replay_time(ps, 1, t, &c, 0, 0, NULL, NULL, ns), STOW_OK);
    cr_assert_str_eq(timing_log, "c0d0");
    cr_assert_eq(ns[0], 0.0);
    stow_trace_free(t);
}

/* A create that fails: the instances made so far are destroyed, nothing timed. */
Test(replay_time, failed_create_destroys_the_others)
{
    stow_trace_t *t = parse_trace("1 2\na 0 512 0\nf 0\n");
    stow_config_t c = ts_config(NULL);
    const stow_replay_policy_t *ps[] = {&timing_policy, &timing_policy, &timing_policy};
    double ns[3] = {-1, -1, -1};
    timing_reset(1);
    cr_assert_eq(stow__replay_time(ps, 3, t, &c, 0, 3, NULL, NULL, ns), STOW_EHOSTMEM);
    cr_assert_str_eq(timing_log, "c0d0");
    cr_assert_eq(ns[0], -1.0);
    cr_assert_eq(stow__replay_time(NULL, 1, t, &c, 0, 1, NULL, NULL, ns), STOW_EINVAL);
    cr_assert_eq(stow__replay_time(ps, 0, t, &c, 0, 1, NULL, NULL, ns), STOW_EINVAL);
    cr_assert_eq(stow__replay_time(ps, 1, t, &c, 0, 1, NULL, NULL, NULL), STOW_EINVAL);
    stow_trace_free(t);
}

/* The real policies side by side: every figure set, on the same trace. */
Test(replay_time, real_policies_side_by_side)
{
    stow_trace_t *t = parse_trace(naive_trace);
    stow_config_t c = ts_config(NULL);
    const stow_replay_policy_t *ps[] = {&stow__replay_policy_classic, &stow__replay_policy_vmm,
                                        &stow__replay_policy_jemalloc};
    double ns[3] = {-1, -1, -1};
    cr_assert_eq(stow__replay_time(ps, 3, t, &c, 0, 3, NULL, NULL, ns), STOW_OK);
    for (int k = 0; k < 3; k++)
        cr_assert_geq(ns[k], 0.0);
    stow_trace_free(t);
}

Test(replay_output, json_keys_present)
{
    const char *keys[] = {"\"trace\": \"dir/\\\"q\\\".rep\"", "\"policy\": \"classic\"",
                          "\"events\": 6",  "\"peak_live_bytes\": 6291456",
                          "\"peak_reserved_bytes\": ", "\"reserved_over_live\": ",
                          "\"backend_calls\": ", "\"ns_per_event\": ", "\"ooms\": 0",
                          "\"min_capacity_bytes\": ", "\"sync_calls\": 0",
                          "\"event_records\": 0", "\"event_waits\": 0"};
    stow_trace_t *t = parse_trace(naive_trace);
    stow_replay_result_t r = run("classic", t, NULL, 0, true);
    char *js = json_of("dir/\"q\".rep", &r);
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        cr_assert_not_null(strstr(js, keys[i]), "missing %s in %s", keys[i], js);
    cr_assert_null(strstr(js, "null"), "%s", js);
    cr_assert_eq(js[strlen(js) - 1], '\n');
    free(js);

    r = run("jemalloc", t, NULL, 0, true);
    js = json_of("t.rep", &r);
    cr_assert_not_null(strstr(js, "\"min_capacity_bytes\": null"), "%s", js);
    cr_assert_not_null(strstr(js, "\"backend_calls\": null"), "%s", js);
    free(js);
    stow_trace_free(t);
}

/* ---- vmm: the page-mapped pool's figures, worked out by hand ---- */

/* Modelled cost of one simulated call, as stowage/sim.h documents the defaults
 * (H200, driver 580), for the calls the vmm replay below makes. */
#define COST_MEM_INFO 3900
#define COST_EVENT_RECORD 157
#define COST_EVENT_DESTROY 126
#define COST_VA_RESERVE 16000
#define COST_PHYS_CREATE 9800
#define COST_MAP 24000
#define COST_UNMAP 15000
#define COST_EVENT_SYNCHRONIZE 10000

/* What a report printer (text or table row) writes for r, as a string. */
typedef void report_printer_t(FILE *f, const char *trace_path, const stow_replay_result_t *r,
                              bool min_capacity);

static char *printed(report_printer_t *print, const char *trace_path,
                     const stow_replay_result_t *r, bool min_capacity)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_not_null(f);
    print(f, trace_path, r, min_capacity);
    fclose(f);
    return buf;
}

/* naive_trace under vmm with a physical handle per granule (vmm_handle_mb:2),
 * on 2 MiB granules of one reserved address range:
 *   a0 (3 MiB) at [0, 3): maps granules G0 and G1, each on a new physical page.
 *   a1 (1 MiB) at [3, 4): inside G1, already mapped: no call.
 *   f0 leaves G0 unused (G1 still holds a1); the pool keeps it mapped.
 *   a2 (5 MiB) does not fit the 3 MiB hole, so it goes at [4, 9): granules
 *   G2..G4. Two get new physical pages; the third takes G0's page, which is
 *   unmapped and mapped again there (the one remap). Unmapping is not
 *   stream-ordered, so before it the pool closes G0's epoch with one event on
 *   the stream that freed a0 and waits on that event (allocator/vmm_epochs.c):
 *   1 event recorded, 1 waited on, destroyed after, and no device synchronize.
 * Calls: mem_info (pool create), va_reserve, 4 phys_create, 5 map, 1 unmap,
 * event_record, event_synchronize, event_destroy: 15. Peak reserved: the 4
 * physical pages, 8 MiB, with a1 + a2 = 6 MiB live (8 / 6 = 1.3333); no cache
 * to drop, so 8 MiB is also the minimum capacity. */
Test(replay_vmm_report, figures_worked_out_by_hand)
{
    stow_trace_t *t = parse_trace(naive_trace);
    stow_replay_result_t r = run("vmm", t, "vmm_handle_mb:2", 0, true);
    cr_assert_str_eq(r.policy, "vmm");
    cr_assert_eq(r.peak_live_bytes, 6 * MIB);
    cr_assert_eq(r.peak_reserved_bytes, 8 * MIB);
    cr_assert_eq(r.ooms, 0);
    cr_assert(r.has_min_capacity);
    cr_assert_eq(r.min_capacity_bytes, 8 * MIB);
    cr_assert(r.has_map_calls);
    cr_assert_eq(r.map_calls, 5);
    cr_assert_eq(r.unmap_calls, 1);
    cr_assert(r.has_backend_calls);
    cr_assert_eq(r.backend_calls, 15);
    cr_assert(r.has_modelled_time);
    const uint64_t modelled = COST_MEM_INFO + COST_EVENT_RECORD + COST_EVENT_DESTROY +
                              COST_VA_RESERVE + 4 * COST_PHYS_CREATE + 5 * COST_MAP +
                              COST_UNMAP + COST_EVENT_SYNCHRONIZE; /* 204383 */
    cr_assert_eq(r.modelled_backend_ns, modelled, "modelled %llu ns",
                 (unsigned long long)r.modelled_backend_ns);
    cr_assert(r.has_stats);
    cr_assert_eq(r.stats.num_map_calls, 5);
    cr_assert_eq(r.stats.num_unmap_calls, 1);
    cr_assert_eq(r.stats.num_sync_all_streams, 0);
    cr_assert_eq(r.stats.num_event_records, 1);
    cr_assert_eq(r.stats.num_event_waits, 1);
    cr_assert_eq(r.stats.num_event_queries, 0); /* differs from records: the text checks which */

    char *js = json_of("t.rep", &r);
    const char *keys[] = {"\"policy\": \"vmm\"", "\"peak_reserved_bytes\": 8388608",
                          "\"reserved_over_live\": 1.333333", "\"backend_calls\": 15",
                          "\"min_capacity_bytes\": 8388608", "\"map_calls\": 5",
                          "\"unmap_calls\": 1", "\"modelled_backend_ms\": 0.204",
                          "\"sync_calls\": 0", "\"event_records\": 1", "\"event_waits\": 1"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++)
        cr_assert_not_null(strstr(js, keys[i]), "missing %s in %s", keys[i], js);
    free(js);

    char *txt = printed(stow__replay_print_text, "t.rep", &r, true);
    char min_line[128];
    snprintf(min_line, sizeof min_line,
             "  minimum capacity       8388608  (1.3333 x live; 2 MiB steps, %u replays)\n",
             r.min_capacity_probes);
    const char *lines[] = {"t.rep  (policy vmm)\n",
                           "  peak reserved bytes    8388608\n",
                           "  reserved / live        1.3333\n",
                           min_line,
                           "  backend calls          15\n",
                           "  map / unmap calls      5 / 1  (1000.0 per 1000 events)\n",
                           "  device synchronizes    0  (1 events recorded, 1 waited on)\n",
                           "  modelled backend time  0.204 ms",
                           "  OOM errors             0\n"};
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
        cr_assert_not_null(strstr(txt, lines[i]), "missing '%s' in\n%s", lines[i], txt);
    free(txt);

    /* The `--policy all` row, up to the (timed, so unchecked) ns/event. */
    char *row = printed(stow__replay_print_table_row, "dir/t.rep", &r, true);
    const char *want = "t                        vmm                        6291456        8388608"
                       "   1.3333        8388608   1.3333            15 ";
    cr_assert_eq(strncmp(row, want, strlen(want)), 0, "row '%s'\nwant '%s'", row, want);
    free(row);
    stow_trace_free(t);
}

/* The same trace with handles of several granules (the default vmm_handle_mb,
 * 20 MiB) on a device without a limit:
 *   a0 (3 MiB) at [0, 3): granules G0 and G1 unmapped, a stretch of 2: one
 *   handle of 4 MiB, one map.
 *   a1 (1 MiB) at [3, 4): inside G1: no call.
 *   f0 leaves G0 unused, but its handle also holds G1, which a1 holds: the
 *   mapping is partly live and cannot be unmapped (a handle goes whole).
 *   a2 (5 MiB) at [4, 9): G2..G4, one handle of 6 MiB. The live peak becomes
 *   6 MiB, 3 granules allowed, 2 held: nothing idle to remap, so the handle is
 *   created beyond the allowance.
 * Calls: mem_info, va_reserve, 2 phys_create, 2 map: 6; no unmap, no event.
 * Peak reserved 10 MiB for 6 live (1.6667): G0, pinned by its handle. On a
 * device only a little larger than that, handles shrink to a granule (each at
 * most 1/4096 of what the pool may still take), so the minimum capacity is the
 * 8 MiB of a handle per granule above. Modelled time: the sizes count beyond
 * 2 MiB (stowage/sim.h): create 9800 + 14 per MiB, map 24000 + 33 per MiB. */
Test(replay_vmm_report, figures_with_handles_of_several_granules)
{
    stow_trace_t *t = parse_trace(naive_trace);
    stow_replay_result_t r = run("vmm", t, NULL, 0, true);
    cr_assert_eq(r.peak_live_bytes, 6 * MIB);
    cr_assert_eq(r.peak_reserved_bytes, 10 * MIB);
    cr_assert(r.has_min_capacity);
    cr_assert_eq(r.min_capacity_bytes, 8 * MIB);
    cr_assert_eq(r.map_calls, 2);
    cr_assert_eq(r.unmap_calls, 0);
    cr_assert_eq(r.backend_calls, 6);
    const uint64_t modelled = COST_MEM_INFO + COST_VA_RESERVE + (COST_PHYS_CREATE + 14 * 2) +
                              (COST_PHYS_CREATE + 14 * 4) + (COST_MAP + 33 * 2) +
                              (COST_MAP + 33 * 4); /* 87782 */
    cr_assert_eq(r.modelled_backend_ns, modelled, "modelled %llu ns",
                 (unsigned long long)r.modelled_backend_ns);
    cr_assert_eq(r.stats.num_device_alloc, 2);
    cr_assert_eq(r.stats.num_event_records, 0);
    stow_trace_free(t);
}

/* pytorch-expandable priced by the same cost model: one 30 MiB request maps
 * two 20 MiB pages of the large pool's segment (a cuMemCreate and a cuMemMap
 * with its share of cuMemSetAccess each), after the segment's address range
 * is reserved; nothing is unmapped. */
Test(replay_pytorch_report, expandable_calls_and_modelled_time_by_hand)
{
    stow_trace_t *t = parse_trace("1 2\na 0 31457280 0\nf 0\n");
    stow_replay_result_t r = run("pytorch-expandable", t, NULL, 0, false);
    cr_assert(r.has_map_calls);
    cr_assert_eq(r.map_calls, 2);
    cr_assert_eq(r.unmap_calls, 0);
    cr_assert(r.has_modelled_time);
    const uint64_t page = COST_PHYS_CREATE + 14 * 18 + COST_MAP + 33 * 18;
    cr_assert_eq(r.modelled_backend_ns, COST_VA_RESERVE + 2 * page, "modelled %llu ns",
                 (unsigned long long)r.modelled_backend_ns);
    char *js = json_of("t.rep", &r);
    cr_assert_not_null(strstr(js, "\"modelled_backend_ms\": 0.085"), "%s", js);
    free(js);
    /* Native segments: one cudaMalloc of 30 MiB (55000 + 183 per MiB beyond 2). */
    r = run("pytorch", t, NULL, 0, false);
    cr_assert(r.has_modelled_time);
    cr_assert_eq(r.modelled_backend_ns, 55000 + 183 * 28);
    stow_trace_free(t);
}

/* ---- the built CLI (build/stowage, next to this test binary) ---- */

static bool cli_path(char *buf, size_t len)
{
    ssize_t n = readlink("/proc/self/exe", buf, len - 1);
    if (n <= 0)
        return false;
    buf[n] = 0;
    char *slash = strrchr(buf, '/');
    if (!slash || (size_t)(slash - buf) + sizeof "/stowage" > len)
        return false;
    strcpy(slash, "/stowage");
    return access(buf, X_OK) == 0;
}

static int cli_run(const char *args, char *out, size_t out_len)
{
    char exe[4096], cmd[8192];
    if (!cli_path(exe, sizeof exe))
        cr_skip_test("build/stowage not built");
    snprintf(cmd, sizeof cmd, "'%s' replay %s 2>/dev/null", exe, args);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, out_len - 1, p);
    out[n] = 0;
    int status = pclose(p);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

Test(replay_cli, bad_usage_exits_2)
{
    char out[4096];
    cr_assert_eq(cli_run("--policy bogus x.rep", out, sizeof out), 2);
    cr_assert_eq(cli_run("--capacity 1G --min-capacity x.rep", out, sizeof out), 2);
    cr_assert_eq(cli_run("/nonexistent/trace.rep", out, sizeof out), 2);
    cr_assert_eq(cli_run("--help", out, sizeof out), 0);
    cr_assert_not_null(strstr(out, "jemalloc"));
}

Test(replay_cli, all_policies_json_one_line_each)
{
    char path[] = "/tmp/stow_replay_cli_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, naive_trace, sizeof naive_trace - 1), (ssize_t)(sizeof naive_trace - 1));
    close(fd);
    char args[256], out[16384];
    snprintf(args, sizeof args, "--policy all --min-capacity --json --repeats 1 %s", path);
    int rc = cli_run(args, out, sizeof out);
    unlink(path);
    cr_assert_eq(rc, 0, "%s", out);
    size_t lines = 0;
    for (const char *c = out; *c; c++)
        lines += *c == '\n';
    cr_assert_eq(lines, 6, "%s", out);
    cr_assert_not_null(strstr(out, "\"policy\": \"naive\""));
    cr_assert_not_null(strstr(out, "\"min_capacity_bytes\": 8388608"), "%s", out);
    cr_assert_null(strstr(out, "planned\""), "no planned rows without markers: %s", out);
}

/* A trace with step markers: `--policy all` adds classic-planned and
 * vmm-planned, whose JSON says what the arena served. */
Test(replay_cli, all_policies_add_planned_rows_for_markers)
{
    char path[] = "/tmp/stow_replay_cli_XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *f = fdopen(fd, "w");
    cr_assert_not_null(f);
    fprintf(f, "%d %d\n", 6 * 3, 6 * 6);
    for (int s = 0; s < 6; s++) {
        fprintf(f, "m train\n");
        for (int i = 0; i < 3; i++)
            fprintf(f, "a %d %d 0\n", s * 3 + i, (i + 1) << 20);
        for (int i = 2; i >= 0; i--)
            fprintf(f, "f %d\n", s * 3 + i);
    }
    fclose(f);
    char args[256], out[16384];
    snprintf(args, sizeof args, "--policy all --json --repeats 0 %s", path);
    int rc = cli_run(args, out, sizeof out);
    unlink(path);
    cr_assert_eq(rc, 0, "%s", out);
    size_t lines = 0;
    for (const char *c = out; *c; c++)
        lines += *c == '\n';
    cr_assert_eq(lines, 8, "%s", out);
    const char *row = strstr(out, "\"policy\": \"vmm-planned\"");
    cr_assert_not_null(row, "%s", out);
    cr_assert_not_null(strstr(out, "\"policy\": \"classic-planned\""), "%s", out);
    const char *hits = strstr(row, "\"planned_hits\": ");
    cr_assert_not_null(hits);
    cr_assert_gt(atoi(hits + strlen("\"planned_hits\": ")), 0, "%s", row);
    cr_assert_not_null(strstr(row, "\"plans\": 1"), "%s", row);
}
