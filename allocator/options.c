/*
 * allocator/options.c: stow_config_t defaults and the STOWAGE_CONF parser
 * (PyTorch's "key:value,key:value" syntax, so users can carry their
 * PYTORCH_CUDA_ALLOC_CONF settings over), and the measured constants of
 * stowage/tuning.h with their parser (the benchmarks' and tests').
 *
 * Parsing works on a copy and commits only when every key was valid: a bad
 * setting never half-applies.
 */
#include "allocator/options.h"
#include "allocator/types.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIB ((size_t)1 << 20)
#define KEY_MAX 64
#define VALUE_MAX 256
/* apply_key and apply_tuning_key: the key is not one of theirs. */
#define KEY_NOT_HERE STOW_STATUS_COUNT_

void stow_config_default(stow_config_t *config)
{
    memset(config, 0, sizeof *config);
    config->policy = STOW_POLICY_AUTO;
    config->max_split_size_bytes = SIZE_MAX;
    config->max_non_split_rounding_bytes = 20 * MIB;
    config->garbage_collection_threshold = 0.0;
    config->memory_fraction = 1.0;
    config->release_idle_on_grow = false;
    config->planned_async = true;
}

void stow_tuning_default(stow_tuning_t *tuning)
{
    memset(tuning, 0, sizeof *tuning);
    tuning->quick_depth = STOW_QUICK_DEPTH_DEFAULT;
    tuning->quick_mid_slots = STOW_QUICK_MID_SLOTS_MAX;
    tuning->keep_idle_max = 0.05;
    tuning->vmm_slack = 0.0095;
    tuning->vmm_slack_max = 0.05;
    tuning->vmm_small_kb = STOW_VMM_SMALL_KB_DEFAULT;
    tuning->vmm_handle_mb = STOW_VMM_HANDLE_MB_DEFAULT;
    tuning->vmm_learn_step = true;
    tuning->planned_warmup_steps = 1;
}

static stow_status_t fail(char *err, size_t err_len, const char *fmt, ...)
{
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return STOW_EINVAL;
}

static bool is_pow2_or_zero(unsigned long v) { return (v & (v - 1)) == 0; }

stow_status_t stow__config_validate(const stow_config_t *c, char *err, size_t err_len)
{
    if (c->policy != STOW_POLICY_CLASSIC && c->policy != STOW_POLICY_VMM &&
        c->policy != STOW_POLICY_AUTO)
        return fail(err, err_len, "key 'policy': unknown policy %d", (int)c->policy);
    if (c->max_split_size_bytes < 20 * MIB)
        return fail(err, err_len, "key 'max_split_size_mb': must be at least 20 (MiB)");
    if (c->max_non_split_rounding_bytes > ((size_t)1 << 50))
        return fail(err, err_len, "key 'max_non_split_rounding_mb': too large");
    if (!(c->garbage_collection_threshold >= 0.0 && c->garbage_collection_threshold < 1.0))
        return fail(err, err_len, "key 'garbage_collection_threshold': must be in (0, 1)");
    if (!(c->memory_fraction > 0.0 && c->memory_fraction <= 1.0))
        return fail(err, err_len, "key 'per_process_memory_fraction': must be in (0, 1]");
    if (c->record_events > STOW_RECORD_EVENTS_MAX)
        return fail(err, err_len, "key 'record_events': at most %zu events", STOW_RECORD_EVENTS_MAX);
    for (unsigned i = 0; i < STOW_ROUNDUP_INTERVALS; i++)
        if (!is_pow2_or_zero(c->roundup_power2_divisions[i]) ||
            c->roundup_power2_divisions[i] > 1024)
            return fail(err, err_len,
                        "key 'roundup_power2_divisions': each value must be 0 or a power of two "
                        "up to 1024");
    return STOW_OK;
}

