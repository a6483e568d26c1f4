/*
 * tests/unit/test_stats_emit.c: accounting/stats.c and accounting/emit.c
 * through the public API.
 *
 * stow_stats_summary / stow_stats_json follow snprintf (buf_len 0 sizes the
 * buffer, truncation NUL-terminates, the full length is always returned); the
 * JSON is checked by a small strict parser (one flat object, unique keys,
 * numbers only). Scopes nest (inner peaks flow into the outer scope at pop),
 * reset_peak sets peaks to current, reset_accumulated keeps
 * current == allocated - freed. Every test ends with stow_pool_destroy == OK.
 */
#include <criterion/criterion.h>

#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "stowage.h"
#include "test_support.h"

#define MIB ((size_t)1 << 20)

static stow_backend_t *sim;
static stow_pool_t *pool;

static void pool_setup(void)
{
    sim = ts_sim(0, false, false);
    cr_assert_not_null(sim);
    cr_assert_eq(stow_pool_create(ts_classic(), sim, &pool), STOW_OK);
}

static void pool_teardown_check(void)
{
    /* In the test body, not .fini: assertions in .fini do not fail a test. */
    cr_assert_eq(stow_pool_destroy(pool), STOW_OK);
    cr_assert_eq(stow_sim_destroy(sim), STOW_OK);
}

static stow_stats_t stats(void)
{
    stow_stats_t s;
    cr_assert_eq(stow_pool_stats(pool, &s), STOW_OK);
    return s;
}

static void *alloc_ok(size_t size)
{
    void *p = NULL;
    stow_status_t st = stow_pool_alloc(pool, size, NULL, &p);
    cr_assert_eq(st, STOW_OK, "alloc %zu -> %d", size, (int)st);
    return p;
}

static void free_ok(void *p) { cr_assert_eq(stow_pool_free(pool, p), STOW_OK); }

/* ---- a strict JSON checker for one flat object of numbers ---- */

typedef struct json {
    const char *s;
    char keys[512][96];
    size_t nkeys;
} json_t;

static void ws(json_t *j)
{
    while (*j->s == ' ' || *j->s == '\n' || *j->s == '\t' || *j->s == '\r')
        j->s++;
}

static bool json_string(json_t *j, char *out, size_t out_len)
{
    if (*j->s != '"')
        return false;
    j->s++;
    size_t n = 0;
    while (*j->s && *j->s != '"') {
        if ((unsigned char)*j->s < 0x20 || *j->s == '\\')
            return false; /* our keys never need escapes */
        if (n + 1 < out_len)
            out[n++] = *j->s;
        j->s++;
    }
    out[n] = '\0';
    if (*j->s != '"')
        return false;
    j->s++;
    return true;
}

static bool json_number(json_t *j)
{
    const char *s = j->s;
    if (*s == '-')
        s++;
    if (*s == '0')
        s++;
    else if (*s >= '1' && *s <= '9')
        while (isdigit((unsigned char)*s))
            s++;
    else
        return false;
    if (*s == '.') {
        s++;
        if (!isdigit((unsigned char)*s))
            return false;
        while (isdigit((unsigned char)*s))
            s++;
    }
    if (*s == 'e' || *s == 'E') {
        s++;
        if (*s == '+' || *s == '-')
            s++;
        if (!isdigit((unsigned char)*s))
            return false;
        while (isdigit((unsigned char)*s))
            s++;
    }
    j->s = s;
    return true;
}

/* Parses text as {"key": number, ...}; false with *why on any defect. */
static bool json_check(const char *text, json_t *j, const char **why)
{
    j->s = text;
    j->nkeys = 0;
    ws(j);
    if (*j->s++ != '{')
        return *why = "no opening brace", false;
    ws(j);
    if (*j->s == '}') {
        j->s++;
    } else {
        for (;;) {
            ws(j);
            if (j->nkeys == 512)
                return *why = "too many keys", false;
            char *key = j->keys[j->nkeys];
            if (!json_string(j, key, sizeof j->keys[0]))
                return *why = "bad key", false;
            for (size_t i = 0; i < j->nkeys; i++)
                if (!strcmp(j->keys[i], key))
                    return *why = "duplicate key", false;
            j->nkeys++;
            ws(j);
            if (*j->s++ != ':')
                return *why = "missing colon", false;
            ws(j);
            if (!json_number(j))
                return *why = "bad number", false;
            ws(j);
            if (*j->s == ',') {
                j->s++;
                continue;
            }
            if (*j->s++ != '}')
                return *why = "missing comma or closing brace", false;
            break;
        }
    }
    ws(j);
    if (*j->s)
        return *why = "trailing characters", false;
    return true;
}

