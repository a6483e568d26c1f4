/*
 * tests/unit/test_report.c: `stowage report` (report/report.h): min/max
 * downsampling keeps the extremes, the allocations alive at the peak, the
 * HTML page is self-contained and carries the data of a small trace, growth
 * detection on a leaking and a steady synthetic trace (tests/data/report_*),
 * stranded memory on hand-made traces whose answer is known, the page's
 * explanations and step markers, tags files, and the built CLI. No timing is
 * asserted.
 */
#include <criterion/criterion.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "report/report.h"
#include "stowage.h"
#include "stowage/trace.h"
#include "test_support.h"

static stow_trace_t *parse(const char *text)
{
    stow_trace_t *t = NULL;
    char err[256] = "";
    cr_assert_eq(stow_trace_parse("synthetic", text, strlen(text), &t, err, sizeof err), STOW_OK,
                 "%s", err);
    return t;
}

static stow_trace_t *load_data(const char *name)
{
    char path[4096], err[512] = "";
    snprintf(path, sizeof path, "%s/tests/data/%s", STOW_SOURCE_DIR, name);
    stow_trace_t *t = NULL;
    cr_assert_eq(stow_trace_load(path, &t, err, sizeof err), STOW_OK, "%s", err);
    return t;
}

static stow_report_t build(const stow_trace_t *t, const char *policy)
{
    stow_config_t c;
    stow_config_default(&c);
    stow_report_t r;
    cr_assert_eq(stow__report_build(t, policy, &c, 0, false, 100, &r), STOW_OK);
    return r;
}

Test(report_series, downsampling_keeps_max_and_min)
{
    enum { N = 10007 };
    uint64_t *v = malloc(N * sizeof *v);
    for (size_t i = 0; i < N; i++)
        v[i] = 1000 + (i * 7919) % 500;
    v[4321] = 999999; /* a one-event spike */
    v[777] = 3;       /* a one-event trough */
    stow_bucket_t b[100];
    size_t n = stow__series_downsample(v, N, 100, b);
    cr_assert_leq(n, 100);
    uint64_t hi = 0, lo = UINT64_MAX;
    size_t covered = 0;
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(b[i].first_event, covered);
        covered += b[i].event_count;
        hi = b[i].hi > hi ? b[i].hi : hi;
        lo = b[i].lo < lo ? b[i].lo : lo;
        cr_assert_leq(b[i].lo, b[i].hi);
    }
    cr_assert_eq(covered, N);
    cr_assert_eq(hi, 999999);
    cr_assert_eq(lo, 3);
    cr_assert_eq(stow__series_downsample(v, 0, 100, b), 0);
    cr_assert_eq(stow__series_downsample(v, 3, 100, b), 3); /* fewer events than buckets */
    free(v);
}

/* Peak live is 3000 after event 3 (ids 0, 1, 2 live); id 2 is the largest. */
static const char small_trace[] = "4 7\n"
                                  "a 0 1000 0\n"
                                  "a 1 500 0\n"
                                  "a 2 1500 0\n"
                                  "f 1\n"
                                  "f 2\n"
                                  "a 3 2000 0\n"
                                  "f 0\n";

Test(report, figures_and_alive_at_peak)
{
    stow_trace_t *t = parse(small_trace);
    stow_report_t r = build(t, "classic");
    cr_assert_eq(r.peak_live_bytes, 3000);
    cr_assert_eq(r.peak_live_event, 2);
    cr_assert_eq(r.live_bytes[6], 2000);
    cr_assert_not_null(r.reserved_bytes);
    cr_assert_geq(r.peak_reserved_bytes, 3000);
    cr_assert_eq(r.ooms, 0);
    cr_assert(r.has_backend_calls);
    cr_assert_gt(r.frag_count, 0);
    stow_report_alloc_t a[4];
    cr_assert_eq(stow__report_alive_at(&r, r.peak_live_event, a, 4), 3);
    cr_assert_eq(a[0].id, 2);
    cr_assert_eq(a[1].id, 0);
    cr_assert_eq(a[2].id, 1);
    cr_assert_eq(a[0].free_event, 4);
    cr_assert_eq(r.allocs[3].free_event, SIZE_MAX);
    stow__report_free(&r);
    stow_trace_free(t);
}