stow_status_t stow__tuning_validate(const stow_tuning_t *t, char *err, size_t err_len)
{
    if (!(t->vmm_slack >= 0.0 && t->vmm_slack <= 1.0))
        return fail(err, err_len, "key 'vmm_slack': must be in [0, 1]");
    if (!(t->vmm_slack_max >= 0.0 && t->vmm_slack_max <= 1.0))
        return fail(err, err_len, "key 'vmm_slack_max': must be in [0, 1]");
    if (!(t->keep_idle_max >= 0.0 && t->keep_idle_max <= 1.0))
        return fail(err, err_len, "key 'keep_idle_max': must be in [0, 1]");
    if (!(t->planned_headroom >= 0.0 && t->planned_headroom <= 1.0))
        return fail(err, err_len, "key 'planned_headroom': must be in [0, 1]");
    if (t->planned_warmup_steps > STOW_PLANNED_WARMUP_MAX)
        return fail(err, err_len, "key 'planned_warmup_steps': at most %u",
                    STOW_PLANNED_WARMUP_MAX);
    if (t->vmm_small_kb > STOW_SMALL_REQUEST_KB)
        return fail(err, err_len, "key 'vmm_small_kb': at most %u", STOW_SMALL_REQUEST_KB);
    if (t->vmm_handle_mb > STOW_VMM_HANDLE_MB_MAX)
        return fail(err, err_len, "key 'vmm_handle_mb': at most %u", STOW_VMM_HANDLE_MB_MAX);
    if (t->quick_depth > STOW_QUICK_DEPTH_MAX)
        return fail(err, err_len, "key 'quick_depth': at most %u", STOW_QUICK_DEPTH_MAX);
    if (t->quick_mid_slots > STOW_QUICK_MID_SLOTS_MAX)
        return fail(err, err_len, "key 'quick_mid_slots': at most %u", STOW_QUICK_MID_SLOTS_MAX);
    return STOW_OK;
}

static bool parse_ulong(const char *s, unsigned long long *out)
{
    if (!*s || !isdigit((unsigned char)*s))
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno || *end)
        return false;
    *out = v;
    return true;
}

static bool parse_double(const char *s, double *out)
{
    if (!*s)
        return false;
    errno = 0;
    char *end;
    double v = strtod(s, &end);
    if (errno || *end || !isfinite(v))
        return false;
    *out = v;
    return true;
}

static bool parse_bool(const char *s, bool *out)
{
    if (!strcmp(s, "true") || !strcmp(s, "True") || !strcmp(s, "1")) {
        *out = true;
        return true;
    }
    if (!strcmp(s, "false") || !strcmp(s, "False") || !strcmp(s, "0")) {
        *out = false;
        return true;
    }
    return false;
}

static stow_status_t parse_mb(const char *key, const char *v, size_t *out, char *err,
                              size_t err_len)
{
    unsigned long long mb;
    if (!parse_ulong(v, &mb) || mb > (SIZE_MAX >> 20))
        return fail(err, err_len, "key '%s': '%s' is not a size in MiB", key, v);
    *out = (size_t)mb * MIB;
    return STOW_OK;
}

/* A count from 0 to max (quick_depth, quick_mid_slots). */
static stow_status_t parse_count(const char *key, const char *v, unsigned max, unsigned *out,
                                 char *err, size_t err_len)
{
    unsigned long long n;
    if (!parse_ulong(v, &n) || n > max)
        return fail(err, err_len, "key '%s': '%s' is not a count up to %u", key, v, max);
    *out = (unsigned)n;
    return STOW_OK;
}

static void trim(char **s)
{
    while (isspace((unsigned char)**s))
        (*s)++;
    char *e = *s + strlen(*s);
    while (e > *s && isspace((unsigned char)e[-1]))
        *--e = '\0';
}

/* "4" for every interval, or "[256:1,512:2,>:8]": interval sizes in MiB, each
 * setting the divisions from that size up to the next entry. */
