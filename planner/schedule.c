/*
 * planner/schedule.c: parser for operator schedules and their exact memory
 * profile (stow_schedule_parse, stow_schedule_peak).
 *
 * The profile is computed from lifetimes in op indices with a difference
 * array, so it costs O(tensors + references) whatever the schedule's shape.
 * The parser rejects every order problem (use before production, double
 * production, reading and writing one tensor in one op) because a peak computed
 * from such a schedule would be a number without meaning.
 */
#include <stdlib.h>
#include <string.h>

#include "planner/plan_internal.h"

#define NONE SIZE_MAX

typedef struct sched_build {
    stow_schedule_tensor_t *t;
    size_t nt, ct;
    stow_schedule_op_t *o;
    size_t no, co;
    size_t *refs; /* all op inputs and outputs; ops hold offsets until the end */
    size_t nr, cr;
    char *str; /* string arena; entries hold offsets until the end */
    size_t ns, cs;
    size_t *producer; /* per tensor: op index or NONE */
    size_t *first_read;
    size_t *hash; /* open addressing over tensor ids */
    size_t hcap;
} sched_build_t;

static bool grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t nc = *cap ? *cap : 64;
    while (nc < need) {
        if (nc > SIZE_MAX / 2 / elem)
            return false;
        nc *= 2;
    }
    void *np = realloc(*p, nc * elem);
    if (np == NULL)
        return false;
    *p = np;
    *cap = nc;
    return true;
}

static bool str_push(sched_build_t *b, const char *s, size_t n, size_t *off)
{
    if (!grow((void **)&b->str, &b->cs, b->ns + n + 1, 1))
        return false;
    memcpy(b->str + b->ns, s, n);
    b->str[b->ns + n] = '\0';
    *off = b->ns;
    b->ns += n + 1;
    return true;
}

static size_t id_hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return (size_t)h;
}

/* Tensor index of id [s, s+n), or NONE. Ids live in the arena by offset. */
static size_t id_find(const sched_build_t *b, const char *s, size_t n)
{
    if (b->hcap == 0)
        return NONE;
    for (size_t h = id_hash(s, n) & (b->hcap - 1);; h = (h + 1) & (b->hcap - 1)) {
        size_t t = b->hash[h];
        if (t == NONE)
            return NONE;
        const char *id = b->str + (size_t)(uintptr_t)b->t[t].id;
        if (strlen(id) == n && memcmp(id, s, n) == 0)
            return t;
    }
}

static bool id_insert(sched_build_t *b, size_t t)
{
    if (2 * (b->nt + 1) > b->hcap) {
        size_t nc = b->hcap ? 2 * b->hcap : 64;
        size_t *nh = malloc(nc * sizeof *nh);
        if (nh == NULL)
            return false;
        for (size_t i = 0; i < nc; i++)
            nh[i] = NONE;
        size_t oc = b->hcap;
        size_t *oh = b->hash;
        b->hash = nh;
        b->hcap = nc;
        for (size_t i = 0; i < oc; i++) {
            if (oh[i] == NONE)
                continue;
            const char *id = b->str + (size_t)(uintptr_t)b->t[oh[i]].id;
            size_t h = id_hash(id, strlen(id)) & (nc - 1);
            while (nh[h] != NONE)
                h = (h + 1) & (nc - 1);
            nh[h] = oh[i];
        }
        free(oh);
    }
    const char *id = b->str + (size_t)(uintptr_t)b->t[t].id;
    size_t h = id_hash(id, strlen(id)) & (b->hcap - 1);
    while (b->hash[h] != NONE)
        h = (h + 1) & (b->hcap - 1);
    b->hash[h] = t;
    return true;
}

static bool is_space(char ch)
{
    return ch == ' ' || ch == '\t' || ch == '\r' || ch == '\v' || ch == '\f';
}