Test(report, other_policies)
{
    stow_trace_t *t = parse(small_trace);
    stow_report_t r = build(t, "pytorch");
    cr_assert_not_null(r.reserved_bytes); /* sampled from the model */
    cr_assert_geq(r.peak_reserved_bytes, 3000);
    stow__report_free(&r);
    r = build(t, "naive");
    cr_assert_null(r.reserved_bytes); /* headline figures only */
    cr_assert_geq(r.peak_reserved_bytes, 3000);
    stow__report_free(&r);
    stow_config_t c;
    stow_config_default(&c);
    cr_assert_eq(stow__report_build(t, "bogus", &c, 0, false, 10, &r), STOW_EINVAL);
    stow_trace_free(t);
}

/* ---- stranded memory (report/report.h) ---- */

/* Eight 256 KiB blocks fill one 2 MiB small segment; blocks 1, 3 and 5 are
 * freed, leaving three 256 KiB holes between live blocks. */
#define EIGHT_QUARTERS "a 0 262144 0\na 1 262144 0\na 2 262144 0\na 3 262144 0\n" \
                       "a 4 262144 0\na 5 262144 0\na 6 262144 0\na 7 262144 0\n" \
                       "f 1\nf 3\nf 5\n"

static void expect_stranded(const stow_report_t *r, const uint64_t *want, size_t n)
{
    cr_assert(r->has_stranded);
    cr_assert_eq(r->frag_count, n, "a small trace is sampled at every event");
    for (size_t i = 0; i < n; i++) {
        cr_assert_eq(r->frag_event[i], i);
        cr_assert_eq(r->stranded_bytes[i], want[i], "event %zu: %llu stranded", i,
                     (unsigned long long)r->stranded_bytes[i]);
    }
}

/* Later requests of the holes' size fill them: nothing is stranded. */
Test(report_stranded, none_when_later_requests_fit_the_holes)
{
    stow_trace_t *t = parse("11 22\n" EIGHT_QUARTERS "a 8 262144 0\na 9 262144 0\na 10 262144 0\n"
                            "f 0\nf 2\nf 4\nf 6\nf 7\nf 8\nf 9\nf 10\n");
    stow_report_t r = build(t, "classic");
    uint64_t want[22] = {0};
    expect_stranded(&r, want, 22);
    cr_assert_eq(r.peak_reserved_bytes, 2 << 20, "the holes took the later requests");
    cr_assert_eq(r.stranded_at_peak_bytes, 0);
    cr_assert_eq(r.stranded_max_bytes, 0);
    stow__report_free(&r);
    stow_trace_free(t);
}

/* The holes are too small for the 512 KiB requests that follow: the pool
 * grows a second segment beside 768 KiB it cannot use. Once no small request
 * is left, nothing is stranded. */
Test(report_stranded, exact_bytes_of_holes_no_later_request_fits)
{
    stow_trace_t *t = parse("10 20\n" EIGHT_QUARTERS "a 8 524288 0\na 9 524288 0\n"
                            "f 0\nf 2\nf 4\nf 6\nf 7\nf 8\nf 9\n");
    stow_report_t r = build(t, "classic");
    const uint64_t q = 262144;
    uint64_t want[20] = {0, 0, 0, 0, 0, 0, 0, 0, q, 2 * q, 3 * q, 3 * q, 3 * q};
    expect_stranded(&r, want, 20);
    cr_assert_eq(r.peak_reserved_bytes, 4 << 20);
    cr_assert_eq(r.peak_reserved_event, 11);
    cr_assert_eq(r.stranded_at_peak_bytes, 3 * q);
    cr_assert_eq(r.stranded_growth_max_bytes, 3 * q);
    cr_assert_eq(r.stranded_growth_max_event, 11);
    cr_assert_eq(r.stranded_max_bytes, 3 * q);
    cr_assert_eq(r.stranded_max_event, 10, "the first event with the most");
    for (size_t i = 0; i < 20; i++)
        cr_assert_eq(r.stranded_growth[i], i == 0 || i == 11, "event %zu", i);
    stow__report_free(&r);
    stow_trace_free(t);
}

/* Large-pool holes are judged against large requests only: two 4 MiB holes in
 * a 20 MiB segment stay stranded while small requests come, and the 10 MiB
 * request that makes the reserved peak grows beside them. */
