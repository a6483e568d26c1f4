/*
 * allocator/planned_plan.c: a key's step laid out in the arena
 * (allocator/planned.h, docs/planned.md), and the helper thread that does it
 * while the pool serves.
 *
 * The step repeats, so its buffers live on a cycle: entry e (instance, position)
 * occupies its slot over [e, e + life) modulo C = c * n allocations. The
 * offline planner (planner/, stow_plan_solve) places buffers on a line, so
 * the cycle is cut where the fewest bytes live across the cut; a buffer live
 * across it becomes two pieces, [start, C) and [0, end - C), which must get
 * the same offset: after the solve, each such pair takes the offset of one
 * of its pieces where the other piece fits too, or a place of its own above
 * everything. The result is checked by the planner's independent validator
 * (pieces included) before it is used: a plan that fails it is not taken.
 *
 * Each stream's entries get a region of their own (regions stacked in the
 * arena), so that inside a layout a slot's bytes pass only between requests
 * of one stream, which that stream's order makes safe without events. A
 * layout is a pure function of its profile: planning touches no pool state
 * and runs on the helper thread, or inline when planned_async is false (the
 * replay tool and the tests, which must be deterministic). The planner runs
 * its greedy passes only (no time-limited search), so the plan is the same on
 * every machine.
 */
#include <string.h>
#include <time.h>

#include "allocator/planned.h"
#include "allocator/types.h"
#include "stowage/plan.h"

#define ALIGN_BYTES ((uint64_t)STOW_MIN_BLOCK_BYTES)

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

void stow__planned_layout_free(stow_plan_layout_t *layout)
{
    if (!layout)
        return;
    for (size_t e = 0; layout->entries && e < layout->entry_count; e++)
        free(layout->entries[e].uses);
    free(layout->entries);
    free(layout->due_first);
    free(layout);
}

/* One region: the entries of one stream. */
typedef struct region {
    uint32_t *entries;   /* entry indexes */
    size_t count;
    size_t cut;          /* the cycle is cut before this entry index */
    size_t height;
} region_t;

/* The entry index before which the fewest bytes of the region's buffers are
 * live (the earliest on a tie): an entry crosses t when it was served before
 * t and is due after it. */
static bool least_crossing_cut(const stow_plan_layout_t *l, const region_t *r, size_t *cut)
{
    size_t c = l->entry_count;
    int64_t *delta = calloc(c + 1, sizeof *delta);
    if (!delta)
        return false;
    for (size_t i = 0; i < r->count; i++) {
        const stow_plan_entry_t *e = &l->entries[r->entries[i]];
        size_t s = r->entries[i], first = s + 1, last = s + e->life - 1; /* crosses [first, last] */
        if (e->life < 2)
            continue;
        int64_t b = (int64_t)e->max_bytes;
        if (last < c) {
            delta[first] += b;
            delta[last + 1] -= b;
        } else {
            if (first < c) {
                delta[first] += b;
                delta[c] -= b;
            }
            delta[first >= c ? first - c : 0] += b;
            delta[last - c + 1] -= b;
        }
    }
    int64_t live = 0, best = INT64_MAX;
    for (size_t t = 0; t < c; t++) {
        live += delta[t];
        if (live < best) {
            best = live;
            *cut = t;
        }
    }
    free(delta);
    return true;
}

/* The planning problem of a region: its entries on the line cut at r->cut,
 * one buffer each, two for an entry live across the cut (tail first, then
 * head: piece[2i] and piece[2i+1] of entry i, the head's size 0 when none). */
