/*
 * tests/fuzz/fuzz_config.c: libFuzzer target for the two parsers of
 * "key:value,..." text (docs/reliability.md): stow_config_parse (the
 * settings, STOWAGE_CONF's) and stow_tuning_parse (the measured constants of
 * stowage/tuning.h, and the settings too when it is given a config).
 *
 * Any text, through stow_config_parse, through stow_tuning_parse with a config
 * and through stow_tuning_parse without one: the parser never crashes; STOW_OK
 * only when the result is valid (the rules of stowage.h and stowage/tuning.h,
 * checked here, and stow_pool_create_tuned accepts it: STOW_OK, or STOW_EINVAL
 * for a memory fraction that leaves less than a granule); on error the config
 * and the tuning are byte-for-byte unchanged and the message is NUL-terminated
 * and non-empty. Parsing is deterministic and does not depend on the starting
 * values beyond the keys the text does not name. Between the parsers: a text
 * stow_config_parse accepts, stow_tuning_parse with a config accepts, to the
 * same config and with no constant changed; a text stow_tuning_parse accepts
 * without a config, it accepts with one, to the same constants and with no
 * setting changed; a text stow_config_parse refuses for naming a constant
 * names the heading of docs/decisions.md that measures it.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stowage.h"
#include "tests/fuzz/fuzz_check.h"


#define FC_MIB ((size_t)1 << 20)

static unsigned long long fc_inputs, fc_accepted, fc_accepted_tuning;
static stow_backend_t *fc_sim;

static void fc_report(void)
{
    fprintf(stderr, "fuzz_config totals: inputs=%llu accepted=%llu accepted_tuning=%llu\n",
            fc_inputs, fc_accepted, fc_accepted_tuning);
    stow_sim_destroy(fc_sim);
}

int LLVMFuzzerInitialize(int *argc, char ***argv);
int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    FUZZ_CHECK(stow_sim_create(NULL, &fc_sim) == STOW_OK, "sim");
    atexit(fc_report);
    return 0;
}

static void fc_check_tuning(const stow_tuning_t *t, const char *text)
{
    FUZZ_CHECK(t->quick_depth <= STOW_QUICK_DEPTH_MAX, "quick_depth %u: %s", t->quick_depth,
               text);
    FUZZ_CHECK(t->quick_mid_slots <= STOW_QUICK_MID_SLOTS_MAX, "quick_mid_slots %u: %s",
               t->quick_mid_slots, text);
    FUZZ_CHECK(t->keep_idle_max >= 0.0 && t->keep_idle_max <= 1.0, "keep_idle_max %g: %s",
               t->keep_idle_max, text);
    FUZZ_CHECK(t->vmm_slack >= 0.0 && t->vmm_slack <= 1.0, "vmm_slack %g: %s", t->vmm_slack,
               text);
    FUZZ_CHECK(t->vmm_slack_max >= 0.0 && t->vmm_slack_max <= 1.0, "vmm_slack_max %g: %s",
               t->vmm_slack_max, text);
    FUZZ_CHECK(t->vmm_small_kb <= 1024, "vmm_small_kb %u: %s", t->vmm_small_kb, text);
    FUZZ_CHECK(t->vmm_handle_mb <= STOW_VMM_HANDLE_MB_MAX, "vmm_handle_mb %u: %s",
               t->vmm_handle_mb, text);
    FUZZ_CHECK(t->planned_warmup_steps <= STOW_PLANNED_WARMUP_MAX, "planned_warmup_steps %u: %s",
               t->planned_warmup_steps, text);
    FUZZ_CHECK(t->planned_headroom >= 0.0 && t->planned_headroom <= 1.0,
               "planned_headroom %g: %s", t->planned_headroom, text);
}

/* An accepted config (and tuning, NULL: the defaults): valid, and a pool of
 * them is created and serves. */
