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

/* Replays t under policy with conf's settings, and its constants given to the
 * replayed pools as --tuning gives them. */
static stow_replay_result_t run(const char *policy, const stow_trace_t *t, const char *conf,
                                size_t capacity, bool min_capacity)
{
    const stow_replay_policy_t *p = stow__replay_policy_find(policy);
    cr_assert_not_null(p, "policy %s", policy);
    stow_config_t c = ts_config(conf);
    stow_tuning_t tuning = ts_tuning(conf);
    stow__replay_set_tuning(&tuning);
    stow_replay_result_t r;
    cr_assert_eq(stow__replay_run(p, t, &c, capacity, 1, min_capacity, NULL, NULL, &r), STOW_OK);
    stow__replay_set_tuning(NULL);
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
    cr_assert_eq(parse(&o, err, sizeof err, 6, "replay", "--conf", "policy:vmm", "--tuning",
                       "vmm_slack:0", "t"),
                 STOW_OK, "%s", err);
    cr_assert_str_eq(o.conf, "policy:vmm");
    cr_assert_str_eq(o.tuning, "vmm_slack:0");
    cr_assert_eq(o.first_trace, 5);
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
        {2, {"replay", "--tuning"}, "needs a value"},
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

/* An option that would leave a value or a flag unused is an error. */
Test(replay_opts, options_that_would_go_unused_are_errors)
{
    stow_replay_opts_t o;
    char err[256];
    struct {
        int argc;
        const char *argv[7];
        const char *msg;
    } cases[] = {
        {6, {"replay", "--conf", "a:1", "--conf", "b:2", "t"}, "--conf given twice"},
        {6, {"replay", "--tuning", "a:1", "--tuning", "b:2", "t"}, "--tuning given twice"},
        {6, {"replay", "--capacity", "1G", "--capacity", "2G", "t"}, "--capacity given twice"},
        {6, {"replay", "--repeats", "1", "--repeats", "2", "t"}, "--repeats given twice"},
        {4, {"replay", "--summary", "--json", "t"}, "--summary prints text"},
        {5, {"replay", "--summary", "--policy", "all", "t"}, "--policy all table"},
        {3, {"replay", "--allow-oom", "t"}, "add --capacity"},
        {5, {"replay", "--allow-oom", "--min-capacity", "t"}, "add --capacity"},
        {5, {"replay", "--capacity", "4M", "--min-capacity", "t"}, "drop --capacity"},
        {4, {"replay", "--capacity", "1M", "t"}, "below 2 MiB"},
        {4, {"replay", "--capacity", "0", "t"}, "below 2 MiB"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *argv[8] = {0};
        for (int k = 0; k < cases[i].argc; k++)
            argv[k] = (char *)cases[i].argv[k];
        err[0] = 0;
        cr_assert_eq(stow__replay_opts_parse(cases[i].argc, argv, &o, err, sizeof err),
                     STOW_EINVAL, "case %zu", i);
        cr_assert_not_null(strstr(err, cases[i].msg), "case %zu: '%s'", i, err);
        cr_assert_null(strchr(err, '\n'), "case %zu: one line: '%s'", i, err);
    }
    cr_assert_eq(parse(&o, err, sizeof err, 5, "replay", "--capacity", "1G", "--allow-oom", "t"),
                 STOW_OK, "%s", err);
    cr_assert(o.allow_oom);
    cr_assert_not(o.policy_given);
    cr_assert_eq(parse(&o, err, sizeof err, 4, "replay", "--policy", "vmm", "t"), STOW_OK);
    cr_assert(o.policy_given);
}

/* ---- settings against the policies (stow__replay_conf_resolve) ---- */

/* Resolves `conf` (STOWAGE_CONF unset) for the named policies (none: the
 * default); returns the status, with the first policy in *first and any note
 * in notes. */
static stow_status_t resolve(const char *conf, const char *const *names, unsigned n,
                             const stow_replay_policy_t **first, unsigned *count, char *err,
                             char *notes, size_t notes_len)
{
    unsetenv("STOWAGE_CONF");
    stow_config_t c;
    cr_assert_eq(stow__replay_load_config(conf, &c, err, 256), STOW_OK, "%s", err);
    const stow_replay_policy_t *ps[STOW_REPLAY_MAX_POLICIES] = {&stow__replay_policy_classic};
    for (unsigned k = 0; k < n; k++)
        cr_assert_not_null(ps[k] = stow__replay_policy_find(names[k]), "%s", names[k]);
    *count = n ? n : 1;
    FILE *f = fmemopen(notes, notes_len, "w");
    cr_assert_not_null(f);
    err[0] = 0;
    stow_status_t st = stow__replay_conf_resolve(conf, &c, n > 0, ps, count, f, "who", err, 256);
    fclose(f);
    *first = ps[0];
    return st;
}

Test(replay_conf_resolve, settings_pick_the_pool_without_policy)
{
    struct {
        const char *conf, *want;
    } cases[] = {
        {NULL, "vmm"},
        {"policy:auto", "vmm"},
        {"policy:classic", "classic"},
        {"policy:vmm", "vmm"},
        {"expandable_segments:True", "vmm"},
        {"expandable_segments:False", "classic"},
        {"planned_steps:true", "vmm-planned"},
        {"policy:classic,planned_steps:true", "classic-planned"},
        {"policy:vmm,planned_steps:true", "vmm-planned"},
        {"policy:vmm,scrub_on_free:true", "vmm"},
        {"planned_steps:true,record_events:16", "vmm-planned"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const stow_replay_policy_t *p;
        unsigned n;
        char err[256], notes[512] = "";
        cr_assert_eq(resolve(cases[i].conf, NULL, 0, &p, &n, err, notes, sizeof notes), STOW_OK,
                     "%s: %s", cases[i].conf, err);
        cr_assert_eq(n, 1);
        cr_assert_str_eq(p->name, cases[i].want, "%s", cases[i].conf);
        cr_assert_str_empty(notes);
    }
}

Test(replay_conf_resolve, environment_picks_the_pool_too)
{
    cr_assert_eq(setenv("STOWAGE_CONF", "policy:vmm", 1), 0);
    stow_config_t c;
    char err[256];
    cr_assert_eq(stow__replay_load_config(NULL, &c, err, sizeof err), STOW_OK);
    const stow_replay_policy_t *ps[1] = {&stow__replay_policy_classic};
    unsigned n = 1;
    cr_assert_eq(stow__replay_conf_resolve(NULL, &c, false, ps, &n, NULL, "who", err, sizeof err),
                 STOW_OK, "%s", err);
    cr_assert_eq(ps[0], &stow__replay_policy_vmm);
    ps[0] = &stow__replay_policy_classic;
    cr_assert_eq(stow__replay_conf_resolve(NULL, &c, true, ps, &n, NULL, "who", err, sizeof err),
                 STOW_EINVAL);
    cr_assert_str_eq(err, "STOWAGE_CONF's policy:vmm selects vmm, not the policy classic given "
                          "with --policy: use --policy vmm in its place, or drop the key");
    unsetenv("STOWAGE_CONF");
}

Test(replay_conf_resolve, a_key_that_contradicts_the_policy_names_the_one_to_use)
{
    struct {
        const char *conf, *policy, *want;
    } cases[] = {
        {"policy:vmm", "classic",
         "--conf policy:vmm selects vmm, not the policy classic given with --policy: use "
         "--policy vmm in its place, or drop the key"},
        {"expandable_segments:True", "pytorch",
         "--conf expandable_segments:True selects pytorch-expandable, not the policy pytorch "
         "given with --policy: use --policy pytorch-expandable in its place, or drop the key"},
        {"policy:classic", "vmm-planned",
         "--conf policy:classic selects classic-planned, not the policy vmm-planned given with "
         "--policy: use --policy classic-planned in its place, or drop the key"},
        {"planned_steps:true", "vmm",
         "--conf planned_steps:true selects vmm-planned, not the policy vmm given with --policy: "
         "use --policy vmm-planned in its place, or drop the key"},
        {"planned_steps:false", "classic-planned",
         "--conf planned_steps:false selects classic, not the policy classic-planned given with "
         "--policy: use --policy classic in its place, or drop the key"},
        {"planned_async:true", "classic-planned",
         "--conf planned_async:true: a replay plans inline, so that its figures repeat "
         "(docs/planned.md): drop the key"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const stow_replay_policy_t *p;
        unsigned n;
        char err[256], notes[512] = "";
        const char *names[] = {cases[i].policy};
        cr_assert_eq(resolve(cases[i].conf, names, 1, &p, &n, err, notes, sizeof notes),
                     STOW_EINVAL, "%s", cases[i].conf);
        cr_assert_str_eq(err, cases[i].want);
    }
}

Test(replay_conf_resolve, a_key_no_policy_applies_is_an_error_naming_it)
{
    struct {
        const char *conf, *policy, *want;
    } cases[] = {
        {"max_split_size_mb:64", "vmm",
         "--conf max_split_size_mb:64 applies to classic, classic-planned, pytorch and "
         "pytorch-expandable only; the policy vmm cannot apply it: use --policy with one of "
         "those, or drop the key"},
        {"scrub_on_free:true", "naive",
         "--conf scrub_on_free:true applies to classic, vmm, classic-planned and vmm-planned "
         "only; the policy naive cannot apply it: use --policy with one of those, or drop the "
         "key"},
        {"max_non_split_rounding_mb:64", NULL,
         "--conf max_non_split_rounding_mb:64 applies to classic, classic-planned, pytorch and "
         "pytorch-expandable only; the policy vmm (the one the settings select) cannot apply "
         "it: use --policy with one of those, or drop the key"},
        {"policy:vmm", "pytorch-expandable",
         "--conf policy:vmm applies to classic, vmm, classic-planned and vmm-planned only; the "
         "policy pytorch-expandable cannot apply it: use --policy with one of those, or drop "
         "the key"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const stow_replay_policy_t *p;
        unsigned n;
        char err[256], notes[512] = "";
        const char *names[] = {cases[i].policy};
        cr_assert_eq(resolve(cases[i].conf, names, cases[i].policy ? 1 : 0, &p, &n, err, notes,
                             sizeof notes),
                     STOW_EINVAL, "%s", cases[i].conf);
        cr_assert_str_eq(err, cases[i].want);
    }
}

/* The pool's measured constants are not settings: --conf (stow__replay_load_config)
 * refuses each, naming where docs/decisions.md measures it, before any policy
 * is weighed. */
Test(replay_conf_resolve, a_constant_given_as_a_setting_is_refused)
{
    const char *constants[] = {"quick_depth:8",         "quick_mid_slots:0",
                               "keep_idle_max:0.1",     "reuse_other_streams_on_miss:true",
                               "vmm_slack:0.02",        "vmm_slack_max:0.1",
                               "vmm_small_kb:64",       "vmm_handle_mb:2",
                               "vmm_learn_step:false",  "planned_warmup_steps:3",
                               "planned_headroom:0.5",  "planned_auto:true",
                               "release_idle_on_grow:false"};
    unsetenv("STOWAGE_CONF");
    for (size_t i = 0; i < sizeof constants / sizeof constants[0]; i++) {
        stow_config_t c;
        char err[256] = "";
        cr_assert_eq(stow__replay_load_config(constants[i], &c, err, sizeof err), STOW_EINVAL,
                     "%s", constants[i]);
        cr_assert_not_null(strstr(err, "is not a setting"), "%s: %s", constants[i], err);
        cr_assert_not_null(strstr(err, "docs/decisions.md"), "%s: %s", constants[i], err);
    }
}

/* The constants' two tables agree: every name stow_tuning_key_name gives
 * (the library's, which STOWAGE_CONF refuses naming its heading) has the
 * policies that use it in --tuning's, and is refused as a setting; and every
 * name --tuning takes is one of the library's. */
Test(replay_conf_resolve, every_constant_has_its_policies_in_tuning)
{
    size_t count = 0;
    unsetenv("STOWAGE_CONF");
    for (const char *name; (name = stow_tuning_key_name(count)) != NULL; count++) {
        cr_assert_neq(stow__replay_tuning_groups(name, strlen(name)), 0,
                      "--tuning has no policies for the constant '%s'", name);
        char text[64];
        snprintf(text, sizeof text, "%s:1", name);
        stow_config_t c;
        char err[256] = "";
        cr_assert_eq(stow__replay_load_config(text, &c, err, sizeof err), STOW_EINVAL, "%s", text);
        cr_assert_not_null(strstr(err, "is not a setting"), "%s: %s", text, err);
    }
    cr_assert_eq(count, 13, "the twelve constants of stow_tuning_t and release_idle_on_grow");
    cr_assert_eq(stow__replay_tuning_groups("policy", 6), 0, "a setting has no constant's groups");
    cr_assert_eq(stow__replay_tuning_groups("vmm_slack", 4), 0, "a prefix is not a name");
    cr_assert_null(stow_tuning_key_name(SIZE_MAX));
}

/* Several policies: a key some of them apply runs there, and a note names the
 * others; a key none of them applies is still an error. */
Test(replay_conf_resolve, several_policies_note_those_without_the_key)
{
    const stow_replay_policy_t *p;
    unsigned n;
    char err[256], notes[512] = "";
    const char *names[] = {"vmm", "pytorch-expandable", "ideal-remap"};
    cr_assert_eq(resolve("scrub_on_free:true", names, 3, &p, &n, err, notes, sizeof notes),
                 STOW_OK, "%s", err);
    cr_assert_eq(n, 3);
    cr_assert_str_eq(notes, "who: note: --conf scrub_on_free:true does not apply to "
                            "pytorch-expandable and ideal-remap, which run without it\n");
    notes[0] = 0;
    cr_assert_eq(resolve("expandable_segments:True", names, 3, &p, &n, err, notes, sizeof notes),
                 STOW_OK, "%s", err);
    cr_assert_str_eq(notes, "who: note: --conf expandable_segments:True does not apply to "
                            "ideal-remap, which runs without it\n");
    const char *refs[] = {"naive", "jemalloc"};
    cr_assert_eq(resolve("roundup_power2_divisions:4", refs, 2, &p, &n, err, notes, sizeof notes),
                 STOW_EINVAL);
    cr_assert_str_eq(err, "--conf roundup_power2_divisions:4 applies to classic, vmm, "
                          "classic-planned, vmm-planned, pytorch and pytorch-expandable only, "
                          "none of the policies given: add one of those with --policy, or drop "
                          "the key");
    /* A list value keeps its commas: one key. */
    const char *pt[] = {"pytorch"};
    cr_assert_eq(resolve("roundup_power2_divisions:[256:1,512:2,>:8], max_split_size_mb:64", pt, 1,
                         &p, &n, err, notes, sizeof notes),
                 STOW_OK, "%s", err);
}

Test(replay_conf_resolve, planned_policy_without_markers_gets_a_note)
{
    stow_trace_t *plain = parse_trace(naive_trace);
    stow_trace_t *marked = parse_trace("1 2\nm train\na 0 512 0\nf 0\n");
    stow_config_t c = ts_config(NULL);
    stow_tuning_t autot = ts_tuning("planned_auto:true");
    char buf[512] = "";
    FILE *f = fmemopen(buf, sizeof buf, "w");
    cr_assert(stow__replay_note_no_steps(f, "who", plain, &stow__replay_policy_vmm_planned, &c));
    cr_assert_not(stow__replay_note_no_steps(f, "who", marked, &stow__replay_policy_vmm_planned,
                                             &c));
    cr_assert_not(stow__replay_note_no_steps(f, "who", plain, &stow__replay_policy_vmm, &c));
    /* The constant planned_auto finds the steps without markers (--tuning). */
    stow__replay_set_tuning(&autot);
    bool noted = stow__replay_note_no_steps(f, "who", plain, &stow__replay_policy_classic_planned,
                                            &c);
    stow__replay_set_tuning(NULL);
    cr_assert_not(noted);
    fclose(f);
    cr_assert_str_eq(buf, "who: note: synthetic has no step markers ('m' lines), so vmm-planned "
                          "plans nothing on it: its figures equal vmm's\n");
    stow_trace_free(plain);
    stow_trace_free(marked);
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
    /* The first step (a warm-up, not planned) also takes 16 MiB: the pool alone
     * reached more than the plan's arena needs, which it then pays for
     * (docs/planned.md, what the arena may cost). */
    fprintf(f, "%d %d\n", 6 * 3 + 1, 6 * 6 + 2);
    for (int s = 0; s < 6; s++) {
        fprintf(f, "m train\n");
        if (s == 0)
            fprintf(f, "a %d %d 0\nf %d\n", 6 * 3, 16 << 20, 6 * 3);
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

/* ---- every subcommand of the built CLI: settings, exit statuses, usage ---- */

/* Runs `build/stowage ARGS` (a shell fragment) with STOWAGE_CONF set to
 * env_conf (NULL: unset): standard output in out, standard error in err.
 * Returns the exit status. */
static int cli_exec(const char *env_conf, const char *args, char *out, size_t out_len, char *err,
                    size_t err_len)
{
    char exe[4096], cmd[8192], err_path[] = "/tmp/stow_cli_err_XXXXXX";
    if (!cli_path(exe, sizeof exe))
        cr_skip_test("build/stowage not built");
    int fd = mkstemp(err_path);
    cr_assert_geq(fd, 0);
    close(fd);
    if (env_conf)
        snprintf(cmd, sizeof cmd, "env STOWAGE_CONF='%s' '%s' %s 2>'%s'", env_conf, exe, args,
                 err_path);
    else
        snprintf(cmd, sizeof cmd, "env -u STOWAGE_CONF '%s' %s 2>'%s'", exe, args, err_path);
    FILE *p = popen(cmd, "r");
    cr_assert_not_null(p);
    size_t n = fread(out, 1, out_len - 1, p);
    out[n] = 0;
    int status = pclose(p);
    FILE *e = fopen(err_path, "r");
    cr_assert_not_null(e);
    n = fread(err, 1, err_len - 1, e);
    err[n] = 0;
    fclose(e);
    unlink(err_path);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

static size_t count_lines(const char *s)
{
    size_t n = 0;
    for (; *s; s++)
        n += *s == '\n';
    return n;
}

/* A temporary file holding text; path is a mkstemp template. */
static void temp_with(char *path, const char *text)
{
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    size_t n = strlen(text);
    cr_assert_eq(write(fd, text, n), (ssize_t)n);
    close(fd);
}

/* The (policy NAME) label of each text block and the JSON's policy show the
 * pool the settings picked, from --conf or STOWAGE_CONF. */
Test(cli_settings, conf_and_environment_pick_the_pool_the_label_shows)
{
    char path[] = "/tmp/stow_cli_XXXXXX", args[512], out[16384], err[4096];
    temp_with(path, naive_trace);
    /* planned_auto (--tuning): the planned pools find the steps of this trace
     * without markers, so that no note is written. */
    struct {
        const char *env, *conf, *tuning, *want;
    } cases[] = {
        {NULL, "policy:vmm", NULL, "(policy vmm)"},
        {"policy:vmm", NULL, NULL, "(policy vmm)"},
        {NULL, "expandable_segments:True", NULL, "(policy vmm)"},
        {"expandable_segments:True", NULL, NULL, "(policy vmm)"},
        {NULL, "planned_steps:true", "planned_auto:true", "(policy vmm-planned)"},
        {NULL, "policy:classic,planned_steps:true", "planned_auto:true",
         "(policy classic-planned)"},
        {NULL, "policy:classic", NULL, "(policy classic)"},
        {"expandable_segments:False", NULL, NULL, "(policy classic)"},
        {NULL, NULL, NULL, "(policy vmm)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, "replay --repeats 0 %s%s%s %s%s%s %s",
                 cases[i].conf ? "--conf '" : "", cases[i].conf ? cases[i].conf : "",
                 cases[i].conf ? "'" : "", cases[i].tuning ? "--tuning '" : "",
                 cases[i].tuning ? cases[i].tuning : "", cases[i].tuning ? "'" : "", path);
        cr_assert_eq(cli_exec(cases[i].env, args, out, sizeof out, err, sizeof err), 0,
                     "case %zu: %s", i, err);
        cr_assert_not_null(strstr(out, cases[i].want), "case %zu: %s", i, out);
        cr_assert_str_empty(err, "case %zu", i);
    }
    snprintf(args, sizeof args, "replay --json --repeats 0 %s", path);
    cr_assert_eq(cli_exec("policy:vmm", args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_not_null(strstr(out, "\"policy\": \"vmm\""), "%s", out);
    unlink(path);
}

/* A setting that contradicts --policy, or that no policy given applies, is a
 * usage error naming the key and what to use: nothing is replayed. */
Test(cli_settings, settings_no_policy_applies_exit_2_naming_the_key)
{
    char path[] = "/tmp/stow_cli_XXXXXX", args[512], out[16384], err[4096];
    temp_with(path, naive_trace);
    struct {
        const char *env, *rest, *key, *instead;
    } cases[] = {
        {NULL, "--policy classic --conf policy:vmm", "--conf policy:vmm", "--policy vmm"},
        {"policy:vmm", "--policy classic", "STOWAGE_CONF's policy:vmm", "--policy vmm"},
        {NULL, "--policy classic --conf expandable_segments:True",
         "--conf expandable_segments:True", "--policy vmm"},
        {NULL, "--policy pytorch --conf expandable_segments:True", "expandable_segments:True",
         "--policy pytorch-expandable"},
        {NULL, "--policy all --conf policy:vmm", "--conf policy:vmm", "--policy vmm"},
        {NULL, "--policy vmm --conf max_split_size_mb:64", "max_split_size_mb:64",
         "classic, classic-planned, pytorch and pytorch-expandable"},
        {NULL, "--conf max_split_size_mb:64", "max_split_size_mb:64",
         "classic, classic-planned, pytorch and pytorch-expandable"},
        {NULL, "--policy naive --policy jemalloc --conf scrub_on_free:true",
         "scrub_on_free:true", "classic, vmm"},
        {NULL, "--conf planned_async:true", "planned_async:true", "drop the key"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, "replay --repeats 0 %s %s", cases[i].rest, path);
        cr_assert_eq(cli_exec(cases[i].env, args, out, sizeof out, err, sizeof err), 2,
                     "case %zu: %s", i, out);
        cr_assert_str_empty(out, "case %zu", i);
        cr_assert_eq(count_lines(err), 2, "case %zu: %s", i, err);
        cr_assert_not_null(strstr(err, cases[i].key), "case %zu: %s", i, err);
        cr_assert_not_null(strstr(err, cases[i].instead), "case %zu: %s", i, err);
        cr_assert_not_null(strstr(err, "\nsee 'stowage replay --help'\n"), "case %zu", i);
    }
    /* report and diff apply the same rule to their one policy. */
    snprintf(args, sizeof args, "report %s --json --policy pytorch --conf scrub_on_free:true",
             path);
    cr_assert_eq(cli_exec(NULL, args, out, sizeof out, err, sizeof err), 2);
    cr_assert_not_null(strstr(err, "scrub_on_free:true applies to classic, vmm, classic-planned "
                                   "and vmm-planned only"),
                       "%s", err);
    snprintf(args, sizeof args, "diff %s %s --policy classic", path, path);
    cr_assert_eq(cli_exec("policy:vmm", args, out, sizeof out, err, sizeof err), 2);
    cr_assert_not_null(strstr(err, "STOWAGE_CONF's policy:vmm selects vmm"), "%s", err);
    snprintf(args, sizeof args, "report %s --json", path);
    cr_assert_eq(cli_exec("policy:vmm", args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_not_null(strstr(out, "\"policy\":\"vmm\""), "%s", out);
    unlink(path);
}

/* A key some of the policies apply runs there; one note names the others. */
Test(cli_settings, key_some_policies_apply_gets_a_note)
{
    char path[] = "/tmp/stow_cli_XXXXXX", args[512], out[16384], err[4096];
    temp_with(path, naive_trace);
    snprintf(args, sizeof args,
             "replay --json --repeats 0 --policy classic --policy pytorch --conf record_events:16 "
             "%s",
             path);
    cr_assert_eq(cli_exec(NULL, args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_eq(count_lines(out), 2, "%s", out);
    cr_assert_str_eq(err, "stowage replay: note: --conf record_events:16 does not apply to "
                          "pytorch, which runs without it\n");
    unlink(path);
}

/* The value of "KEY": N in a JSON line. */
static uint64_t json_u64(const char *json, const char *key)
{
    char needle[64];
    snprintf(needle, sizeof needle, "\"%s\": ", key);
    const char *at = strstr(json, needle);
    cr_assert_not_null(at, "no %s in %s", key, json);
    return strtoull(at + strlen(needle), NULL, 10);
}

/* The pool's measured constants go with --tuning and reach the replayed
 * pools: without slack the page-mapped pool remaps granules the default
 * slack lets it create, and holds less at its peak. */
Test(cli_settings, tuning_sets_the_constants_of_the_replayed_pools)
{
    char trace[4096], args[8192], base[16384], out[16384], err[4096];
    cr_assert_not_null(ts_shared_trace("resnet50_train.rep", trace, sizeof trace));
    snprintf(args, sizeof args, "replay --json --repeats 0 --policy vmm '%s'", trace);
    cr_assert_eq(cli_exec(NULL, args, base, sizeof base, err, sizeof err), 0, "%s", err);
    snprintf(args, sizeof args, "replay --json --repeats 0 --policy vmm --tuning vmm_slack:0 '%s'",
             trace);
    cr_assert_eq(cli_exec(NULL, args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_str_empty(err);
    cr_assert_eq(count_lines(out), 1, "%s", out);
    cr_assert_eq(json_u64(out, "peak_live_bytes"), json_u64(base, "peak_live_bytes"));
    cr_assert_lt(json_u64(out, "peak_reserved_bytes"), json_u64(base, "peak_reserved_bytes"),
                 "vmm_slack:0: %s\ndefault: %s", out, base);
    cr_assert_gt(json_u64(out, "unmap_calls"), json_u64(base, "unmap_calls"),
                 "vmm_slack:0: %s\ndefault: %s", out, base);
    /* The defaults given by name are the defaults. */
    snprintf(args, sizeof args,
             "replay --json --repeats 0 --policy vmm --tuning vmm_slack:0.0095,vmm_handle_mb:20 "
             "'%s'",
             trace);
    cr_assert_eq(cli_exec(NULL, args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(out, base);
}

/* A key --tuning does not know, a bad value, a setting given with --tuning, a
 * constant that no policy given uses, or a constant given with --conf (a
 * setting's option) is a usage error, two lines, with nothing replayed;
 * --conf names where docs/decisions.md measures the constant. */
Test(cli_settings, bad_tuning_and_constants_in_conf_exit_2)
{
    char path[] = "/tmp/stow_cli_XXXXXX", args[512], out[16384], err[4096];
    temp_with(path, naive_trace);
    struct {
        const char *rest, *want;
    } cases[] = {
        {"--tuning bogus:1", "stowage replay: --tuning: unknown key 'bogus'\n"},
        {"--tuning vmm_slack:2", "stowage replay: --tuning: key 'vmm_slack'"},
        {"--tuning quick_depth:256", "stowage replay: --tuning: key 'quick_depth'"},
        {"--tuning policy:classic",
         "stowage replay: --tuning takes the pools' constants (stowage/tuning.h); 'policy' is a "
         "setting: give it in --conf\n"},
        {"--policy vmm --tuning quick_mid_slots:0",
         "stowage replay: --tuning quick_mid_slots: no policy given uses it (classic and "
         "classic-planned)"},
        {"--policy classic --tuning vmm_slack:0",
         "stowage replay: --tuning vmm_slack: no policy given uses it (vmm and vmm-planned)"},
        {"--policy vmm --tuning planned_headroom:0.5", "--tuning planned_headroom: no policy"},
        {"--policy pytorch --tuning quick_depth:0", "--tuning quick_depth: no policy given uses it"},
        {"--conf quick_depth:0",
         "stowage replay: key 'quick_depth' is not a setting: it is one of the pool's measured "
         "constants (docs/decisions.md, \"Quick lists\")"},
        {"--conf vmm_slack:0", "(docs/decisions.md, \"vmm_slack 0.0095\")"},
        {"--conf policy:vmm,planned_auto:true",
         "(docs/decisions.md, \"planned_steps and planned_auto false\")"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        snprintf(args, sizeof args, "replay --repeats 0 %s %s", cases[i].rest, path);
        cr_assert_eq(cli_exec(NULL, args, out, sizeof out, err, sizeof err), 2, "%s: %s",
                     cases[i].rest, err);
        cr_assert_str_empty(out, "%s", cases[i].rest);
        cr_assert_eq(count_lines(err), 2, "%s: %s", cases[i].rest, err);
        cr_assert_not_null(strstr(err, cases[i].want), "%s: %s", cases[i].rest, err);
        cr_assert_not_null(strstr(err, "\nsee 'stowage replay --help'\n"), "%s", cases[i].rest);
    }
    unlink(path);
}

/* classic-planned on a trace with no step markers: one note, and classic's
 * figures. */
Test(cli_settings, planned_policy_without_markers_says_it_plans_nothing)
{
    char path[] = "/tmp/stow_cli_XXXXXX", args[512], out[16384], err[4096], base[16384];
    temp_with(path, churn_trace);
    snprintf(args, sizeof args, "replay --json --repeats 0 --policy classic %s", path);
    cr_assert_eq(cli_exec(NULL, args, base, sizeof base, err, sizeof err), 0, "%s", err);
    snprintf(args, sizeof args, "replay --json --repeats 0 --policy classic-planned %s", path);
    cr_assert_eq(cli_exec(NULL, args, out, sizeof out, err, sizeof err), 0, "%s", err);
    char want[1024];
    snprintf(want, sizeof want,
             "stowage replay: note: %s has no step markers ('m' lines), so classic-planned plans "
             "nothing on it: its figures equal classic's\n",
             path);
    cr_assert_str_eq(err, want);
    const char *key = "\"peak_reserved_bytes\": ";
    const char *a = strstr(base, key), *b = strstr(out, key);
    cr_assert(a && b);
    cr_assert_eq(strtoull(a + strlen(key), NULL, 10), strtoull(b + strlen(key), NULL, 10));
    /* The same through the settings. */
    snprintf(args, sizeof args, "replay --repeats 0 --conf policy:classic,planned_steps:true %s",
             path);
    cr_assert_eq(cli_exec(NULL, args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(err, want);
    unlink(path);
}

/* OOM errors fail the replay (exit 1, one line naming the policy and the
 * count) unless --allow-oom accepts them; --min-capacity is unaffected. */
Test(cli_settings, oom_exits_1_unless_allow_oom)
{
    char path[] = "/tmp/stow_cli_XXXXXX", args[512], out[16384], err[4096], want[1024];
    temp_with(path, naive_trace);
    snprintf(args, sizeof args, "replay --repeats 0 --policy naive --capacity 6M %s", path);
    cr_assert_eq(cli_exec(NULL, args, out, sizeof out, err, sizeof err), 1, "%s", err);
    cr_assert_not_null(strstr(out, "OOM errors             1\n"), "%s", out);
    snprintf(want, sizeof want,
             "stowage replay: %s: 1 out-of-memory error under policy naive on a 6291456-byte "
             "device; --allow-oom accepts them\n",
             path);
    cr_assert_str_eq(err, want);
    snprintf(args, sizeof args,
             "replay --repeats 0 --policy naive --capacity 6M --allow-oom --json %s", path);
    cr_assert_eq(cli_exec(NULL, args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_not_null(strstr(out, "\"ooms\": 1"), "%s", out);
    snprintf(args, sizeof args, "replay --repeats 0 --policy all --min-capacity %s", path);
    cr_assert_eq(cli_exec(NULL, args, out, sizeof out, err, sizeof err), 0, "%s", err);
    snprintf(args, sizeof args, "replay --repeats 0 --policy naive --capacity 8M %s", path);
    cr_assert_eq(cli_exec(NULL, args, out, sizeof out, err, sizeof err), 0, "%s", err);
    unlink(path);
}

/* Options a policy cannot use: an error when no policy of the run can, a note
 * for the others. */
Test(cli_settings, options_the_policies_cannot_use)
{
    char path[] = "/tmp/stow_cli_XXXXXX", args[512], out[16384], err[4096];
    temp_with(path, naive_trace);
    const char *bad[] = {
        "replay --summary --policy pytorch",
        "replay --capacity 1G --policy jemalloc",
        "replay --min-capacity --policy jemalloc",
        "replay --conf policy:vmm --conf policy:classic",
        "replay --tuning quick_depth:1 --tuning quick_depth:2",
        "report --json --bars 10",
        "report --growth --tags /dev/null",
        "report --iterations 2 --boundary 1",
        "report --policy jemalloc --capacity 1G",
        "diff --policy jemalloc --min-capacity",
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        /* diff takes the trace twice. */
        snprintf(args, sizeof args, "%s %s%s%s", bad[i], path, bad[i][0] == 'd' ? " " : "",
                 bad[i][0] == 'd' ? path : "");
        cr_assert_eq(cli_exec(NULL, args, out, sizeof out, err, sizeof err), 2, "%s: %s", bad[i],
                     err);
        cr_assert_eq(count_lines(err), 2, "%s: %s", bad[i], err);
    }
    snprintf(args, sizeof args, "replay --json --repeats 0 --capacity 1G --policy classic "
                                "--policy jemalloc %s",
             path);
    cr_assert_eq(cli_exec(NULL, args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(err, "stowage replay: note: jemalloc runs on host memory, without "
                          "--capacity\n");
    unlink(path);
}

/* Every usage error of every subcommand is one line saying what is wrong and
 * one pointing at its --help; nothing on standard output. */
Test(cli_usage, usage_errors_are_two_lines)
{
    struct {
        const char *args, *cmd, *what;
    } cases[] = {
        {"", "", "no command given"},
        {"frobnicate", "", "unknown command 'frobnicate'"},
        {"replay", "replay", "no trace given"},
        {"replay --bogus t.rep", "replay", "unknown option '--bogus'"},
        {"replay --policy", "replay", "needs a value"},
        {"replay --conf nokey t.rep", "replay", "'nokey' is not key:value"},
        {"plan", "plan", "no input"},
        {"plan --capacity x f.csv", "plan", "--capacity: 'x' is not a byte count"},
        {"plan a.csv b.csv", "plan", "one input only"},
        {"plan --seed", "plan", "needs a value"},
        {"plan --time-limit 1 --time-limit 2 f.csv", "plan", "--time-limit given twice"},
        {"peak", "peak", "no FILE given"},
        {"peak --alpha -1 f", "peak", "--alpha: '-1'"},
        {"peak --nope f", "peak", "unknown option '--nope'"},
        {"report", "report", "no trace given"},
        {"report t.rep --bars 0", "report", "--bars: bad value '0'"},
        {"report t.rep -o", "report", "needs a value"},
        {"report t.rep --policy nope", "report", "unknown policy 'nope'"},
        {"diff a.rep", "diff", "two traces needed"},
        {"diff a b c", "diff", "two traces only"},
        {"diff a b --threshold x", "diff", "--threshold: 'x'"},
        {"import", "import", "give a format and an input"},
        {"import rmm in.csv", "import", "no output"},
        {"import csv in.csv -o x.rep", "import", "unknown format 'csv'"},
        {"import rmm in.csv -o a -o b", "import", "-o given twice"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char out[16384], err[4096], want[256];
        cr_assert_eq(cli_exec(NULL, cases[i].args, out, sizeof out, err, sizeof err), 2, "'%s'",
                     cases[i].args);
        cr_assert_str_empty(out, "'%s'", cases[i].args);
        cr_assert_eq(count_lines(err), 2, "'%s': %s", cases[i].args, err);
        snprintf(want, sizeof want, "stowage%s%s: ", *cases[i].cmd ? " " : "", cases[i].cmd);
        cr_assert_eq(strncmp(err, want, strlen(want)), 0, "'%s': %s", cases[i].args, err);
        cr_assert_not_null(strstr(err, cases[i].what), "'%s': %s", cases[i].args, err);
        snprintf(want, sizeof want, "\nsee 'stowage%s%s --help'\n", *cases[i].cmd ? " " : "",
                 cases[i].cmd);
        cr_assert_not_null(strstr(err, want), "'%s': %s", cases[i].args, err);
    }
}

/* --help prints the whole help, with its exit statuses, to standard output
 * and exits 0. */
Test(cli_usage, help_is_whole_on_stdout)
{
    const char *cmds[] = {"", "replay", "plan", "peak", "report", "diff", "import"};
    for (size_t i = 0; i < sizeof cmds / sizeof cmds[0]; i++) {
        char args[64], out[16384], err[4096];
        snprintf(args, sizeof args, "%s --help", cmds[i]);
        cr_assert_eq(cli_exec(NULL, args, out, sizeof out, err, sizeof err), 0, "%s", cmds[i]);
        cr_assert_str_empty(err, "%s", cmds[i]);
        cr_assert_not_null(strstr(out, "usage: stowage"), "%s", cmds[i]);
        cr_assert(strstr(out, "xit status") || strstr(out, "exit 0"), "%s: %s", cmds[i], out);
        cr_assert_gt(count_lines(out), 4, "%s", cmds[i]);
    }
}

/* The exit statuses each --help states: 0, 1 and 2 where it names them. */
Test(cli_usage, exit_statuses_are_those_help_states)
{
    char small[] = "/tmp/stow_cli_XXXXXX", large[] = "/tmp/stow_cli_XXXXXX";
    char leak[] = "/tmp/stow_cli_XXXXXX", csv[] = "/tmp/stow_cli_XXXXXX";
    char sched[] = "/tmp/stow_cli_XXXXXX", rmm[] = "/tmp/stow_cli_XXXXXX";
    char bad[] = "/tmp/stow_cli_XXXXXX", rep[] = "/tmp/stow_cli_XXXXXX";
    temp_with(small, "1 2\na 0 1048576 0\nf 0\n");
    temp_with(large, "1 2\na 0 3145728 0\nf 0\n");
    char text[2048] = "16 24\n";
    for (int i = 0; i < 8; i++)
        snprintf(text + strlen(text), sizeof text - strlen(text),
                 "a %d 1048576 0\nf %d\na %d 4096 0\n", 2 * i, 2 * i, 2 * i + 1);
    temp_with(leak, text);
    temp_with(csv, "id,lower,upper,size\na,0,4,100\nb,1,5,100\n");
    temp_with(sched, "tensor a 10\ntensor b 20\nop x - a\nop y a b\n");
    temp_with(rmm, "Thread,Time,Action,Pointer,Size,Stream\n1,t,allocate,0x10,64,0\n"
                   "1,t,free,0x10,64,0\n");
    temp_with(bad, "1 1\na 0 -5 0\n");
    temp_with(rep, "");
    struct {
        const char *fmt;
        int want;
    } cases[] = {
        {"replay --repeats 0 %1$s", 0},
        {"replay --repeats 0 --capacity 2M %2$s", 1},
        {"replay --repeats 0 --capacity 2M --allow-oom %2$s", 0},
        {"replay %5$s", 2},
        {"plan %3$s", 0},
        {"plan --capacity 150 --time-limit 0 %3$s", 1},
        {"plan %5$s", 2},
        {"peak %4$s", 0},
        {"peak --capacity 35 %4$s", 1},
        {"peak --capacity 1K %4$s", 0},
        {"peak %5$s", 2},
        {"diff %1$s %1$s", 0},
        {"diff %1$s %2$s", 1},
        {"diff %1$s %5$s", 2},
        {"report %1$s --json", 0},
        {"report %6$s --growth --iterations 8", 1},
        {"report %5$s --json", 2},
        {"import rmm %7$s -o %8$s", 0},
        {"import rmm %5$s -o %8$s", 2},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char args[1024], out[65536], err[4096];
        snprintf(args, sizeof args, cases[i].fmt, small, large, csv, sched, bad, leak, rmm, rep);
        cr_assert_eq(cli_exec(NULL, args, out, sizeof out, err, sizeof err), cases[i].want,
                     "'%s': %s", args, err);
    }
    const char *files[] = {small, large, leak, csv, sched, rmm, bad, rep};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        unlink(files[i]);
}

/* '-' is standard output for every file a command writes; plan without -o
 * prints its offsets after the summary. */
Test(cli_output, dash_is_standard_output)
{
    char csv[] = "/tmp/stow_cli_XXXXXX", trace[] = "/tmp/stow_cli_XXXXXX";
    char rmm[] = "/tmp/stow_cli_XXXXXX", args[512], out[65536], err[4096];
    temp_with(csv, "id,lower,upper,size\nconv1.out,0,4,100\nb,1,5,200\n");
    temp_with(trace, naive_trace);
    temp_with(rmm, "Thread,Time,Action,Pointer,Size,Stream\n1,t,allocate,0x10,64,0\n"
                   "1,t,free,0x10,64,0\n");

    snprintf(args, sizeof args, "plan -o - %s", csv);
    cr_assert_eq(cli_exec(NULL, args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(out, "id,lower,upper,size,offset\nconv1.out,0,4,100,200\nb,1,5,200,0\n");
    cr_assert_not_null(strstr(err, "validator:    valid\n"), "%s", err);
    cr_assert_not_null(strstr(err, "plan written: standard output\n"), "%s", err);

    snprintf(args, sizeof args, "plan %s", csv);
    cr_assert_eq(cli_exec(NULL, args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_str_empty(err);
    const char *table = strstr(out, "\nid ");
    cr_assert_not_null(table, "%s", out);
    cr_assert_not_null(strstr(table, "lower"));
    cr_assert_not_null(strstr(table, " offset\n"), "%s", table);
    cr_assert_not_null(strstr(table, "\nconv1.out "), "%s", table);
    cr_assert_not_null(strstr(table, " 200\nb "), "%s", table);

    snprintf(args, sizeof args, "plan --json %s", csv);
    cr_assert_eq(cli_exec(NULL, args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_eq(count_lines(out), 1, "%s", out);
    snprintf(args, sizeof args, "plan --json -o - %s", csv);
    cr_assert_eq(cli_exec(NULL, args, out, sizeof out, err, sizeof err), 2);

    bool dash_file = access("-", F_OK) == 0;
    snprintf(args, sizeof args, "report %s -o -", trace);
    cr_assert_eq(cli_exec(NULL, args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_eq(strncmp(out, "<!DOCTYPE html>", 15), 0, "%.40s", out);
    cr_assert_str_empty(err);
    cr_assert(dash_file || access("-", F_OK) != 0, "no file named '-'");

    snprintf(args, sizeof args, "import rmm %s -o -", rmm);
    cr_assert_eq(cli_exec(NULL, args, out, sizeof out, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(out, "1 2\na 0 64 0\nf 0\n");
    cr_assert_not_null(strstr(err, "wrote standard output: 1 allocations"), "%s", err);
    unlink(csv);
    unlink(trace);
    unlink(rmm);
}

/* Trace errors through the CLI: one line each, exit 2. */
Test(cli_output, trace_errors_are_sentences)
{
    char dir[] = "/tmp/stow_cli_dir_XXXXXX", empty[] = "/tmp/stow_cli_XXXXXX";
    char args[512], out[4096], err[4096], want[600];
    cr_assert_not_null(mkdtemp(dir));
    temp_with(empty, "");
    snprintf(args, sizeof args, "replay %s", dir);
    cr_assert_eq(cli_exec(NULL, args, out, sizeof out, err, sizeof err), 2);
    snprintf(want, sizeof want, "stowage replay: %s: is a directory, not a trace file\n", dir);
    cr_assert_str_eq(err, want);
    snprintf(args, sizeof args, "replay %s", empty);
    cr_assert_eq(cli_exec(NULL, args, out, sizeof out, err, sizeof err), 2);
    snprintf(want, sizeof want,
             "stowage replay: %s: the file is empty; a trace starts with the header '<number of "
             "ids> <number of events>'\n",
             empty);
    cr_assert_str_eq(err, want);
    rmdir(dir);
    unlink(empty);
}