static bool region_problem(const stow_plan_layout_t *l, const region_t *r,
                           stow_plan_problem_t *pb, uint32_t *owner)
{
    size_t c = l->entry_count, count = 0;
    for (size_t i = 0; i < r->count; i++) {
        const stow_plan_entry_t *e = &l->entries[r->entries[i]];
        size_t start = (r->entries[i] + c - r->cut) % c;
        count += start + e->life > c ? 2 : 1;
    }
    if (stow_plan_problem_init(pb, count) != STOW_OK)
        return false;
    size_t k = 0;
    for (size_t i = 0; i < r->count; i++) {
        const stow_plan_entry_t *e = &l->entries[r->entries[i]];
        size_t start = (r->entries[i] + c - r->cut) % c;
        stow_plan_buffer_t *b = &pb->buffers[k];
        b->size = e->max_bytes;
        b->alignment = ALIGN_BYTES;
        b->lower = start;
        owner[k++] = (uint32_t)i;
        if (start + e->life <= c) {
            b->upper = start + e->life;
        } else {
            b->upper = c;
            stow_plan_buffer_t *h = &pb->buffers[k];
            h->size = e->max_bytes;
            h->alignment = ALIGN_BYTES;
            h->lower = 0;
            h->upper = start + e->life - c;
            owner[k++] = (uint32_t)i;
        }
    }
    return true;
}

static bool overlaps(uint64_t lo1, uint64_t hi1, uint64_t lo2, uint64_t hi2)
{
    return lo1 < hi2 && lo2 < hi1;
}

/* Whether buffer `me` (and its other piece `twin`) fits at offset o: no
 * other buffer live at the same time holds any of its bytes. */
static bool fits_at(const stow_plan_problem_t *pb, const uint64_t *off, size_t me, size_t twin,
                    uint64_t o)
{
    const stow_plan_buffer_t *a = &pb->buffers[me], *t = &pb->buffers[twin];
    for (size_t j = 0; j < pb->count; j++) {
        if (j == me || j == twin)
            continue;
        const stow_plan_buffer_t *b = &pb->buffers[j];
        if (!overlaps(o, o + a->size, off[j], off[j] + b->size))
            continue;
        if (overlaps(a->lower, a->upper, b->lower, b->upper) ||
            overlaps(t->lower, t->upper, b->lower, b->upper))
            return false;
    }
    return true;
}

/* Gives both pieces of every entry live across the cut one offset. */
static uint64_t tie_pieces(const stow_plan_problem_t *pb, const uint32_t *owner, uint64_t *off,
                           uint64_t height)
{
    for (size_t k = 0; k + 1 < pb->count; k++) {
        if (owner[k] != owner[k + 1])
            continue;
        size_t tail = k, head = k + 1;
        if (off[tail] != off[head]) {
            if (fits_at(pb, off, head, tail, off[tail]))
                off[head] = off[tail];
            else if (fits_at(pb, off, tail, head, off[head]))
                off[tail] = off[head];
            else {
                off[tail] = off[head] = height;
                height += pb->buffers[tail].size;
            }
        }
        k++;
    }
    return height;
}

/* Lays region r out; offsets (from the region's base) into the entries. */
static bool plan_region(stow_plan_layout_t *l, region_t *r)
{
    if (!least_crossing_cut(l, r, &r->cut))
        return false;
    uint32_t *owner = malloc(2 * r->count * sizeof *owner);
    stow_plan_problem_t pb = {0, NULL, NULL};
    if (!owner || !region_problem(l, r, &pb, owner)) {
        free(owner);
        return false;
    }
    stow_plan_options_t opts = stow_plan_options_default();
    opts.time_limit_seconds = 0; /* greedy only: the same plan on every machine */
    stow_plan_result_t res;
    bool ok = stow_plan_solve(&pb, &opts, &res) == STOW_OK;
    if (ok) {
        uint64_t height = tie_pieces(&pb, owner, res.offsets, res.height);
        /* The validator shares no code with the solver or the ties. */
        ok = height <= SIZE_MAX &&
             stow_plan_validate(&pb, res.offsets, 0, NULL, 0) == STOW_OK;
        for (size_t k = 0; ok && k < pb.count; k++)
            l->entries[r->entries[owner[k]]].offset = (size_t)res.offsets[k];
        r->height = (size_t)height;
        stow_plan_result_free(&res);
    }
    stow_plan_problem_free(&pb);
    free(owner);
    return ok;
}