static bool json_has(const json_t *j, const char *key)
{
    for (size_t i = 0; i < j->nkeys; i++)
        if (!strcmp(j->keys[i], key))
            return true;
    return false;
}

/* Value of "key": N in text, as an unsigned integer. */
static uint64_t json_u64(const char *text, const char *key)
{
    char pat[128];
    snprintf(pat, sizeof pat, "\"%s\": ", key);
    const char *p = strstr(text, pat);
    cr_assert_not_null(p, "key %s missing", key);
    return strtoull(p + strlen(pat), NULL, 10);
}

Test(json_checker, self_test)
{
    json_t *j = malloc(sizeof *j);
    const char *why = "";
    cr_assert(json_check("{}", j, &why));
    cr_assert(json_check("{\"a\": 1, \"b\": -0.5e3}", j, &why));
    cr_assert_not(json_check("{\"a\": 1,}", j, &why));
    cr_assert_not(json_check("{\"a\": 1, \"a\": 2}", j, &why));
    cr_assert_not(json_check("{\"a\": 01}", j, &why));
    cr_assert_not(json_check("{\"a\": nan}", j, &why));
    cr_assert_not(json_check("{\"a\": 1", j, &why));
    cr_assert_not(json_check("{\"a\": 1}}", j, &why));
    free(j);
}

/* ---- JSON and summary ---- */

static void exercise_pool(void)
{
    void *a = alloc_ok(100);         /* small pool */
    void *b = alloc_ok(3 * MIB + 5); /* large pool */
    void *c = alloc_ok(30 * MIB);
    free_ok(b);
    void *bad = (void *)(uintptr_t)0x1234;
    cr_assert_eq(stow_pool_free(pool, bad), STOW_ENOTOWNED);
    free_ok(c);
    free_ok(a);
}

static const char *const required_keys[] = {
    "version",
    "allocated_bytes.all.current",
    "allocated_bytes.all.peak",
    "allocated_bytes.small_pool.allocated",
    "allocated_bytes.large_pool.freed",
    "reserved_bytes.large_pool.peak",
    "reserved_bytes.all.current",
    "active_bytes.all.current",
    "requested_bytes.all.peak",
    "inactive_split_bytes.all.current",
    "segment.all.current",
    "allocation.all.allocated",
    "num_ooms",
    "num_alloc_retries",
    "num_invalid_frees",
    "num_device_alloc",
    "free_reserved_bytes",
    "largest_free_block_bytes",
    "fragmentation",
    "fragmentation_peak",
    "capacity_bytes",
    "limit_bytes",
    "waste_at_peak.reserved_bytes",
    "waste_at_peak.rounding_bytes",
    "waste_at_peak.split_remainder_bytes",
    "waste_at_peak.fragmentation",
};

Test(stats_emit, json_is_valid_with_keys, .init = pool_setup)
{
    exercise_pool();
    stow_stats_t s = stats();
    size_t n = stow_stats_json(&s, NULL, 0);
    cr_assert_gt(n, 100);
    char *buf = malloc(n + 1);
    cr_assert_eq(stow_stats_json(&s, buf, n + 1), n);
    cr_assert_eq(strlen(buf), n);
    json_t *j = malloc(sizeof *j);
    const char *why = "";
    cr_assert(json_check(buf, j, &why), "invalid JSON (%s):\n%s", why, buf);
    for (size_t i = 0; i < sizeof required_keys / sizeof required_keys[0]; i++)
        cr_assert(json_has(j, required_keys[i]), "missing key %s", required_keys[i]);
    /* Values agree with the struct. */
    cr_assert_eq(json_u64(buf, "allocated_bytes.all.peak"), s.allocated_bytes[STOW_POOL_ALL].peak);
    cr_assert_eq(json_u64(buf, "reserved_bytes.large_pool.peak"),
                 s.reserved_bytes[STOW_POOL_LARGE].peak);
    cr_assert_eq(json_u64(buf, "num_invalid_frees"), 1);
    cr_assert_eq(json_u64(buf, "allocation.all.allocated"), 3);
    cr_assert_eq(json_u64(buf, "version"), STOW_STATS_VERSION);
    cr_assert_eq(json_u64(buf, "allocated_bytes.all.current"), 0);
    cr_assert_gt(json_u64(buf, "waste_at_peak.reserved_bytes"), 0);
    /* Size-class keys appear for used classes (class 0: <= 512 B). */
    cr_assert(json_has(j, "size_class.0.requests"));
    cr_assert_eq(json_u64(buf, "size_class.0.requests"), 1);
    free(j);
    free(buf);
    pool_teardown_check();
}

