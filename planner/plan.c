/*
 * planner/plan.c: the planner's solver (stow_plan_solve).
 *
 * Three phases, each keeping the best plan so far:
 *   1. greedy: best-fit / first-fit placement under a list of (order, fit)
 *      pairs, best first (greedy_plan), with a max-upper segment tree over
 *      buffers sorted by start time, so that one placement costs
 *      O((k + 1) log n) for k time-overlapping placed buffers;
 *   2. exact search (<= SEARCH_MAX_BUFFERS buffers): a depth-first
 *      branch-and-bound over canonical plans, in the spirit of MiniMalloc
 *      (Moffitt, ASPLOS'23) - see search_dfs for the pruning rules;
 *   3. ruin and recreate (larger problems, or what the search left): the
 *      highest buffers around a buffer near the top are taken out and put back
 *      in a random order rule, until the time limit (ruin_run).
 * Every plan the search or the ruin phase accepts passes stow_plan_validate; that file
 * shares no placement code with this one.
 */
#include <math.h>
#ifdef PLAN_DEBUG
#include <stdio.h>
#endif
#include <stdlib.h>
#include <string.h>

#include "planner/plan_internal.h"

#define SEARCH_MAX_BUFFERS 4000u /* above this the exact search rarely helps */
#define GREEDY_SHARE 0.45 /* greedy passes after the first stop at this share of the limit */

typedef struct plan_ctx {
    size_t n;
    const stow_plan_buffer_t *b;
    uint32_t *by_lower; /* buffer indices sorted by lower */
    uint32_t *pos;      /* pos[i]: index of buffer i in by_lower */
    uint64_t *lowers;   /* lowers[k] = b[by_lower[k]].lower, for binary search */
    uint64_t *tree;     /* max upper of placed buffers; 0 = none placed */
    size_t leaves;
    uint64_t *pu, *po, *pe; /* by start order: upper (0 = unplaced), offset, end */
    uint64_t (*iv)[2];    /* scratch: (offset, end) of hits */
    uint64_t (*iv_tmp)[2]; /* scratch for the radix sort */
    uint32_t *hit;        /* scratch: start positions of hits (ruin phase) */
    uint64_t *tload;      /* max load over each buffer's lifetime (lazy) */
    uint64_t lb;          /* load lower bound */
    double span;          /* max upper - min lower */
    double deadline;      /* absolute stow__plan_now() time */
    double pass_deadline; /* a greedy pass gives up after this; 0 = never */
    uint64_t rng;         /* xorshift state */
} plan_ctx_t;

static uint64_t plan_rand(plan_ctx_t *c)
{
    uint64_t x = c->rng;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    c->rng = x;
    return x;
}

/* ------------------------------------------------------------- greedy -- */

/* The placed set is kept in start-time order, in blocks of BLOCK positions
 * under a max-upper segment tree: the tree skips blocks with nothing alive
 * after the query's start, and a block is scanned linearly, which is several
 * times faster per hit than descending to single leaves. */
#define BLOCK 16

static void tree_reset(plan_ctx_t *c)
{
    memset(c->tree, 0, 2 * c->leaves * sizeof *c->tree);
    memset(c->pu, 0, c->n * sizeof *c->pu);
}

static void tree_place(plan_ctx_t *c, uint32_t i, uint64_t offset)
{
    size_t p = c->pos[i];
    uint64_t up = c->b[i].upper;
    c->pu[p] = up;
    c->po[p] = offset;
    c->pe[p] = offset + c->b[i].size;
    for (size_t k = p / BLOCK + c->leaves; k >= 1; k /= 2) {
        if (c->tree[k] >= up)
            break;
        c->tree[k] = up;
    }
}

/* Placed buffers with lower < u (a prefix [0, bound) of by_lower) and upper > l
 * are exactly the time-overlapping ones; their (offset, end) go to c->iv. */
static size_t tree_collect(plan_ctx_t *c, size_t k, size_t lo, size_t span, size_t bound,
                           uint64_t l, size_t nh)
{
    if (c->tree[k] <= l || lo * BLOCK >= bound)
        return nh;
    if (span == 1) {
        size_t e = (lo + 1) * BLOCK < bound ? (lo + 1) * BLOCK : bound;
        for (size_t p = lo * BLOCK; p < e; p++) {
            if (c->pu[p] > l) {
                c->iv[nh][0] = c->po[p];
                c->iv[nh][1] = c->pe[p];
                nh++;
            }
        }
        return nh;
    }
    nh = tree_collect(c, 2 * k, lo, span / 2, bound, l, nh);
    return tree_collect(c, 2 * k + 1, lo + span / 2, span / 2, bound, l, nh);
}

static size_t tree_query(plan_ctx_t *c, size_t bound, uint64_t l)
{
    return tree_collect(c, 1, 0, c->leaves, bound, l, 0);
}

/* Takes buffer i out of the placed set. */
static void tree_remove(plan_ctx_t *c, uint32_t i)
{
    size_t p = c->pos[i];
    c->pu[p] = 0;
    size_t blk = p / BLOCK, e = (blk + 1) * BLOCK < c->n ? (blk + 1) * BLOCK : c->n;
    uint64_t m = 0;
    for (size_t q = blk * BLOCK; q < e; q++)
        if (c->pu[q] > m)
            m = c->pu[q];
    size_t k = blk + c->leaves;
    c->tree[k] = m;
    for (k /= 2; k >= 1; k /= 2) {
        uint64_t v = c->tree[2 * k] > c->tree[2 * k + 1] ? c->tree[2 * k] : c->tree[2 * k + 1];
        if (c->tree[k] == v)
            break;
        c->tree[k] = v;
    }
}

/* As tree_collect, but the start positions of the hits go to c->hit. */
static size_t tree_collect_pos(plan_ctx_t *c, size_t k, size_t lo, size_t span, size_t bound,
                               uint64_t l, size_t nh)
{
    if (c->tree[k] <= l || lo * BLOCK >= bound)
        return nh;
    if (span == 1) {
        size_t e = (lo + 1) * BLOCK < bound ? (lo + 1) * BLOCK : bound;
        for (size_t p = lo * BLOCK; p < e; p++)
            if (c->pu[p] > l)
                c->hit[nh++] = (uint32_t)p;
        return nh;
    }
    nh = tree_collect_pos(c, 2 * k, lo, span / 2, bound, l, nh);
    return tree_collect_pos(c, 2 * k + 1, lo + span / 2, span / 2, bound, l, nh);
}

/* Sorts (offset, end) pairs by offset. LSD radix on the bytes that differ:
 * the comparator-based qsort was 80% of the greedy time on 20k-buffer traces,
 * where each placement sees thousands of time-overlapping buffers. */
static void iv_sort(uint64_t (*iv)[2], uint64_t (*tmp)[2], size_t n)
{
    if (n < 48) {
        for (size_t i = 1; i < n; i++) {
            uint64_t a0 = iv[i][0], a1 = iv[i][1];
            size_t j = i;
            while (j > 0 && iv[j - 1][0] > a0) {
                iv[j][0] = iv[j - 1][0];
                iv[j][1] = iv[j - 1][1];
                j--;
            }
            iv[j][0] = a0;
            iv[j][1] = a1;
        }
        return;
    }
    uint64_t all_or = 0, all_and = UINT64_MAX;
    for (size_t i = 0; i < n; i++) {
        all_or |= iv[i][0];
        all_and &= iv[i][0];
    }
    uint64_t varying = all_or ^ all_and;
    uint64_t(*src)[2] = iv, (*dst)[2] = tmp;
    for (unsigned shift = 0; shift < 64; shift += 8) {
        if (((varying >> shift) & 0xff) == 0)
            continue;
        size_t count[257] = {0};
        for (size_t i = 0; i < n; i++)
            count[((src[i][0] >> shift) & 0xff) + 1]++;
        for (size_t d = 0; d < 256; d++)
            count[d + 1] += count[d];
        for (size_t i = 0; i < n; i++) {
            size_t d = (size_t)((src[i][0] >> shift) & 0xff);
            dst[count[d]][0] = src[i][0];
            dst[count[d]][1] = src[i][1];
            count[d]++;
        }
        uint64_t(*t)[2] = src;
        src = dst;
        dst = t;
    }
    if (src != iv)
        memcpy(iv, src, n * sizeof iv[0]);
}

