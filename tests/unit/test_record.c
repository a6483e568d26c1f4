/*
 * tests/unit/test_record.c: tags, per-tag accounting, sites, the event ring
 * buffer and stow_trace_dump (allocator/record.c), and the tags of a dump as
 * `stowage report` shows them.
 */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "stowage/record.h"
#include "stowage/torch.h"
#include "test_support.h"

#define MIB ((size_t)1 << 20)

static stow_backend_t *sim;
static stow_pool_t *pool;

static void make_pool(const char *conf)
{
    sim = ts_sim(0, false, false);
    pool = ts_pool(conf, sim);
}

static void finish(void)
{
    cr_assert_eq(stow_pool_destroy(pool), STOW_OK);
    cr_assert_eq(stow_sim_destroy(sim), STOW_OK);
}

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "r");
    cr_assert_not_null(f, "%s", path);
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = 0;
    fclose(f);
    return buf;
}

Test(tags, interned_per_process_and_current_per_thread)
{
    unsigned a, b, c;
    cr_assert_eq(stow_tag_set("weights", &a), STOW_OK);
    cr_assert_eq(stow_tag_set("activations", &b), STOW_OK);
    cr_assert_eq(stow_tag_set("weights", &c), STOW_OK);
    cr_assert_eq(a, c);
    cr_assert_neq(a, b);
    cr_assert_str_eq(stow_tag_current(), "weights");
    cr_assert_str_eq(stow_tag_name(b), "activations");
    cr_assert_str_eq(stow_tag_name(0), "");
    cr_assert_str_eq(stow_tag_name(999), "");
    char longname[STOW_TAG_NAME_MAX + 1];
    memset(longname, 'x', sizeof longname - 1);
    longname[sizeof longname - 1] = 0;
    cr_assert_eq(stow_tag_set(longname, NULL), STOW_EINVAL);
    /* A name the tags file cannot hold as written: refused, the current tag kept. */
    const char *bad[] = {"two\nlines", "cr\r", " lead", "\ttab"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        unsigned untouched = 77;
        cr_assert_eq(stow_tag_set(bad[i], &untouched), STOW_EINVAL, "%zu", i);
        cr_assert_eq(untouched, 77);
        cr_assert_str_eq(stow_tag_current(), "weights");
    }
    cr_assert_eq(stow_tag_set("inner blank ok", NULL), STOW_OK);
    cr_assert_eq(stow_tag_set(NULL, &a), STOW_OK);
    cr_assert_eq(a, 0);
    cr_assert_str_eq(stow_tag_current(), "");
    char name[16];
    stow_status_t st = STOW_OK;
    for (int i = 0; i < STOW_TAG_MAX && st == STOW_OK; i++) {
        snprintf(name, sizeof name, "t%d", i);
        st = stow_tag_set(name, NULL);
    }
    cr_assert_eq(st, STOW_EBUSY, "at most STOW_TAG_MAX - 1 names");
}

Test(tags, pool_accounts_bytes_per_tag)
{
    make_pool("policy:classic");
    unsigned w, act;
    cr_assert_eq(stow_tag_set("weights", &w), STOW_OK);
    void *p, *q, *r;
    cr_assert_eq(stow_pool_alloc(pool, 10 * MIB, NULL, &p), STOW_OK);
    cr_assert_eq(stow_tag_set("activations", &act), STOW_OK);
    cr_assert_eq(stow_pool_alloc(pool, 1000, NULL, &q), STOW_OK);
    cr_assert_eq(stow_pool_alloc(pool, 2000, NULL, &r), STOW_OK);
    stow_tag_stats_t t[STOW_TAG_MAX];
    cr_assert_eq(stow_pool_tag_stats(pool, t), STOW_OK);
    cr_assert_eq(t[w].allocated_bytes, 10 * MIB);
    cr_assert_eq(t[act].allocated_bytes, 1024 + 2048);
    cr_assert_eq(t[act].allocations, 2);
    cr_assert_eq(stow_pool_free(pool, q), STOW_OK);
    cr_assert_eq(stow_pool_tag_stats(pool, t), STOW_OK);
    cr_assert_eq(t[act].allocated_bytes, 2048);
    cr_assert_eq(t[act].allocated_bytes_peak, 1024 + 2048);
    stow_stats_reset_peak(pool);
    cr_assert_eq(stow_pool_tag_stats(pool, t), STOW_OK);
    cr_assert_eq(t[act].allocated_bytes_peak, 2048);
    cr_assert_eq(stow_pool_free(pool, p), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, r), STOW_OK);
    finish();
}