Test(stats_emit, json_of_fresh_pool_and_null, .init = pool_setup)
{
    stow_stats_t s = stats();
    char buf[8192];
    size_t n = stow_stats_json(&s, buf, sizeof buf);
    cr_assert_lt(n, sizeof buf);
    json_t *j = malloc(sizeof *j);
    const char *why = "";
    cr_assert(json_check(buf, j, &why), "%s:\n%s", why, buf);
    cr_assert_eq(json_u64(buf, "max_split_size"), 0, "unlimited is written as 0");
    free(j);
    /* NULL stats: an empty string. */
    char small[4] = "abc";
    cr_assert_eq(stow_stats_json(NULL, small, sizeof small), 0);
    cr_assert_str_empty(small);
    cr_assert_eq(stow_stats_summary(NULL, small, sizeof small), 0);
    pool_teardown_check();
}

/* snprintf semantics for every truncation length. */
static void check_truncation(size_t (*emit)(const stow_stats_t *, char *, size_t),
                             const stow_stats_t *s)
{
    size_t n = emit(s, NULL, 0);
    char *full = malloc(n + 1);
    char *buf = malloc(n + 2);
    cr_assert_eq(emit(s, full, n + 1), n);
    cr_assert_eq(strlen(full), n);
    for (size_t len = 1; len <= n + 1; len += (len < 300 || len > n - 300) ? 1 : 37) {
        memset(buf, 'Z', n + 2);
        cr_assert_eq(emit(s, buf, len), n, "buf_len %zu", len);
        size_t want = len - 1 < n ? len - 1 : n;
        cr_assert_eq(buf[want], '\0', "buf_len %zu: no NUL at %zu", len, want);
        cr_assert_eq(memcmp(buf, full, want), 0, "buf_len %zu: prefix differs", len);
        cr_assert_eq(buf[len], 'Z', "buf_len %zu: wrote past the buffer", len);
    }
    /* buf_len 0 never touches the buffer. */
    char guard = 'G';
    cr_assert_eq(emit(s, &guard, 0), n);
    cr_assert_eq(guard, 'G');
    free(full);
    free(buf);
}

Test(stats_emit, json_snprintf_semantics, .init = pool_setup)
{
    exercise_pool();
    stow_stats_t s = stats();
    check_truncation(stow_stats_json, &s);
    pool_teardown_check();
}

Test(stats_emit, summary_snprintf_semantics_and_rows, .init = pool_setup)
{
    exercise_pool();
    void *keep = alloc_ok(5 * MIB);
    stow_stats_t s = stats();
    check_truncation(stow_stats_summary, &s);
    size_t n = stow_stats_summary(&s, NULL, 0);
    char *buf = malloc(n + 1);
    stow_stats_summary(&s, buf, n + 1);
    const char *rows[] = {"Allocated memory", "Active memory", "Requested memory",
                          "Reserved memory", "Non-releasable memory", "Allocations",
                          "Reserved segments", "from small pool", "from large pool",
                          "OOMs:", "fragmentation", "At the reserved peak"};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++)
        cr_assert(strstr(buf, rows[i]), "summary lacks '%s':\n%s", rows[i], buf);
    cr_assert(!strstr(buf, "Page maps"), "a classic pool maps no pages:\n%s", buf);
    cr_assert_eq(buf[n - 1], '\n');
    /* stow_summary = snapshot + summary. */
    char *buf2 = malloc(n + 1);
    cr_assert_eq(stow_summary(pool, buf2, n + 1), n);
    cr_assert_str_eq(buf, buf2);
    free(buf);
    free(buf2);
    free_ok(keep);
    pool_teardown_check();
}

/* ---- scopes ---- */

