/*
 * replay/replay_engine.c: the replay driver, the minimum-capacity search, the
 * options and the printers of `stowage replay` (contract: replay_engine.h).
 *
 * It owns no allocation policy: every decision is the policy's, through the
 * vtable. The hot loop (pass) makes one indirect call per event for every
 * policy alike, so host costs compare fairly between policies.
 */
#include "replay/replay_engine.h"

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define STOW_UNLIKELY_(x) __builtin_expect(!!(x), 0)

const stow_replay_policy_t *const stow__replay_policies[] = {
    &stow__replay_policy_classic,
    &stow__replay_policy_vmm,
    &stow__replay_policy_classic_planned,
    &stow__replay_policy_vmm_planned,
    &stow__replay_policy_pytorch,
    &stow__replay_policy_pytorch_expandable,
    &stow__replay_policy_naive,
    &stow__replay_policy_jemalloc,
    &stow__replay_policy_jemalloc_decay,
    &stow__replay_policy_jemalloc_tcache,
    &stow__replay_policy_ideal_remap,
    NULL,
};

const stow_replay_policy_t *stow__replay_policy_find(const char *name)
{
    for (size_t i = 0; name && stow__replay_policies[i]; i++)
        if (!strcmp(stow__replay_policies[i]->name, name))
            return stow__replay_policies[i];
    return NULL;
}

/* ---- options ---- */

stow_status_t stow__replay_load_config(const char *conf, stow_config_t *out, char *err,
                                       size_t err_len)
{
    stow_config_default(out);
    stow_status_t st = stow_config_from_env(out, err, err_len);
    if (st == STOW_OK && conf)
        st = stow_config_parse(out, conf, err, err_len);
    return st;
}

static stow_status_t opts_error(char *err, size_t err_len, const char *fmt, ...)
{
    if (err && err_len) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err, err_len, fmt, ap);
        va_end(ap);
    }
    return STOW_EINVAL;
}

/* ---- settings against policies ---- */

/* The groups of policies a STOWAGE_CONF key applies to (conf_keys). */
enum {
    APPLY_CLASSIC = 1u << 0, /* classic, classic-planned */
    APPLY_VMM = 1u << 1,     /* vmm, vmm-planned */
    APPLY_PLANNED = 1u << 2, /* classic-planned, vmm-planned */
    APPLY_PYTORCH = 1u << 3, /* pytorch, pytorch-expandable */
    APPLY_POOLS = APPLY_CLASSIC | APPLY_VMM,
};

/* How a key meets a policy: applied or not (KEY_PLAIN), or a choice between
 * pools that must agree with the policy's own. */
typedef enum {
    KEY_PLAIN,
    KEY_PAGE_MAPPED,   /* policy, expandable_segments: page-mapped or not */
    KEY_PLANNED_STEPS, /* planned_steps: planned or not */
    KEY_PLANNED_ASYNC, /* planned_async: replays plan inline (false) */
} key_kind_t;

typedef struct conf_key {
    const char *name;
    unsigned groups;
    key_kind_t kind;
} conf_key_t;

/* Every key of stow_config_parse. The pools apply what stowage.h says of each
 * field (garbage_collection_threshold, the classic pool's segment growth;
 * max_split_size_mb and max_non_split_rounding_mb, classic only:
 * docs/design.md), the PyTorch models what replay_policies.c hands them. */
static const conf_key_t conf_keys[] = {
    {"policy", APPLY_POOLS, KEY_PAGE_MAPPED},
    {"expandable_segments", APPLY_POOLS | APPLY_PYTORCH, KEY_PAGE_MAPPED},
    {"planned_steps", APPLY_POOLS, KEY_PLANNED_STEPS},
    {"planned_async", APPLY_POOLS, KEY_PLANNED_ASYNC},
    {"max_split_size_mb", APPLY_CLASSIC | APPLY_PYTORCH, KEY_PLAIN},
    {"max_non_split_rounding_mb", APPLY_CLASSIC | APPLY_PYTORCH, KEY_PLAIN},
    {"garbage_collection_threshold", APPLY_CLASSIC | APPLY_PYTORCH, KEY_PLAIN},
    {"roundup_power2_divisions", APPLY_POOLS | APPLY_PYTORCH, KEY_PLAIN},
    {"per_process_memory_fraction", APPLY_POOLS | APPLY_PYTORCH, KEY_PLAIN},
    {"memory_fraction", APPLY_POOLS | APPLY_PYTORCH, KEY_PLAIN},
    {"scrub_on_free", APPLY_POOLS, KEY_PLAIN},
    {"record_events", APPLY_POOLS, KEY_PLAIN},
};

static unsigned policy_groups(const stow_replay_policy_t *p)
{
    if (p == &stow__replay_policy_classic)
        return APPLY_CLASSIC;
    if (p == &stow__replay_policy_vmm)
        return APPLY_VMM;
    if (p == &stow__replay_policy_classic_planned)
        return APPLY_CLASSIC | APPLY_PLANNED;
    if (p == &stow__replay_policy_vmm_planned)
        return APPLY_VMM | APPLY_PLANNED;
    if (p == &stow__replay_policy_pytorch || p == &stow__replay_policy_pytorch_expandable)
        return APPLY_PYTORCH;
    return 0; /* naive, jemalloc, ideal-remap: no setting */
}

static bool policy_page_mapped(const stow_replay_policy_t *p)
{
    return p == &stow__replay_policy_vmm || p == &stow__replay_policy_vmm_planned ||
           p == &stow__replay_policy_pytorch_expandable;
}

/* The Stowage pool that is page-mapped or not, planned or not. */
static const stow_replay_policy_t *pool_policy(bool page_mapped, bool planned)
{
    if (page_mapped)
        return planned ? &stow__replay_policy_vmm_planned : &stow__replay_policy_vmm;
    return planned ? &stow__replay_policy_classic_planned : &stow__replay_policy_classic;
}

const stow_replay_policy_t *stow__replay_planned_base(const stow_replay_policy_t *p)
{
    if (p == &stow__replay_policy_classic_planned)
        return &stow__replay_policy_classic;
    if (p == &stow__replay_policy_vmm_planned)
        return &stow__replay_policy_vmm;
    return NULL;
}