/* Entry e's due index: the entry index its free must precede. */
static size_t due_index(const stow_plan_layout_t *l, size_t e)
{
    return (e + l->entries[e].life) % l->entry_count;
}

/* The slot of a position: its largest request, and where its size varied
 * over the recorded steps (a sequence length, a batch's token count), the
 * spread seen again on top, up to an eighth of the largest, so that the next
 * step's size fits without a miss and a re-plan. A position whose size never
 * varied gets exactly its size. */
#define SLOT_MARGIN_MAX_SHARE 8
static size_t slot_bytes(const stow_plan_pos_t *q)
{
    if (q->min_bytes >= q->max_bytes)
        return q->max_bytes;
    size_t spread = q->max_bytes - q->min_bytes, cap = q->max_bytes / SLOT_MARGIN_MAX_SHARE;
    size_t margin = spread < cap ? spread : cap;
    margin = (margin + ALIGN_BYTES - 1) & ~(size_t)(ALIGN_BYTES - 1);
    return margin <= SIZE_MAX - q->max_bytes ? q->max_bytes + margin : q->max_bytes;
}

stow_plan_layout_t *stow__planned_make_layout(const stow_plan_profile_t *p)
{
    uint64_t t0 = now_ns();
    size_t n = p->n;
    unsigned cycle = 1;
    bool any = false;
    for (size_t i = 0; i < n; i++) {
        any |= p->pos[i].life > 0;
        if (p->pos[i].life > n)
            cycle = 2;
    }
    if (!any || n == 0 || n > STOW_PLANNED_MAX_POSITIONS)
        return NULL;
    stow_plan_layout_t *l = calloc(1, sizeof *l);
    if (!l)
        return NULL;
    l->n = n;
    l->cycle_steps = cycle;
    l->entry_count = n * cycle;
    l->entries = calloc(l->entry_count, sizeof *l->entries);
    l->due_first = malloc(l->entry_count * sizeof *l->due_first);
    region_t regions[STOW_PLANNED_STREAMS];
    unsigned n_regions = 0;
    memset(regions, 0, sizeof regions);
    bool ok = l->entries && l->due_first;
    for (size_t e = 0; ok && e < l->entry_count; e++) {
        const stow_plan_pos_t *q = &p->pos[e % n];
        stow_plan_entry_t *x = &l->entries[e];
        x->max_bytes = slot_bytes(q);
        x->min_bytes = q->min_bytes;
        x->seen_max_bytes = q->max_bytes;
        x->stream = q->stream;
        x->life = q->life;
        x->due_next = STOW_PLANNED_NONE;
        l->due_first[e] = STOW_PLANNED_NONE;
        if (!x->life)
            continue;
        unsigned g = 0;
        while (g < n_regions && l->entries[regions[g].entries[0]].stream != x->stream)
            g++;
        if (g == n_regions) {
            if (n_regions == STOW_PLANNED_STREAMS) {
                x->life = 0; /* a stream too many: the pool serves it */
                continue;
            }
            regions[n_regions].entries = malloc(l->entry_count * sizeof(uint32_t));
            if (!regions[n_regions].entries) {
                ok = false;
                break;
            }
            n_regions++;
        }
        regions[g].entries[regions[g].count++] = (uint32_t)e;
    }
    size_t base = 0;
    for (unsigned g = 0; ok && g < n_regions; g++) {
        l->streams[g] = l->entries[regions[g].entries[0]].stream;
        l->stream_count = g + 1;
        ok = plan_region(l, &regions[g]);
        for (size_t i = 0; ok && i < regions[g].count; i++)
            l->entries[regions[g].entries[i]].offset += base;
        if (ok && base > SIZE_MAX - regions[g].height - ALIGN_BYTES)
            ok = false;
        if (ok)
            base += (regions[g].height + ALIGN_BYTES - 1) / ALIGN_BYTES * ALIGN_BYTES;
    }
    for (unsigned g = 0; g < n_regions; g++)
        free(regions[g].entries);
    if (!ok) {
        stow__planned_layout_free(l);
        return NULL;
    }
    l->height_bytes = base;
    for (size_t e = 0; e < l->entry_count; e++)
        if (l->entries[e].life) {
            size_t d = due_index(l, e);
            l->entries[e].due_next = l->due_first[d];
            l->due_first[d] = (uint32_t)e;
        }
    l->planning_ns = now_ns() - t0;
    return l;
}