Test(stats_emit, scope_nesting, .init = pool_setup)
{
    unsigned depth = 0;
    stow_scope_result_t r;
    cr_assert_eq(stow_scope_push(pool, &depth), STOW_OK);
    cr_assert_eq(depth, 1);
    void *a = alloc_ok(4 * MIB);
    uint64_t after_a = stats().allocated_bytes[STOW_POOL_ALL].current;
    cr_assert_eq(after_a, 4 * MIB);

    cr_assert_eq(stow_scope_push(pool, &depth), STOW_OK);
    cr_assert_eq(depth, 2);
    stow_stats_t at_inner_push = stats();
    void *b = alloc_ok(8 * MIB);
    uint64_t inner_peak = stats().allocated_bytes[STOW_POOL_ALL].current;
    uint64_t inner_reserved_peak = stats().reserved_bytes[STOW_POOL_ALL].current;
    cr_assert_eq(inner_peak, 12 * MIB);
    free_ok(b);
    cr_assert_eq(stow_scope_pop(pool, &r), STOW_OK);
    cr_assert_eq(r.allocated_bytes_at_push, 4 * MIB);
    cr_assert_eq(r.allocated_bytes_peak, 12 * MIB);
    cr_assert_eq(r.allocated_bytes_at_pop, 4 * MIB);
    cr_assert_eq(r.reserved_bytes_at_push, at_inner_push.reserved_bytes[STOW_POOL_ALL].current);
    cr_assert_eq(r.reserved_bytes_peak, inner_reserved_peak);
    cr_assert_eq(r.reserved_bytes_at_pop, stats().reserved_bytes[STOW_POOL_ALL].current);

    /* A smaller peak after the inner pop does not lower the outer one. */
    void *c = alloc_ok(2 * MIB);
    free_ok(c);
    free_ok(a);
    cr_assert_eq(stow_scope_pop(pool, &r), STOW_OK);
    cr_assert_eq(r.allocated_bytes_at_push, 0);
    cr_assert_eq(r.allocated_bytes_peak, 12 * MIB, "outer scope sees the inner peak");
    cr_assert_eq(r.allocated_bytes_at_pop, 0);
    cr_assert_eq(r.reserved_bytes_at_push, 0);
    cr_assert_geq(r.reserved_bytes_peak, inner_reserved_peak);
    cr_assert_geq(r.reserved_bytes_peak, r.allocated_bytes_peak);
    cr_assert_eq(stow_scope_pop(pool, &r), STOW_EINVAL, "no scope open");
    cr_assert_eq(stow_scope_pop(pool, NULL), STOW_EINVAL);
    pool_teardown_check();
}

Test(stats_emit, scope_peak_independent_of_global_peak, .init = pool_setup)
{
    /* A global peak reached before the push does not leak into the scope, and
     * reset_peak inside the scope does not affect it. */
    void *big = alloc_ok(32 * MIB);
    free_ok(big);
    cr_assert_eq(stow_scope_push(pool, NULL), STOW_OK);
    void *a = alloc_ok(4 * MIB);
    stow_stats_reset_peak(pool);
    free_ok(a);
    stow_scope_result_t r;
    cr_assert_eq(stow_scope_pop(pool, &r), STOW_OK);
    cr_assert_eq(r.allocated_bytes_at_push, 0);
    cr_assert_eq(r.allocated_bytes_peak, 4 * MIB);
    cr_assert_eq(stats().allocated_bytes[STOW_POOL_ALL].peak, 4 * MIB);
    /* An empty scope: peak == value at push. */
    cr_assert_eq(stow_scope_push(pool, NULL), STOW_OK);
    cr_assert_eq(stow_scope_pop(pool, &r), STOW_OK);
    cr_assert_eq(r.allocated_bytes_peak, r.allocated_bytes_at_push);
    cr_assert_eq(r.reserved_bytes_peak, r.reserved_bytes_at_push);
    pool_teardown_check();
}

