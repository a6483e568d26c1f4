/*
 * tests/fuzz/fuzz_config.c: libFuzzer target for stow_config_parse
 * (docs/reliability.md).
 *
 * Any text: the parser never crashes; STOW_OK only when the result is a valid
 * configuration (the rules of stowage.h, checked here, and stow_pool_create
 * accepts it: STOW_OK, or STOW_ENOSYS for policy vmm where unsupported); on error the config is
 * byte-for-byte unchanged and the message is NUL-terminated and non-empty.
 * Parsing is deterministic and does not depend on the starting config beyond
 * the keys the text does not name.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stowage.h"
#include "tests/fuzz/fuzz_check.h"


#define FC_MIB ((size_t)1 << 20)

static unsigned long long fc_inputs, fc_accepted;
static stow_backend_t *fc_sim;

static void fc_report(void)
{
    fprintf(stderr, "fuzz_config totals: inputs=%llu accepted=%llu\n", fc_inputs, fc_accepted);
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

static void fc_check_valid(const stow_config_t *c, const char *text)
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
    /* The default simulated device holds 2^46 bytes; a fraction leaving less
     * than one 2 MiB granule is refused at creation (stow_pool_create). */
    double limit = c->memory_fraction >= 1.0 ? 0x1p46 : c->memory_fraction * 0x1p46;
    bool usable = (size_t)limit >= 2 * FC_MIB;
    stow_pool_t *pool = NULL;
    stow_status_t st = stow_pool_create(c, fc_sim, &pool);
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

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    fc_inputs++;
    char *text = malloc(size + 1);
    FUZZ_CHECK(text != NULL, "host memory");
    memcpy(text, data, size);
    text[size] = '\0';

    stow_config_t c, before, again;
    stow_config_default(&c);
    /* A non-default starting point: keys not named must keep these values. */
    if (size && (data[0] & 1)) {
        c.memory_fraction = 0.5;
        c.release_idle_on_grow = false;
        c.reuse_other_streams_on_miss = true;
    }
    before = c;
    char err[96];
    memset(err, 'x', sizeof err);
    stow_status_t st = stow_config_parse(&c, text, err, sizeof err);
    if (st == STOW_OK) {
        fc_accepted++;
        fc_check_valid(&c, text);
        again = before;
        FUZZ_CHECK(stow_config_parse(&again, text, NULL, 0) == STOW_OK, "not deterministic");
        FUZZ_CHECK(memcmp(&again, &c, sizeof c) == 0, "not deterministic: %s", text);
    } else {
        FUZZ_CHECK(st == STOW_EINVAL || st == STOW_EHOSTMEM, "status %d", (int)st);
        FUZZ_CHECK(memcmp(&before, &c, sizeof c) == 0, "config changed on error: %s", text);
        FUZZ_CHECK(memchr(err, '\0', sizeof err) != NULL && err[0] != '\0',
                 "error message empty or not terminated");
        again = before;
        char tiny[1];
        FUZZ_CHECK(stow_config_parse(&again, text, tiny, sizeof tiny) == st && tiny[0] == '\0',
                 "tiny error buffer");
        FUZZ_CHECK(memcmp(&before, &again, sizeof c) == 0, "config changed on error");
    }
    free(text);
    return 0;
}