/* Splits [s, e) into up to max whitespace-separated tokens. */
static size_t tokenize(const char *s, const char *e, const char **tok, size_t *len, size_t max)
{
    size_t n = 0;
    while (s < e) {
        while (s < e && is_space(*s))
            s++;
        if (s == e)
            break;
        const char *t = s;
        while (s < e && !is_space(*s))
            s++;
        if (n < max) {
            tok[n] = t;
            len[n] = (size_t)(s - t);
        }
        n++;
    }
    return n;
}

static bool parse_u64(const char *s, size_t n, uint64_t *out)
{
    if (n == 0)
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (v > (UINT64_MAX - d) / 10)
            return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

static void build_free(sched_build_t *b)
{
    free(b->t);
    free(b->o);
    free(b->refs);
    free(b->str);
    free(b->producer);
    free(b->first_read);
    free(b->hash);
}

#define PERR(...)                                                                                  \
    do {                                                                                           \
        stow__plan_errf(err, errlen, __VA_ARGS__);                                                 \
        rc = STOW_EPARSE;                                                                          \
        goto fail;                                                                                 \
    } while (0)
#define PMEM()                                                                                     \
    do {                                                                                           \
        rc = STOW_EHOSTMEM;                                                                        \
        goto fail;                                                                                 \
    } while (0)

/* Parses one comma list of an op into refs; is_out selects the checks. */
static stow_status_t parse_list(sched_build_t *b, const char *name, size_t line, const char *s,
                                size_t n, bool is_out, size_t first_ref, char *err,
                                size_t errlen)
{
    stow_status_t rc = STOW_OK;
    if (n == 1 && s[0] == '-')
        return STOW_OK;
    const char *e = s + n;
    size_t list_start = b->nr;
    while (s <= e) {
        const char *c = memchr(s, ',', (size_t)(e - s));
        if (c == NULL)
            c = e;
        size_t len = (size_t)(c - s);
        int w = (int)(len > 40 ? 40 : len);
        if (len == 0)
            PERR("%s:%zu: empty tensor id in %s list", name, line, is_out ? "output" : "input");
        size_t t = id_find(b, s, len);
        if (t == NONE)
            PERR("%s:%zu: unknown tensor '%.*s' (declare it with a 'tensor' line first)", name,
                 line, w, s);
        for (size_t r = first_ref; r < b->nr; r++) {
            if (b->refs[r] != t)
                continue;
            if (r < list_start)
                PERR("%s:%zu: tensor '%.*s' is both an input and an output of one op", name,
                     line, w, s);
            PERR("%s:%zu: tensor '%.*s' listed twice in one op", name, line, w, s);
        }
        if (is_out) {
            if (b->producer[t] != NONE)
                PERR("%s:%zu: tensor '%.*s' already produced by the op on line %zu", name, line,
                     w, s, b->o[b->producer[t]].line);
            if (b->first_read[t] != NONE)
                PERR("%s:%zu: tensor '%.*s' is read by the op on line %zu before it is produced",
                     name, line, w, s, b->o[b->first_read[t]].line);
            b->producer[t] = b->no;
        } else if (b->first_read[t] == NONE) {
            b->first_read[t] = b->no;
        }
        if (!grow((void **)&b->refs, &b->cr, b->nr + 1, sizeof *b->refs))
            PMEM();
        b->refs[b->nr++] = t;
        s = c + 1;
    }
    return STOW_OK;
fail:
    return rc;
}

stow_status_t stow_schedule_parse(const char *name, const char *text, size_t len,
                                  stow_schedule_t *out, char *err, size_t errlen)
{
    if (text == NULL || out == NULL)
        return STOW_EINVAL;
    if (name == NULL)
        name = "<input>";
    sched_build_t b = {0};
    stow_status_t rc = STOW_OK;
    const char *p = text, *end = text + len;
    size_t line = 0;
    while (p < end) {
        const char *ls = p, *le = memchr(p, '\n', (size_t)(end - p));
        if (le == NULL)
            le = end;
        p = le < end ? le + 1 : end;
        line++;
        if (memchr(ls, '\0', (size_t)(le - ls)) != NULL)
            PERR("%s:%zu: NUL byte in line", name, line);
        const char *tok[5];
        size_t tl[5];
        size_t nt = tokenize(ls, le, tok, tl, 5);
        if (nt == 0 || tok[0][0] == '#')
            continue;
        if (tl[0] == 6 && memcmp(tok[0], "tensor", 6) == 0) {
            if (nt < 3)
                PERR("%s:%zu: the line ends before its %s: expected 'tensor <id> <bytes> [name]'",
                     name, line, nt == 1 ? "<id>" : "<bytes>");
            if (nt > 4)
                PERR("%s:%zu: expected 'tensor <id> <bytes> [name]'", name, line);
            if (memchr(tok[1], ',', tl[1]) != NULL || (tl[1] == 1 && tok[1][0] == '-'))
                PERR("%s:%zu: tensor id '%.*s' may not contain ',' or be '-'", name, line,
                     (int)(tl[1] > 40 ? 40 : tl[1]), tok[1]);
            uint64_t bytes;
            if (!parse_u64(tok[2], tl[2], &bytes)) {
                const char *why = stow__plan_number_error(tok[2], tok[2] + tl[2]);
                PERR("%s:%zu: bytes '%.*s' %s", name, line, (int)(tl[2] > 40 ? 40 : tl[2]),
                     tok[2], why ? why : "is not a decimal number");
            }
            size_t dup = id_find(&b, tok[1], tl[1]);
            if (dup != NONE)
                PERR("%s:%zu: tensor '%.*s' declared twice (first on line %zu)", name, line,
                     (int)(tl[1] > 40 ? 40 : tl[1]), tok[1], b.t[dup].line);
            if (!grow((void **)&b.t, &b.ct, b.nt + 1, sizeof *b.t))
                PMEM();
            /* producer and first_read are kept at the capacity of t. */
            size_t *np = realloc(b.producer, b.ct * sizeof *np);
            if (np == NULL)
                PMEM();
            b.producer = np;
            size_t *nf = realloc(b.first_read, b.ct * sizeof *nf);
            if (nf == NULL)
                PMEM();
            b.first_read = nf;
            size_t id_off, name_off = 0;
            if (!str_push(&b, tok[1], tl[1], &id_off) ||
                !str_push(&b, nt == 4 ? tok[3] : "", nt == 4 ? tl[3] : 0, &name_off))
                PMEM();
            b.t[b.nt] = (stow_schedule_tensor_t){(const char *)(uintptr_t)id_off,
                                                 (const char *)(uintptr_t)name_off, bytes, line};
            b.producer[b.nt] = NONE;
            b.first_read[b.nt] = NONE;
            if (!id_insert(&b, b.nt))
                PMEM();
            b.nt++;
        } else if (tl[0] == 2 && memcmp(tok[0], "op", 2) == 0) {
            static const char *const op_fields[] = {"<name>", "<inputs|->", "<outputs|->"};
            if (nt < 4)
                PERR("%s:%zu: the line ends before its %s: expected 'op <name> <inputs|-> "
                     "<outputs|->' (ids comma-separated)",
                     name, line, op_fields[nt - 1]);
            if (nt > 4)
                PERR("%s:%zu: expected 'op <name> <inputs|-> <outputs|->' (ids comma-separated)",
                     name, line);
            if (!grow((void **)&b.o, &b.co, b.no + 1, sizeof *b.o))
                PMEM();
            size_t name_off;
            if (!str_push(&b, tok[1], tl[1], &name_off))
                PMEM();
            stow_schedule_op_t *op = &b.o[b.no];
            op->name = (const char *)(uintptr_t)name_off;
            op->line = line;
            size_t r0 = b.nr;
            rc = parse_list(&b, name, line, tok[2], tl[2], false, r0, err, errlen);
            if (rc != STOW_OK)
                goto fail;
            size_t r1 = b.nr;
            /* An output may not also be an input of the same op. */
            rc = parse_list(&b, name, line, tok[3], tl[3], true, r0, err, errlen);
            if (rc != STOW_OK)
                goto fail;
            op = &b.o[b.no];
            op->inputs = (size_t *)(uintptr_t)r0;
            op->input_count = r1 - r0;
            op->outputs = (size_t *)(uintptr_t)r1;
            op->output_count = b.nr - r1;
            b.no++;
        } else {
            PERR("%s:%zu: unknown directive '%.*s' (expected 'tensor' or 'op')", name, line,
                 (int)(tl[0] > 40 ? 40 : tl[0]), tok[0]);
        }
    }
    /* Everything was stored by offset because the arrays moved while growing;
     * turn the offsets into pointers now that nothing moves any more. An op
     * list may be empty everywhere ('-'), so refs is allocated regardless. */
    if (!grow((void **)&b.refs, &b.cr, 1, sizeof *b.refs) || !grow((void **)&b.str, &b.cs, 1, 1))
        PMEM();
    for (size_t i = 0; i < b.nt; i++) {
        b.t[i].id = b.str + (size_t)(uintptr_t)b.t[i].id;
        b.t[i].name = b.str + (size_t)(uintptr_t)b.t[i].name;
    }
    for (size_t i = 0; i < b.no; i++) {
        b.o[i].name = b.str + (size_t)(uintptr_t)b.o[i].name;
        b.o[i].inputs = b.refs + (size_t)(uintptr_t)b.o[i].inputs;
        b.o[i].outputs = b.refs + (size_t)(uintptr_t)b.o[i].outputs;
    }
    void **storage = calloc(3, sizeof *storage);
    if (storage == NULL)
        PMEM();
    storage[0] = b.refs;
    storage[1] = b.str;
    out->tensor_count = b.nt;
    out->tensors = b.t;
    out->op_count = b.no;
    out->ops = b.o;
    out->storage = storage;
    free(b.producer);
    free(b.first_read);
    free(b.hash);
    return STOW_OK;
fail:
    build_free(&b);
    return rc;
}

stow_status_t stow_schedule_load(const char *path, stow_schedule_t *out, char *err,
                                 size_t errlen)
{
    if (path == NULL || out == NULL)
        return STOW_EINVAL;
    char *text;
    size_t len;
    stow_status_t rc = stow__plan_read_file(path, "a schedule file", &text, &len, err, errlen);
    if (rc != STOW_OK)
        return rc;
    rc = stow_schedule_parse(path, text, len, out, err, errlen);
    free(text);
    return rc;
}

void stow_schedule_free(stow_schedule_t *schedule)
{
    if (schedule == NULL)
        return;
    void **storage = schedule->storage;
    if (storage != NULL) {
        free(storage[0]);
        free(storage[1]);
        free(storage);
    }
    free(schedule->tensors);
    free(schedule->ops);
    memset(schedule, 0, sizeof *schedule);
}

/* ------------------------------------------------------------------ peak -- */

void stow_schedule_peak_free(stow_schedule_peak_t *peak)
{
    if (peak == NULL)
        return;
    free(peak->memory_during_op);
    free(peak->memory_after_op);
    free(peak->alive_at_peak);
    memset(peak, 0, sizeof *peak);
}

typedef struct rank_item {
    uint64_t bytes;
    size_t t;
} rank_item_t;

static int rank_cmp(const void *a, const void *b)
{
    const rank_item_t *x = a, *y = b;
    if (x->bytes != y->bytes)
        return x->bytes > y->bytes ? -1 : 1;
    return (x->t > y->t) - (x->t < y->t);
}

stow_status_t stow_schedule_peak(const stow_schedule_t *s, stow_schedule_peak_t *out)
{
    if (s == NULL || out == NULL || (s->tensor_count && s->tensors == NULL) ||
        (s->op_count && s->ops == NULL))
        return STOW_EINVAL;
    size_t nt = s->tensor_count, no = s->op_count;
    size_t *first = malloc((nt ? nt : 1) * sizeof *first); /* first op alive, 0 for weights */
    size_t *last = malloc((nt ? nt : 1) * sizeof *last);   /* last op alive, NONE = never */
    uint64_t *add = calloc(no + 1, sizeof *add);
    uint64_t *sub = calloc(no + 1, sizeof *sub);
    stow_schedule_peak_t r = {0};
    r.op_count = no;
    r.memory_during_op = malloc((no ? no : 1) * sizeof *r.memory_during_op);
    r.memory_after_op = malloc((no ? no : 1) * sizeof *r.memory_after_op);
    stow_status_t rc = STOW_OK;
    if (!first || !last || !add || !sub || !r.memory_during_op || !r.memory_after_op) {
        rc = STOW_EHOSTMEM;
        goto out;
    }
    for (size_t t = 0; t < nt; t++) {
        first[t] = NONE;
        last[t] = NONE;
    }
    bool *produced = calloc(nt ? nt : 1, sizeof *produced);
    if (produced == NULL) {
        rc = STOW_EHOSTMEM;
        goto out;
    }
    for (size_t k = 0; k < no; k++) {
        const stow_schedule_op_t *op = &s->ops[k];
        for (size_t j = 0; j < op->output_count; j++) {
            size_t t = op->outputs[j];
            first[t] = k;
            last[t] = k;
            produced[t] = true;
        }
        for (size_t j = 0; j < op->input_count; j++) {
            size_t t = op->inputs[j];
            if (!produced[t] && first[t] == NONE)
                first[t] = 0; /* a weight or graph input: alive from the start */
            last[t] = k;
        }
    }
    free(produced);
    for (size_t t = 0; t < nt; t++) {
        if (first[t] == NONE)
            continue;
        if (!stow__plan_add(add[first[t]], s->tensors[t].bytes, &add[first[t]]) ||
            !stow__plan_add(sub[last[t]], s->tensors[t].bytes, &sub[last[t]])) {
            rc = STOW_EOVERFLOW;
            goto out;
        }
    }
    uint64_t live = 0;
    for (size_t k = 0; k < no; k++) {
        if (!stow__plan_add(live, add[k], &live)) {
            rc = STOW_EOVERFLOW;
            goto out;
        }
        r.memory_during_op[k] = live;
        live -= sub[k];
        r.memory_after_op[k] = live;
        if (k == 0 || r.memory_during_op[k] > r.peak_bytes) {
            r.peak_bytes = r.memory_during_op[k];
            r.peak_op = k;
        }
    }
    if (no > 0) {
        size_t na = 0;
        for (size_t t = 0; t < nt; t++)
            na += first[t] != NONE && first[t] <= r.peak_op && last[t] >= r.peak_op;
        rank_item_t *items = malloc((na ? na : 1) * sizeof *items);
        r.alive_at_peak = malloc((na ? na : 1) * sizeof *r.alive_at_peak);
        if (items == NULL || r.alive_at_peak == NULL) {
            free(items);
            rc = STOW_EHOSTMEM;
            goto out;
        }
        na = 0;
        for (size_t t = 0; t < nt; t++)
            if (first[t] != NONE && first[t] <= r.peak_op && last[t] >= r.peak_op)
                items[na++] = (rank_item_t){s->tensors[t].bytes, t};
        qsort(items, na, sizeof *items, rank_cmp);
        for (size_t i = 0; i < na; i++)
            r.alive_at_peak[i] = items[i].t;
        r.alive_count = na;
        free(items);
    }
out:
    free(first);
    free(last);
    free(add);
    free(sub);
    if (rc != STOW_OK) {
        stow_schedule_peak_free(&r);
        return rc;
    }
    *out = r;
    return STOW_OK;
}