Test(report_stranded, pool_kinds_apart_and_the_peak_growth_beside_the_holes)
{
    stow_trace_t *t = parse("8 11\n"
                            "a 0 4194304 0\na 1 4194304 0\na 2 4194304 0\na 3 4194304 0\n"
                            "a 4 4194304 0\nf 1\nf 3\na 5 4096 0\na 6 10485760 0\na 7 4096 0\n"
                            "f 0\n");
    stow_report_t r = build(t, "classic");
    const uint64_t m4 = 4 << 20;
    uint64_t want[11] = {0, 0, 0, 0, 0, m4, 2 * m4, 2 * m4, 2 * m4, 0, 0};
    expect_stranded(&r, want, 11);
    cr_assert_eq(r.peak_reserved_event, 8);
    cr_assert_eq(r.peak_reserved_bytes, (20 + 2 + 10) << 20);
    cr_assert_eq(r.stranded_at_peak_bytes, 2 * m4);
    stow__report_free(&r);
    stow_trace_free(t);
}

/* On a long trace the samples are spaced out, but every event that raises
 * reserved bytes to a new high is one, so the figure at the peak is exact. */
Test(report_stranded, every_growth_sampled)
{
    stow_trace_t *t = load_data("report_leak.rep");
    stow_config_t c;
    stow_config_default(&c);
    stow_report_t r;
    cr_assert_eq(stow__report_build(t, "classic", &c, 0, false, 10, &r), STOW_OK);
    cr_assert_lt(r.frag_count, t->event_count / 4);
    cr_assert_eq(r.frag_event[r.frag_count - 1], t->event_count - 1, "the last event too");
    uint64_t high = 0;
    size_t k = 0, growths = 0;
    for (size_t i = 0; i < t->event_count; i++) {
        if (r.reserved_bytes[i] <= high && i > 0)
            continue;
        high = r.reserved_bytes[i];
        while (k < r.frag_count && r.frag_event[k] < i)
            k++;
        cr_assert(k < r.frag_count && r.frag_event[k] == i && r.stranded_growth[k],
                  "growth at event %zu not sampled", i);
        growths++;
        if (i == r.peak_reserved_event)
            cr_assert_eq(r.stranded_at_peak_bytes, r.stranded_bytes[k]);
    }
    cr_assert_gt(growths, 1);
    stow__report_free(&r);
    stow_trace_free(t);
}

Test(report_stranded, classic_only)
{
    stow_trace_t *t = parse(small_trace);
    stow_report_t r = build(t, "vmm");
    cr_assert_not(r.has_stranded);
    cr_assert_eq(r.frag_count, 0);
    stow__report_free(&r);
    r = build(t, "pytorch");
    cr_assert_not(r.has_stranded);
    stow__report_free(&r);
    stow_trace_free(t);
}

static char *html_of(const stow_report_t *r, const stow_growth_t *g, const stow_html_opts_t *o)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    cr_assert_eq(stow__report_write_html(f, r, g, o), STOW_OK);
    fclose(f);
    return buf;
}

Test(report_html, self_contained_with_the_data)
{
    stow_trace_t *t = parse(small_trace);
    stow_report_t r = build(t, "classic");
    const char *tags[4] = {"weights", NULL, "<attn> & mlp", NULL};
    r.tags = tags;
    stow_growth_t g;
    stow__report_growth(&r, NULL, 0, 0, &g);
    char *html = html_of(&r, &g, NULL);
    cr_assert_null(strstr(html, "http://"));
    cr_assert_null(strstr(html, "https://"));
    cr_assert_null(strstr(html, "<script src"));
    cr_assert_null(strstr(html, "<link"));
    cr_assert_null(strstr(html, "@import"));
    cr_assert_not_null(strstr(html, "\"peak_live\":3000"));
    cr_assert_not_null(strstr(html, "\"peak_live_event\":2"));
    /* the peak table, largest first, tags escaped */
    char *p2 = strstr(html, "<tr data-id=2>"), *p0 = strstr(html, "<tr data-id=0>");
    char *p1 = strstr(html, "<tr data-id=1>");
    cr_assert(p2 && p0 && p1 && p2 < p0 && p0 < p1);
    cr_assert_null(strstr(html, "<tr data-id=3>")); /* not alive at the peak */
    cr_assert_not_null(strstr(html, "&lt;attn&gt; &amp; mlp"));
    cr_assert_not_null(strstr(html, "weights"));
    /* the memory series and the bars */
    cr_assert_not_null(strstr(html, "\"hi\":[1000,1500,3000,2500,1000,3000,2000]"), "%s", html);
    cr_assert_not_null(strstr(html, "\"bars\":{\"id\":[3,2,0,1]"));
    free(html);
    stow__report_free(&r);
    stow_trace_free(t);
}