static void *site_of_new_thread(void *arg)
{
    (void)arg;
    return (void *)(uintptr_t)stow_record_site_current();
}

Test(sites, interned_per_process_and_current_per_thread)
{
    uint32_t a, b, c;
    cr_assert_eq(stow_record_site_intern("train.py:42 forward", &a), STOW_OK);
    cr_assert_eq(stow_record_site_intern("model.py:7 step via lib/x.py:3 f", &b), STOW_OK);
    cr_assert_eq(stow_record_site_intern("train.py:42 forward", &c), STOW_OK);
    cr_assert_eq(a, c);
    cr_assert_neq(a, b);
    cr_assert_geq(a, 1);
    cr_assert_str_eq(stow_record_site_text(a), "train.py:42 forward");
    cr_assert_str_eq(stow_record_site_text(0), "");
    cr_assert_str_eq(stow_record_site_text(UINT32_MAX), "");
    cr_assert_eq(stow_record_site_current(), 0);
    cr_assert_eq(stow_record_site_set(b), STOW_OK);
    cr_assert_eq(stow_record_site_current(), b);
    cr_assert_eq(stow_record_site_set(UINT32_MAX), STOW_EINVAL, "never interned");
    cr_assert_eq(stow_record_site_current(), b);
    pthread_t th;
    void *other;
    cr_assert_eq(pthread_create(&th, NULL, site_of_new_thread, NULL), 0);
    cr_assert_eq(pthread_join(th, &other), 0);
    cr_assert_eq((uintptr_t)other, 0, "another thread has its own current site");
    cr_assert_eq(stow_record_site_set(0), STOW_OK);
    /* Texts a tags file cannot hold as written, or too long: refused. */
    char longtext[STOW_RECORD_SITE_TEXT_MAX + 1];
    memset(longtext, 'x', sizeof longtext - 1);
    longtext[sizeof longtext - 1] = 0;
    const char *bad[] = {"", "two\nlines", "cr\r", " lead", "\ttab", longtext};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        uint32_t untouched = 77;
        cr_assert_eq(stow_record_site_intern(bad[i], &untouched), STOW_EINVAL, "%zu", i);
        cr_assert_eq(untouched, 77);
    }
    longtext[STOW_RECORD_SITE_TEXT_MAX - 1] = 0;
    cr_assert_eq(stow_record_site_intern(longtext, &c), STOW_OK, "1023 bytes fit");
    cr_assert_eq(stow_record_site_intern(NULL, &c), STOW_EINVAL);
    cr_assert_eq(stow_record_site_intern("x.py:1 f", NULL), STOW_EINVAL);
    /* Many sites: each keeps its id while the table grows. */
    enum { N = 5000 };
    static uint32_t ids[N];
    char text[64];
    for (int i = 0; i < N; i++) {
        snprintf(text, sizeof text, "gen.py:%d f", i);
        cr_assert_eq(stow_record_site_intern(text, &ids[i]), STOW_OK);
    }
    for (int i = 0; i < N; i++) {
        snprintf(text, sizeof text, "gen.py:%d f", i);
        cr_assert_str_eq(stow_record_site_text(ids[i]), text);
        cr_assert_eq(stow_record_site_intern(text, &c), STOW_OK);
        cr_assert_eq(c, ids[i]);
    }
    cr_assert_str_eq(stow_record_site_text(a), "train.py:42 forward");
}

/* A recorded allocation's site, else its thread's tag, goes into TRACE.tags,
 * and `stowage report` reads that file next to the trace into its sources of
 * the peak. */