static stow_status_t parse_divisions(const char *v, stow_config_t *c, char *err, size_t err_len)
{
    unsigned long long d;
    if (parse_ulong(v, &d)) {
        if (d > 1024 || !is_pow2_or_zero((unsigned long)d))
            return fail(err, err_len,
                        "key 'roundup_power2_divisions': %s is not 0 or a power of two <= 1024",
                        v);
        for (unsigned i = 0; i < STOW_ROUNDUP_INTERVALS; i++)
            c->roundup_power2_divisions[i] = (unsigned)d;
        return STOW_OK;
    }
    size_t n = strlen(v);
    if (n < 2 || v[0] != '[' || v[n - 1] != ']')
        return fail(err, err_len,
                    "key 'roundup_power2_divisions': '%s' is neither a number nor a list "
                    "like [256:1,512:2,>:8]",
                    v);
    char list[VALUE_MAX];
    snprintf(list, sizeof list, "%.*s", (int)(n - 2), v + 1);
    unsigned next_interval = 0;
    unsigned last_value = 0;
    for (char *save = NULL, *item = strtok_r(list, "|", &save); item;
         item = strtok_r(NULL, "|", &save)) {
        trim(&item);
        char *colon = strchr(item, ':');
        unsigned long long val;
        if (!colon || !parse_ulong(colon + 1, &val) || val > 1024 ||
            !is_pow2_or_zero((unsigned long)val))
            return fail(err, err_len, "key 'roundup_power2_divisions': bad entry '%s'", item);
        *colon = '\0';
        trim(&item);
        unsigned upto;
        if (!strcmp(item, ">")) {
            upto = STOW_ROUNDUP_INTERVALS;
        } else {
            unsigned long long mb;
            if (!parse_ulong(item, &mb) || mb == 0 || (mb & (mb - 1)))
                return fail(err, err_len,
                            "key 'roundup_power2_divisions': interval '%s' is not a power of "
                            "two (MiB)",
                            item);
            unsigned lg = 0;
            while (((unsigned long long)1 << lg) < mb)
                lg++;
            upto = lg + 1 < STOW_ROUNDUP_INTERVALS ? lg + 1 : STOW_ROUNDUP_INTERVALS;
        }
        for (; next_interval < upto; next_interval++)
            c->roundup_power2_divisions[next_interval] = (unsigned)val;
        last_value = (unsigned)val;
    }
    for (; next_interval < STOW_ROUNDUP_INTERVALS; next_interval++)
        c->roundup_power2_divisions[next_interval] = last_value;
    return STOW_OK;
}

static stow_status_t apply_key(stow_config_t *c, const char *key, const char *v, char *err,
                               size_t err_len)
{
    if (!strcmp(key, "policy")) {
        if (!strcmp(v, "classic"))
            c->policy = STOW_POLICY_CLASSIC;
        else if (!strcmp(v, "vmm"))
            c->policy = STOW_POLICY_VMM;
        else if (!strcmp(v, "auto"))
            c->policy = STOW_POLICY_AUTO;
        else
            return fail(err, err_len, "key 'policy': '%s' is not auto, classic or vmm", v);
        return STOW_OK;
    }
    if (!strcmp(key, "expandable_segments")) {
        bool on;
        if (!parse_bool(v, &on))
            return fail(err, err_len, "key 'expandable_segments': '%s' is not True or False", v);
        c->policy = on ? STOW_POLICY_VMM : STOW_POLICY_CLASSIC;
        return STOW_OK;
    }
    if (!strcmp(key, "max_split_size_mb"))
        return parse_mb(key, v, &c->max_split_size_bytes, err, err_len);
    if (!strcmp(key, "max_non_split_rounding_mb"))
        return parse_mb(key, v, &c->max_non_split_rounding_bytes, err, err_len);
    if (!strcmp(key, "roundup_power2_divisions"))
        return parse_divisions(v, c, err, err_len);
    if (!strcmp(key, "garbage_collection_threshold")) {
        double t;
        if (!parse_double(v, &t) || !(t > 0.0 && t < 1.0))
            return fail(err, err_len,
                        "key 'garbage_collection_threshold': '%s' is not a number in (0, 1)", v);
        c->garbage_collection_threshold = t;
        return STOW_OK;
    }
    if (!strcmp(key, "per_process_memory_fraction") || !strcmp(key, "memory_fraction")) {
        double f;
        if (!parse_double(v, &f) || !(f > 0.0 && f <= 1.0))
            return fail(err, err_len, "key '%s': '%s' is not a number in (0, 1]", key, v);
        c->memory_fraction = f;
        return STOW_OK;
    }
    if (!strcmp(key, "scrub_on_free")) {
        if (!parse_bool(v, &c->scrub_on_free))
            return fail(err, err_len, "key 'scrub_on_free': '%s' is not true or false", v);
        return STOW_OK;
    }
    if (!strcmp(key, "record_events")) {
        unsigned long long n;
        if (!parse_ulong(v, &n) || n > STOW_RECORD_EVENTS_MAX)
            return fail(err, err_len,
                        "key 'record_events': '%s' is not a count up to %zu (2^24 events, 512 MiB)",
                        v, STOW_RECORD_EVENTS_MAX);
        c->record_events = (size_t)n;
        return STOW_OK;
    }
    if (!strcmp(key, "planned_steps") || !strcmp(key, "planned_async")) {
        bool *flag = !strcmp(key, "planned_steps") ? &c->planned_steps : &c->planned_async;
        if (!parse_bool(v, flag))
            return fail(err, err_len, "key '%s': '%s' is not true or false", key, v);
        return STOW_OK;
    }
    return KEY_NOT_HERE;
}