/* Every section of the page, and the cards, carries a sentence saying what it
 * shows and how to read it, before the next section begins. */
static void expect_explained(const char *html)
{
    const char *cards = strstr(html, "<div class=cards>");
    cr_assert_not_null(cards);
    const char *why = strstr(cards, "<p class=why>");
    const char *h2 = strstr(cards, "<h2>");
    cr_assert(why && h2 && why < h2, "the cards are explained");
    size_t sections = 0;
    for (const char *s = h2; s; s = strstr(s + 4, "<h2>"), sections++) {
        const char *next = strstr(s + 4, "<h2>");
        const char *w = strstr(s, "<p class=why>");
        cr_assert(w && (!next || w < next), "section %zu unexplained: %.60s", sections, s);
    }
    cr_assert_geq(sections, 4);
}

Test(report_html, explains_every_figure)
{
    stow_trace_t *t = parse(small_trace);
    const char *policies[] = {"classic", "vmm", "pytorch", "naive"};
    for (size_t i = 0; i < sizeof policies / sizeof *policies; i++) {
        stow_report_t r = build(t, policies[i]);
        stow_growth_t g;
        stow__report_growth(&r, NULL, 0, 0, &g);
        char *html = html_of(&r, &g, NULL);
        expect_explained(html);
        cr_assert_not_null(strstr(html, "the event index"), "%s: the x axis", policies[i]);
        cr_assert_not_null(strstr(html, "no step markers"), "%s", policies[i]);
        if (r.has_stranded) {
            cr_assert_not_null(strstr(html, "stranded at the reserved peak"));
            cr_assert_not_null(strstr(html, "<canvas id=stranded"));
        } else {
            cr_assert_null(strstr(html, "<canvas id=stranded"));
        }
        if (!strcmp(policies[i], "vmm"))
            cr_assert_not_null(strstr(html, "computed for policy classic only"));
        free(html);
        stow__report_free(&r);
    }
    stow_trace_free(t);
}

/* The stranded samples and the step markers reach the page's data. */
Test(report_html, stranded_samples_and_step_markers)
{
    stow_trace_t *t = parse("4 7\nm train\na 0 1000 0\na 1 500 0\na 2 1500 0\nf 1\n"
                            "m train\nf 2\na 3 2000 0\ne\nm eval\nf 0\n");
    stow_report_t r = build(t, "classic");
    char *html = html_of(&r, NULL, NULL);
    cr_assert_not_null(strstr(html, "\"steps\":{\"ev\":[0,4,6,6],"
                                    "\"key\":[\"train\",\"train\",\"end\",\"eval\"]}"),
                       "%s", html);
    cr_assert_not_null(strstr(html, "step markers (<code>m KEY</code> lines)"));
    cr_assert_null(strstr(html, "no step markers"));
    /* the 512-byte hole id 1 leaves is smaller than the 2000-byte request after it */
    cr_assert_not_null(strstr(html, "\"s\":[0,0,0,512,0,0,0]"), "%s", html);
    cr_assert_not_null(strstr(html, "\"g\":[1,0,0,0,0,0,0]"));
    free(html);
    stow__report_free(&r);
    stow_trace_free(t);
}

Test(report_html, large_trace_aggregates)
{
    /* 20000 allocations: the page keeps max_bars bars and max_points buckets,
     * and the spike survives downsampling */
    size_t n = 20000, cap = n * 40 + 64;
    char *text = malloc(cap);
    size_t len = (size_t)snprintf(text, cap, "%zu %zu\n", n, 2 * n);
    for (size_t i = 0; i < n; i++)
        len += (size_t)snprintf(text + len, cap - len, "a %zu %zu 0\nf %zu\n", i,
                                i == 12345 ? (size_t)1 << 30 : 4096 + i % 977, i);
    stow_trace_t *t = parse(text);
    stow_report_t r = build(t, "classic");
    stow_html_opts_t o = {100, 50, 10};
    char *html = html_of(&r, NULL, &o);
    cr_assert_not_null(strstr(html, ",1073741824,")); /* the spike, in "hi" */
    char *ev = strstr(html, "\"ev\":[");
    size_t commas = 0;
    for (char *c = ev; *c != ']'; c++)
        commas += *c == ',';
    cr_assert_leq(commas + 1, 100);
    char *bars = strstr(html, "\"bars\":{\"id\":[");
    commas = 0;
    for (char *c = bars + 14; *c != ']'; c++)
        commas += *c == ',';
    cr_assert_eq(commas + 1, 50);
    cr_assert_not_null(strstr(bars, "\"id\":[12345,")); /* the largest first */
    cr_assert_lt(strlen(html), 200000);
    free(html);
    stow__report_free(&r);
    stow_trace_free(t);
    free(text);
}