static size_t lower_bound_pos(const plan_ctx_t *c, uint64_t u)
{
    size_t lo = 0, hi = c->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (c->lowers[mid] < u)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

enum { FIT_BEST, FIT_FIRST };

/* The offset best-fit / first-fit would give buffer i among the placed set;
 * UINT64_MAX when its top would not stay below UINT64_MAX. */
static uint64_t place_find(plan_ctx_t *c, uint32_t i, int fit)
{
    const stow_plan_buffer_t *bi = &c->b[i];
    size_t nh = tree_query(c, lower_bound_pos(c, bi->upper), bi->lower);
    iv_sort(c->iv, c->iv_tmp, nh);
    uint64_t run_end = 0, best = UINT64_MAX, best_gap = UINT64_MAX;
    for (size_t k = 0; k <= nh; k++) {
        uint64_t next = k < nh ? c->iv[k][0] : UINT64_MAX;
        uint64_t start, top;
        if (next > run_end && stow__plan_align_up(run_end, bi->alignment, &start) &&
            stow__plan_add(start, bi->size, &top) && top <= next) {
            uint64_t gap = next - run_end;
            if (k == nh) {
                if (best == UINT64_MAX)
                    best = start;
            } else if (fit == FIT_FIRST) {
                best = start;
                break;
            } else if (gap < best_gap) {
                best_gap = gap;
                best = start;
            }
        }
        if (k < nh && c->iv[k][1] > run_end)
            run_end = c->iv[k][1];
    }
    /* A top of UINT64_MAX is refused too: heights of UINT64_MAX mark a pass
     * that did not finish (greedy_run) and "no plan yet" (stow_plan_solve), so
     * a real one would be dropped (fuzz_plan_csv: a load of 2^64 - 1 came
     * back as offsets never written). */
    uint64_t top;
    if (best == UINT64_MAX || !stow__plan_add(best, bi->size, &top) || top == UINT64_MAX)
        return UINT64_MAX;
    return best;
}

/* Places buffers in `order`; offsets into off. STOW_EOVERFLOW if a top would
 * not fit in 64 bits. A pass that runs past c->pass_deadline stops and reports
 * height UINT64_MAX (its plan is incomplete). */
static stow_status_t greedy_run(plan_ctx_t *c, const uint32_t *order, int fit, uint64_t *off,
                                uint64_t *height)
{
    tree_reset(c);
    uint64_t h = 0;
    for (size_t t = 0; t < c->n; t++) {
        if ((t & 255) == 255 && c->pass_deadline > 0 && stow__plan_now() > c->pass_deadline) {
            *height = UINT64_MAX;
            return STOW_OK;
        }
        uint32_t i = order[t];
        uint64_t best = place_find(c, i, fit);
        if (best == UINT64_MAX)
            return STOW_EOVERFLOW;
        off[i] = best;
        if (best + c->b[i].size > h)
            h = best + c->b[i].size;
        tree_place(c, i, best);
    }
    *height = h;
    return STOW_OK;
}

/* Sort keys for the static orders; all descending except where noted. */
typedef struct order_key {
    double k1, k2;
    uint32_t i;
} order_key_t;

static int order_key_cmp(const void *a, const void *b)
{
    const order_key_t *x = a, *y = b;
    if (x->k1 != y->k1)
        return x->k1 > y->k1 ? -1 : 1;
    if (x->k2 != y->k2)
        return x->k2 > y->k2 ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

enum {
    ORD_SIZE_START,
    ORD_TLOAD,
    ORD_TBAND,
    ORD_TBAND_LEN,
    ORD_LONG_SIZE,
    ORD_SIZE_TLOAD,
    ORD_SIZE_END,
    ORD_SIZE,
    ORD_AREA,
    ORD_LENGTH,
    ORD_START,
    ORD_COUNT
};

static int u64_cmp(const void *a, const void *b);

/* c->tload[i] = the largest load (total size alive) at any time in buffer i's
 * lifetime: the buffers that sit under the peak get the highest values, and
 * placing them first stacks the peak without holes. O(n log n). */
static bool compute_tload(plan_ctx_t *c)
{
    if (c->tload != NULL)
        return true;
    size_t n = c->n, nt = 0;
    uint64_t *t = malloc((2 * n + 1) * sizeof *t);
    uint64_t *load = calloc(2 * n + 1, sizeof *load);
    c->tload = malloc((n ? n : 1) * sizeof *c->tload);
    if (t == NULL || load == NULL || c->tload == NULL) {
        free(t);
        free(load);
        free(c->tload);
        c->tload = NULL;
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        t[2 * i] = c->b[i].lower;
        t[2 * i + 1] = c->b[i].upper;
    }
    qsort(t, 2 * n, sizeof *t, u64_cmp);
    for (size_t i = 0; i < 2 * n; i++)
        if (nt == 0 || t[nt - 1] != t[i])
            t[nt++] = t[i];
    /* leaves 0..nt-1 of a max tree over section loads (section q = [t_q, t_q+1)) */
    size_t L = 1;
    while (L < nt)
        L *= 2;
    uint64_t *tree = calloc(2 * L, sizeof *tree);
    if (tree == NULL) {
        free(t);
        free(load);
        free(c->tload);
        c->tload = NULL;
        return false;
    }
    for (size_t i = 0; i < n; i++) {
        size_t a = 0, z = nt;
        while (a < z) { /* index of lower */
            size_t mid = (a + z) / 2;
            if (t[mid] < c->b[i].lower)
                a = mid + 1;
            else
                z = mid;
        }
        load[a] += c->b[i].size; /* the load fits in 64 bits (checked by the bound) */
        a = 0, z = nt;
        while (a < z) {
            size_t mid = (a + z) / 2;
            if (t[mid] < c->b[i].upper)
                a = mid + 1;
            else
                z = mid;
        }
        load[a] -= c->b[i].size;
    }
    uint64_t run = 0;
    for (size_t q = 0; q < nt; q++) {
        run += load[q];
        tree[L + q] = run;
    }
    for (size_t k = L - 1; k >= 1; k--)
        tree[k] = tree[2 * k] > tree[2 * k + 1] ? tree[2 * k] : tree[2 * k + 1];
    for (size_t i = 0; i < n; i++) {
        size_t a = 0, z = nt;
        while (a < z) {
            size_t mid = (a + z) / 2;
            if (t[mid] < c->b[i].lower)
                a = mid + 1;
            else
                z = mid;
        }
        size_t lo = a;
        a = 0, z = nt;
        while (a < z) {
            size_t mid = (a + z) / 2;
            if (t[mid] < c->b[i].upper)
                a = mid + 1;
            else
                z = mid;
        }
        uint64_t m = 0; /* max over leaves [lo, a) */
        for (size_t x = lo + L, y = a + L; x < y; x /= 2, y /= 2) {
            if (x & 1) {
                if (tree[x] > m)
                    m = tree[x];
                x++;
            }
            if (y & 1) {
                y--;
                if (tree[y] > m)
                    m = tree[y];
            }
        }
        c->tload[i] = m;
    }
    free(tree);
    free(t);
    free(load);
    return true;
}

static void make_order(const plan_ctx_t *c, int kind, order_key_t *keys, uint32_t *order)
{
    double band = (double)(c->lb ? c->lb : 1) / 256.0;
    for (size_t i = 0; i < c->n; i++) {
        const stow_plan_buffer_t *bi = &c->b[i];
        double size = (double)bi->size, len = (double)(bi->upper - bi->lower);
        keys[i].i = (uint32_t)i;
        switch (kind) {
        case ORD_SIZE_START: /* TFLite's arena planner order */
            keys[i].k1 = size;
            keys[i].k2 = -(double)bi->lower;
            break;
        case ORD_TLOAD: /* under the heaviest time first */
            keys[i].k1 = (double)c->tload[i];
            keys[i].k2 = size;
            break;
        case ORD_TBAND: /* by load band (1/256 of the bound), then size */
            keys[i].k1 = floor((double)c->tload[i] / band);
            keys[i].k2 = size;
            break;
        case ORD_TBAND_LEN: /* by load band, then lifetime length */
            keys[i].k1 = floor((double)c->tload[i] / band);
            keys[i].k2 = len * 1e20 + size;
            break;
        case ORD_LONG_SIZE: /* long-lived (over a quarter of the span) first, then size */
            keys[i].k1 = len > c->span / 4 ? len : 0.0;
            keys[i].k2 = size;
            break;
        case ORD_SIZE_TLOAD: /* size, ties under the heaviest time first */
            keys[i].k1 = size;
            keys[i].k2 = (double)c->tload[i];
            break;
        case ORD_SIZE_END: /* size, ties latest start first */
            keys[i].k1 = size;
            keys[i].k2 = (double)bi->lower;
            break;
        case ORD_SIZE:
            keys[i].k1 = size;
            keys[i].k2 = len;
            break;
        case ORD_AREA:
            keys[i].k1 = size * len;
            keys[i].k2 = size;
            break;
        case ORD_LENGTH:
            keys[i].k1 = len;
            keys[i].k2 = size;
            break;
        default: /* in start order, as an online allocator would see them */
            keys[i].k1 = -(double)bi->lower;
            keys[i].k2 = size;
            break;
        }
    }
    qsort(keys, c->n, sizeof *keys, order_key_cmp);
    for (size_t i = 0; i < c->n; i++)
        order[i] = keys[i].i;
}

/* The greedy passes, best first: each (order, fit) pair is the best one on
 * some benchmark family (docs/planner.md, section 5), so that a short budget
 * that only allows a few passes still runs the ones that matter. */
static const int greedy_plan[][2] = {
    {ORD_SIZE_START, FIT_BEST}, /* TFLite: most real traces */
    {ORD_TBAND_LEN, FIT_BEST},  /* load band, then length: iopddl S_1 */
    {ORD_TBAND, FIT_FIRST},     /* load band, then size: allocation traces */
    {ORD_SIZE, FIT_BEST},       /* XLA's spatial order: iopddl Y_1 */
    {ORD_SIZE_START, FIT_FIRST}, {ORD_TBAND, FIT_BEST},    {ORD_TBAND_LEN, FIT_FIRST},
    {ORD_TLOAD, FIT_BEST},       {ORD_TLOAD, FIT_FIRST},   {ORD_SIZE, FIT_FIRST},
    {ORD_LONG_SIZE, FIT_BEST},   {ORD_LONG_SIZE, FIT_FIRST}, {ORD_SIZE_TLOAD, FIT_BEST},
    {ORD_SIZE_END, FIT_BEST},    {ORD_AREA, FIT_BEST},     {ORD_AREA, FIT_FIRST},
    {ORD_LENGTH, FIT_BEST},      {ORD_LENGTH, FIT_FIRST},  {ORD_START, FIT_BEST},
    {ORD_START, FIT_FIRST},
};

/* -------------------------------------------------------- exact search -- */

/* Plans are canonical when buffers are placed in non-decreasing (offset,
 * preorder) order, each at its minimum offset: the top of the highest placed
 * buffer it overlaps in time. Any plan can be pushed down into such a plan
 * without growing, so the search loses nothing by only enumerating them.
 * Pruning (all sound for the decision "fits in `cap`"):
 *   - dominance: a buffer whose minimum offset is at or above the lowest top
 *     any unplaced buffer could reach would leave a hole that buffer fits in;
 *   - section inference: in every time section, max(floor, current offset) +
 *     the sizes still unplaced there must fit under the capacity; the floor of
 *     a section is raised to the lowest minimum offset of its unplaced buffers. */
#define UNPLACED UINT64_MAX

typedef struct trail_entry {
    uint32_t what; /* index; top bit set = section floor, clear = minoff */
    uint64_t old;
} trail_entry_t;

typedef struct search {
    plan_ctx_t *c;
    size_t n, S;
    uint64_t cap;
    uint32_t *sa, *sb;          /* section range [sa, sb) of each buffer */
    uint32_t *ov_start, *ov;    /* CSR: buffers overlapping each buffer */
    uint32_t *sec_start, *sec;  /* CSR: buffers alive in each section */
    uint32_t *pre;              /* preorder rank of each buffer */
    uint64_t *off, *minoff, *floor, *total;
    uint64_t *align;            /* alignment of each buffer (flat copy) */
    uint64_t *best;             /* the plan found */
    int32_t *diff;              /* S + 1 zeros between uses: raised ranges */
    uint32_t *affected;
    trail_entry_t *trail;
    size_t trail_len, trail_cap;
    uint32_t *cand;             /* candidate stack shared by all depths */
    size_t cand_len, cand_cap;
    uint32_t *cuts;             /* unplaced buffers crossing boundary q|q+1 */
    uint32_t *all;              /* 0..n-1, the root partition */
    const char *how;            /* current preorder heuristic */
    int64_t nodes_left;
    uint64_t nodes;
    bool oom, timeout;
} search_t;

enum { SR_FOUND, SR_NONE, SR_ABORT };

static uint64_t sat_add(uint64_t a, uint64_t b)
{
    return a > UINT64_MAX - b ? UINT64_MAX : a + b;
}

static bool trail_reserve(search_t *s, size_t need)
{
    if (s->trail_cap - s->trail_len >= need)
        return true;
    size_t nc = s->trail_cap ? 2 * s->trail_cap : 4096;
    while (nc - s->trail_len < need)
        nc *= 2;
    trail_entry_t *nt = realloc(s->trail, nc * sizeof *nt);
    if (nt == NULL) {
        s->oom = true;
        return false;
    }
    s->trail = nt;
    s->trail_cap = nc;
    return true;
}

static void trail_undo(search_t *s, size_t mark)
{
    while (s->trail_len > mark) {
        trail_entry_t e = s->trail[--s->trail_len];
        if (e.what & 0x80000000u)
            s->floor[e.what & 0x7fffffffu] = e.old;
        else
            s->minoff[e.what] = e.old;
    }
}

/* Insertion sort: candidate lists are short and qsort has no context pointer. */
static void cand_sort(const search_t *s, uint32_t *a, size_t n)
{
    for (size_t i = 1; i < n; i++) {
        uint32_t v = a[i];
        size_t j = i;
        while (j > 0) {
            uint32_t u = a[j - 1];
            if (s->minoff[u] < s->minoff[v] ||
                (s->minoff[u] == s->minoff[v] && s->pre[u] < s->pre[v]))
                break;
            a[j] = u;
            j--;
        }
        a[j] = v;
    }
}

/* A sub-problem: the unplaced buffers inside sections [s0, s1). */
typedef struct part {
    const uint32_t *bufs;
    size_t nb;
    uint32_t s0, s1;
} part_t;

static int search_dfs(search_t *s, const part_t *pt, uint64_t min_off, uint32_t min_pre);
static bool search_rerank(search_t *s, const uint32_t *bufs, size_t nb);

/* Dynamic decomposition (MiniMalloc's "cutlines"): once every buffer crossing a
 * section boundary is placed, the two sides stop interacting, so each side
 * is solved on its own and a failure on one side never re-searches the other.
 * Called after `b` was placed; returns the result of the remaining search. */
static int search_split(search_t *s, const part_t *pt, uint32_t b, uint64_t o)
{
    size_t ncut = 0;
    for (uint32_t q = s->sa[b]; q + 1 < s->sb[b]; q++)
        if (--s->cuts[q] == 0)
            ncut++;
    int result;
    if (ncut == 0) {
        result = search_dfs(s, pt, o, s->pre[b]);
    } else {
        uint32_t *sub = malloc((pt->nb ? pt->nb : 1) * sizeof *sub);
        result = sub == NULL ? SR_ABORT : SR_FOUND;
        uint32_t lo = pt->s0;
        for (uint32_t q = pt->s0; q < pt->s1 && result == SR_FOUND; q++) {
            /* a cut after section q, or the end of the partition */
            if (q + 1 < pt->s1 && s->cuts[q] != 0)
                continue;
            uint32_t hi = q + 1;
            size_t ns = 0;
            for (size_t k = 0; k < pt->nb; k++) {
                uint32_t j = pt->bufs[k];
                if (s->off[j] == UNPLACED && s->sa[j] < hi && s->sb[j] > lo)
                    sub[ns++] = j;
            }
            if (ns > 0) {
                /* The child gets its own preorder from the current section
                 * loads, as MiniMalloc does: the loads that made the parent's
                 * order are stale once part of the problem is placed. */
                uint32_t *saved = malloc(ns * sizeof *saved);
                if (saved == NULL) {
                    result = SR_ABORT;
                    break;
                }
                for (size_t k = 0; k < ns; k++)
                    saved[k] = s->pre[sub[k]];
                part_t child = {sub, ns, lo, hi};
                result = search_rerank(s, sub, ns) ? search_dfs(s, &child, 0, 0) : SR_ABORT;
                for (size_t k = 0; k < ns; k++)
                    s->pre[sub[k]] = saved[k];
                free(saved);
            }
            lo = hi;
        }
        free(sub);
    }
    for (uint32_t q = s->sa[b]; q + 1 < s->sb[b]; q++)
        s->cuts[q]++;
    return result;
}

static int search_dfs(search_t *s, const part_t *pt, uint64_t min_off, uint32_t min_pre)
{
    uint64_t min_height = UINT64_MAX;
    size_t left = 0;
    for (size_t k = 0; k < pt->nb; k++) {
        uint32_t i = pt->bufs[k];
        if (s->off[i] == UNPLACED) {
            uint64_t t = sat_add(s->minoff[i], s->c->b[i].size);
            if (t < min_height)
                min_height = t;
            left++;
        }
    }
    if (left == 0)
        return SR_FOUND;
    if (--s->nodes_left < 0)
        return SR_ABORT;
    if ((++s->nodes & 1023) == 0 && stow__plan_now() > s->c->deadline) {
        s->timeout = true;
        return SR_ABORT;
    }
    if (min_height > s->cap)
        return SR_NONE;
    size_t base = s->cand_len;
    if (s->cand_cap - s->cand_len < left) {
        size_t nc = s->cand_cap * 2 + s->n;
        uint32_t *ncand = realloc(s->cand, nc * sizeof *ncand);
        if (ncand == NULL) {
            s->oom = true;
            return SR_ABORT;
        }
        s->cand = ncand;
        s->cand_cap = nc;
    }
    for (size_t k = 0; k < pt->nb; k++) {
        uint32_t i = pt->bufs[k];
        if (s->off[i] != UNPLACED)
            continue;
        uint64_t m = s->minoff[i];
        if (m < min_off || (m == min_off && s->pre[i] < min_pre))
            continue; /* not canonical */
        if (m >= min_height)
            continue; /* dominated */
        s->cand[s->cand_len++] = i;
    }
    size_t ncand = s->cand_len - base;
    cand_sort(s, s->cand + base, ncand);
    int result = SR_NONE;
    for (size_t k = 0; k < ncand; k++) {
        uint32_t b = s->cand[base + k];
        uint64_t o = s->minoff[b], size = s->c->b[b].size;
        uint64_t top = sat_add(o, size);
        if (top > s->cap)
            continue;
        size_t mark = s->trail_len;
        /* One reservation covers every push of this step: b's sections, its
         * overlaps and the raised sections. */
        size_t need = (s->sb[b] - s->sa[b]) + (s->ov_start[b + 1] - s->ov_start[b]) + s->S + 1;
        if (!trail_reserve(s, need)) {
            result = SR_ABORT;
            break;
        }
        s->off[b] = o;
        s->best[b] = o; /* the last write on the successful path wins */
        /* minoff of a placed buffer reads as UINT64_MAX, so the loops below
         * need not look at off[] (saves a load per buffer in the hot loops). */
        s->minoff[b] = UINT64_MAX;
        size_t naff = 0;
        trail_entry_t *tr = s->trail;
        size_t tl = s->trail_len;
        for (uint32_t q = s->sa[b]; q < s->sb[b]; q++) {
            tr[tl++] = (trail_entry_t){q | 0x80000000u, s->floor[q]};
            s->floor[q] = top;
            s->total[q] -= size;
        }
        /* The raised buffers' section ranges are marked in a difference
         * array and swept once: O(raised + union of ranges) rather than the
         * sum of their lengths, which dominated the search on long-lived
         * buffers. */
        uint32_t ulo = UINT32_MAX, uhi = 0;
        uint64_t maxnm = 0;
        for (uint32_t e = s->ov_start[b]; e < s->ov_start[b + 1]; e++) {
            uint32_t j = s->ov[e];
            if (s->minoff[j] >= top)
                continue; /* placed, or already above */
            uint64_t a = s->align[j], nm;
            if (!stow__plan_align_up(top, a, &nm))
                nm = UINT64_MAX - 1; /* never fits: any top saturates above cap */
            tr[tl++] = (trail_entry_t){j, s->minoff[j]};
            s->minoff[j] = nm;
            if (nm > maxnm)
                maxnm = nm;
            s->diff[s->sa[j]]++;
            s->diff[s->sb[j]]--;
            if (s->sa[j] < ulo)
                ulo = s->sa[j];
            if (s->sb[j] > uhi)
                uhi = s->sb[j];
        }
        if (ulo != UINT32_MAX) {
            /* A section whose floor is already >= every raised minimum offset
             * cannot rise: a raised buffer bounds the lowest one there. */
            int32_t run = 0;
            for (uint32_t q = ulo; q < uhi; q++) {
                run += s->diff[q];
                s->diff[q] = 0;
                if (run > 0 && s->floor[q] < maxnm)
                    s->affected[naff++] = q;
            }
            s->diff[uhi] = 0;
        }
        for (size_t a = 0; a < naff; a++) {
            uint32_t q = s->affected[a];
            uint64_t m = UINT64_MAX, fl = s->floor[q];
            for (uint32_t e = s->sec_start[q]; e < s->sec_start[q + 1]; e++) {
                uint64_t mj = s->minoff[s->sec[e]];
                if (mj < m) {
                    m = mj;
                    if (m <= fl)
                        break; /* no raise possible */
                }
            }
            if (m != UINT64_MAX && fl < m) {
                tr[tl++] = (trail_entry_t){q | 0x80000000u, fl};
                s->floor[q] = m;
            }
        }
        s->trail_len = tl;
        bool ok = true;
        if (ok) {
            for (uint32_t q = pt->s0; q < pt->s1; q++) {
                uint64_t f = s->floor[q] > o ? s->floor[q] : o;
                if (s->total[q] > 0 && sat_add(f, s->total[q]) > s->cap) {
                    ok = false;
                    break;
                }
            }
        }
        if (s->oom)
            result = SR_ABORT;
        else if (ok)
            result = search_split(s, pt, b, o);
        /* sections of b were all updated unless a trail push failed (oom) */
        for (uint32_t q = s->sa[b]; q < s->sb[b]; q++)
            s->total[q] += size;
        trail_undo(s, mark);
        s->off[b] = UNPLACED;
        s->minoff[b] = o;
        if (result != SR_NONE)
            break;
    }
    s->cand_len = base;
    return result;
}

static void search_free(search_t *s)
{
    free(s->sa);
    free(s->sb);
    free(s->ov_start);
    free(s->ov);
    free(s->sec_start);
    free(s->sec);
    free(s->pre);
    free(s->off);
    free(s->minoff);
    free(s->floor);
    free(s->total);
    free(s->best);
    free(s->diff);
    free(s->affected);
    free(s->trail);
    free(s->cand);
    free(s->cuts);
    free(s->all);
    free(s->align);
    memset(s, 0, sizeof *s);
}

static int u64_cmp(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

static size_t time_index(const uint64_t *t, size_t nt, uint64_t v)
{
    size_t lo = 0, hi = nt;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (t[mid] < v)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* Builds sections and overlap lists; false on allocation failure or when the
 * problem is too big for the exact search. */
static bool search_init(search_t *s, plan_ctx_t *c)
{
    memset(s, 0, sizeof *s);
    s->c = c;
    size_t n = s->n = c->n;
    uint64_t *t = malloc(2 * n * sizeof *t);
    if (t == NULL)
        return false;
    for (size_t i = 0; i < n; i++) {
        t[2 * i] = c->b[i].lower;
        t[2 * i + 1] = c->b[i].upper;
    }
    qsort(t, 2 * n, sizeof *t, u64_cmp);
    size_t nt = 0;
    for (size_t i = 0; i < 2 * n; i++)
        if (nt == 0 || t[nt - 1] != t[i])
            t[nt++] = t[i];
    s->S = nt - 1;
    s->sa = malloc(n * sizeof *s->sa);
    s->sb = malloc(n * sizeof *s->sb);
    s->sec_start = calloc(s->S + 2, sizeof *s->sec_start);
    s->ov_start = calloc(n + 1, sizeof *s->ov_start);
    if (!s->sa || !s->sb || !s->sec_start || !s->ov_start) {
        free(t);
        return false;
    }
    size_t sec_total = 0;
    for (size_t i = 0; i < n; i++) {
        s->sa[i] = (uint32_t)time_index(t, nt, c->b[i].lower);
        s->sb[i] = (uint32_t)time_index(t, nt, c->b[i].upper);
        sec_total += s->sb[i] - s->sa[i];
    }
    free(t);
    if (sec_total > 32u * 1024 * 1024)
        return false;
    for (size_t i = 0; i < n; i++)
        for (uint32_t q = s->sa[i]; q < s->sb[i]; q++)
            s->sec_start[q + 1]++;
    for (size_t q = 0; q < s->S; q++)
        s->sec_start[q + 1] += s->sec_start[q];
    s->sec = malloc((sec_total ? sec_total : 1) * sizeof *s->sec);
    uint32_t *fill = calloc(s->S + 1, sizeof *fill);
    if (s->sec == NULL || fill == NULL) {
        free(fill);
        return false;
    }
    for (size_t i = 0; i < n; i++)
        for (uint32_t q = s->sa[i]; q < s->sb[i]; q++)
            s->sec[s->sec_start[q] + fill[q]++] = (uint32_t)i;
    free(fill);
    /* Overlaps: two buffers overlap iff they share a section. */
    size_t ov_total = 0;
    for (size_t pass = 0; pass < 2; pass++) {
        if (pass == 1) {
            for (size_t i = 0; i < n; i++)
                s->ov_start[i + 1] += s->ov_start[i];
            s->ov = malloc((ov_total ? ov_total : 1) * sizeof *s->ov);
            if (s->ov == NULL)
                return false;
        }
        for (size_t i = 0; i < n; i++) {
            size_t k = 0;
            for (size_t j = 0; j < n; j++) {
                if (j == i || c->b[j].upper <= c->b[i].lower || c->b[i].upper <= c->b[j].lower)
                    continue;
                if (pass == 0)
                    k++;
                else
                    s->ov[s->ov_start[i] + k++] = (uint32_t)j;
            }
            if (pass == 0) {
                s->ov_start[i + 1] = (uint32_t)k;
                ov_total += k;
                if (ov_total > 64u * 1024 * 1024)
                    return false;
            }
        }
    }
    s->pre = malloc(n * sizeof *s->pre);
    s->off = malloc(n * sizeof *s->off);
    s->minoff = malloc(n * sizeof *s->minoff);
    s->best = malloc(n * sizeof *s->best);
    s->floor = malloc((s->S + 1) * sizeof *s->floor);
    s->total = malloc((s->S + 1) * sizeof *s->total);
    s->diff = calloc(s->S + 2, sizeof *s->diff);
    s->affected = malloc((s->S + 1) * sizeof *s->affected);
    s->cuts = malloc((s->S + 1) * sizeof *s->cuts);
    s->all = malloc(n * sizeof *s->all);
    s->align = malloc(n * sizeof *s->align);
    if (s->align != NULL)
        for (size_t i = 0; i < n; i++)
            s->align[i] = c->b[i].alignment;
    if (s->all != NULL)
        for (size_t i = 0; i < n; i++)
            s->all[i] = (uint32_t)i;
    return s->align && s->cuts && s->all && s->pre && s->off && s->minoff && s->best && s->floor && s->total && s->diff &&
           s->affected;
}

/* Preorders, after MiniMalloc's "WAT", "TAW", "TWA": W = lifetime length,
 * A = area, T = the largest section load the buffer sits in. */
static const char *const preorders[] = {"TWA", "TAW", "WAT"};

typedef struct pre_key {
    double w, a, t;
    uint32_t i;
    const char *how;
} pre_key_t;

static int pre_key_cmp(const void *x, const void *y)
{
    const pre_key_t *p = x, *q = y;
    for (const char *h = p->how; *h; h++) {
        double u = *h == 'W' ? p->w : *h == 'A' ? p->a : p->t;
        double v = *h == 'W' ? q->w : *h == 'A' ? q->a : q->t;
        if (u != v)
            return u > v ? -1 : 1;
    }
    return (p->i > q->i) - (p->i < q->i);
}

static bool search_preorder(search_t *s, const char *how)
{
    size_t n = s->n;
    pre_key_t *k = malloc(n * sizeof *k);
    if (k == NULL)
        return false;
    for (size_t q = 0; q < s->S; q++) {
        s->total[q] = 0;
        for (uint32_t e = s->sec_start[q]; e < s->sec_start[q + 1]; e++)
            s->total[q] = sat_add(s->total[q], s->c->b[s->sec[e]].size);
    }
    for (size_t i = 0; i < n; i++) {
        const stow_plan_buffer_t *b = &s->c->b[i];
        uint64_t tmax = 0;
        for (uint32_t q = s->sa[i]; q < s->sb[i]; q++)
            if (s->total[q] > tmax)
                tmax = s->total[q];
        k[i] = (pre_key_t){(double)(b->upper - b->lower),
                           (double)(b->upper - b->lower) * (double)b->size, (double)tmax,
                           (uint32_t)i, how};
    }
    qsort(k, n, sizeof *k, pre_key_cmp);
    for (size_t r = 0; r < n; r++)
        s->pre[k[r].i] = (uint32_t)r;
    free(k);
    return true;
}

static bool search_rerank(search_t *s, const uint32_t *bufs, size_t nb)
{
    pre_key_t *k = malloc((nb ? nb : 1) * sizeof *k);
    if (k == NULL)
        return false;
    for (size_t r = 0; r < nb; r++) {
        uint32_t i = bufs[r];
        const stow_plan_buffer_t *b = &s->c->b[i];
        uint64_t tmax = 0;
        for (uint32_t q = s->sa[i]; q < s->sb[i]; q++)
            if (s->total[q] > tmax)
                tmax = s->total[q];
        k[r] = (pre_key_t){(double)(b->upper - b->lower),
                           (double)(b->upper - b->lower) * (double)b->size, (double)tmax, i,
                           s->how};
    }
    qsort(k, nb, sizeof *k, pre_key_cmp);
    for (size_t r = 0; r < nb; r++)
        s->pre[k[r].i] = (uint32_t)r;
    free(k);
    return true;
}

/* One depth-first search for a plan of height <= cap, under preorder `how`,
 * giving up after node_limit nodes or at the deadline. */
static int search_run(search_t *s, uint64_t cap, const char *how, int64_t node_limit)
{
    if (!search_preorder(s, how))
        return SR_ABORT;
    s->how = how;
    s->cap = cap;
    for (size_t i = 0; i < s->n; i++) {
        s->off[i] = UNPLACED;
        s->minoff[i] = 0;
    }
    for (size_t q = 0; q < s->S; q++) {
        s->floor[q] = 0;
        if (s->total[q] > cap)
            return SR_NONE;
    }
    memset(s->cuts, 0, (s->S + 1) * sizeof *s->cuts);
    for (size_t i = 0; i < s->n; i++)
        for (uint32_t q = s->sa[i]; q + 1 < s->sb[i]; q++)
            s->cuts[q]++;
    s->trail_len = 0;
    s->cand_len = 0;
    s->nodes_left = node_limit;
    part_t root = {s->all, s->n, 0, (uint32_t)s->S};
    return search_dfs(s, &root, 0, 0);
}

/* Round robin over the preorders with a doubling node limit, as a stuck
 * ordering is the common failure and another one often finishes at once.
 * SR_NONE only when a search finished without the node limit (a proof). */
static int search_decide(search_t *s, uint64_t cap, double deadline)
{
    double saved = s->c->deadline;
    s->c->deadline = deadline;
    int64_t limit = (int64_t)s->n;
    int r = SR_ABORT;
    while (!s->timeout && !s->oom) {
        for (size_t h = 0; h < sizeof preorders / sizeof preorders[0]; h++) {
            r = search_run(s, cap, preorders[h], limit);
#ifdef PLAN_DEBUG
            fprintf(stderr, "  %s limit %lld r=%d used=%lld\n", preorders[h], (long long)limit, r,
                    (long long)(limit - s->nodes_left));
#endif
            if (r != SR_ABORT || s->timeout || s->oom)
                break;
        }
        if (r != SR_ABORT)
            break;
        if (limit > INT64_MAX / 4)
            break;
        limit *= 2;
    }
#ifdef PLAN_DEBUG
    fprintf(stderr, "search cap=%llu r=%d nodes=%llu limit=%lld\n", (unsigned long long)cap, r,
            (unsigned long long)s->nodes, (long long)limit);
#endif
    s->timeout = false;
    s->c->deadline = saved;
    return r;
}

/* -------------------------------------------------------------- repair -- */

typedef struct plan_best {
    uint64_t *off;
    uint64_t height;
    uint32_t *order; /* greedy order that produced it (NULL after the search) */
    int fit;
    const char *method;
} plan_best_t;

/* ------------------------------------------------------------ promote -- */

/* Squeaky wheel (Joslin & Clements, JAIR 1999), deterministic: run the greedy,
 * move every buffer that ends above the level halfway between the goal and the
 * height to the front of the order (keeping their relative order, and the rest's),
 * and run again, until the height reaches the goal, the order stops changing,
 * six passes bring no new best, or time runs out. From the load order this takes pangu_2.6B from 1.0076 x LB to
 * LB in three passes: the buffers that stick out just after the peak get placed
 * before the peak stack and the stack arranges itself around them. */
static stow_status_t promote_run(plan_ctx_t *c, const uint32_t *start, int fit, plan_best_t *best,
                                 uint64_t goal, double until, const char *how)
{
    size_t n = c->n;
    uint32_t *ord = malloc(n * sizeof *ord);
    uint32_t *tmp = malloc(n * sizeof *tmp);
    uint64_t *off = malloc(n * sizeof *off);
    if (ord == NULL || tmp == NULL || off == NULL) {
        free(ord);
        free(tmp);
        free(off);
        return STOW_EHOSTMEM;
    }
    memcpy(ord, start, n * sizeof *ord);
    stow_status_t rc = STOW_OK;
    double saved = c->pass_deadline;
    c->pass_deadline = until;
    int stale = 0;
    for (int pass = 0; pass < 64 && stale < 6 && best->height > goal && stow__plan_now() < until;
         pass++) {
        uint64_t h;
        rc = greedy_run(c, ord, fit, off, &h);
        if (rc != STOW_OK || h == UINT64_MAX)
            break;
#ifdef PLAN_DEBUG
        fprintf(stderr, "promote %s pass %d: %llu\n", how, pass, (unsigned long long)h);
#else
        (void)how;
#endif
        if (h < best->height) {
            best->height = h;
            memcpy(best->off, off, n * sizeof *off);
            memcpy(best->order, ord, n * sizeof *ord);
            best->fit = fit;
            best->method = "greedy+promote";
            stale = 0;
        } else {
            stale++; /* orders can cycle without a fixed point */
        }
        if (h <= goal)
            break;
        uint64_t thr = goal + (h - goal) / 2;
        size_t k = 0;
        for (size_t t = 0; t < n; t++)
            if (off[ord[t]] + c->b[ord[t]].size > thr)
                tmp[k++] = ord[t];
        for (size_t t = 0; t < n; t++)
            if (off[ord[t]] + c->b[ord[t]].size <= thr)
                tmp[k++] = ord[t];
        if (memcmp(tmp, ord, n * sizeof *ord) == 0)
            break; /* a fixed point: the same order gives the same plan */
        memcpy(ord, tmp, n * sizeof *ord);
    }
    c->pass_deadline = saved;
    free(ord);
    free(tmp);
    free(off);
    return rc;
}

/* --------------------------------------------------------------- ruin -- */

/* Ruin and recreate (Schrimpf et al., J. Comp. Phys. 2000) on the best plan:
 * pick a buffer near the top, take out the m buffers that reach highest among
 * those alive during its lifetime (m random), and put them back one by one with
 * best- or first-fit under a randomised order. The new plan is kept when its
 * height is lower, or equal with no more area above a level halfway between
 * the goal and the height (so that plateau moves that lower the top region are
 * taken); otherwise the old offsets are restored. Each step costs
 * O(m (k + log n)) for k buffers alive together, independent of n. */
typedef struct ruin_item {
    double key;
    uint32_t i;
} ruin_item_t;

static int ruin_item_cmp(const void *a, const void *b)
{
    const ruin_item_t *x = a, *y = b;
    if (x->key != y->key)
        return x->key > y->key ? -1 : 1;
    return (x->i > y->i) - (x->i < y->i);
}

static double plan_unit(plan_ctx_t *c)
{
    return (double)(plan_rand(c) >> 11) * (1.0 / 9007199254740992.0);
}

static double above(const stow_plan_buffer_t *b, uint64_t off, uint64_t level)
{
    uint64_t top = off + b->size;
    if (top <= level)
        return 0.0;
    uint64_t from = off > level ? off : level;
    return (double)(top - from) * (double)(b->upper - b->lower);
}

static stow_status_t ruin_run(plan_ctx_t *c, uint64_t *off, uint64_t *height, uint64_t goal,
                              uint64_t *iters_out)
{
    size_t n = c->n;
    if (n == 0)
        return STOW_OK;
    ruin_item_t *rm = malloc(n * sizeof *rm);
    uint64_t *old = malloc(n * sizeof *old);
    uint64_t(*ends)[2] = malloc(n * sizeof *ends);
    if (rm == NULL || old == NULL || ends == NULL) {
        free(rm);
        free(old);
        free(ends);
        return STOW_EHOSTMEM;
    }
    tree_reset(c);
    for (size_t i = 0; i < n; i++)
        tree_place(c, (uint32_t)i, off[i]);
    uint64_t h = *height, iters = 0;
#ifdef PLAN_DEBUG
    uint64_t st_acc = 0, st_m = 0, st_nh = 0, st_fail = 0;
#endif
    uint64_t level = goal + (h - goal) / 2;
    while (h > goal) {
        if (stow__plan_now() > c->deadline)
            break;
        iters++;
        /* Seed: a random buffer reaching above a random threshold (the top
         * itself half of the time), by reservoir sampling. */
        uint64_t thr = (plan_rand(c) & 1) ? h - 1 : h - 1 - (uint64_t)((double)(h - 1 - goal) * plan_unit(c));
        uint32_t seed = UINT32_MAX;
        uint64_t seen = 0;
        for (size_t i = 0; i < n; i++)
            if (off[i] + c->b[i].size > thr && plan_rand(c) % ++seen == 0)
                seed = (uint32_t)i;
        if (seed == UINT32_MAX)
            continue;
        /* Window: the seed's lifetime, sometimes widened. */
        uint64_t wl = c->b[seed].lower, wu = c->b[seed].upper;
        if (plan_rand(c) & 1) {
            uint64_t len = wu - wl;
            uint64_t a = (uint64_t)((double)len * plan_unit(c)), b = (uint64_t)((double)len * plan_unit(c));
            wl = wl > a ? wl - a : 0;
            wu = wu > UINT64_MAX - b ? UINT64_MAX : wu + b;
        }
        size_t nh = tree_collect_pos(c, 1, 0, c->leaves, lower_bound_pos(c, wu), wl, 0);
        if (nh == 0)
            continue;
        /* The m highest-reaching of them. */
        size_t mmax = nh < 256 ? nh : 256;
        size_t m = 2 + (size_t)(plan_rand(c) % mmax);
        if (m > nh)
            m = nh;
        /* In half of the steps, buffers living far beyond the window stay put
         * (except the seed): re-placing one costs a scan of everything alive
         * in its lifetime, so these steps are many times cheaper. */
        uint64_t wlen = wu - wl, far = wlen > UINT64_MAX / 8 ? UINT64_MAX : 8 * wlen;
        if (plan_rand(c) & 1)
            far = UINT64_MAX; /* half of the steps may move them all the same */
        size_t kept = 0;
        for (size_t k = 0; k < nh; k++) {
            uint32_t i = c->by_lower[c->hit[k]];
            if (i != seed && c->b[i].upper - c->b[i].lower > far)
                continue;
            ends[kept][0] = UINT64_MAX - c->pe[c->hit[k]]; /* ascending = highest first */
            ends[kept][1] = i;
            kept++;
        }
        nh = kept;
        if (m > nh)
            m = nh;
        iv_sort(ends, c->iv_tmp, nh);
        double before = 0.0;
        for (size_t k = 0; k < m; k++) {
            uint32_t i = (uint32_t)ends[k][1];
            rm[k] = (ruin_item_t){0.0, i};
            old[k] = off[i];
            before += above(&c->b[i], off[i], level);
            tree_remove(c, i);
        }
        /* One ordering rule for the step: size (half the time), area,
         * length, or size with noise. */
        {
            int how = (int)(plan_rand(c) % 8);
            for (size_t k = 0; k < m; k++) {
                const stow_plan_buffer_t *b = &c->b[rm[k].i];
                double len = (double)(b->upper - b->lower), size = (double)b->size;
                rm[k].key = how < 4 ? size * (1.0 + 1e-12 * len) : how < 6 ? size * len
                          : how < 7 ? len * (1.0 + 1e-12 * size) : size * (0.7 + 0.6 * plan_unit(c));
            }
        }
        qsort(rm, m, sizeof *rm, ruin_item_cmp);
        int fit = (plan_rand(c) & 1) ? FIT_BEST : FIT_FIRST;
        bool ok = true;
        double after = 0.0;
        size_t placed = 0;
        for (; placed < m; placed++) {
            uint32_t i = rm[placed].i;
            if ((placed & 15) == 15 && stow__plan_now() > c->deadline) {
                ok = false; /* out of time: undo this step */
                break;
            }
            uint64_t o = place_find(c, i, fit);
            if (o == UINT64_MAX || o + c->b[i].size > h) {
                ok = false;
                break;
            }
            off[i] = o;
            after += above(&c->b[i], o, level);
            tree_place(c, i, o);
        }
        uint64_t nhgt = 0;
        if (ok) {
            for (size_t i = 0; i < n; i++)
                if (off[i] + c->b[i].size > nhgt)
                    nhgt = off[i] + c->b[i].size;
            ok = nhgt < h || after <= before;
        }
#ifdef PLAN_DEBUG
        st_m += m;
        st_nh += nh;
        st_acc += ok;
        st_fail += placed < m;
#endif
        if (ok) {
            if (nhgt < h) {
                h = nhgt;
                level = goal + (h - goal) / 2;
            }
            continue;
        }
        /* Undo: rm[0..placed) were put back at new offsets. */
        for (size_t k = 0; k < placed; k++)
            tree_remove(c, rm[k].i);
        for (size_t k = 0; k < m; k++) {
            uint32_t i = (uint32_t)ends[k][1];
            off[i] = old[k];
            tree_place(c, i, old[k]);
        }
    }
#ifdef PLAN_DEBUG
    fprintf(stderr, "ruin: accepted %llu, over the top %llu, mean m %.1f, mean window %.1f\n",
            (unsigned long long)st_acc, (unsigned long long)st_fail,
            (double)st_m / (double)(iters ? iters : 1), (double)st_nh / (double)(iters ? iters : 1));
#endif
    *height = h;
    *iters_out = iters;
    free(rm);
    free(old);
    free(ends);
    return STOW_OK;
}

/* --------------------------------------------------------------- solve -- */

stow_plan_options_t stow_plan_options_default(void)
{
    stow_plan_options_t o = {0, 10.0, 1};
    return o;
}

void stow_plan_result_free(stow_plan_result_t *result)
{
    if (result == NULL)
        return;
    free(result->offsets);
    memset(result, 0, sizeof *result);
}

static void ctx_free(plan_ctx_t *c)
{
    free(c->by_lower);
    free(c->pos);
    free(c->lowers);
    free(c->tree);
    free(c->pu);
    free(c->po);
    free(c->pe);
    free(c->iv);
    free(c->iv_tmp);
    free(c->hit);
    free(c->tload);
}

static int by_lower_cmp_pair(const void *a, const void *b)
{
    const uint64_t *x = a, *y = b;
    if (x[0] != y[0])
        return x[0] < y[0] ? -1 : 1;
    return (x[1] > y[1]) - (x[1] < y[1]);
}

static stow_status_t ctx_init(plan_ctx_t *c, const stow_plan_problem_t *p)
{
    memset(c, 0, sizeof *c);
    size_t n = c->n = p->count;
    c->b = p->buffers;
    c->leaves = 1;
    while (c->leaves * BLOCK < n)
        c->leaves *= 2;
    c->by_lower = malloc(n * sizeof *c->by_lower);
    c->pos = malloc(n * sizeof *c->pos);
    c->lowers = malloc(n * sizeof *c->lowers);
    c->tree = malloc(2 * c->leaves * sizeof *c->tree);
    c->pu = malloc((n ? n : 1) * sizeof *c->pu);
    c->po = malloc((n ? n : 1) * sizeof *c->po);
    c->pe = malloc((n ? n : 1) * sizeof *c->pe);
    c->iv = malloc(n * sizeof *c->iv);
    c->iv_tmp = malloc(n * sizeof *c->iv_tmp);
    c->hit = malloc((n ? n : 1) * sizeof *c->hit);
    uint64_t(*pairs)[2] = malloc(n * sizeof *pairs);
    if (!c->by_lower || !c->pos || !c->lowers || !c->tree || !c->pu || !c->po || !c->pe || !c->iv || !c->iv_tmp || !c->hit || !pairs) {
        free(pairs);
        ctx_free(c);
        return STOW_EHOSTMEM;
    }
    for (size_t i = 0; i < n; i++) {
        pairs[i][0] = p->buffers[i].lower;
        pairs[i][1] = i;
    }
    qsort(pairs, n, sizeof pairs[0], by_lower_cmp_pair);
    for (size_t k = 0; k < n; k++) {
        c->by_lower[k] = (uint32_t)pairs[k][1];
        c->pos[pairs[k][1]] = (uint32_t)k;
        c->lowers[k] = pairs[k][0];
    }
    free(pairs);
    return STOW_OK;
}

static uint64_t plan_height(const plan_ctx_t *c, const uint64_t *off)
{
    uint64_t h = 0;
    for (size_t i = 0; i < c->n; i++)
        if (off[i] + c->b[i].size > h)
            h = off[i] + c->b[i].size;
    return h;
}

/* The exact search, for problems small enough. Without a capacity it first
 * asks for the lower bound itself (perfect packings are common in practice and
 * in benchmarks), then bisects between what failed and the best found. */
static stow_status_t search_phase(plan_ctx_t *c, const stow_plan_problem_t *p, uint64_t lb,
                                  uint64_t capacity, plan_best_t *best)
{
    search_t s;
    if (!search_init(&s, c)) {
        search_free(&s);
        return STOW_OK; /* too big or no memory: the repair phase still runs */
    }
    uint64_t lo = lb, hi = best->height - 1;
    bool first = true;
    while (lo <= hi && stow__plan_now() < c->deadline) {
        uint64_t target;
        double now = stow__plan_now(), left = c->deadline - now, slice;
        if (capacity != 0) {
            target = capacity;
            slice = left;
        } else if (first) {
            /* A quarter: perfect packings are found fast or not at all (D and
             * J of MiniMalloc's suite), and the bisection needs the rest. */
            target = lo;
            slice = left * 0.25;
        } else {
            target = lo + (hi - lo) / 2;
            slice = left * 0.5;
        }
        first = false;
        int r = search_decide(&s, target, now + slice);
        if (s.oom)
            break;
        if (r == SR_FOUND) {
            uint64_t h = plan_height(c, s.best);
            if (h < best->height && stow_plan_validate(p, s.best, 0, NULL, 0) == STOW_OK) {
                memcpy(best->off, s.best, c->n * sizeof *s.best);
                best->height = h;
                best->method = "search";
            }
            hi = h - 1;
            if (capacity != 0)
                break;
        } else {
            if (capacity != 0)
                break;
            lo = target + 1;
        }
    }
    search_free(&s);
    return STOW_OK;
}

stow_status_t stow_plan_solve(const stow_plan_problem_t *problem,
                              const stow_plan_options_t *opts, stow_plan_result_t *out)
{
    if (out == NULL || stow_plan_problem_check(problem, NULL, 0) != STOW_OK)
        return STOW_EINVAL;
    stow_plan_options_t o = opts ? *opts : stow_plan_options_default();
    if (!(o.time_limit_seconds >= 0))
        return STOW_EINVAL;
    double t0 = stow__plan_now();
    size_t n = problem->count;
    if (n > UINT32_MAX / 4)
        return STOW_EOVERFLOW;
    uint64_t lb;
    stow_status_t rc = stow_plan_lower_bound(problem, &lb);
    if (rc != STOW_OK)
        return rc;
    plan_ctx_t c;
    rc = ctx_init(&c, problem);
    if (rc != STOW_OK)
        return rc;
    c.deadline = t0 + o.time_limit_seconds;
    c.rng = o.seed * 0x9E3779B97F4A7C15ull + 0x2545F4914F6CDD1Dull;
    if (c.rng == 0)
        c.rng = 1;
    plan_best_t best = {malloc((n ? n : 1) * sizeof(uint64_t)), UINT64_MAX,
                        malloc((n ? n : 1) * sizeof(uint32_t)), FIT_BEST, "greedy"};
    uint64_t *off = malloc((n ? n : 1) * sizeof *off);
    uint32_t *order = malloc((n ? n : 1) * sizeof *order);
    order_key_t *keys = malloc((n ? n : 1) * sizeof *keys);
    if (!best.off || !best.order || !off || !order || !keys) {
        rc = STOW_EHOSTMEM;
        goto out;
    }
    uint64_t goal = o.capacity != 0 ? (o.capacity > lb ? o.capacity : lb) : lb;
    if (n == 0)
        best.height = 0;
    /* Greedy orders share at most 45% of the budget (a pass on 60k buffers
     * costs seconds); the first pass always completes, later ones give up
     * at that point. A limit of 0 means "greedy only": all orders. */
    c.lb = lb;
    if (n > 0) {
        uint64_t mn = UINT64_MAX, mx = 0;
        for (size_t i = 0; i < n; i++) {
            mn = problem->buffers[i].lower < mn ? problem->buffers[i].lower : mn;
            mx = problem->buffers[i].upper > mx ? problem->buffers[i].upper : mx;
        }
        c.span = (double)(mx - mn);
    }
    double best_area = 0.0;
    for (size_t g = 0; g < sizeof greedy_plan / sizeof greedy_plan[0] && n > 0; g++) {
        int kind = greedy_plan[g][0], fit = greedy_plan[g][1];
        if ((kind == ORD_TLOAD || kind == ORD_TBAND || kind == ORD_TBAND_LEN ||
             kind == ORD_SIZE_TLOAD) &&
            !compute_tload(&c))
            continue;
        make_order(&c, kind, keys, order);
        uint64_t h;
        c.pass_deadline = best.height == UINT64_MAX || o.time_limit_seconds == 0
                              ? 0.0
                              : t0 + GREEDY_SHARE * o.time_limit_seconds;
        rc = greedy_run(&c, order, fit, off, &h);
        if (rc != STOW_OK)
            goto out;
#ifdef PLAN_DEBUG
        fprintf(stderr, "greedy order %d fit %d: %llu (%.3f s)\n", kind, fit,
                (unsigned long long)h, stow__plan_now() - t0);
#endif
#ifdef PLAN_DEBUG
        if (getenv("PLAN_DUMP_ORDER") && atoi(getenv("PLAN_DUMP_ORDER")) == (int)g) {
            stow_plan_write_csv("/tmp/pd/dump.csv", problem, off);
        }
#endif
        /* Ties go to the plan with less area above the bound: its top is
         * made of fewer, shorter-lived buffers, which the ruin phase moves
         * at a fraction of the cost of long-lived ones. */
        double area = 0.0;
        if (h <= best.height)
            for (size_t i = 0; i < n; i++)
                area += above(&c.b[i], off[i], lb);
        if (h < best.height || (h == best.height && area < best_area)) {
            best_area = area;
            best.height = h;
            best.fit = fit;
            memcpy(best.off, off, n * sizeof *off);
            memcpy(best.order, order, n * sizeof *order);
        }
        if (best.height <= goal)
            break;
        if (o.time_limit_seconds > 0 && stow__plan_now() > t0 + GREEDY_SHARE * o.time_limit_seconds)
            break;
    }
    c.pass_deadline = 0.0;
    uint64_t greedy_height = best.height;
    if (best.height > goal && o.time_limit_seconds > 0 && n <= SEARCH_MAX_BUFFERS) {
        rc = search_phase(&c, problem, lb, o.capacity, &best);
        if (rc != STOW_OK)
            goto out;
    }
    /* Promotion from the load order, then from the best greedy order, each
     * until 80% of the limit at most; the ruin phase gets the rest. */
    if (best.height > goal && o.time_limit_seconds > 0 && n > SEARCH_MAX_BUFFERS &&
        compute_tload(&c)) {
        double until = t0 + 0.8 * o.time_limit_seconds;
        memcpy(order, best.order, n * sizeof *order);
        rc = promote_run(&c, order, best.fit, &best, goal, until, "best");
        if (rc == STOW_OK && best.height > goal) {
            make_order(&c, ORD_TLOAD, keys, order);
            rc = promote_run(&c, order, FIT_BEST, &best, goal, until, "load");
        }
        if (rc != STOW_OK)
            goto out;
    }
    if (best.height > goal && o.time_limit_seconds > 0 && stow__plan_now() < c.deadline &&
        strncmp(best.method, "greedy", 6) == 0) {
        uint64_t h = best.height, iters = 0;
        memcpy(off, best.off, n * sizeof *off); /* the greedy plan, kept as a fallback */
        rc = ruin_run(&c, best.off, &h, goal, &iters);
        if (rc != STOW_OK)
            goto out;
        if (stow_plan_validate(problem, best.off, 0, NULL, 0) != STOW_OK) {
            memcpy(best.off, off, n * sizeof *off); /* never expected; be safe */
            h = best.height;
        }
#ifdef PLAN_DEBUG
        fprintf(stderr, "ruin: %llu steps, %llu -> %llu (%.3f s)\n", (unsigned long long)iters,
                (unsigned long long)best.height, (unsigned long long)h, stow__plan_now() - t0);
#endif
        if (h < best.height) {
            best.height = h;
            best.method = strcmp(best.method, "greedy") == 0 ? "greedy+ruin" : "greedy+promote+ruin";
        }
    }
    out->count = n;
    out->offsets = best.off;
    best.off = NULL;
    out->height = best.height;
    out->lower_bound = lb;
    out->greedy_height = greedy_height;
    out->fits = o.capacity == 0 || best.height <= o.capacity;
    out->optimal = best.height == lb;
    out->method = best.method;
    out->seconds = stow__plan_now() - t0;
    rc = STOW_OK;
out:
    free(best.off);
    free(best.order);
    free(off);
    free(order);
    free(keys);
    ctx_free(&c);
    return rc;
}
