/*
 * allocator/planned_record.c: recording a key's steps for a plan
 * (allocator/planned.h, docs/planned.md).
 *
 * While a key records, each of its steps logs its allocations in order (the
 * rounded size and stream of each, whoever serves it: the pool, or the
 * key's current plan), and each free of a logged allocation says when that
 * allocation's life ended: in its own step (at which position), between its
 * step and the key's next one, in the key's next step, or later. From
 * STOW_PLANNED_RECORD_STEPS steps (one, for a step ended by
 * stow_pool_step(NULL): what outlives it is the caller's) comes a profile:
 * per position the largest and smallest size, the stream, and the life in
 * allocations of the key; a position whose allocation outlives the next step
 * is left to the pool.
 *
 * Owns the key's recorder (k->rec) and nothing else; the address map holds
 * allocations still live, so a free of anything else costs one probe.
 */
#include <string.h>

#include "allocator/planned.h"
#include "allocator/ptr_map.h"
#include "allocator/types.h"

void stow__planned_rec_free(stow_planned_rec_t *rec)
{
    if (!rec)
        return;
    for (unsigned i = 0; i < STOW_PLANNED_RECORD_STEPS; i++)
        free(rec->steps[i].a);
    stow__ptr_map_destroy(&rec->live);
    free(rec);
}

void stow__planned_profile_free(stow_plan_profile_t *p)
{
    free(p->pos);
    p->pos = NULL;
    p->n = 0;
}

static unsigned steps_wanted(const stow_planned_key_t *k)
{
    const stow_planned_rec_t *r = k->rec;
    return r && r->count && r->steps[0].closed ? 1 : STOW_PLANNED_RECORD_STEPS;
}

bool stow__planned_rec_complete(const stow_planned_key_t *k)
{
    const stow_planned_rec_t *r = k->rec;
    if (!r)
        return false;
    unsigned want = steps_wanted(k);
    return r->count >= want && r->steps[want - 1].done;
}

bool stow__planned_rec_step_begin(stow_planned_t *pl, stow_planned_key_t *k)
{
    (void)pl;
    stow_planned_rec_t *r = k->rec;
    if (!r) {
        r = calloc(1, sizeof *r);
        if (!r || stow__ptr_map_init(&r->live) != STOW_OK) {
            free(r);
            return false;
        }
        k->rec = r;
    }
    if (r->count == STOW_PLANNED_RECORD_STEPS)
        return true; /* enough steps: only the frees of the last one are followed */
    stow_rec_step_t *s = &r->steps[r->count++];
    s->n = 0;
    s->key_step = k->steps;
    s->closed = s->done = false;
    return true;
}

void stow__planned_rec_step_end(stow_planned_t *pl, stow_planned_key_t *k, bool closed)
{
    (void)pl;
    stow_planned_rec_t *r = k->rec;
    if (!r || !r->count)
        return;
    stow_rec_step_t *s = &r->steps[r->count - 1];
    if (s->done || s->key_step != k->steps)
        return;
    s->done = true;
    s->closed = closed;
}

void stow__planned_rec_alloc(stow_planned_t *pl, stow_planned_key_t *k, uintptr_t addr,
                             size_t rounded, stow_stream_state_t *ss)
{
    stow_planned_rec_t *r = k->rec;
    unsigned j = r->count - 1;
    stow_rec_step_t *s = &r->steps[j];
    if (s->done || s->key_step != k->steps || s->n != pl->step_allocs ||
        s->n >= STOW_PLANNED_MAX_POSITIONS)
        return; /* a step past the recorded ones, or one too long to plan */
    if (s->n == s->capacity) {
        size_t cap = s->capacity ? 2 * s->capacity : 256;
        stow_rec_alloc_t *grown = realloc(s->a, cap * sizeof *grown);
        if (!grown) {
            s->n = STOW_PLANNED_MAX_POSITIONS; /* no plan from this step */
            return;
        }
        s->a = grown;
        s->capacity = cap;
    }
    if (stow__ptr_map_reserve_one(&r->live) != STOW_OK) {
        s->n = STOW_PLANNED_MAX_POSITIONS;
        return;
    }
    s->a[s->n] = (stow_rec_alloc_t){rounded, ss, 0, REC_LIVE};
    stow__ptr_map_put(&r->live, addr, (void *)(uintptr_t)(1 + ((uint64_t)j << 32 | s->n)));
    s->n++;
}