/* One key as given: its last occurrence in STOWAGE_CONF, then --conf. */
typedef struct given_key {
    const conf_key_t *key;
    char text[96]; /* "key:value" as written (cut at 95 characters) */
    bool from_env;
} given_key_t;

#define CONF_KEY_COUNT (sizeof conf_keys / sizeof conf_keys[0])

/* Adds the keys of `text` (stow_config_parse syntax, already accepted) to
 * given[]; a key given again replaces its earlier entry. */
/* The next "key:value" item of a settings text (STOWAGE_CONF syntax: commas
 * inside [...] belong to the value) from *at: the item and its key, blanks
 * trimmed (key_len 0 without a colon); *at moves past it. False at the end. */
static bool next_item(const char **at, const char **item, size_t *item_len, size_t *key_len)
{
    const char *c = *at;
    if (!c)
        return false;
    int depth = 0;
    for (; *c && (*c != ',' || depth > 0); c++)
        depth += *c == '[' ? 1 : *c == ']' ? -1 : 0;
    const char *b = *at, *e = c;
    while (b < e && (*b == ' ' || *b == '\t'))
        b++;
    while (e > b && (e[-1] == ' ' || e[-1] == '\t'))
        e--;
    const char *colon = memchr(b, ':', (size_t)(e - b));
    const char *ke = colon ? colon : b;
    while (ke > b && (ke[-1] == ' ' || ke[-1] == '\t'))
        ke--;
    *item = b;
    *item_len = (size_t)(e - b);
    *key_len = (size_t)(ke - b);
    *at = *c ? c + 1 : NULL;
    return true;
}

static void scan_keys(const char *text, bool from_env, given_key_t *given, unsigned *n)
{
    const char *b;
    size_t len, key_len;
    for (const char *at = text; next_item(&at, &b, &len, &key_len);) {
        for (unsigned k = 0; key_len && k < CONF_KEY_COUNT; k++) {
            if (strlen(conf_keys[k].name) != key_len || memcmp(conf_keys[k].name, b, key_len))
                continue;
            unsigned j = 0;
            while (j < *n && given[j].key != &conf_keys[k])
                j++;
            if (j == *n)
                (*n)++;
            given[j].key = &conf_keys[k];
            given[j].from_env = from_env;
            snprintf(given[j].text, sizeof given[j].text, "%.*s", (int)len, b);
        }
    }
}

/* "--conf policy:vmm" or "STOWAGE_CONF's policy:vmm". */
static void key_origin(const given_key_t *g, char *buf, size_t len)
{
    snprintf(buf, len, "%s%s", g->from_env ? "STOWAGE_CONF's " : "--conf ", g->text);
}

/* The names of the policies of the table in `groups`, as "a, b and c". */
static void policies_in(unsigned groups, char *buf, size_t len)
{
    const stow_replay_policy_t *in[STOW_REPLAY_MAX_POLICIES];
    unsigned n = 0;
    for (size_t i = 0; stow__replay_policies[i] && n < STOW_REPLAY_MAX_POLICIES; i++)
        if (policy_groups(stow__replay_policies[i]) & groups)
            in[n++] = stow__replay_policies[i];
    size_t used = 0;
    buf[0] = '\0';
    for (unsigned k = 0; k < n && used < len; k++) {
        int w = snprintf(buf + used, len - used, "%s%s", k == 0 ? "" : k + 1 == n ? " and " : ", ",
                         in[k]->name);
        used += w > 0 ? (size_t)w : 0;
    }
}

/* The groups a key applies to, with the settings in force. */
static unsigned key_groups(const conf_key_t *key, const stow_config_t *config)
{
    (void)config;
    return key->groups;
}

/* For a key that picks a pool: the policy it wants in place of p, or NULL when
 * p agrees with it. *none_fits: no policy can take the key's value (a replay
 * always plans inline). */
static const stow_replay_policy_t *key_wants(const conf_key_t *key, const stow_config_t *config,
                                             const stow_replay_policy_t *p, bool *none_fits)
{
    *none_fits = false;
    unsigned g = policy_groups(p);
    bool planned = (g & APPLY_PLANNED) != 0;
    switch (key->kind) {
    case KEY_PAGE_MAPPED: {
        /* The simulated device maps pages: policy auto is the page-mapped pool. */
        bool want = config->policy != STOW_POLICY_CLASSIC;
        if (policy_page_mapped(p) == want)
            return NULL;
        if (g & APPLY_PYTORCH)
            return want ? &stow__replay_policy_pytorch_expandable : &stow__replay_policy_pytorch;
        return pool_policy(want, planned);
    }
    case KEY_PLANNED_STEPS:
        return planned == config->planned_steps ? NULL
                                                : pool_policy(policy_page_mapped(p),
                                                              config->planned_steps);
    case KEY_PLANNED_ASYNC:
        *none_fits = config->planned_async;
        return config->planned_async ? p : NULL;
    default:
        return NULL;
    }
}