Test(stats_emit, scope_depth_limit, .init = pool_setup)
{
    unsigned depth = 0;
    for (unsigned i = 1; i <= STOW_SCOPE_MAX_DEPTH; i++) {
        cr_assert_eq(stow_scope_push(pool, &depth), STOW_OK);
        cr_assert_eq(depth, i);
    }
    depth = 777;
    cr_assert_eq(stow_scope_push(pool, &depth), STOW_EBUSY);
    cr_assert_eq(depth, 777, "depth_out untouched on error");
    void *p = alloc_ok(MIB * 6);
    free_ok(p);
    stow_scope_result_t r;
    for (unsigned i = 0; i < STOW_SCOPE_MAX_DEPTH; i++) {
        cr_assert_eq(stow_scope_pop(pool, &r), STOW_OK);
        cr_assert_eq(r.allocated_bytes_peak, 6 * MIB, "pop %u", i);
    }
    cr_assert_eq(stow_scope_pop(pool, &r), STOW_EINVAL);
    cr_assert_eq(stow_scope_push(pool, NULL), STOW_OK, "usable again after unwinding");
    cr_assert_eq(stow_scope_pop(pool, NULL), STOW_OK);
    cr_assert_eq(stow_scope_push(NULL, NULL), STOW_EINVAL);
    cr_assert_eq(stow_scope_pop(NULL, NULL), STOW_EINVAL);
    pool_teardown_check();
}

/* ---- resets ---- */