Test(record, sites_and_tags_reach_the_report)
{
    make_pool("record_events:1000");
    uint32_t line, other_line;
    cr_assert_eq(stow_record_site_intern("train.py:42 forward", &line), STOW_OK);
    cr_assert_eq(stow_record_site_intern("model.py:7 step", &other_line), STOW_OK);
    void *a, *b, *c, *d;
    cr_assert_eq(stow_tag_set("kv_cache", NULL), STOW_OK);
    cr_assert_eq(stow_record_site_set(line), STOW_OK);
    cr_assert_eq(stow_pool_alloc(pool, 30 * MIB, NULL, &a), STOW_OK); /* site and tag */
    cr_assert_eq(stow_record_site_set(0), STOW_OK);
    cr_assert_eq(stow_pool_alloc(pool, 20 * MIB, NULL, &b), STOW_OK); /* tag only */
    cr_assert_eq(stow_tag_set(NULL, NULL), STOW_OK);
    cr_assert_eq(stow_record_site_set(other_line), STOW_OK);
    cr_assert_eq(stow_pool_alloc(pool, 10 * MIB, NULL, &c), STOW_OK); /* site only */
    cr_assert_eq(stow_record_site_set(0), STOW_OK);
    cr_assert_eq(stow_pool_alloc(pool, 4096, NULL, &d), STOW_OK); /* neither */
    char path[] = "/tmp/stow_sites_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    cr_assert_eq(stow_trace_dump(pool, path), STOW_OK);
    char tags_path[64], html[80], args[256], out[4096];
    snprintf(tags_path, sizeof tags_path, "%s.tags", path);
    cr_assert_str_eq(slurp(tags_path), "0 train.py:42 forward\n1 kv_cache\n2 model.py:7 step\n");
    snprintf(html, sizeof html, "%s.html", path);
    snprintf(args, sizeof args, "%s -o %s", path, html);
    cr_assert_eq(ts_cli("report", args, out, sizeof out), 0, "%s", out);
    char *page = slurp(html);
    const char *rows[] = {"<tr data-id=0>", "<tr data-id=1>", "<tr data-id=2>",
                          "<tr data-id=3>"};
    const char *want[] = {"train.py:42 forward</td>", "kv_cache</td>", "model.py:7 step</td>",
                          "<td class=l></td>"};
    for (size_t i = 0; i < 4; i++) {
        const char *row = strstr(page, rows[i]);
        cr_assert_not_null(row, "%s", rows[i]);
        const char *end = strstr(row, "</tr>");
        const char *tag = strstr(row, want[i]);
        cr_assert(tag && tag < end, "row %zu has no '%s'", i, want[i]);
    }
    unlink(path);
    unlink(tags_path);
    unlink(html);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, c), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, d), STOW_OK);
    finish();
}

static uint32_t hook_site;
static unsigned hook_calls;
static uint32_t count_and_give_site(void)
{
    hook_calls++;
    return hook_site;
}

/* The PyTorch entry point asks the site hook for each allocation's site, and
 * gives the thread back its own site afterwards. */