Test(report_growth, leaking_trace_warns)
{
    stow_trace_t *t = load_data("report_leak.rep");
    stow_report_t r = build(t, "classic");
    stow_growth_t g;
    stow__report_growth(&r, NULL, 0, 0, &g);
    cr_assert_str_eq(g.method, "pattern");
    cr_assert_eq(g.iterations, 10);
    cr_assert(g.leak);
    cr_assert_eq(g.growth_per_iteration_bytes, 2 << 20);
    stow__report_growth(&r, NULL, 0, 10, &g); /* --iterations 10 */
    cr_assert_str_eq(g.method, "iterations");
    cr_assert(g.leak);
    stow__report_free(&r);
    stow_trace_free(t);
}

Test(report_growth, steady_trace_does_not)
{
    stow_trace_t *t = load_data("report_steady.rep");
    stow_report_t r = build(t, "classic");
    stow_growth_t g;
    stow__report_growth(&r, NULL, 0, 0, &g);
    cr_assert_eq(g.iterations, 10);
    cr_assert_not(g.leak);
    for (unsigned i = 1; i < g.boundary_count; i++)
        cr_assert_eq(g.boundary_live[i], g.boundary_live[0]);
    size_t given[] = {62, 122, 182};
    stow__report_growth(&r, given, 3, 0, &g);
    cr_assert_str_eq(g.method, "given");
    cr_assert_eq(g.boundary_count, 3);
    cr_assert_not(g.leak);
    stow__report_free(&r);
    stow_trace_free(t);
}

Test(report_growth, shared_training_trace_no_leak)
{
    char path[4096], err[512];
    if (!ts_shared_trace("gpt2_train.rep", path, sizeof path))
        cr_skip_test("shared traces absent");
    stow_trace_t *t = NULL;
    cr_assert_eq(stow_trace_load(path, &t, err, sizeof err), STOW_OK);
    stow_report_t r = build(t, "classic");
    stow_growth_t g;
    stow__report_growth(&r, NULL, 0, 0, &g);
    cr_assert_eq(g.iterations, 4); /* 4 steps */
    cr_assert_not(g.leak);
    stow__report_free(&r);
    stow_trace_free(t);
}

Test(report, tags_file)
{
    char path[] = "/tmp/stow_tags_XXXXXX";
    int fd = mkstemp(path);
    const char good[] = "# id tag\n0 train.py:10 forward\n\n2 opt\n";
    cr_assert_eq(write(fd, good, sizeof good - 1), (ssize_t)(sizeof good - 1));
    close(fd);
    char err[256] = "";
    const char **tags = stow__report_tags_load(path, 4, err, sizeof err);
    cr_assert_not_null(tags, "%s", err);
    cr_assert_str_eq(tags[0], "train.py:10 forward");
    cr_assert_null(tags[1]);
    cr_assert_str_eq(tags[2], "opt");
    stow__report_tags_free(tags, 4);
    cr_assert_null(stow__report_tags_load(path, 2, err, sizeof err)); /* id 2 >= 2 */
    char want[64];
    snprintf(want, sizeof want, "%s:4: ", path);
    cr_assert_not_null(strstr(err, want), "%s", err);
    /* A tag longer than any line buffer (a deep stack, say) is read whole. */
    FILE *f = fopen(path, "w");
    cr_assert_not_null(f);
    fputs("3 ", f);
    for (int i = 0; i < 6000; i++)
        fputc('a' + i % 26, f);
    fputs("\n1 next\n", f);
    cr_assert_eq(fclose(f), 0);
    tags = stow__report_tags_load(path, 4, err, sizeof err);
    cr_assert_not_null(tags, "%s", err);
    cr_assert_eq(strlen(tags[3]), 6000);
    cr_assert_str_eq(tags[1], "next");
    stow__report_tags_free(tags, 4);
    cr_assert_null(stow__report_tags_load("/nonexistent/tags", 4, err, sizeof err));
    cr_assert_not_null(strstr(err, "/nonexistent/tags: cannot open"), "%s", err);
    unlink(path);
}