static void check_stat_identity(const stow_stats_t *s)
{
#define CHECK_ARRAY_(name, label)                                                     \
    for (unsigned k = 0; k < STOW_POOL_KINDS; k++) {                                  \
        cr_assert_eq(s->name[k].current, s->name[k].allocated - s->name[k].freed,     \
                     #name "[%u]: current %llu allocated %llu freed %llu", k,         \
                     (unsigned long long)s->name[k].current,                          \
                     (unsigned long long)s->name[k].allocated,                        \
                     (unsigned long long)s->name[k].freed);                           \
        cr_assert_leq(s->name[k].current, s->name[k].peak, #name "[%u]", k);          \
    }
    STOW_STAT_ARRAY_FIELDS(CHECK_ARRAY_)
#undef CHECK_ARRAY_
}

Test(stats_emit, reset_peak_sets_peaks_to_current, .init = pool_setup)
{
    void *a = alloc_ok(4 * MIB);
    void *b = alloc_ok(16 * MIB);
    void *c = alloc_ok(300);
    free_ok(b);
    stow_stats_t before = stats();
    cr_assert_eq(before.allocated_bytes[STOW_POOL_ALL].peak, 20 * MIB + 512);
    stow_stats_reset_peak(pool);
    stow_stats_t s = stats();
#define CHECK_PEAK_(name, label)                                                      \
    for (unsigned k = 0; k < STOW_POOL_KINDS; k++) {                                  \
        cr_assert_eq(s.name[k].peak, s.name[k].current, #name "[%u]", k);             \
        cr_assert_eq(s.name[k].allocated, before.name[k].allocated, #name "[%u]", k); \
    }
    STOW_STAT_ARRAY_FIELDS(CHECK_PEAK_)
#undef CHECK_PEAK_
    cr_assert(s.fragmentation_peak == s.fragmentation);
    cr_assert_eq(s.waste_at_peak.reserved_bytes, s.reserved_bytes[STOW_POOL_ALL].current);
    cr_assert_eq(s.waste_at_peak.requested_bytes, s.requested_bytes[STOW_POOL_ALL].current);
    cr_assert_eq(s.waste_at_peak.rounding_bytes,
                 s.allocated_bytes[STOW_POOL_ALL].current - s.requested_bytes[STOW_POOL_ALL].current);
    const stow_waste_t *w = &s.waste_at_peak;
    cr_assert_eq(w->requested_bytes + w->rounding_bytes + w->split_remainder_bytes +
                     w->idle_cached_bytes + w->pending_bytes,
                 w->reserved_bytes, "waste parts sum to the reserved peak");
    /* New peaks count from here. */
    void *d = alloc_ok(2 * MIB);
    s = stats();
    cr_assert_eq(s.allocated_bytes[STOW_POOL_ALL].peak, 6 * MIB + 512);
    check_stat_identity(&s);
    free_ok(a);
    free_ok(c);
    free_ok(d);
    pool_teardown_check();
}

Test(stats_emit, reset_accumulated_keeps_identity, .init = pool_setup)
{
    void *keep = alloc_ok(4 * MIB);
    void *small = alloc_ok(1000);
    exercise_pool();
    cr_assert_eq(stow_pool_free(pool, (void *)(uintptr_t)0x4242), STOW_ENOTOWNED);
    stow_stats_t before = stats();
    check_stat_identity(&before);
    cr_assert_gt(before.num_invalid_frees, 0);
    stow_stats_reset_accumulated(pool);
    stow_stats_t s = stats();
    check_stat_identity(&s);
#define CHECK_ACC_(name, label)                                                        \
    for (unsigned k = 0; k < STOW_POOL_KINDS; k++) {                                   \
        cr_assert_eq(s.name[k].current, before.name[k].current, #name "[%u]", k);      \
        cr_assert_eq(s.name[k].peak, before.name[k].peak, #name "[%u] peak kept", k);  \
        cr_assert_eq(s.name[k].freed, 0, #name "[%u]", k);                             \
        cr_assert_eq(s.name[k].allocated, s.name[k].current, #name "[%u]", k);         \
    }
    STOW_STAT_ARRAY_FIELDS(CHECK_ACC_)
#undef CHECK_ACC_
#define CHECK_COUNTER_(name, desc) cr_assert_eq(s.name, 0, #name);
    STOW_COUNTER_FIELDS(CHECK_COUNTER_)
#undef CHECK_COUNTER_
    for (unsigned c = 0; c < STOW_SIZE_CLASS_COUNT; c++) {
        cr_assert_eq(s.size_class[c].requests, 0);
        cr_assert_eq(s.size_class[c].live, before.size_class[c].live, "live kept");
    }
    /* Activity after the reset keeps the identity. */
    exercise_pool();
    free_ok(small);
    s = stats();
    check_stat_identity(&s);
    cr_assert_eq(s.allocation[STOW_POOL_ALL].allocated, 2 + 3);
    cr_assert_eq(s.allocation[STOW_POOL_ALL].freed, 4);
    free_ok(keep);
    s = stats();
    check_stat_identity(&s);
    cr_assert_eq(s.allocated_bytes[STOW_POOL_ALL].current, 0);
    pool_teardown_check();
}

Test(stats_emit, stats_header_and_null_arguments, .init = pool_setup)
{
    stow_stats_t s = stats();
    cr_assert_eq(s.size, sizeof(stow_stats_t));
    cr_assert_eq(s.version, STOW_STATS_VERSION);
    cr_assert_eq(s.capacity_bytes, (uint64_t)1 << 46);
    cr_assert_eq(s.limit_bytes, s.capacity_bytes);
    cr_assert_eq(stow_pool_stats(pool, NULL), STOW_EINVAL);
    cr_assert_eq(stow_pool_stats(NULL, &s), STOW_EINVAL);
    stow_stats_reset_peak(NULL);
    stow_stats_reset_accumulated(NULL);
    char b[4] = "xyz";
    cr_assert_eq(stow_summary(NULL, b, sizeof b), 0);
    cr_assert_str_empty(b);
    pool_teardown_check();
}

/* fragmentation_peak is the highest fragmentation any allocation or free left
 * behind (the pool checks it against a bound per largest free block, not the
 * fraction itself: this replays 3000 random calls and compares after each). */
Test(stats_emit, fragmentation_peak_is_the_highest_value_seen, .init = pool_setup)
{
    void *live[64] = {0};
    uint64_t x = 0x9E3779B97F4A7C15ull;
    double highest = 0.0;
    for (int i = 0; i < 3000; i++) {
        ts_xorshift(&x);
        size_t slot = (size_t)(x % 64);
        if (live[slot]) {
            free_ok(live[slot]);
            live[slot] = NULL;
        } else {
            /* 512 B to 12 MiB, small and large pools alike */
            size_t size = (size_t)512 << ((x >> 8) % 15);
            live[slot] = alloc_ok(size + (size_t)((x >> 20) % 4096));
        }
        stow_stats_t s = stats();
        if (s.fragmentation > highest)
            highest = s.fragmentation;
        cr_assert(s.fragmentation_peak >= highest - 1e-12 && s.fragmentation_peak <= highest + 1e-12,
                  "call %d: peak %.17g, highest seen %.17g", i, s.fragmentation_peak, highest);
        if (i == 1500) {
            stow_stats_reset_peak(pool);
            highest = stats().fragmentation;
        }
    }
    for (size_t k = 0; k < 64; k++)
        if (live[k])
            free_ok(live[k]);
    pool_teardown_check();
}