/* ---- the helper thread ---- */

static void *planner_main(void *arg)
{
    stow_planner_job_t *j = arg;
    pthread_mutex_lock(&j->lock);
    for (;;) {
        while (!j->queued && !j->stop)
            pthread_cond_wait(&j->wake, &j->lock);
        if (j->stop)
            break;
        stow_plan_profile_t profile = j->profile;
        j->profile = (stow_plan_profile_t){0, NULL};
        pthread_mutex_unlock(&j->lock);
        stow_plan_layout_t *layout = stow__planned_make_layout(&profile);
        stow__planned_profile_free(&profile);
        pthread_mutex_lock(&j->lock);
        j->result = layout;
        j->queued = false;
        atomic_store_explicit(&j->done, true, memory_order_release);
    }
    pthread_mutex_unlock(&j->lock);
    return NULL;
}

bool stow__planned_job_submit(stow_planned_t *pl, stow_planned_key_t *k,
                              stow_plan_profile_t *profile)
{
    stow_planner_job_t *j = &pl->job;
    if (!j->started) {
        if (pthread_mutex_init(&j->lock, NULL) != 0)
            return false;
        if (pthread_cond_init(&j->wake, NULL) != 0) {
            pthread_mutex_destroy(&j->lock);
            return false;
        }
        if (pthread_create(&j->thread, NULL, planner_main, j) != 0) {
            pthread_cond_destroy(&j->wake);
            pthread_mutex_destroy(&j->lock);
            return false;
        }
        j->started = true;
    }
    pthread_mutex_lock(&j->lock);
    bool free_now = !j->queued && !j->key && !atomic_load(&j->done);
    if (free_now) {
        j->key = k;
        j->generation = k->generation;
        j->profile = *profile;
        *profile = (stow_plan_profile_t){0, NULL};
        j->queued = true;
        pthread_cond_signal(&j->wake);
    }
    pthread_mutex_unlock(&j->lock);
    return free_now;
}

bool stow__planned_job_collect(stow_planned_t *pl, stow_planned_key_t **key,
                               uint32_t *generation, stow_plan_layout_t **out)
{
    stow_planner_job_t *j = &pl->job;
    if (!j->started || !atomic_load_explicit(&j->done, memory_order_acquire))
        return false;
    pthread_mutex_lock(&j->lock);
    *key = j->key;
    *generation = j->generation;
    *out = j->result;
    j->result = NULL;
    j->key = NULL;
    atomic_store(&j->done, false);
    pthread_mutex_unlock(&j->lock);
    return true;
}

void stow__planned_job_stop(stow_planned_t *pl)
{
    stow_planner_job_t *j = &pl->job;
    if (!j->started)
        return;
    pthread_mutex_lock(&j->lock);
    j->stop = true;
    pthread_cond_signal(&j->wake);
    pthread_mutex_unlock(&j->lock);
    pthread_join(j->thread, NULL);
    stow__planned_profile_free(&j->profile);
    stow__planned_layout_free(j->result);
    j->result = NULL;
    j->key = NULL;
    pthread_cond_destroy(&j->wake);
    pthread_mutex_destroy(&j->lock);
    j->started = false;
}