static void fc_check_valid(const stow_config_t *c, const stow_tuning_t *t, const char *text)
{
    FUZZ_CHECK(c->policy == STOW_POLICY_CLASSIC || c->policy == STOW_POLICY_VMM ||
                   c->policy == STOW_POLICY_AUTO,
               "policy: %s", text);
    FUZZ_CHECK(c->max_split_size_bytes >= 20 * FC_MIB, "max_split_size: %s", text);
    FUZZ_CHECK(c->garbage_collection_threshold >= 0.0 && c->garbage_collection_threshold < 1.0,
             "gc threshold %g: %s", c->garbage_collection_threshold, text);
    FUZZ_CHECK(c->memory_fraction > 0.0 && c->memory_fraction <= 1.0, "fraction %g: %s",
             c->memory_fraction, text);
    FUZZ_CHECK(c->record_events <= STOW_RECORD_EVENTS_MAX, "record_events %zu: %s",
             c->record_events, text);
    for (int i = 0; i < STOW_ROUNDUP_INTERVALS; i++) {
        unsigned d = c->roundup_power2_divisions[i];
        FUZZ_CHECK((d & (d - 1)) == 0 && d <= 1024, "divisions[%d] = %u: %s", i, d, text);
    }
    if (t)
        fc_check_tuning(t, text);
    /* The default simulated device holds 2^46 bytes; a fraction leaving less
     * than one 2 MiB granule is refused at creation (stow_pool_create). */
    double limit = c->memory_fraction >= 1.0 ? 0x1p46 : c->memory_fraction * 0x1p46;
    bool usable = (size_t)limit >= 2 * FC_MIB;
    stow_pool_t *pool = NULL;
    stow_status_t st = stow_pool_create_tuned(c, t, fc_sim, &pool);
    FUZZ_CHECK(usable ? st == STOW_OK : st == STOW_EINVAL,
             "pool_create of an accepted config: %s: %s", stow_strerror(st), text);
    if (pool) {
        /* 3 MiB + 1 needs at least a 4 MiB segment (the exact-size fallback). */
        stow_stats_t s;
        FUZZ_CHECK(stow_pool_stats(pool, &s) == STOW_OK, "stats");
        void *p = NULL;
        st = stow_pool_alloc(pool, 3 * FC_MIB + 1, NULL, &p);
        FUZZ_CHECK(s.limit_bytes >= 4 * FC_MIB ? st == STOW_OK : st == STOW_ENOMEM,
                 "alloc with an accepted config (limit %llu): %s: %s",
                 (unsigned long long)s.limit_bytes, stow_strerror(st), text);
        if (st != STOW_OK)
            p = NULL;
        FUZZ_CHECK(!p || stow_pool_free(pool, p) == STOW_OK, "free");
        FUZZ_CHECK(stow_pool_destroy(pool) == STOW_OK, "destroy");
    }
}

/* stow_config_parse when tuning is NULL, else stow_tuning_parse (config NULL:
 * the constants alone). */
static stow_status_t fc_parse(stow_config_t *config, stow_tuning_t *tuning, const char *text,
                              char *err, size_t err_len)
{
    return tuning ? stow_tuning_parse(config, tuning, text, err, err_len)
                  : stow_config_parse(config, text, err, err_len);
}

static bool fc_same(const stow_config_t *a, const stow_config_t *b, const stow_tuning_t *ta,
                    const stow_tuning_t *tb)
{
    return (!a || memcmp(a, b, sizeof *a) == 0) && (!ta || memcmp(ta, tb, sizeof *ta) == 0);
}

/* One parser on text, over the values *c and *t hold (either may be NULL, not
 * both): the checks of every parse. Returns its status. */
