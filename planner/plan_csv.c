/*
 * planner/plan_csv.c: the planner's CSV reader and writer, problem lifetime,
 * and the small shared helpers of plan_internal.h.
 *
 * The reader is strict on purpose: a planning input that is silently
 * misread (a wrapped number, an inclusive end read as exclusive) produces a
 * plan that corrupts memory, so every doubt is a "FILE:LINE: reason" error.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>

#include "planner/plan_internal.h"

void stow__plan_errf(char *err, size_t errlen, const char *fmt, ...)
{
    if (err == NULL || errlen == 0)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

double stow__plan_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

stow_status_t stow__plan_read_file(const char *path, const char *what, char **text, size_t *len,
                                   char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (f == NULL) {
        stow__plan_errf(err, errlen, "%s: %s", path, strerror(errno));
        return STOW_EIO;
    }
    struct stat sb;
    if (fstat(fileno(f), &sb) == 0 && S_ISDIR(sb.st_mode)) {
        stow__plan_errf(err, errlen, "%s: is a directory, not %s", path, what);
        fclose(f);
        return STOW_EIO;
    }
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    if (buf == NULL) {
        fclose(f);
        return STOW_EHOSTMEM;
    }
    for (;;) {
        if (cap - n < 2) {
            char *nb = cap > SIZE_MAX / 2 ? NULL : realloc(buf, cap * 2);
            if (nb == NULL) {
                free(buf);
                fclose(f);
                return STOW_EHOSTMEM;
            }
            buf = nb;
            cap *= 2;
        }
        size_t got = fread(buf + n, 1, cap - n - 1, f);
        n += got;
        if (got == 0)
            break;
    }
    if (ferror(f)) {
        stow__plan_errf(err, errlen, "%s: read error", path);
        free(buf);
        fclose(f);
        return STOW_EIO;
    }
    fclose(f);
    buf[n] = '\0';
    *text = buf;
    *len = n;
    return STOW_OK;
}

/* ---------------------------------------------------------------- problem -- */

stow_status_t stow_plan_problem_init(stow_plan_problem_t *problem, size_t count)
{
    if (problem == NULL)
        return STOW_EINVAL;
    if (count > SIZE_MAX / sizeof(stow_plan_buffer_t))
        return STOW_EOVERFLOW;
    stow_plan_buffer_t *b = calloc(count ? count : 1, sizeof *b);
    if (b == NULL)
        return STOW_EHOSTMEM;
    for (size_t i = 0; i < count; i++)
        b[i].alignment = 1;
    problem->count = count;
    problem->buffers = b;
    problem->id_storage = NULL;
    return STOW_OK;
}

void stow_plan_problem_free(stow_plan_problem_t *problem)
{
    if (problem == NULL)
        return;
    free(problem->buffers);
    free(problem->id_storage);
    memset(problem, 0, sizeof *problem);
}

stow_status_t stow_plan_problem_check(const stow_plan_problem_t *problem, char *why, size_t len)
{
    if (problem == NULL || (problem->count > 0 && problem->buffers == NULL)) {
        stow__plan_errf(why, len, "no problem");
        return STOW_EINVAL;
    }
    for (size_t i = 0; i < problem->count; i++) {
        const stow_plan_buffer_t *b = &problem->buffers[i];
        const char *what = NULL;
        if (b->size == 0)
            what = "size is 0";
        else if (b->upper <= b->lower)
            what = "upper <= lower (lifetimes are half-open [lower, upper))";
        else if (b->alignment == 0)
            what = "alignment is 0";
        if (what != NULL) {
            if (b->id != NULL)
                stow__plan_errf(why, len, "buffer '%s': %s", b->id, what);
            else
                stow__plan_errf(why, len, "buffer #%zu: %s", i, what);
            return STOW_EINVAL;
        }
    }
    return STOW_OK;
}

/* ------------------------------------------------------------------ parse -- */

enum { COL_ID, COL_LOWER, COL_UPPER, COL_SIZE, COL_ALIGN, COL_OFFSET, COL_HINT, COL_COUNT };
static const char *const col_names[COL_COUNT] = {"id",        "lower",  "upper", "size",
                                                 "alignment", "offset", "hint"};

/* Field [s, e) with surrounding blanks removed. */
static void csv_trim(const char **s, const char **e)
{
    while (*s < *e && (**s == ' ' || **s == '\t'))
        (*s)++;
    while (*e > *s && ((*e)[-1] == ' ' || (*e)[-1] == '\t' || (*e)[-1] == '\r'))
        (*e)--;
}