stow_status_t stow__replay_conf_resolve(const char *conf, const stow_config_t *config,
                                        bool policy_given, const stow_replay_policy_t **policies,
                                        unsigned *count, FILE *notes, const char *who, char *err,
                                        size_t err_len)
{
    if (!config || !policies || !count || !*count || *count > STOW_REPLAY_MAX_POLICIES)
        return opts_error(err, err_len, "no policy");
    given_key_t given[CONF_KEY_COUNT];
    unsigned n = 0;
    const char *env = getenv("STOWAGE_CONF");
    if (env)
        scan_keys(env, true, given, &n);
    if (conf)
        scan_keys(conf, false, given, &n);
    if (!policy_given) {
        policies[0] = pool_policy(config->policy != STOW_POLICY_CLASSIC, config->planned_steps);
        *count = 1;
    }
    char origin[128], names[256];
    for (unsigned j = 0; j < n; j++) {
        const conf_key_t *key = given[j].key;
        key_origin(&given[j], origin, sizeof origin);
        unsigned groups = key_groups(key, config);
        const stow_replay_policy_t *without[STOW_REPLAY_MAX_POLICIES];
        unsigned applied = 0, left = 0;
        for (unsigned k = 0; k < *count; k++) {
            const stow_replay_policy_t *p = policies[k];
            if (!(policy_groups(p) & groups)) {
                without[left++] = p;
                continue;
            }
            bool none_fits;
            const stow_replay_policy_t *want = key_wants(key, config, p, &none_fits);
            if (none_fits)
                return opts_error(err, err_len,
                                  "%s: a replay plans inline, so that its figures repeat "
                                  "(docs/planned.md): drop the key",
                                  origin);
            if (want)
                return opts_error(err, err_len,
                                  "%s selects %s, not the policy %s given with --policy: use "
                                  "--policy %s in its place, or drop the key",
                                  origin, want->name, p->name, want->name);
            applied++;
        }
        if (!applied) {
            policies_in(groups, names, sizeof names);
            if (*count == 1)
                return opts_error(err, err_len,
                                  "%s applies to %s only; the policy %s%s cannot apply it: use "
                                  "--policy with one of those, or drop the key",
                                  origin, names, policies[0]->name,
                                  policy_given ? "" : " (the one the settings select)");
            return opts_error(err, err_len,
                              "%s applies to %s only, none of the policies given: add one of "
                              "those with --policy, or drop the key",
                              origin, names);
        }
        if (left && notes) {
            size_t used = 0;
            names[0] = '\0';
            for (unsigned k = 0; k < left && used < sizeof names; k++) {
                int w = snprintf(names + used, sizeof names - used, "%s%s",
                                 k == 0 ? "" : k + 1 == left ? " and " : ", ", without[k]->name);
                used += w > 0 ? (size_t)w : 0;
            }
            fprintf(notes, "%s: note: %s does not apply to %s, which %s without it\n", who,
                    origin, names, left == 1 ? "runs" : "run");
        }
    }
    return STOW_OK;
}

/* The constants of --tuning and the pools each applies to (stowage/tuning.h,
 * docs/design.md); release_idle_on_grow is stow_config_t's field of the C API. */
static const struct tuning_key {
    const char *name;
    unsigned groups;
} tuning_keys[] = {
    {"quick_depth", APPLY_POOLS},
    {"quick_mid_slots", APPLY_CLASSIC},
    {"keep_idle_max", APPLY_CLASSIC},
    {"release_idle_on_grow", APPLY_CLASSIC},
    {"reuse_other_streams_on_miss", APPLY_POOLS},
    {"vmm_slack", APPLY_VMM},
    {"vmm_slack_max", APPLY_VMM},
    {"vmm_small_kb", APPLY_VMM},
    {"vmm_handle_mb", APPLY_VMM},
    {"vmm_learn_step", APPLY_VMM},
    {"planned_warmup_steps", APPLY_PLANNED},
    {"planned_headroom", APPLY_PLANNED},
    {"planned_auto", APPLY_POOLS},
};

unsigned stow__replay_tuning_groups(const char *name, size_t len)
{
    for (size_t k = 0; k < sizeof tuning_keys / sizeof tuning_keys[0]; k++)
        if (strlen(tuning_keys[k].name) == len && !memcmp(tuning_keys[k].name, name, len))
            return tuning_keys[k].groups;
    return 0;
}

/* The groups of the policies given, with planned_auto making every pool a
 * planned one. */
static unsigned given_groups(const stow_replay_policy_t *const *policies, unsigned count,
                             const stow_tuning_t *tuning)
{
    unsigned groups = 0;
    for (unsigned k = 0; k < count; k++) {
        unsigned g = policy_groups(policies[k]);
        if (tuning->planned_auto && (g & APPLY_POOLS))
            g |= APPLY_PLANNED;
        groups |= g;
    }
    return groups;
}

stow_status_t stow__replay_tuning_resolve(const char *text,
                                          const stow_replay_policy_t *const *policies,
                                          unsigned count, stow_config_t *config,
                                          stow_tuning_t *out, char *err, size_t err_len)
{
    stow_config_t scratch = *config;
    stow_tuning_default(out);
    char why[256];
    if (stow_tuning_parse(&scratch, out, text, why, sizeof why) != STOW_OK)
        return opts_error(err, err_len, "--tuning: %s", why);
    unsigned groups = given_groups(policies, count, out);
    const char *b;
    size_t len, n;
    for (const char *at = text; next_item(&at, &b, &len, &n);) {
        unsigned key_groups = n ? stow__replay_tuning_groups(b, n) : 0;
        if (n && !key_groups)
            return opts_error(err, err_len,
                              "--tuning takes the pools' constants (stowage/tuning.h); '%.*s' is "
                              "a setting: give it in --conf",
                              (int)n, b);
        if (key_groups && !(key_groups & groups))
            return opts_error(err, err_len,
                              "--tuning %.*s: no policy given uses it (%s): add one or drop it",
                              (int)n, b,
                              key_groups == APPLY_VMM       ? "vmm and vmm-planned"
                              : key_groups == APPLY_CLASSIC ? "classic and classic-planned"
                              : key_groups == APPLY_PLANNED
                                  ? "classic-planned and vmm-planned, or any pool with "
                                    "planned_auto"
                                  : "the Stowage pools");
    }
    config->release_idle_on_grow = scratch.release_idle_on_grow;
    return STOW_OK;
}

bool stow__replay_note_no_steps(FILE *f, const char *who, const stow_trace_t *trace,
                                const stow_replay_policy_t *policy, const stow_config_t *config)
{
    (void)config;
    const stow_replay_policy_t *base = stow__replay_planned_base(policy);
    if (!base || !trace || trace->marker_count || (stow__replay_tuning() && stow__replay_tuning()->planned_auto))
        return false;
    fprintf(f,
            "%s: note: %s has no step markers ('m' lines), so %s plans nothing on it: its "
            "figures equal %s's\n",
            who, trace->path ? trace->path : "the trace", policy->name, base->name);
    return true;
}