static stow_status_t fc_one(stow_config_t *c, stow_tuning_t *t, const char *text)
{
    stow_config_t before = {0}, again = {0};
    stow_tuning_t tbefore = {0}, tagain = {0};
    if (c)
        before = *c;
    if (t)
        tbefore = *t;
    char err[96];
    memset(err, 'x', sizeof err);
    stow_status_t st = fc_parse(c, t, text, err, sizeof err);
    if (st == STOW_OK) {
        stow_config_t defaults;
        stow_config_default(&defaults);
        fc_check_valid(c ? c : &defaults, t, text);
        if (c)
            again = before;
        if (t)
            tagain = tbefore;
        FUZZ_CHECK(fc_parse(c ? &again : NULL, t ? &tagain : NULL, text, NULL, 0) == STOW_OK,
                   "not deterministic");
        FUZZ_CHECK(fc_same(c, &again, t, &tagain), "not deterministic: %s", text);
    } else {
        FUZZ_CHECK(st == STOW_EINVAL || st == STOW_EHOSTMEM, "status %d", (int)st);
        FUZZ_CHECK(fc_same(c, &before, t, &tbefore), "changed on error: %s", text);
        FUZZ_CHECK(memchr(err, '\0', sizeof err) != NULL && err[0] != '\0',
                 "error message empty or not terminated");
        if (c)
            again = before;
        if (t)
            tagain = tbefore;
        char tiny[1];
        FUZZ_CHECK(fc_parse(c ? &again : NULL, t ? &tagain : NULL, text, tiny, sizeof tiny) ==
                           st &&
                       tiny[0] == '\0',
                   "tiny error buffer");
        FUZZ_CHECK(fc_same(c, &before, t, &tbefore), "changed on error");
    }
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fc_inputs++;
    char *text = malloc(size + 1);
    FUZZ_CHECK(text != NULL, "host memory");
    memcpy(text, data, size);
    text[size] = '\0';

    stow_config_t start;
    stow_config_default(&start);
    stow_tuning_t tstart;
    stow_tuning_default(&tstart);
    /* A non-default starting point: keys not named must keep these values. */
    if (size && (data[0] & 1)) {
        start.memory_fraction = 0.5;
        start.release_idle_on_grow = false;
        tstart.reuse_other_streams_on_miss = true;
        tstart.quick_depth = 3;
        tstart.vmm_slack = 0.02;
    }

    /* The settings alone. */
    stow_config_t c = start;
    stow_status_t st = fc_one(&c, NULL, text);
    fc_accepted += st == STOW_OK;
    if (st == STOW_EINVAL) {
        char err[512];
        stow_config_t scratch = start;
        FUZZ_CHECK(stow_config_parse(&scratch, text, err, sizeof err) == STOW_EINVAL,
                   "not deterministic");
        /* A refused constant's message is "key 'NAME' is not a setting: ..."
         * (a key of the text echoed inside another message does not count). */
        const char *refusal = "' is not a setting: it is one of the pool's measured constants";
        const char *at = strstr(err, refusal);
        bool constant_refused =
            !strncmp(err, "key '", 5) && at && !memchr(err + 5, '\'', (size_t)(at - err - 5));
        FUZZ_CHECK(!constant_refused || strstr(at, "(docs/decisions.md, \""),
                   "a constant refused without its measurement: %s", err);
    }

    /* The settings and the constants. */
    stow_config_t cb = start;
    stow_tuning_t tb = tstart;
    stow_status_t st_both = fc_one(&cb, &tb, text);
    fc_accepted_tuning += st_both == STOW_OK;
    if (st == STOW_OK)
        FUZZ_CHECK(st_both == STOW_OK && fc_same(&cb, &c, &tb, &tstart),
                   "stow_tuning_parse with a config differs from stow_config_parse: %s", text);

    /* The constants alone. */
    stow_tuning_t t = tstart;
    if (fc_one(NULL, &t, text) == STOW_OK)
        FUZZ_CHECK(st_both == STOW_OK && fc_same(&cb, &start, &tb, &t),
                   "stow_tuning_parse differs with a config and without: %s", text);
    free(text);
    return 0;
}