/* The parser behind the file: lines of any length (none is split at 4095
 * bytes and its rest read as a line of its own), CRLF, a later line replacing
 * an earlier tag, and the lines it refuses. */
Test(report, tags_parse)
{
    size_t long_len = 10000;
    char *text = malloc(long_len + 64);
    cr_assert_not_null(text);
    int head = sprintf(text, "1 ");
    memset(text + head, 'x', long_len);
    strcpy(text + head + long_len, "\r\n0 first\n0 second\r\n");
    char err[256] = "";
    const char **tags = stow__report_tags_parse("t", text, strlen(text), 3, err, sizeof err);
    cr_assert_not_null(tags, "%s", err);
    cr_assert_str_eq(tags[0], "second");
    cr_assert_eq(strlen(tags[1]), long_len);
    cr_assert_null(tags[2]);
    stow__report_tags_free(tags, 3);
    free(text);

    struct {
        const char *text;
        size_t len;
        const char *want;
    } bad[] = {
        {"+1 a\n", 5, "t:1: expected '<id> <tag>' with id < 3"},
        {"# c\n-1 a\n", 9, "t:2: expected"},
        {"1\n", 2, "t:1: expected"},
        {"1a b\n", 5, "t:1: expected"},
        {"99999999999999999999 a\n", 23, "t:1: expected"},
        {"0 a\n1 b\0c\n", 10, "t:2: NUL byte in the line"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cr_assert_null(stow__report_tags_parse("t", bad[i].text, bad[i].len, 3, err, sizeof err),
                       "case %zu", i);
        cr_assert_not_null(strstr(err, bad[i].want), "case %zu: '%s'", i, err);
    }
    /* No ids: any tag line is out of range, comments and blank lines are fine. */
    tags = stow__report_tags_parse("t", "# none\n\n", 8, 0, err, sizeof err);
    cr_assert_not_null(tags, "%s", err);
    stow__report_tags_free(tags, 0);
}

/* ---- the built CLI ---- */

static int cli(const char *args, char *out, size_t out_len)
{
    return ts_cli("report", args, out, out_len);
}

Test(report_cli, growth_exit_status_and_html)
{
    char args[8192], out[16384];
    snprintf(args, sizeof args, "--growth %s/tests/data/report_leak.rep", STOW_SOURCE_DIR);
    cr_assert_eq(cli(args, out, sizeof out), 1, "%s", out);
    cr_assert_not_null(strstr(out, "warning: live bytes grow"));
    snprintf(args, sizeof args, "--growth %s/tests/data/report_steady.rep", STOW_SOURCE_DIR);
    cr_assert_eq(cli(args, out, sizeof out), 0, "%s", out);
    char html[] = "/tmp/stow_report_XXXXXX";
    close(mkstemp(html));
    snprintf(args, sizeof args, "--json -o %s %s/tests/data/report_steady.rep", html,
             STOW_SOURCE_DIR);
    cr_assert_eq(cli(args, out, sizeof out), 0, "%s", out);
    cr_assert_not_null(strstr(out, "\"peak_live_bytes\":169869312"), "%s", out);
    cr_assert_not_null(strstr(out, "\"leak\":false"), "%s", out);
    cr_assert_not_null(strstr(out, "\"policy\":\"vmm\""), "the default pool: %s", out);
    /* Stranded bytes are the classic pool's: free pieces of segments it cannot release. */
    snprintf(args, sizeof args, "--json --policy classic -o %s %s/tests/data/report_steady.rep",
             html, STOW_SOURCE_DIR);
    cr_assert_eq(cli(args, out, sizeof out), 0, "%s", out);
    cr_assert_not_null(strstr(out, "\"stranded_at_peak_bytes\":"), "%s", out);
    FILE *f = fopen(html, "r");
    char head[64] = "";
    cr_assert_gt(fread(head, 1, 15, f), 0);
    fclose(f);
    cr_assert_str_eq(head, "<!DOCTYPE html>");
    unlink(html);
    cr_assert_eq(cli("--policy bogus x.rep", out, sizeof out), 2);
    cr_assert_eq(cli("/nonexistent.rep", out, sizeof out), 2);
    cr_assert_eq(cli("--iterations 1 x.rep", out, sizeof out), 2);
    cr_assert_eq(cli("--help", out, sizeof out), 0);
}