/* A key of stowage/tuning.h: KEY_NOT_HERE when `key` is none of them. */
static stow_status_t apply_tuning_key(stow_tuning_t *t, const char *key, const char *v,
                                      char *err, size_t err_len)
{
    if (!strcmp(key, "vmm_slack") || !strcmp(key, "vmm_slack_max") ||
        !strcmp(key, "keep_idle_max") || !strcmp(key, "planned_headroom")) {
        double f;
        if (!parse_double(v, &f) || !(f >= 0.0 && f <= 1.0))
            return fail(err, err_len, "key '%s': '%s' is not a number in [0, 1]", key, v);
        *(!strcmp(key, "vmm_slack")       ? &t->vmm_slack
          : !strcmp(key, "vmm_slack_max") ? &t->vmm_slack_max
          : !strcmp(key, "keep_idle_max") ? &t->keep_idle_max
                                          : &t->planned_headroom) = f;
        return STOW_OK;
    }
    if (!strcmp(key, "planned_warmup_steps"))
        return parse_count(key, v, STOW_PLANNED_WARMUP_MAX, &t->planned_warmup_steps, err,
                           err_len);
    if (!strcmp(key, "quick_depth"))
        return parse_count(key, v, STOW_QUICK_DEPTH_MAX, &t->quick_depth, err, err_len);
    if (!strcmp(key, "quick_mid_slots"))
        return parse_count(key, v, STOW_QUICK_MID_SLOTS_MAX, &t->quick_mid_slots, err, err_len);
    if (!strcmp(key, "vmm_small_kb"))
        return parse_count(key, v, STOW_SMALL_REQUEST_KB, &t->vmm_small_kb, err, err_len);
    if (!strcmp(key, "vmm_handle_mb"))
        return parse_count(key, v, STOW_VMM_HANDLE_MB_MAX, &t->vmm_handle_mb, err, err_len);
    if (!strcmp(key, "reuse_other_streams_on_miss") || !strcmp(key, "vmm_learn_step") ||
        !strcmp(key, "planned_auto")) {
        bool *flag = !strcmp(key, "vmm_learn_step") ? &t->vmm_learn_step
                     : !strcmp(key, "planned_auto") ? &t->planned_auto
                                                    : &t->reuse_other_streams_on_miss;
        if (!parse_bool(v, flag))
            return fail(err, err_len, "key '%s': '%s' is not true or false", key, v);
        return STOW_OK;
    }
    return KEY_NOT_HERE;
}

/* The keys that are the pool's constants, with the heading of
 * docs/decisions.md that measures each: STOWAGE_CONF names them with this. */
static const struct constant_key {
    const char *key;
    const char *heading;
} constant_keys[] = {
    {"quick_depth", "Quick lists"},
    {"quick_mid_slots", "Quick lists"},
    {"keep_idle_max", "keep_idle_max 0.05"},
    {"release_idle_on_grow", "release_idle_on_grow false"},
    {"reuse_other_streams_on_miss", "reuse_other_streams_on_miss false"},
    {"vmm_slack", "vmm_slack 0.0095"},
    {"vmm_slack_max", "vmm_slack_max 0.05"},
    {"vmm_small_kb", "vmm_small_kb 128"},
    {"vmm_handle_mb", "vmm_handle_mb 20"},
    {"vmm_learn_step", "vmm_learn_step true"},
    {"planned_warmup_steps", "Planned steps"},
    {"planned_headroom", "Planned steps"},
    {"planned_auto", "planned_steps and planned_auto false"},
};

const char *stow_tuning_key_name(size_t index)
{
    return index < sizeof constant_keys / sizeof constant_keys[0] ? constant_keys[index].key
                                                                  : NULL;
}