Test(record, torch_entry_site_hook)
{
    setenv("STOWAGE_BACKEND", "sim", 1);
    void *first = stow_torch_malloc(4096, 0, NULL); /* creates device 0's pool */
    cr_assert_not_null(first);
    cr_assert_eq(stow_record_start(stow_torch_pool(0), 100), STOW_OK);
    uint32_t mine, line;
    cr_assert_eq(stow_record_site_intern("main.c:10 main", &mine), STOW_OK);
    cr_assert_eq(stow_record_site_intern("train.py:9 forward", &line), STOW_OK);
    cr_assert_eq(stow_record_site_set(mine), STOW_OK);
    stow_torch_set_site_hook(count_and_give_site);
    hook_site = line;
    void *a = stow_torch_malloc((ssize_t)MIB, 0, NULL);
    cr_assert_eq(stow_record_site_current(), mine, "the thread's site restored");
    hook_site = UINT32_MAX; /* not a site: the allocation gets none */
    void *b = stow_torch_malloc(4096, 0, NULL);
    stow_torch_set_site_hook(NULL);
    void *c = stow_torch_malloc(4096, 0, NULL);
    cr_assert(a && b && c);
    cr_assert_eq(hook_calls, 2);
    char path[] = "/tmp/stow_hook_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    cr_assert_eq(stow_torch_dump_trace(0, path), STOW_OK);
    char tags_path[64];
    snprintf(tags_path, sizeof tags_path, "%s.tags", path);
    cr_assert_str_eq(slurp(tags_path), "0 train.py:9 forward\n2 main.c:10 main\n");
    unlink(path);
    unlink(tags_path);
    stow_torch_set_site_hook(count_and_give_site);
    stow_torch_shutdown(); /* forgets the hook */
    hook_calls = 0;
    stow_torch_free(stow_torch_malloc(4096, 0, NULL), 0, 0, NULL);
    cr_assert_eq(hook_calls, 0);
    stow_torch_shutdown();
}