void stow__replay_usage(FILE *f)
{
    fprintf(f,
            "usage: stowage replay [--policy P]... [--capacity BYTES [--allow-oom] |\n"
            "                      --min-capacity] [--json] [--repeats N]\n"
            "                      [--conf KEY:VALUE,...] [--summary] TRACE...\n"
            "\n"
            "Replays each .rep trace under a policy and prints peak live bytes (the lower\n"
            "bound), peak reserved bytes, their ratio, backend calls, OOM errors and host\n"
            "ns/event (median of N warm repeats, default 5; the policies of a trace are\n"
            "timed in rounds, each replaying it untimed and then timed in turn).\n"
            "  --policy P      a policy below, or all (one table row per trace and policy);\n"
            "                  may be repeated. Default: the pool the settings select:\n"
            "                  vmm (policy auto: the simulated device maps pages); classic\n"
            "                  with policy:classic or expandable_segments:False;\n"
            "                  vmm-planned or classic-planned with planned_steps:true\n"
            "  --capacity B    simulated device memory in bytes (suffixes K, M, G, T), at\n"
            "                  least 2M; default unlimited; device policies only\n"
            "  --allow-oom     out-of-memory errors do not fail the replay (capacity\n"
            "                  studies); without it they exit 1\n"
            "  --min-capacity  also find the smallest device capacity (a multiple of 2 MiB)\n"
            "                  at which the trace runs with no OOM error (binary search)\n"
            "  --conf S        settings in STOWAGE_CONF syntax (also read from STOWAGE_CONF);\n"
            "                  a key that no policy given applies is an error naming it;\n"
            "                  max_split_size_mb, max_non_split_rounding_mb,\n"
            "                  roundup_power2_divisions, garbage_collection_threshold,\n"
            "                  per_process_memory_fraction and expandable_segments apply\n"
            "                  to the pytorch models too\n"
            "  --tuning S      the pools' measured constants (KEY:VALUE,..., stowage/tuning.h,\n"
            "                  and release_idle_on_grow), to measure one against its\n"
            "                  alternatives; not a setting\n"
            "  --json          one JSON object per trace and policy, one per line\n"
            "  --summary       print the pool's memory summary (classic, vmm and their\n"
            "                  planned variants; text output)\n"
            "Policies:\n");
    for (size_t i = 0; stow__replay_policies[i]; i++)
        fprintf(f, "  %-19s %s\n", stow__replay_policies[i]->name,
                stow__replay_policies[i]->summary);
    fprintf(f, "Exit status: 0 ok; 1 a replay failed, or had OOM errors without --allow-oom;\n"
               "2 bad usage, settings or trace.\n");
}

bool stow__replay_parse_bytes(const char *s, size_t *out)
{
    if (!s || *s < '0' || *s > '9')
        return false;
    errno = 0;
    char *end;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno)
        return false;
    unsigned shift = 0;
    switch (*end) {
    case 'K': case 'k': shift = 10; end++; break;
    case 'M': case 'm': shift = 20; end++; break;
    case 'G': case 'g': shift = 30; end++; break;
    case 'T': case 't': shift = 40; end++; break;
    default: break;
    }
    if (shift && *end == 'i' && end[1] == 'B')
        end += 2;
    else if (*end == 'B')
        end++;
    if (*end || v > (SIZE_MAX >> shift))
        return false;
    *out = (size_t)(v << shift);
    return true;
}

static bool opts_add_policy(stow_replay_opts_t *o, const stow_replay_policy_t *p)
{
    for (unsigned k = 0; k < o->policy_count; k++)
        if (o->policies[k] == p)
            return true;
    if (o->policy_count == STOW_REPLAY_MAX_POLICIES)
        return false;
    o->policies[o->policy_count++] = p;
    return true;
}

stow_status_t stow__replay_opts_parse(int argc, char **argv, stow_replay_opts_t *o, char *err,
                                      size_t err_len)
{
    if (!o || argc < 1 || !argv)
        return opts_error(err, err_len, "no arguments");
    memset(o, 0, sizeof *o);
    o->repeats = 5;
    bool capacity_given = false, repeats_given = false;
    int i = 1;
    for (; i < argc && argv[i][0] == '-' && argv[i][1]; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        bool takes_value = !strcmp(a, "--policy") || !strcmp(a, "--capacity") ||
                           !strcmp(a, "--repeats") || !strcmp(a, "--conf") ||
                           !strcmp(a, "--tuning");
        if (takes_value && !v)
            return opts_error(err, err_len, "option '%s' needs a value", a);
        /* A value given twice would leave one of them unused. */
        if ((!strcmp(a, "--capacity") && capacity_given) ||
            (!strcmp(a, "--repeats") && repeats_given) || (!strcmp(a, "--conf") && o->conf) ||
            (!strcmp(a, "--tuning") && o->tuning))
            return opts_error(err, err_len, "%s given twice%s", a,
                              !strcmp(a, "--conf")     ? ": join the settings with ',' in one --conf"
                              : !strcmp(a, "--tuning") ? ": join the constants with ',' in one "
                                                         "--tuning"
                                                       : "");
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            o->help = true;
            return STOW_OK;
        } else if (!strcmp(a, "--json")) {
            o->json = true;
        } else if (!strcmp(a, "--summary")) {
            o->summary = true;
        } else if (!strcmp(a, "--allow-oom")) {
            o->allow_oom = true;
        } else if (!strcmp(a, "--min-capacity")) {
            o->min_capacity = true;
        } else if (!strcmp(a, "--policy")) {
            i++;
            o->policy_given = true;
            if (!strcmp(v, "all")) {
                o->all = true;
                for (size_t k = 0; stow__replay_policies[k]; k++)
                    if (!stow__replay_policies[k]->not_in_all)
                        (void)opts_add_policy(o, stow__replay_policies[k]);
            } else {
                const stow_replay_policy_t *p = stow__replay_policy_find(v);
                if (!p)
                    return opts_error(err, err_len, "unknown policy '%s'", v);
                if (!opts_add_policy(o, p))
                    return opts_error(err, err_len, "too many policies");
            }
        } else if (!strcmp(a, "--capacity")) {
            i++;
            capacity_given = true;
            if (!stow__replay_parse_bytes(v, &o->capacity_bytes))
                return opts_error(err, err_len, "--capacity: '%s' is not a byte count", v);
            if (o->capacity_bytes < STOW_REPLAY_CAPACITY_STEP_BYTES)
                return opts_error(err, err_len,
                                  "--capacity: '%s' is below 2 MiB, the simulated device's "
                                  "granule",
                                  v);
        } else if (!strcmp(a, "--repeats")) {
            i++;
            repeats_given = true;
            char *end;
            errno = 0;
            unsigned long n = strtoul(v, &end, 10);
            if (errno || end == v || *end || n > 1000 || *v == '-')
                return opts_error(err, err_len, "--repeats: '%s' is not 0..1000", v);
            o->repeats = (unsigned)n;
        } else if (!strcmp(a, "--conf")) {
            i++;
            o->conf = v;
        } else if (!strcmp(a, "--tuning")) {
            i++;
            o->tuning = v;
        } else {
            return opts_error(err, err_len, "unknown option '%s'", a);
        }
    }
    if (o->min_capacity && capacity_given)
        return opts_error(err, err_len, "--min-capacity searches the capacity: drop --capacity");
    if (o->allow_oom && !capacity_given)
        return opts_error(err, err_len,
                          "--allow-oom accepts the OOM errors of a --capacity run; without "
                          "--capacity the device is unlimited: add --capacity or drop it");
    if (o->summary && o->json)
        return opts_error(err, err_len, "--summary prints text, which --json replaces: drop one");
    if (o->summary && o->all)
        return opts_error(err, err_len,
                          "--summary prints one pool's text, which the --policy all table "
                          "replaces: name the pools with --policy classic, --policy vmm");
    if (i == argc)
        return opts_error(err, err_len, "no trace given");
    if (!o->policy_count)
        o->policies[o->policy_count++] = &stow__replay_policy_classic;
    o->first_trace = i;
    return STOW_OK;
}