static stow_status_t unknown_key(const char *key, char *err, size_t err_len)
{
    for (size_t i = 0; i < sizeof constant_keys / sizeof constant_keys[0]; i++)
        if (!strcmp(key, constant_keys[i].key))
            return fail(err, err_len,
                        "key '%s' is not a setting: it is one of the pool's measured constants "
                        "(docs/decisions.md, \"%s\"); `stowage replay --tuning %s:VALUE` "
                        "measures another value",
                        key, constant_keys[i].heading, key);
    return fail(err, err_len, "unknown key '%s'", key);
}

/* Parses `text` into c, and into t when t is not NULL (stow_tuning_parse);
 * commits nothing unless every key is valid. */
static stow_status_t parse_text(stow_config_t *config, stow_tuning_t *tuning, const char *text,
                                char *err, size_t err_len)
{
    if (err && err_len)
        err[0] = '\0';
    if ((!config && !tuning) || !text)
        return fail(err, err_len, "no configuration given");
    stow_config_t c;
    stow_tuning_t t;
    if (config)
        c = *config;
    else
        stow_config_default(&c);
    if (tuning)
        t = *tuning;
    /* Commas inside [...] belong to the list value: turn them into '|' first. */
    size_t n = strlen(text);
    char *copy = malloc(n + 1);
    if (!copy)
        return STOW_EHOSTMEM;
    int depth = 0;
    for (size_t i = 0; i <= n; i++) {
        char ch = text[i];
        depth += ch == '[' ? 1 : ch == ']' ? -1 : 0;
        copy[i] = (ch == ',' && depth > 0) ? '|' : ch;
    }
    stow_status_t st = STOW_OK;
    for (char *save = NULL, *item = strtok_r(copy, ",", &save); item && st == STOW_OK;
         item = strtok_r(NULL, ",", &save)) {
        trim(&item);
        if (!*item)
            continue;
        char *colon = strchr(item, ':');
        if (!colon) {
            st = fail(err, err_len, "'%s' is not key:value", item);
            break;
        }
        *colon = '\0';
        char *key = item, *value = colon + 1;
        trim(&key);
        trim(&value);
        if (strlen(key) >= KEY_MAX || strlen(value) >= VALUE_MAX) {
            st = fail(err, err_len, "key '%.32s': too long", key);
            break;
        }
        st = config ? apply_key(&c, key, value, err, err_len) : KEY_NOT_HERE;
        if (st == KEY_NOT_HERE && tuning)
            st = apply_tuning_key(&t, key, value, err, err_len);
        /* The C API's field, which a measurement may set beside the constants. */
        if (st == KEY_NOT_HERE && tuning && config && !strcmp(key, "release_idle_on_grow"))
            st = parse_bool(value, &c.release_idle_on_grow)
                     ? STOW_OK
                     : fail(err, err_len, "key '%s': '%s' is not true or false", key, value);
        if (st == KEY_NOT_HERE)
            st = unknown_key(key, err, err_len);
    }
    free(copy);
    if (st == STOW_OK && config)
        st = stow__config_validate(&c, err, err_len);
    if (st == STOW_OK && tuning)
        st = stow__tuning_validate(&t, err, err_len);
    if (st == STOW_OK && config)
        *config = c;
    if (st == STOW_OK && tuning)
        *tuning = t;
    return st;
}

stow_status_t stow_config_parse(stow_config_t *config, const char *text, char *err,
                                size_t err_len)
{
    if (!config)
        return parse_text(NULL, NULL, text, err, err_len);
    return parse_text(config, NULL, text, err, err_len);
}

stow_status_t stow_tuning_parse(stow_config_t *config, stow_tuning_t *tuning, const char *text,
                                char *err, size_t err_len)
{
    if (!tuning)
        return parse_text(NULL, NULL, text, err, err_len);
    return parse_text(config, tuning, text, err, err_len);
}

stow_status_t stow_config_from_env(stow_config_t *config, char *err, size_t err_len)
{
    if (err && err_len)
        err[0] = '\0';
    const char *text = getenv("STOWAGE_CONF");
    if (!text)
        return STOW_OK;
    stow_status_t st = stow_config_parse(config, text, err, err_len);
    if (st != STOW_OK && err && err_len) {
        char tmp[512];
        snprintf(tmp, sizeof tmp, "STOWAGE_CONF: %s", err);
        snprintf(err, err_len, "%s", tmp);
    }
    return st;
}