Test(record, dump_writes_a_trace_the_reader_accepts)
{
    make_pool("policy:classic,record_events:1000");
    char path[] = "/tmp/stow_record_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    unsigned kv;
    cr_assert_eq(stow_tag_set("kv_cache", &kv), STOW_OK);
    void *a, *b;
    cr_assert_eq(stow_pool_alloc(pool, 3000, NULL, &a), STOW_OK);
    cr_assert_eq(stow_tag_set(NULL, NULL), STOW_OK);
    cr_assert_eq(stow_pool_alloc(pool, 20 * MIB, (stow_stream_t)0x5, &b), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    uint64_t recorded, kept;
    stow_record_counts(pool, &recorded, &kept);
    cr_assert_eq(recorded, 5, "2 allocs, 1 free, 2 segment reservations");
    cr_assert_eq(kept, 5);
    cr_assert_eq(stow_trace_dump(pool, path), STOW_OK);
    stow_trace_t *t;
    char err[256];
    cr_assert_eq(stow_trace_load(path, &t, err, sizeof err), STOW_OK, "%s", err);
    cr_assert_eq(t->id_count, 2);
    cr_assert_eq(t->event_count, 3);
    cr_assert_eq(t->events[0].kind, STOW_TRACE_ALLOC);
    cr_assert_eq(t->events[0].size_bytes, 3000);
    cr_assert_eq(t->events[1].size_bytes, 20 * MIB);
    cr_assert_eq(t->events[0].stream, 0, "streams numbered from 0 in order of use");
    cr_assert_eq(t->events[1].stream, 1);
    cr_assert_eq(t->events[2].kind, STOW_TRACE_FREE);
    cr_assert_eq(t->events[2].id, 0);
    cr_assert_eq(t->peak_live_bytes, 3000 + 20 * MIB);
    stow_trace_free(t);
    char *text = slurp(path);
    cr_assert_not_null(strstr(text, "# segment_reserve"), "%s", text);
    char tags_path[64];
    snprintf(tags_path, sizeof tags_path, "%s.tags", path);
    cr_assert_str_eq(slurp(tags_path), "0 kv_cache\n");
    unlink(path);
    unlink(tags_path);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    finish();
}

/* Step markers are recorded in order with the events and dumped as 'm KEY'
 * and 'e' lines, which the reader gives back as markers; a bad key changes
 * nothing; markers without recording are accepted and leave no trace. */
Test(record, step_markers_are_recorded_and_dumped)
{
    make_pool("policy:classic");
    cr_assert_eq(stow_pool_step(pool, "early"), STOW_OK, "not recording: nothing kept");
    cr_assert_eq(stow_record_start(pool, 100), STOW_OK);
    char path[] = "/tmp/stow_record_XXXXXX";
    int fd = mkstemp(path);
    cr_assert(fd >= 0);
    close(fd);
    void *a, *b;
    cr_assert_eq(stow_pool_step(pool, "train"), STOW_OK);
    cr_assert_eq(stow_pool_alloc(pool, 4096, NULL, &a), STOW_OK);
    cr_assert_eq(stow_pool_step(pool, "bad key"), STOW_EINVAL);
    cr_assert_eq(stow_pool_step(pool, ""), STOW_EINVAL);
    cr_assert_eq(stow_pool_step(NULL, "train"), STOW_EINVAL);
    char long_key[STOW_STEP_KEY_MAX + 2];
    memset(long_key, 'k', sizeof long_key - 1);
    long_key[sizeof long_key - 1] = '\0';
    cr_assert_eq(stow_pool_step(pool, long_key), STOW_EINVAL);
    long_key[STOW_STEP_KEY_MAX] = '\0';
    cr_assert_eq(stow_pool_step(pool, long_key), STOW_OK, "64 characters");
    cr_assert_eq(stow_pool_free(pool, a), STOW_OK);
    cr_assert_eq(stow_pool_step(pool, "train"), STOW_OK);
    cr_assert_eq(stow_pool_alloc(pool, 4096, NULL, &b), STOW_OK);
    cr_assert_eq(stow_pool_step(pool, NULL), STOW_OK);
    cr_assert_eq(stow_pool_free(pool, b), STOW_OK);
    cr_assert_eq(stow_trace_dump(pool, path), STOW_OK);
    stow_trace_t *t;
    char err[256];
    cr_assert_eq(stow_trace_load(path, &t, err, sizeof err), STOW_OK, "%s", err);
    cr_assert_eq(t->event_count, 4);
    cr_assert_eq(t->marker_count, 4);
    cr_assert_eq(t->key_count, 2);
    cr_assert_str_eq(t->keys[0], "train");
    cr_assert_str_eq(t->keys[1], long_key);
    size_t before[] = {0, 1, 2, 3};
    uint32_t key[] = {0, 1, 0, STOW_TRACE_STEP_END};
    for (size_t i = 0; i < 4; i++) {
        cr_assert_eq(t->markers[i].before_event, before[i], "marker %zu", i);
        cr_assert_eq(t->markers[i].key, key[i], "marker %zu", i);
    }
    stow_trace_free(t);
    unlink(path);
    finish();
}

/* The pool's recording dumped to a file and read back. */
static stow_trace_t *dump_and_load(void)
{
    char path[] = "/tmp/stow_ring_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    cr_assert_eq(stow_trace_dump(pool, path), STOW_OK);
    stow_trace_t *t;
    char err[256];
    cr_assert_eq(stow_trace_load(path, &t, err, sizeof err), STOW_OK, "%s", err);
    unlink(path);
    return t;
}

Test(record, the_ring_keeps_the_newest_events)
{
    make_pool("policy:classic");
    cr_assert_eq(stow_trace_dump(pool, "/tmp/never"), STOW_EINVAL, "not recording");
    cr_assert_eq(stow_record_start(pool, 4), STOW_OK);
    void *p[6];
    for (int i = 0; i < 6; i++)
        cr_assert_eq(stow_pool_alloc(pool, 1000 + (size_t)i, NULL, &p[i]), STOW_OK);
    for (int i = 0; i < 6; i++)
        cr_assert_eq(stow_pool_free(pool, p[i]), STOW_OK);
    uint64_t recorded, kept;
    stow_record_counts(pool, &recorded, &kept);
    cr_assert_eq(recorded, 13, "1 segment + 6 allocs + 6 frees");
    cr_assert_eq(kept, 4);
    /* Only frees survive, whose allocations were overwritten: an empty trace. */
    stow_trace_t *t = dump_and_load();
    cr_assert_eq(t->event_count, 0);
    stow_trace_free(t);
    cr_assert_eq(stow_record_start(pool, 0), STOW_OK);
    stow_record_counts(pool, &recorded, &kept);
    cr_assert_eq(recorded, 0);
    /* Past the maximum: refused, and recording stays as it was (off). */
    cr_assert_eq(stow_record_start(pool, STOW_RECORD_EVENTS_MAX + 1), STOW_EINVAL);
    cr_assert_eq(stow_record_start(pool, SIZE_MAX), STOW_EINVAL);
    cr_assert_eq(stow_trace_dump(pool, "/tmp/never"), STOW_EINVAL, "still not recording");
    finish();
}

/* Records n allocations of 512 bytes then their frees on segments made
 * before the recording (no segment events), and loads the dump. */
static stow_trace_t *record_pairs(size_t capacity_events, size_t n, uint64_t *kept)
{
    void **p = calloc(n, sizeof *p);
    cr_assert_not_null(p);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(stow_pool_alloc(pool, 512, NULL, &p[i]), STOW_OK);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(stow_pool_free(pool, p[i]), STOW_OK);
    cr_assert_eq(stow_record_start(pool, capacity_events), STOW_OK);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(stow_pool_alloc(pool, 512, NULL, &p[i]), STOW_OK);
    for (size_t i = 0; i < n; i++)
        cr_assert_eq(stow_pool_free(pool, p[i]), STOW_OK);
    free(p);
    uint64_t recorded;
    stow_record_counts(pool, &recorded, kept);
    cr_assert_eq(recorded, 2 * n);
    stow_trace_t *t = dump_and_load();
    cr_assert_eq(stow_record_start(pool, 0), STOW_OK);
    return t;
}

/* The ring grows from its first 4,096 events as they come: past them nothing
 * is lost below its capacity, and once full it keeps the newest. */
Test(record, the_ring_grows_to_its_capacity_then_wraps)
{
    make_pool("policy:classic");
    uint64_t kept;
    stow_trace_t *t = record_pairs(20000, 6000, &kept);
    cr_assert_eq(kept, 12000);
    cr_assert_eq(t->event_count, 12000, "every event kept past the first buffer");
    stow_trace_free(t);
    /* 9,000 of 12,000 kept: the last 3,000 allocations and every free; the
     * frees of overwritten allocations are left out of the dump. */
    t = record_pairs(9000, 6000, &kept);
    cr_assert_eq(kept, 9000);
    cr_assert_eq(t->event_count, 6000);
    stow_trace_free(t);
    finish();
}

/* Recording a replay of a real trace gives the same trace back. */
Test(record, replay_round_trip)
{
    stow_trace_t *t;
    char err[256];
    cr_assert_eq(stow_trace_load(STOW_SOURCE_DIR "/bench/traces/resnet50_train.rep", &t, err,
                                 sizeof err),
                 STOW_OK, "%s", err);
    make_pool("record_events:100000");
    void **ptrs = calloc(t->id_count, sizeof *ptrs);
    for (size_t i = 0; i < t->event_count; i++) {
        const stow_trace_event_t *e = &t->events[i];
        if (e->kind == STOW_TRACE_ALLOC)
            cr_assert_eq(stow_pool_alloc(pool, e->size_bytes, NULL, &ptrs[e->id]), STOW_OK);
        else
            cr_assert_eq(stow_pool_free(pool, ptrs[e->id]), STOW_OK);
    }
    char path[] = "/tmp/stow_rt_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    cr_assert_eq(stow_trace_dump(pool, path), STOW_OK);
    stow_trace_t *back;
    cr_assert_eq(stow_trace_load(path, &back, err, sizeof err), STOW_OK, "%s", err);
    cr_assert_eq(back->event_count, t->event_count);
    cr_assert_eq(back->id_count, t->id_count);
    cr_assert_eq(back->peak_live_bytes, t->peak_live_bytes);
    for (size_t i = 0; i < t->event_count; i++) {
        cr_assert_eq(back->events[i].kind, t->events[i].kind, "event %zu", i);
        cr_assert_eq(back->events[i].size_bytes, t->events[i].size_bytes, "event %zu", i);
    }
    stow_trace_free(back);
    unlink(path);
    stow_pool_destroy_force(pool);
    cr_assert_eq(stow_sim_destroy(sim), STOW_OK);
    free(ptrs);
    stow_trace_free(t);
}