/* ---- replays ---- */

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

/* Per-id state of one replay. */
typedef struct replay_state {
    uint64_t *handles;     /* [id_count] */
    unsigned char *live;   /* [id_count] */
    uint64_t *sizes;       /* [id_count]: requested size, for leftovers */
} replay_state_t;

static void state_free(replay_state_t *s)
{
    free(s->handles);
    free(s->live);
    free(s->sizes);
}

static stow_status_t state_init(replay_state_t *s, const stow_trace_t *t)
{
    size_t n = t->id_count ? t->id_count : 1;
    s->handles = calloc(n, sizeof *s->handles);
    s->live = calloc(n, 1);
    s->sizes = calloc(n, sizeof *s->sizes);
    if (!s->handles || !s->live || !s->sizes) {
        state_free(s);
        return STOW_EHOSTMEM;
    }
    for (size_t i = 0; i < t->event_count; i++)
        if (t->events[i].kind == STOW_TRACE_ALLOC)
            s->sizes[t->events[i].id] = t->events[i].size_bytes;
    return STOW_OK;
}

/* The key of marker m (NULL for a step end). */
static const char *marker_key(const stow_trace_t *t, size_t m)
{
    uint32_t k = t->markers[m].key;
    return k == STOW_TRACE_STEP_END ? NULL : t->keys[k];
}

/* One pass over the trace. Failed allocations are not live, so their frees are
 * skipped. Step markers go to the policy before the event they precede (and
 * those after the last event at the end). Returns the number of failed
 * allocations (stops at the first if stop_on_oom). */
static uint64_t pass(const stow_replay_policy_t *p, void *ctx, const stow_trace_t *t,
                     replay_state_t *s, bool sample, bool stop_on_oom)
{
    uint64_t ooms = 0;
    size_t m = 0, markers = p->step ? t->marker_count : 0;
    size_t next_marker = markers ? t->markers[0].before_event : SIZE_MAX;
    for (size_t i = 0; i < t->event_count; i++) {
        while (STOW_UNLIKELY_(i == next_marker)) {
            p->step(ctx, marker_key(t, m));
            next_marker = ++m < markers ? t->markers[m].before_event : SIZE_MAX;
        }
        const stow_trace_event_t *e = &t->events[i];
        if (e->kind == STOW_TRACE_ALLOC) {
            bool ok = p->alloc(ctx, e->size_bytes, e->stream, &s->handles[e->id]) == STOW_OK;
            s->live[e->id] = ok;
            if (!ok) {
                ooms++;
                if (stop_on_oom)
                    return ooms;
            } else if (sample) {
                p->sample(ctx, s->handles[e->id], e->size_bytes, true);
            }
        } else if (s->live[e->id]) {
            if (sample)
                p->sample(ctx, s->handles[e->id], e->size_bytes, false);
            p->free(ctx, s->handles[e->id], e->size_bytes);
            s->live[e->id] = 0;
        }
    }
    for (; m < markers; m++)
        p->step(ctx, marker_key(t, m));
    return ooms;
}

static void free_leftovers(const stow_replay_policy_t *p, void *ctx, const stow_trace_t *t,
                           replay_state_t *s)
{
    for (uint32_t id = 0; id < t->id_count; id++)
        if (s->live[id]) {
            p->free(ctx, s->handles[id], s->sizes[id]);
            s->live[id] = 0;
        }
}

stow_status_t stow__replay_fits(const stow_replay_policy_t *p, const stow_trace_t *t,
                                const stow_config_t *config, size_t capacity_bytes, bool *fits)
{
    if (!p || !t || !config || !fits || !capacity_bytes)
        return STOW_EINVAL;
    if (!p->device)
        return STOW_ENOSYS;
    replay_state_t s;
    stow_status_t st = state_init(&s, t);
    if (st != STOW_OK)
        return st;
    stow_replay_setup_t setup = {config, capacity_bytes};
    void *ctx = NULL;
    st = p->create(&setup, &ctx);
    if (st == STOW_OK) {
        *fits = pass(p, ctx, t, &s, false, true) == 0;
        p->destroy(ctx);
    }
    state_free(&s);
    return st;
}