/* Strict decimal: digits only, no sign, no wrap. */
static bool csv_u64(const char *s, const char *e, uint64_t *out)
{
    if (s == e)
        return false;
    uint64_t v = 0;
    for (; s < e; s++) {
        if (*s < '0' || *s > '9')
            return false;
        uint64_t d = (uint64_t)(*s - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

const char *stow__plan_number_error(const char *s, const char *e)
{
    if (s == e)
        return "is empty";
    const char *digits = *s == '-' ? s + 1 : s;
    for (const char *q = digits; q < e; q++)
        if (*q < '0' || *q > '9')
            return "is not a decimal number";
    if (digits == e)
        return "is not a decimal number";
    if (digits != s)
        return "is negative";
    uint64_t v = 0;
    for (const char *q = s; q < e; q++) {
        uint64_t d = (uint64_t)(*q - '0');
        if (v > (UINT64_MAX - d) / 10)
            return "is beyond 2^64 - 1";
        v = v * 10 + d;
    }
    return NULL;
}

static uint64_t csv_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a: ids are short; speed is irrelevant */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

typedef struct csv_state {
    stow_plan_buffer_t *bufs;
    size_t count, cap;
    size_t *id_off; /* offset of each id inside ids */
    size_t *id_line;
    char *ids;
    size_t ids_len, ids_cap;
} csv_state_t;

static void csv_state_free(csv_state_t *st)
{
    free(st->bufs);
    free(st->id_off);
    free(st->id_line);
    free(st->ids);
}

static bool csv_grow(csv_state_t *st)
{
    size_t ncap = st->cap ? st->cap * 2 : 256;
    if (ncap > SIZE_MAX / sizeof(stow_plan_buffer_t))
        return false;
    stow_plan_buffer_t *nb = realloc(st->bufs, ncap * sizeof *nb);
    if (nb == NULL)
        return false;
    st->bufs = nb;
    size_t *no = realloc(st->id_off, ncap * sizeof *no);
    if (no == NULL)
        return false;
    st->id_off = no;
    size_t *nl = realloc(st->id_line, ncap * sizeof *nl);
    if (nl == NULL)
        return false;
    st->id_line = nl;
    st->cap = ncap;
    return true;
}

static bool csv_push_id(csv_state_t *st, const char *s, size_t n, size_t *off)
{
    if (st->ids_cap - st->ids_len < n + 1) {
        size_t ncap = st->ids_cap ? st->ids_cap : 4096;
        while (ncap - st->ids_len < n + 1) {
            if (ncap > SIZE_MAX / 2)
                return false;
            ncap *= 2;
        }
        char *ni = realloc(st->ids, ncap);
        if (ni == NULL)
            return false;
        st->ids = ni;
        st->ids_cap = ncap;
    }
    memcpy(st->ids + st->ids_len, s, n);
    st->ids[st->ids_len + n] = '\0';
    *off = st->ids_len;
    st->ids_len += n + 1;
    return true;
}

/* Duplicate ids are an error because the output is keyed by id: two buffers
 * with one id could not be told apart by a consumer of the plan. */
static stow_status_t csv_check_dups(csv_state_t *st, const char *name, char *err, size_t errlen)
{
    size_t tcap = 16;
    while (tcap < st->count * 2)
        tcap *= 2;
    size_t *table = malloc(tcap * sizeof *table);
    if (table == NULL)
        return STOW_EHOSTMEM;
    for (size_t i = 0; i < tcap; i++)
        table[i] = SIZE_MAX;
    for (size_t i = 0; i < st->count; i++) {
        const char *id = st->ids + st->id_off[i];
        size_t n = strlen(id);
        size_t h = (size_t)csv_hash(id, n) & (tcap - 1);
        while (table[h] != SIZE_MAX) {
            size_t j = table[h];
            if (strcmp(st->ids + st->id_off[j], id) == 0) {
                stow__plan_errf(err, errlen, "%s:%zu: duplicate id '%s' (first on line %zu)", name,
                                st->id_line[i], id, st->id_line[j]);
                free(table);
                return STOW_EPARSE;
            }
            h = (h + 1) & (tcap - 1);
        }
        table[h] = i;
    }
    free(table);
    return STOW_OK;
}

stow_status_t stow_plan_parse_csv(const char *name, const char *text, size_t len,
                                  stow_plan_problem_t *out, char *err, size_t errlen)
{
    if (text == NULL || out == NULL)
        return STOW_EINVAL;
    if (name == NULL)
        name = "<input>";
    int col_of_field[64]; /* header field index -> known column */
    size_t nfields = 0;
    int have[COL_COUNT] = {0};
    bool header_done = false;
    csv_state_t st = {0};
    stow_status_t rc = STOW_OK;
    size_t line = 0;
    const char *p = text, *end = text + len;

    while (p < end) {
        const char *ls = p;
        const char *le = memchr(p, '\n', (size_t)(end - p));
        if (le == NULL)
            le = end;
        p = le < end ? le + 1 : end;
        line++;
        const char *ts = ls, *te = le;
        csv_trim(&ts, &te);
        if (ts == te || *ts == '#')
            continue;
        if (memchr(ts, '\0', (size_t)(te - ts)) != NULL) {
            stow__plan_errf(err, errlen, "%s:%zu: NUL byte in line", name, line);
            rc = STOW_EPARSE;
            goto fail;
        }
        if (!header_done) {
            const char *f = ts;
            for (;;) {
                const char *fe = memchr(f, ',', (size_t)(te - f));
                const char *next = fe ? fe + 1 : NULL;
                if (fe == NULL)
                    fe = te;
                const char *fs = f;
                csv_trim(&fs, &fe);
                if (nfields == sizeof col_of_field / sizeof col_of_field[0]) {
                    stow__plan_errf(err, errlen, "%s:%zu: too many columns in header", name, line);
                    rc = STOW_EPARSE;
                    goto fail;
                }
                int col = -1;
                for (int c = 0; c < COL_COUNT; c++)
                    if ((size_t)(fe - fs) == strlen(col_names[c]) &&
                        memcmp(fs, col_names[c], (size_t)(fe - fs)) == 0)
                        col = c;
                if (col < 0) {
                    int w = (int)((fe - fs) > 40 ? 40 : (fe - fs));
                    /* MiniMalloc's legacy files: buffer,start,end,size with an
                     * inclusive end (docs/planner.md). */
                    bool legacy = (fe - fs == 6 && memcmp(fs, "buffer", 6) == 0) ||
                                  (fe - fs == 3 && memcmp(fs, "end", 3) == 0) ||
                                  (fe - fs == 5 && memcmp(fs, "start", 5) == 0);
                    if (legacy)
                        stow__plan_errf(err, errlen,
                                        "%s:%zu: unknown column '%.*s': a legacy MiniMalloc header "
                                        "(buffer,start,end,size, inclusive end); write "
                                        "id,lower,upper,size with upper = end + 1",
                                        name, line, w, fs);
                    else
                        stow__plan_errf(err, errlen,
                                        "%s:%zu: unknown column '%.*s' (expected "
                                        "id,lower,upper,size[,alignment][,offset][,hint])",
                                        name, line, w, fs);
                    rc = STOW_EPARSE;
                    goto fail;
                }
                if (have[col]) {
                    stow__plan_errf(err, errlen, "%s:%zu: column '%s' appears twice", name, line,
                                    col_names[col]);
                    rc = STOW_EPARSE;
                    goto fail;
                }
                have[col] = 1;
                col_of_field[nfields++] = col;
                if (next == NULL)
                    break;
                f = next;
            }
            for (int c = COL_ID; c <= COL_SIZE; c++) {
                if (!have[c]) {
                    stow__plan_errf(err, errlen, "%s:%zu: missing column '%s' in header", name,
                                    line, col_names[c]);
                    rc = STOW_EPARSE;
                    goto fail;
                }
            }
            header_done = true;
            continue;
        }
        if (st.count == st.cap && !csv_grow(&st)) {
            rc = STOW_EHOSTMEM;
            goto fail;
        }
        stow_plan_buffer_t b = {NULL, 0, 0, 0, 1};
        size_t field = 0, id_off = 0;
        const char *f = ts;
        for (;;) {
            const char *fe = memchr(f, ',', (size_t)(te - f));
            const char *next = fe ? fe + 1 : NULL;
            if (fe == NULL)
                fe = te;
            if (field == nfields) {
                stow__plan_errf(err, errlen, "%s:%zu: more than %zu fields", name, line, nfields);
                rc = STOW_EPARSE;
                goto fail;
            }
            const char *fs = f;
            csv_trim(&fs, &fe);
            int col = col_of_field[field++];
            uint64_t v = 0;
            if (col == COL_ID) {
                if (fs == fe) {
                    stow__plan_errf(err, errlen, "%s:%zu: empty id", name, line);
                    rc = STOW_EPARSE;
                    goto fail;
                }
                if (!csv_push_id(&st, fs, (size_t)(fe - fs), &id_off)) {
                    rc = STOW_EHOSTMEM;
                    goto fail;
                }
            } else if ((col == COL_OFFSET || col == COL_HINT) && fs == fe) {
                /* optional and empty: fine */
            } else if (!csv_u64(fs, fe, &v)) {
                int w = (int)((fe - fs) > 40 ? 40 : (fe - fs));
                const char *why = stow__plan_number_error(fs, fe);
                if (fs == fe)
                    stow__plan_errf(err, errlen, "%s:%zu: %s is empty", name, line,
                                    col_names[col]);
                else
                    stow__plan_errf(err, errlen, "%s:%zu: %s '%.*s' %s", name, line,
                                    col_names[col], w, fs, why ? why : "is not a decimal number");
                rc = STOW_EPARSE;
                goto fail;
            } else if (col == COL_LOWER) {
                b.lower = v;
            } else if (col == COL_UPPER) {
                b.upper = v;
            } else if (col == COL_SIZE) {
                b.size = v;
            } else if (col == COL_ALIGN) {
                b.alignment = v;
            }
            if (next == NULL)
                break;
            f = next;
        }
        if (field != nfields) {
            stow__plan_errf(err, errlen, "%s:%zu: expected %zu fields, got %zu: the line ends "
                                         "before its %s",
                            name, line, nfields, field, col_names[col_of_field[field]]);
            rc = STOW_EPARSE;
            goto fail;
        }
        const char *what = NULL;
        if (b.size == 0)
            what = "size is 0";
        else if (b.upper <= b.lower)
            what = "upper <= lower (lifetimes are half-open [lower, upper))";
        else if (b.alignment == 0)
            what = "alignment is 0";
        if (what != NULL) {
            stow__plan_errf(err, errlen, "%s:%zu: %s", name, line, what);
            rc = STOW_EPARSE;
            goto fail;
        }
        st.bufs[st.count] = b;
        st.id_off[st.count] = id_off;
        st.id_line[st.count] = line;
        st.count++;
    }
    if (!header_done && len == 0) {
        stow__plan_errf(err, errlen,
                        "%s: the file is empty; a plan CSV starts with the header "
                        "id,lower,upper,size",
                        name);
        rc = STOW_EPARSE;
        goto fail;
    }
    if (!header_done) {
        stow__plan_errf(err, errlen, "%s:%zu: no header line (expected id,lower,upper,size)", name,
                        line ? line : 1);
        rc = STOW_EPARSE;
        goto fail;
    }
    rc = csv_check_dups(&st, name, err, errlen);
    if (rc != STOW_OK)
        goto fail;
    /* The id store may have moved while growing, so pointers are fixed last. */
    for (size_t i = 0; i < st.count; i++)
        st.bufs[i].id = st.ids + st.id_off[i];
    if (st.bufs == NULL && (st.bufs = malloc(sizeof *st.bufs)) == NULL) {
        rc = STOW_EHOSTMEM;
        goto fail;
    }
    out->count = st.count;
    out->buffers = st.bufs;
    out->id_storage = st.ids;
    free(st.id_off);
    free(st.id_line);
    return STOW_OK;
fail:
    csv_state_free(&st);
    return rc;
}

stow_status_t stow_plan_load_csv(const char *path, stow_plan_problem_t *out, char *err,
                                 size_t errlen)
{
    if (path == NULL || out == NULL)
        return STOW_EINVAL;
    char *text = NULL;
    size_t len = 0;
    stow_status_t rc = stow__plan_read_file(path, "a CSV file", &text, &len, err, errlen);
    if (rc != STOW_OK)
        return rc;
    rc = stow_plan_parse_csv(path, text, len, out, err, errlen);
    free(text);
    return rc;
}

bool stow__plan_has_alignment(const stow_plan_problem_t *problem)
{
    for (size_t i = 0; i < problem->count; i++)
        if (problem->buffers[i].alignment > 1)
            return true;
    return false;
}

stow_status_t stow__plan_write_csv_to(FILE *f, const stow_plan_problem_t *problem,
                                      const uint64_t *offsets)
{
    bool aligned = stow__plan_has_alignment(problem);
    fprintf(f, aligned ? "id,lower,upper,size,alignment,offset\n" : "id,lower,upper,size,offset\n");
    for (size_t i = 0; i < problem->count; i++) {
        const stow_plan_buffer_t *b = &problem->buffers[i];
        if (b->id != NULL)
            fprintf(f, "%s,", b->id);
        else
            fprintf(f, "%zu,", i);
        fprintf(f, "%llu,%llu,%llu,", (unsigned long long)b->lower, (unsigned long long)b->upper,
                (unsigned long long)b->size);
        if (aligned)
            fprintf(f, "%llu,", (unsigned long long)b->alignment);
        fprintf(f, "%llu\n", (unsigned long long)offsets[i]);
    }
    return ferror(f) ? STOW_EIO : STOW_OK;
}

stow_status_t stow_plan_write_csv(const char *path, const stow_plan_problem_t *problem,
                                  const uint64_t *offsets)
{
    if (path == NULL || problem == NULL || (problem->count > 0 && offsets == NULL))
        return STOW_EINVAL;
    FILE *f = fopen(path, "w");
    if (f == NULL)
        return STOW_EIO;
    bool bad = stow__plan_write_csv_to(f, problem, offsets) != STOW_OK;
    if (fclose(f) != 0 || bad)
        return STOW_EIO;
    return STOW_OK;
}