void stow__planned_rec_free_addr(stow_planned_t *pl, stow_planned_key_t *k, uintptr_t addr)
{
    stow_planned_rec_t *r = k->rec;
    uintptr_t v = (uintptr_t)stow__ptr_map_remove(&r->live, addr);
    if (!v)
        return;
    uint64_t packed = (uint64_t)v - 1;
    stow_rec_step_t *s = &r->steps[packed >> 32];
    size_t pos = (size_t)(packed & 0xffffffffu);
    if (pos >= s->n || s->n > STOW_PLANNED_MAX_POSITIONS)
        return;
    stow_rec_alloc_t *a = &s->a[pos];
    bool in_key_step = pl->cur == k;
    if (in_key_step && k->steps == s->key_step) {
        a->how = REC_FREED_IN_STEP;
        a->free_pos = (uint32_t)pl->step_allocs;
    } else if (!in_key_step && k->steps == s->key_step) {
        a->how = REC_FREED_BETWEEN;
    } else if (in_key_step && k->steps == s->key_step + 1) {
        a->how = REC_FREED_NEXT;
        a->free_pos = (uint32_t)pl->step_allocs;
    } else {
        a->how = REC_FREED_LATER;
    }
}

/* The life, in allocations of the key, of allocation a made at position p of
 * a step of n; 0 when it is not known or too long to plan. */
static uint32_t life_of(const stow_rec_alloc_t *a, size_t p, size_t n)
{
    size_t life;
    switch (a->how) {
    case REC_FREED_IN_STEP: life = a->free_pos > p ? a->free_pos - p : 1; break;
    case REC_FREED_BETWEEN: life = n - p; break;
    case REC_FREED_NEXT: life = n + a->free_pos - p; break;
    default: return 0;
    }
    /* A life of two steps or more would have its next two instances live with
     * it; the pool serves such allocations. */
    return life < 2 * n && life <= UINT32_MAX ? (uint32_t)life : 0;
}

bool stow__planned_rec_profile(const stow_planned_key_t *k, stow_plan_profile_t *out)
{
    const stow_planned_rec_t *r = k->rec;
    unsigned want = steps_wanted(k);
    if (!stow__planned_rec_complete(k))
        return false;
    size_t n = r->steps[0].n;
    if (n == 0 || n >= STOW_PLANNED_MAX_POSITIONS)
        return false;
    for (unsigned j = 1; j < want; j++)
        if (r->steps[j].n != n)
            return false;
    stow_plan_pos_t *pos = calloc(n, sizeof *pos);
    if (!pos)
        return false;
    bool merge = k->sizes.pos && k->sizes.n == n;
    for (size_t p = 0; p < n; p++) {
        stow_plan_pos_t *q = &pos[p];
        q->stream = r->steps[0].a[p].stream;
        q->min_bytes = SIZE_MAX;
        for (unsigned j = 0; j < want; j++) {
            const stow_rec_alloc_t *a = &r->steps[j].a[p];
            if (a->stream != q->stream) {
                free(pos);
                return false; /* the steps do not repeat */
            }
            if (a->rounded > q->max_bytes)
                q->max_bytes = a->rounded;
            if (a->rounded < q->min_bytes)
                q->min_bytes = a->rounded;
            /* The longest life seen, from the steps whose allocation here
             * ended; the last step's may still be live (its next step is
             * not recorded): the others say how long it lives. */
            uint32_t life = life_of(a, p, n);
            if (life > q->life)
                q->life = life;
        }
        /* An allocation that outlived its step in the first step but not
         * before the next one is a pool request for good. */
        const stow_rec_alloc_t *first = &r->steps[0].a[p];
        if (want > 1 && first->how != REC_FREED_IN_STEP && first->how != REC_FREED_BETWEEN &&
            first->how != REC_FREED_NEXT)
            q->life = 0;
        if (merge && k->sizes.pos[p].stream == q->stream) {
            /* Sizes only grow from plan to plan: a key whose shapes vary
             * within a bound settles on slots for the largest. */
            if (k->sizes.pos[p].max_bytes > q->max_bytes)
                q->max_bytes = k->sizes.pos[p].max_bytes;
            if (k->sizes.pos[p].min_bytes < q->min_bytes)
                q->min_bytes = k->sizes.pos[p].min_bytes;
        }
    }
    out->n = n;
    out->pos = pos;
    return true;
}