static void report_progress(stow_replay_progress_fn fn, void *arg, const stow_trace_t *t,
                            const stow_replay_policy_t *p, const char *fmt, ...)
{
    if (!fn)
        return;
    char stage[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(stage, sizeof stage, fmt, ap);
    va_end(ap);
    fn(arg, t->path ? t->path : "", p->name, stage);
}

static stow_status_t min_capacity_search(const stow_replay_policy_t *p, const stow_trace_t *t,
                                         const stow_config_t *config, uint64_t peak_reserved,
                                         uint64_t *min_bytes, unsigned *probes,
                                         stow_replay_progress_fn fn, void *arg)
{
    const uint64_t step = STOW_REPLAY_CAPACITY_STEP_BYTES;
    const uint64_t limit = (uint64_t)1 << 46; /* the simulated device's "unlimited" */
    if (!p || !t || !config || !min_bytes)
        return STOW_EINVAL;
    if (!p->device)
        return STOW_ENOSYS;
    unsigned n = 0;
    stow_status_t st = STOW_OK;
    bool fits = false;
    if (peak_reserved == 0) {
        /* Nothing was ever reserved: any device runs it. */
        *min_bytes = 0;
        if (probes)
            *probes = 0;
        return STOW_OK;
    }
    /* Invariant: capacity `lo` fails (or is 0, which holds no reservation) and
     * capacity `hi` fits. */
    uint64_t lo = t->peak_live_bytes ? (t->peak_live_bytes + step - 1) / step * step - step : 0;
    uint64_t hi = (peak_reserved + step - 1) / step * step;
    if (lo >= hi)
        lo = hi - step;
    if (lo) {
        report_progress(fn, arg, t, p, "min capacity: probe %u", n + 1);
        st = stow__replay_fits(p, t, config, (size_t)lo, &fits);
        n++;
        if (st == STOW_OK && fits) { /* below peak live: impossible unless not 2 MiB-granular */
            hi = lo;
            lo = 0;
        }
    }
    for (bool top_fits = false; st == STOW_OK && !top_fits;) {
        report_progress(fn, arg, t, p, "min capacity: probe %u", n + 1);
        st = stow__replay_fits(p, t, config, (size_t)hi, &top_fits);
        n++;
        if (st == STOW_OK && !top_fits) {
            lo = hi;
            hi *= 2;
            if (hi > limit)
                st = STOW_ENOMEM;
        }
    }
    while (st == STOW_OK && hi - lo > step) {
        uint64_t mid = lo + (hi - lo) / step / 2 * step;
        report_progress(fn, arg, t, p, "min capacity: probe %u", n + 1);
        st = stow__replay_fits(p, t, config, (size_t)mid, &fits);
        n++;
        if (st == STOW_OK) {
            if (fits)
                hi = mid;
            else
                lo = mid;
        }
    }
    if (probes)
        *probes = n;
    if (st == STOW_OK)
        *min_bytes = hi;
    return st;
}

stow_status_t stow__replay_min_capacity(const stow_replay_policy_t *p, const stow_trace_t *t,
                                        const stow_config_t *config, uint64_t peak_reserved,
                                        uint64_t *min_bytes, unsigned *probes)
{
    return min_capacity_search(p, t, config, peak_reserved, min_bytes, probes, NULL, NULL);
}

/* One policy instance in the timed rounds. */
typedef struct timed_instance {
    const stow_replay_policy_t *p;
    void *ctx;
    replay_state_t s;
    uint64_t *times; /* [repeats]: nanoseconds of each timed pass */
} timed_instance_t;

/*
 * `repeats` rounds; in each, every instance in turn replays the trace twice,
 * live allocations freed before each pass: an untimed pass that brings its own
 * data back into the caches the other instances used, then the timed one.
 * Rounds, not one policy's passes after another's: this VM's speed changes
 * by up to 1.5x from one second to the next, and a policy timed in a slow
 * second against one timed in a fast second gave ratios that moved by as much
 * (resnet_multiscale_train classic / jemalloc 0.15-0.36 within an hour).
 * Passes a few milliseconds apart see the same machine.
 */
static void time_rounds(timed_instance_t *in, unsigned n, const stow_trace_t *t,
                        unsigned repeats, stow_replay_progress_fn fn, void *arg)
{
    for (unsigned r = 0; r < repeats; r++)
        for (unsigned k = 0; k < n; k++) {
            report_progress(fn, arg, t, in[k].p, "timed pass %u/%u", r + 1, repeats);
            free_leftovers(in[k].p, in[k].ctx, t, &in[k].s);
            (void)pass(in[k].p, in[k].ctx, t, &in[k].s, false, false);
            free_leftovers(in[k].p, in[k].ctx, t, &in[k].s);
            uint64_t t0 = now_ns();
            (void)pass(in[k].p, in[k].ctx, t, &in[k].s, false, false);
            in[k].times[r] = now_ns() - t0;
        }
}

/* The median of `repeats` pass times (sorted in place) over `events`; 0 if none. */
static double median_ns_per_event(uint64_t *times, unsigned repeats, size_t events)
{
    if (!repeats || !events)
        return 0.0;
    qsort(times, repeats, sizeof *times, cmp_u64);
    double mid = repeats % 2 ? (double)times[repeats / 2]
                             : ((double)times[repeats / 2 - 1] + (double)times[repeats / 2]) / 2;
    return mid / (double)events;
}

stow_status_t stow__replay_time(const stow_replay_policy_t *const *policies, unsigned n,
                                const stow_trace_t *t, const stow_config_t *config,
                                size_t capacity_bytes, unsigned repeats,
                                stow_replay_progress_fn fn, void *arg, double *ns_per_event)
{
    if (!policies || !n || !t || !config || !ns_per_event)
        return STOW_EINVAL;
    timed_instance_t *in = calloc(n, sizeof *in);
    if (!in)
        return STOW_EHOSTMEM;
    stow_status_t st = STOW_OK;
    unsigned made = 0;
    for (; made < n && st == STOW_OK; made++) {
        timed_instance_t *x = &in[made];
        x->p = policies[made];
        stow_replay_setup_t setup = {config, x->p->device ? capacity_bytes : 0};
        x->times = calloc(repeats ? repeats : 1, sizeof *x->times);
        st = x->times ? state_init(&x->s, t) : STOW_EHOSTMEM;
        if (st == STOW_OK && (st = x->p->create(&setup, &x->ctx)) != STOW_OK)
            state_free(&x->s);
        if (st != STOW_OK) {
            free(x->times);
            break;
        }
    }
    if (st == STOW_OK) {
        time_rounds(in, n, t, repeats, fn, arg);
        for (unsigned k = 0; k < n; k++)
            ns_per_event[k] = median_ns_per_event(in[k].times, repeats, t->event_count);
    }
    for (unsigned k = 0; k < made; k++) {
        free_leftovers(in[k].p, in[k].ctx, t, &in[k].s);
        in[k].p->destroy(in[k].ctx);
        state_free(&in[k].s);
        free(in[k].times);
    }
    free(in);
    return st;
}

stow_status_t stow__replay_run(const stow_replay_policy_t *p, const stow_trace_t *t,
                               const stow_config_t *config, size_t capacity_bytes,
                               unsigned repeats, bool min_capacity,
                               stow_replay_progress_fn fn, void *arg, stow_replay_result_t *out)
{
    if (!p || !t || !config || !out)
        return STOW_EINVAL;
    memset(out, 0, sizeof *out);
    out->policy = p->name;
    out->events = t->event_count;
    out->peak_live_bytes = t->peak_live_bytes;
    out->repeats = repeats;
    out->fragmentation_at_peak = -1.0;

    replay_state_t s;
    stow_status_t st = state_init(&s, t);
    if (st != STOW_OK)
        return st;
    uint64_t *times = calloc(repeats ? repeats : 1, sizeof *times);
    stow_replay_setup_t setup = {config, p->device ? capacity_bytes : 0};
    void *ctx = NULL;
    if (!times)
        st = STOW_EHOSTMEM;
    else
        st = p->create(&setup, &ctx);
    if (st != STOW_OK) {
        free(times);
        state_free(&s);
        return st;
    }

    report_progress(fn, arg, t, p, "measured pass");
    out->ooms = pass(p, ctx, t, &s, p->sample != NULL, false);
    stow_replay_report_t rep = {0};
    rep.fragmentation_at_peak = -1.0;
    p->report(ctx, &rep);
    out->peak_reserved_bytes = rep.peak_reserved_bytes;
    out->backend_calls = rep.backend_calls;
    out->has_backend_calls = rep.has_backend_calls;
    out->fragmentation_at_peak = rep.fragmentation_at_peak;
    out->has_map_calls = rep.has_map_calls;
    out->map_calls = rep.map_calls;
    out->unmap_calls = rep.unmap_calls;
    out->has_modelled_time = rep.has_modelled_time;
    out->modelled_backend_ns = rep.modelled_backend_ns;
    if (rep.stats) {
        out->stats = *rep.stats;
        out->has_stats = true;
    }

    /* The instance moves into the rounds' record: one state from here on. */
    timed_instance_t one = {p, ctx, s, times};
    time_rounds(&one, 1, t, repeats, fn, arg);
    out->ns_per_event = median_ns_per_event(one.times, repeats, t->event_count);
    free_leftovers(p, ctx, t, &one.s);
    p->destroy(ctx);
    free(one.times);
    state_free(&one.s);

    if (min_capacity && p->device) {
        st = min_capacity_search(p, t, config, out->peak_reserved_bytes,
                                 &out->min_capacity_bytes, &out->min_capacity_probes, fn, arg);
        out->has_min_capacity = st == STOW_OK;
    }
    return st;
}

/* ---- output ---- */

static double ratio(uint64_t a, uint64_t b) { return b ? (double)a / (double)b : 0.0; }

void stow__json_string(FILE *f, const char *s)
{
    fputc('"', f);
    for (; s && *s; s++) {
        unsigned char c = (unsigned char)*s;
        if (c == '"' || c == '\\')
            fprintf(f, "\\%c", c);
        else if (c < 0x20)
            fprintf(f, "\\u%04x", c);
        else
            fputc(c, f);
    }
    fputc('"', f);
}

void stow__replay_print_json(FILE *f, const char *trace_path, const stow_replay_result_t *r)
{
    fprintf(f, "{\"trace\": ");
    stow__json_string(f, trace_path);
    fprintf(f, ", \"policy\": ");
    stow__json_string(f, r->policy);
    fprintf(f, ", \"events\": %zu, \"peak_live_bytes\": %" PRIu64
               ", \"peak_reserved_bytes\": %" PRIu64 ", \"reserved_over_live\": %.6f",
            r->events, r->peak_live_bytes, r->peak_reserved_bytes,
            ratio(r->peak_reserved_bytes, r->peak_live_bytes));
    if (r->has_backend_calls)
        fprintf(f, ", \"backend_calls\": %" PRIu64, r->backend_calls);
    else
        fprintf(f, ", \"backend_calls\": null");
    fprintf(f, ", \"ns_per_event\": %.1f, \"repeats\": %u, \"ooms\": %" PRIu64, r->ns_per_event,
            r->repeats, r->ooms);
    if (r->has_min_capacity)
        fprintf(f, ", \"min_capacity_bytes\": %" PRIu64 ", \"min_capacity_probes\": %u",
                r->min_capacity_bytes, r->min_capacity_probes);
    else
        fprintf(f, ", \"min_capacity_bytes\": null");
    if (r->fragmentation_at_peak >= 0)
        fprintf(f, ", \"fragmentation_at_peak\": %.6f", r->fragmentation_at_peak);
    if (r->has_map_calls)
        fprintf(f, ", \"map_calls\": %" PRIu64 ", \"unmap_calls\": %" PRIu64, r->map_calls,
                r->unmap_calls);
    else
        fprintf(f, ", \"map_calls\": null, \"unmap_calls\": null");
    if (r->has_modelled_time)
        fprintf(f, ", \"modelled_backend_ms\": %.3f", (double)r->modelled_backend_ns / 1e6);
    if (r->has_stats) {
        const stow_waste_t *w = &r->stats.waste_at_peak;
        fprintf(f,
                ", \"waste_at_peak\": {\"requested_bytes\": %" PRIu64
                ", \"rounding_bytes\": %" PRIu64 ", \"split_remainder_bytes\": %" PRIu64
                ", \"idle_cached_bytes\": %" PRIu64 ", \"pending_bytes\": %" PRIu64
                "}, \"num_alloc_retries\": %" PRIu64 ", \"sync_calls\": %" PRIu64
                ", \"event_records\": %" PRIu64 ", \"event_waits\": %" PRIu64
                ", \"step_plans\": %" PRIu64 ", \"planned_allocations\": %" PRIu64
                ", \"planned_hits\": %" PRIu64 ", \"planned_misses\": %" PRIu64
                ", \"planned_realignments\": %" PRIu64 ", \"planned_fallbacks\": %" PRIu64
                ", \"plans\": %" PRIu64 ", \"plans_dropped\": %" PRIu64
                ", \"planning_ms\": %.3f, \"arena_bytes\": %" PRIu64
                ", \"arena_peak_bytes\": %" PRIu64,
                w->requested_bytes, w->rounding_bytes, w->split_remainder_bytes,
                w->idle_cached_bytes, w->pending_bytes, r->stats.num_alloc_retries,
                r->stats.num_sync_all_streams, r->stats.num_event_records,
                r->stats.num_event_waits, r->stats.num_vmm_step_plans,
                r->stats.num_vmm_planned_allocations, r->stats.num_planned_hits,
                r->stats.num_planned_misses, r->stats.num_planned_realignments,
                r->stats.num_planned_fallbacks, r->stats.num_plans, r->stats.num_plans_dropped,
                (double)r->stats.planning_ns / 1e6, r->stats.arena_bytes,
                r->stats.arena_peak_bytes);
    }
    fprintf(f, "}\n");
}

void stow__replay_print_text(FILE *f, const char *trace_path, const stow_replay_result_t *r,
                             bool min_capacity)
{
    fprintf(f, "%s  (policy %s)\n", trace_path, r->policy);
    fprintf(f, "  events                 %zu\n", r->events);
    fprintf(f, "  peak live bytes        %" PRIu64 "  (lower bound)\n", r->peak_live_bytes);
    fprintf(f, "  peak reserved bytes    %" PRIu64 "\n", r->peak_reserved_bytes);
    fprintf(f, "  reserved / live        %.4f\n", ratio(r->peak_reserved_bytes, r->peak_live_bytes));
    if (min_capacity) {
        if (r->has_min_capacity)
            fprintf(f, "  minimum capacity       %" PRIu64 "  (%.4f x live; 2 MiB steps, %u replays)\n",
                    r->min_capacity_bytes, ratio(r->min_capacity_bytes, r->peak_live_bytes),
                    r->min_capacity_probes);
        else
            fprintf(f, "  minimum capacity       -  (host memory: not defined)\n");
    }
    if (r->fragmentation_at_peak >= 0)
        fprintf(f, "  fragmentation at peak  %.4f\n", r->fragmentation_at_peak);
    if (r->has_backend_calls)
        fprintf(f, "  backend calls          %" PRIu64 "\n", r->backend_calls);
    else
        fprintf(f, "  backend calls          -  (host memory)\n");
    if (r->has_map_calls)
        fprintf(f, "  map / unmap calls      %" PRIu64 " / %" PRIu64 "  (%.1f per 1000 events)\n",
                r->map_calls, r->unmap_calls,
                r->events ? 1000.0 * (double)(r->map_calls + r->unmap_calls) / (double)r->events
                          : 0.0);
    if (r->has_stats)
        fprintf(f,
                "  device synchronizes    %" PRIu64 "  (%" PRIu64 " events recorded, %" PRIu64
                " waited on)\n",
                r->stats.num_sync_all_streams, r->stats.num_event_records,
                r->stats.num_event_waits);
    if (r->has_stats && r->stats.num_vmm_step_plans)
        fprintf(f, "  learned step           %" PRIu64 " plans, %" PRIu64 " planned allocations\n",
                r->stats.num_vmm_step_plans, r->stats.num_vmm_planned_allocations);
    if (r->has_stats && (r->stats.num_plans || r->stats.num_planned_fallbacks))
        fprintf(f,
                "  planned steps          %" PRIu64 " hits, %" PRIu64 " misses, %" PRIu64
                " to the pool; %" PRIu64 " plans, arena %" PRIu64 " bytes\n",
                r->stats.num_planned_hits, r->stats.num_planned_misses,
                r->stats.num_planned_fallbacks, r->stats.num_plans, r->stats.arena_bytes);
    if (r->has_modelled_time)
        fprintf(f, "  modelled backend time  %.3f ms  (H200 cost per call, stowage/sim.h)\n",
                (double)r->modelled_backend_ns / 1e6);
    fprintf(f, "  OOM errors             %" PRIu64 "\n", r->ooms);
    fprintf(f, "  host ns / event        %.1f  (median of %u warm repeats)\n", r->ns_per_event,
            r->repeats);
}

void stow__replay_print_table_header(FILE *f, bool min_capacity)
{
    fprintf(f, "%-24s %-19s %14s %14s %8s", "trace", "policy", "peak live", "peak reserved",
            "res/live");
    if (min_capacity)
        fprintf(f, " %14s %8s", "min capacity", "min/live");
    fprintf(f, " %13s %9s %5s\n", "backend calls", "ns/event", "OOMs");
}

void stow__replay_print_table_row(FILE *f, const char *trace_path, const stow_replay_result_t *r,
                                  bool min_capacity)
{
    /* The file name without directory and ".rep". */
    const char *base = strrchr(trace_path, '/');
    base = base ? base + 1 : trace_path;
    size_t len = strlen(base);
    if (len > 4 && !strcmp(base + len - 4, ".rep"))
        len -= 4;
    fprintf(f, "%-24.*s %-19s %14" PRIu64 " %14" PRIu64 " %8.4f", (int)len, base, r->policy,
            r->peak_live_bytes, r->peak_reserved_bytes,
            ratio(r->peak_reserved_bytes, r->peak_live_bytes));
    if (min_capacity) {
        if (r->has_min_capacity)
            fprintf(f, " %14" PRIu64 " %8.4f", r->min_capacity_bytes,
                    ratio(r->min_capacity_bytes, r->peak_live_bytes));
        else
            fprintf(f, " %14s %8s", "-", "-");
    }
    if (r->has_backend_calls)
        fprintf(f, " %13" PRIu64, r->backend_calls);
    else
        fprintf(f, " %13s", "-");
    fprintf(f, " %9.1f %5" PRIu64 "\n", r->ns_per_event, r->ooms);
}
