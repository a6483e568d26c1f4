/*
 * allocator/planned_serve.c: the planned layer in front of the pool
 * (config planned_steps; allocator/planned.h, docs/planned.md).
 *
 * Keys and their lives: a key's steps are recorded (planned_record.c) after
 * its warm-up, planned (planned_plan.c, inline or on the helper thread), and
 * the plan serves its later steps; a plan whose steps keep missing is
 * recorded and planned again (sizes only grow, so shapes that vary within a
 * bound settle), a key whose steps do not repeat is left alone for a while
 * that doubles each time. At most STOW_PLANNED_KEYS_MAX keys; the least
 * recently used one with nothing live goes.
 *
 * Serving: each request of a planned step is matched with the position the
 * step has reached (same stream, size between the smallest seen there and
 * its slot), else (match_elsewhere) with one of the next
 * STOW_PLANNED_LOOKAHEAD positions or, where the position's size varies,
 * with the position itself if it is smaller than any seen there, else it is
 * a miss and the pool serves it (past the position when it is that
 * position's request grown). A matched position whose allocation outlives
 * the step (life 0), or whose slot is still busy, or sharing bytes with an
 * overdue slot or another layout's busy one, also goes to the pool (a
 * fallback). The due lists are scanned as positions are passed: a busy slot
 * found past its due time is overdue, and no slot over its bytes is served
 * until it is freed (a late free costs the slots it blocks, not the rest of
 * the step).
 *
 * The arena: one block taken from the pool (pool.c, BLOCK_ARENA), sized to
 * the largest plan x (1 + planned_headroom). Its bytes follow one layout at a
 * time; another layout (key, or re-plan) takes over beside at most
 * STOW_PLANNED_FOREIGN_LISTED busy slots of the others when one stream is all
 * there is, else once no slot of any other is busy and, when the streams it
 * used and the new layout's are not one and the same, once events recorded
 * on the streams that used it have completed (the pool's own rule for reuse
 * across streams). It goes back to
 * the pool at empty_cache and at the out-of-memory retry when no slot is
 * busy, and for a step the pool serves while its key is recorded (lent; the
 * next planned step takes it again). After a plan serves its first good
 * step, the pool's idle memory is released once (the steps it served are
 * the arena's now).
 *
 * Called with the pool lock held; touches the pool only through pool.c's
 * arena functions, the books and the recorder.
 */
#include <string.h>

#include "allocator/assert.h"
#include "allocator/planned.h"
#include "allocator/planned_serve.h"
#include "allocator/pool.h"
#include "allocator/ptr_map.h"
#include "allocator/recorder.h"
#include "allocator/types.h"
#include "allocator/vmm.h"

#define BAD_STEP_MISSES(n) (1 + (n) / 128) /* misses that make a step bad */
#define BAD_STEPS_REPLAN 2                  /* bad steps in a row before a re-plan */
#define PLANS_MAX 16                        /* plans a key may take before it rests */
#define RECORDS_FAILED_MAX 3                /* recordings in a row that gave no plan */
#define BACKOFF_FIRST_STEPS 64
#define BACKOFF_MAX_STEPS ((uint64_t)1 << 16)
#define UNPAID_MAX 2                        /* plans that did not pay before a key rests */

/* ---- the live map's values: which layout and entry a busy address is ---- */

static void *pack(const stow_planned_t *pl, const stow_planned_key_t *k, uint32_t generation,
                  size_t e)
{
    uint64_t ki = (uint64_t)(k - pl->keys);
    return (void *)(uintptr_t)(1 + (ki << 40 | (uint64_t)(generation & 0xff) << 32 | e));
}

/* The layout (current or retired) and entry of a packed value; NULL if stale. */
static stow_plan_layout_t *unpack(stow_planned_t *pl, void *v, stow_planned_key_t **k,
                                  size_t *e)
{
    uint64_t x = (uint64_t)(uintptr_t)v - 1;
    *k = &pl->keys[x >> 40];
    *e = (size_t)(x & 0xffffffffu);
    uint32_t g = (uint32_t)(x >> 32) & 0xff;
    stow_plan_layout_t *l = (*k)->layout;
    if (l && (l->generation & 0xff) == g)
        return l;
    l = (*k)->retired;
    return l && (l->generation & 0xff) == g ? l : NULL;
}

/* ---- layouts ---- */

static void layout_drop(stow_pool_t *pool, stow_planned_t *pl, stow_plan_layout_t *l)
{
    if (!l)
        return;
    if (pl->active == l) {
        pl->active = NULL;
        pl->foreign_count = 0;
    }
    pool->acct.s.num_plans_dropped++;
    stow__planned_layout_free(l);
}

/* A layout leaves service: freed now, or kept as the key's retired layout
 * until its busy slots are freed (a retired one still busy is dropped first:
 * its slots were freed by the caller's order... never: see key_may_replan). */
static void layout_retire(stow_pool_t *pool, stow_planned_t *pl, stow_planned_key_t *k)
{
    stow_plan_layout_t *l = k->layout;
    k->layout = NULL;
    if (!l)
        return;
    if (l->busy == 0) {
        layout_drop(pool, pl, l);
        return;
    }
    stow_assert_internal(k->retired == NULL);
    k->retired = l;
}

static void key_reset(stow_pool_t *pool, stow_planned_t *pl, stow_planned_key_t *k)
{
    stow__planned_rec_free(k->rec);
    k->rec = NULL;
    if (k->rec_counted) {
        pl->recording_keys--;
        k->rec_counted = false;
    }
    layout_drop(pool, pl, k->layout);
    layout_drop(pool, pl, k->retired);
    k->layout = k->retired = NULL;
    stow__planned_profile_free(&k->sizes);
    uint32_t generation = k->generation;
    memset(k, 0, sizeof *k);
    k->generation = generation + 1;
}

/* A page-mapped pool maps a handle per granule while the layer may plan
 * (stow_pool_t.fine_handles): before any key, and while one records, waits
 * or is planned. Once every key rests, the pool is on its own. */
static void note_fine_handles(stow_pool_t *pool, const stow_planned_t *pl)
{
    bool any = false, may_plan = pl->arena != NULL || pl->auto_on;
    for (unsigned i = 0; i < STOW_PLANNED_KEYS_MAX; i++) {
        any |= pl->keys[i].used;
        may_plan |= pl->keys[i].used && pl->keys[i].state != KEY_UNSETTLED;
    }
    pool->fine_handles = pool->vmm && (may_plan || !any);
}

/* ---- creation ---- */

stow_status_t stow__planned_create(stow_pool_t *pool)
{
    stow_planned_t *pl = calloc(1, sizeof *pl);
    if (!pl)
        return STOW_EHOSTMEM;
    if (stow__ptr_map_init(&pl->live) != STOW_OK) {
        free(pl);
        return STOW_EHOSTMEM;
    }
    pool->planned = pl;
    pl->auto_on = pool->tuning.planned_auto;
    note_fine_handles(pool, pl);
    return STOW_OK;
}

void stow__planned_destroy(stow_pool_t *pool)
{
    stow_planned_t *pl = pool->planned;
    if (!pl)
        return;
    stow__planned_job_stop(pl);
    stow__planned_auto_destroy(pl);
    for (unsigned i = 0; i < STOW_PLANNED_KEYS_MAX; i++) {
        stow_planned_key_t *k = &pl->keys[i];
        stow__planned_rec_free(k->rec);
        stow__planned_layout_free(k->layout);
        stow__planned_layout_free(k->retired);
        stow__planned_profile_free(&k->sizes);
    }
    for (unsigned i = 0; i < pl->clear_count; i++)
        stow__pool_destroy_event(pool, pl->clear_events[i]);
    stow__ptr_map_destroy(&pl->live);
    free(pl);
    pool->planned = NULL;
}

/* ---- the arena ---- */

static uint64_t budget(const stow_planned_t *pl);

static void set_arena(stow_pool_t *pool, stow_planned_t *pl, stow_block_t *b)
{
    pl->arena = b;
    pl->base = b ? b->addr : 0;
    pl->bytes = b ? b->size_bytes : 0;
    pool->planned_base = pl->base;
    pool->planned_bytes = pl->bytes;
    pool->vmm_cap_bytes = pool->vmm && b ? budget(pl) : 0;
    pool->acct.s.arena_bytes = pl->bytes;
    pl->active = NULL;
    pl->foreign_count = 0;
    pl->user_count = 0;
    if (b) {
        pl->users[0] = b->owner;
        pl->user_count = 1;
    }
}

static bool arena_dissolve(stow_pool_t *pool, stow_planned_t *pl);

/* Whether one stream used the arena's bytes, the one the pool took it on:
 * it can go back to the pool without a synchronize. */
static bool arena_one_owner(const stow_planned_t *pl)
{
    return pl->user_count == 1 && pl->users[0] == pl->arena->owner;
}

/* Gives the arena back to the pool (nothing busy). Its bytes were used on
 * the streams of pl->users: unless that is the one stream the pool took it
 * on, the device is synchronized first and it goes back to every stream. */
static bool arena_give_back(stow_pool_t *pool, stow_planned_t *pl, bool synchronized)
{
    stow_block_t *b = pl->arena;
    if (!b)
        return true;
    stow_assert_internal(pl->busy_total == 0);
    bool one_owner = arena_one_owner(pl);
    if (!synchronized && !one_owner && pool->has_events && !stow__pool_synchronize(pool))
        return false;
    for (unsigned i = 0; i < pl->clear_count; i++)
        stow__pool_destroy_event(pool, pl->clear_events[i]);
    pl->clear_count = 0;
    stow__pool_release_arena(pool, b, one_owner && !synchronized ? b->owner : pool->any);
    set_arena(pool, pl, NULL);
    return true;
}

/* A step the pool serves while its key is recorded for a plan, with no slot
 * busy: the arena goes back to the pool for the step, so that the step's
 * blocks take its place rather than adding to it; the next planned step
 * takes it again (arena_ready), where the step's blocks, freed, left room.
 * Not for a key left alone (its steps would hand the arena back and forth
 * for good), and only when that needs no synchronize: one stream used the
 * arena, the one it was taken on. */
static void arena_lend(stow_pool_t *pool, stow_planned_t *pl)
{
    if (!pl->arena || pl->busy_total || pl->pending_count ||
        (pool->has_events && !arena_one_owner(pl)))
        return;
    if (arena_give_back(pool, pl, false))
        pl->arena_lent = true;
}

/* ---- what the arena costs: the budget ----
 *
 * A plan pays when it holds the step's memory in less than the pool alone
 * would. The pool alone reaches at least its reserved high-water mark of the
 * times it held no arena (before the first plan, that is the pool alone on
 * the same run), and at least the allocated high-water mark (reserved memory
 * holds what is allocated). So the layer holds an arena only while reserved
 * memory stays within the larger of the two, the budget: an arena that would
 * take reserved memory past it is not taken, and one held when the pool must
 * grow past it is dissolved at once (arena_dissolve): its busy slots become
 * the pool's blocks, its other bytes the pool's free memory, and its plans
 * go. A plan that pays never moves the reserved peak past what the pool alone
 * reached; one that does not is dropped as soon as it would. */

static uint64_t budget(const stow_planned_t *pl)
{
    return pl->alone_reserved_hw > pl->allocated_hw ? pl->alone_reserved_hw : pl->allocated_hw;
}

static uint64_t reserved_now(const stow_pool_t *pool)
{
    return pool->acct.s.reserved_bytes[STOW_POOL_ALL].current;
}

/* After every allocation: the two high-water marks the budget is made of;
 * a page-mapped pool holding the arena takes no new handle past the budget
 * while it can remap idle ones (its allowance's cap). */
static void note_marks(stow_pool_t *pool, stow_planned_t *pl)
{
    uint64_t a = pool->acct.s.allocated_bytes[STOW_POOL_ALL].current;
    if (a > pl->allocated_hw)
        pl->allocated_hw = a;
    if (!pl->arena && reserved_now(pool) > pl->alone_reserved_hw)
        pl->alone_reserved_hw = reserved_now(pool);
    pool->vmm_cap_bytes = pool->vmm && pl->arena ? budget(pl) : 0;
}

/* The most the pool can serve one request from without growing: its largest
 * free block, and for a page-mapped pool the idle physical memory outside the
 * arena too (the arena's free bytes are neither active nor the pool's). */
static uint64_t pool_room(stow_pool_t *pool, const stow_planned_t *pl)
{
    uint64_t room = stow__pool_largest_free(pool);
    if (pool->vmm) {
        uint64_t held = reserved_now(pool), used = stow__acct_active_bytes(&pool->acct,
                                                                          STOW_POOL_ALL) +
                                                   (pl->bytes - pl->live_bytes);
        uint64_t idle = held > used ? held - used : 0;
        room = idle < room ? idle : room;
    }
    return room;
}

/* Whether serving `bytes` may take reserved memory past the budget: growth
 * by that much would, and the pool has no room for it (pool_room). */
static bool may_pass_budget(stow_pool_t *pool, const stow_planned_t *pl, size_t bytes)
{
    return reserved_now(pool) + bytes > budget(pl) && pool_room(pool, pl) < bytes;
}

/* Whether an arena of `want` bytes, taken after the pool's idle memory went
 * back (trim) or from what it holds, keeps reserved memory within the
 * budget: a segment of the arena's size rounded to the backend granularity,
 * or (page-mapped) its granules, one more where it starts inside one.
 * Checked before the trim, which changes the pool for the plan alone. */
static bool take_pays(stow_pool_t *pool, const stow_planned_t *pl, size_t want, bool trim)
{
    uint64_t reserved = reserved_now(pool);
    if (trim)
        reserved -= pool->vmm ? stow__vmm_releasable_bytes(pool) : pool->acct.idle_segment_bytes;
    else if (pool_room(pool, pl) >= want)
        return true;
    uint64_t g = pool->granularity_bytes;
    uint64_t needs = (want + g - 1) / g * g + (pool->vmm ? g : 0);
    return reserved + needs <= budget(pl);
}

/* The arena bytes a layout needs: the largest plan of any key x (1 + headroom). */
static size_t arena_want(const stow_pool_t *pool, const stow_planned_t *pl,
                         const stow_plan_layout_t *l)
{
    size_t h = l->height_bytes;
    for (unsigned i = 0; i < STOW_PLANNED_KEYS_MAX; i++)
        if (pl->keys[i].layout && pl->keys[i].layout->height_bytes > h)
            h = pl->keys[i].layout->height_bytes;
    double want = (double)h * (1.0 + pool->tuning.planned_headroom);
    if (want >= (double)(SIZE_MAX / 2))
        return 0;
    size_t w = (size_t)want;
    w = w < h ? h : w;
    return (w + STOW_MIN_BLOCK_BYTES - 1) / STOW_MIN_BLOCK_BYTES * STOW_MIN_BLOCK_BYTES;
}

/* An arena for layout l, taking a new one when the present one is too small
 * and nothing is busy in it. */
static bool arena_ready(stow_pool_t *pool, stow_planned_t *pl, const stow_plan_layout_t *l)
{
    if (pl->arena && pl->bytes >= l->height_bytes)
        return true;
    if (pl->busy_total || pl->clock < pl->take_retry_step)
        return false;
    size_t want = arena_want(pool, pl, l);
    if (!want || !arena_give_back(pool, pl, false))
        return false;
    /* The steps the pool served are the arena's now: their memory, idle at a
     * step boundary, goes back first, so that the arena takes its place
     * rather than adding to it. Not when the arena was lent: its own memory,
     * idle now, would go too (the trim at the step's end comes once it is
     * taken again). */
    bool lent = pl->arena_lent;
    bool trim = pl->trim_due && !lent;
    stow_block_t *b = NULL;
    bool taken = take_pays(pool, pl, want, trim);
    if (!taken && pl->cur)
        pl->cur->unpaid++; /* a plan that would not pay: the key rests after another */
    if (taken) {
        pl->arena_lent = false;
        if (trim) {
            stow__pool_trim_for_plan(pool);
            pool->acct.s.num_plan_trims++;
        }
        taken = stow__pool_take_arena(pool, l->streams[0], want, &b) == STOW_OK;
        if (taken && reserved_now(pool) > budget(pl)) {
            stow__pool_release_arena(pool, b, b->owner); /* only its stream used it */
            taken = false;
        }
    }
    if (!taken) {
        pl->take_backoff = pl->take_backoff ? 2 * pl->take_backoff : 1;
        if (pl->take_backoff > BACKOFF_MAX_STEPS)
            pl->take_backoff = BACKOFF_MAX_STEPS;
        pl->take_retry_step = pl->clock + pl->take_backoff;
        return false;
    }
    pl->take_backoff = 0;
    set_arena(pool, pl, b);
    return true;
}

/* ---- which layout the arena's bytes follow ---- */

/* Whether every byte of the arena stays with the stream whose work may use
 * it now when layout l takes over: only when one stream is all there is,
 * before and after (two layouts with the same streams give them other
 * regions). */
static bool same_single_stream(const stow_planned_t *pl, const stow_plan_layout_t *l)
{
    return pl->user_count == 1 && l->stream_count == 1 && pl->users[0] == l->streams[0];
}

/* Events on every stream that used the arena; the next layout takes over
 * when they complete (the clearance). Returns true when the arena is clear
 * already: a stream whose event cannot be recorded makes it a synchronize. */
static bool start_clearance(stow_pool_t *pool, stow_planned_t *pl)
{
    bool sync = false;
    for (unsigned i = 0; !sync && i < pl->user_count; i++) {
        stow_stream_state_t *ss = pl->users[i];
        pool->acct.s.num_event_records++;
        stow_event_t ev = NULL;
        if (ss->is_any ||
            stow__backend_status(pool, pool->backend->event_record(pool->backend->ctx,
                                                                   ss->stream, &ev)) != STOW_OK)
            sync = true;
        else
            pl->clear_events[pl->clear_count++] = ev;
    }
    if (!sync)
        return false;
    for (unsigned i = 0; i < pl->clear_count; i++)
        stow__pool_destroy_event(pool, pl->clear_events[i]);
    pl->clear_count = 0;
    return stow__pool_synchronize(pool);
}

/* The layout that serves now used the arena after the clearance's events
 * were recorded: its later work is not covered by them. */
static void cancel_clearance(stow_pool_t *pool, stow_planned_t *pl)
{
    for (unsigned i = 0; i < pl->clear_count; i++)
        stow__pool_destroy_event(pool, pl->clear_events[i]);
    pl->clear_count = 0;
}

static bool clearance_done(stow_pool_t *pool, stow_planned_t *pl)
{
    unsigned left = 0;
    for (unsigned i = 0; i < pl->clear_count; i++) {
        bool done = false;
        pool->acct.s.num_event_queries++;
        if (stow__backend_status(pool, pool->backend->event_query(pool->backend->ctx,
                                                                  pl->clear_events[i], &done)) ==
                STOW_OK &&
            done)
            stow__pool_destroy_event(pool, pl->clear_events[i]);
        else
            pl->clear_events[left++] = pl->clear_events[i];
    }
    pl->clear_count = left;
    return left == 0;
}

/* Lists the busy slots of layouts other than l, `others` of them; false
 * (the list unchanged) when there are more than it holds. */
static bool list_foreign(stow_planned_t *pl, const stow_plan_layout_t *l, size_t others)
{
    if (others > STOW_PLANNED_FOREIGN_LISTED)
        return false;
    size_t offset[STOW_PLANNED_FOREIGN_LISTED], bytes[STOW_PLANNED_FOREIGN_LISTED], n = 0;
    for (unsigned i = 0; i < STOW_PLANNED_KEYS_MAX; i++) {
        const stow_plan_layout_t *of_key[2] = {pl->keys[i].layout, pl->keys[i].retired};
        for (unsigned j = 0; j < 2; j++) {
            const stow_plan_layout_t *o = of_key[j];
            for (size_t x = 0; o && o != l && x < o->entry_count; x++) {
                if (!o->entries[x].busy)
                    continue;
                if (n == others)
                    return false; /* the books disagree: take over only when all are free */
                offset[n] = o->entries[x].offset;
                bytes[n++] = o->entries[x].max_bytes;
            }
        }
    }
    if (n != others)
        return false;
    for (size_t i = 0; i < n; i++) {
        pl->foreign[i].offset = offset[i];
        pl->foreign[i].bytes = bytes[i];
    }
    pl->foreign_count = n;
    return true;
}

/* A foreign slot (busy, of another layout) at offset was freed. */
static void unlist_foreign(stow_planned_t *pl, size_t offset)
{
    for (size_t i = 0; i < pl->foreign_count; i++)
        if (pl->foreign[i].offset == offset) {
            pl->foreign[i] = pl->foreign[--pl->foreign_count];
            return;
        }
}

static bool blocked_by_foreign(const stow_planned_t *pl, const stow_plan_entry_t *e)
{
    for (size_t i = 0; i < pl->foreign_count; i++)
        if (pl->foreign[i].offset < e->offset + e->max_bytes &&
            e->offset < pl->foreign[i].offset + pl->foreign[i].bytes)
            return true;
    return false;
}

/* Whether layout l may serve now, making it the arena's layout if it can.
 * With slots of other layouts still busy (another key's step freed late, a
 * re-plan's retired layout), it takes over beside them when they are few and
 * one stream is all there is, before and after; else only once all are free
 * (and, across streams, their events complete). */
static bool activate(stow_pool_t *pool, stow_planned_t *pl, stow_plan_layout_t *l)
{
    size_t others = pl->busy_total - l->busy;
    if (pl->active == l)
        return others == pl->foreign_count && arena_ready(pool, pl, l);
    if (!arena_ready(pool, pl, l))
        return false;
    bool other_streams = pool->has_events && pl->user_count && !same_single_stream(pl, l);
    if (others) {
        if (other_streams || !list_foreign(pl, l, others))
            return false;
    } else if (other_streams) {
        bool clear = false;
        if (pl->clear_count == 0)
            clear = start_clearance(pool, pl);
        if (!clear && (pl->clear_count == 0 || !clearance_done(pool, pl)))
            return false;
    }
    for (unsigned j = 0; j < l->stream_count; j++)
        pl->users[j] = l->streams[j];
    pl->user_count = l->stream_count;
    pl->active = l;
    if (!others)
        pl->foreign_count = 0;
    return true;
}

/* ---- due lists ---- */

/* Passes the due lists of positions [pl->scanned, upto] of the step: a busy
 * slot past its due time is overdue. */
static void scan_due(stow_planned_t *pl, stow_plan_layout_t *l, size_t upto)
{
    size_t base = (size_t)(l->step % l->cycle_steps) * l->n;
    uint64_t t0 = l->step * (uint64_t)l->n;
    for (size_t p = pl->scanned; p <= upto && p < l->n; p++)
        for (uint32_t x = l->due_first[base + p]; x != STOW_PLANNED_NONE;
             x = l->entries[x].due_next) {
            stow_plan_entry_t *e = &l->entries[x];
            if (e->busy && !e->overdue && t0 + p >= e->served_at + e->life) {
                e->overdue = 1;
                if (l->overdue_listed == l->overdue &&
                    l->overdue_listed < STOW_PLANNED_OVERDUE_LISTED)
                    l->overdue_list[l->overdue_listed++] = x;
                l->overdue++;
            }
        }
    if (upto + 1 > pl->scanned)
        pl->scanned = upto + 1;
}

/* Whether entry e may not be served for an overdue entry: one shares a byte
 * with it, or more are overdue than the list holds. */
static bool blocked_by_overdue(const stow_plan_layout_t *l, const stow_plan_entry_t *e)
{
    if (l->overdue_listed != l->overdue)
        return true;
    for (size_t i = 0; i < l->overdue_listed; i++) {
        const stow_plan_entry_t *o = &l->entries[l->overdue_list[i]];
        if (o->offset < e->offset + e->max_bytes && e->offset < o->offset + o->max_bytes)
            return true;
    }
    return false;
}

/* ---- serving ---- */

static bool fits_exactly(const stow_plan_entry_t *e, const stow_stream_state_t *ss,
                         size_t rounded)
{
    return e->stream == ss && rounded <= e->max_bytes && rounded >= e->min_bytes;
}

static size_t look_ahead(const stow_plan_layout_t *l, size_t base, size_t p,
                         const stow_stream_state_t *ss, size_t rounded)
{
    size_t end = p + 1 + STOW_PLANNED_LOOKAHEAD < l->n ? p + 1 + STOW_PLANNED_LOOKAHEAD : l->n;
    for (size_t q = p + 1; q < end; q++)
        if (fits_exactly(&l->entries[base + q], ss, rounded))
            return q;
    return SIZE_MAX;
}

/* The position a request that does not fit position p exactly takes, or
 * SIZE_MAX: a later position that only ever saw its size (the request at p
 * is missing), else p itself if the request is smaller than any seen there
 * and p's size varies (a shape that varies: taking a later position whose
 * range it happens to fall in would shift the rest of the step), else any
 * later position whose range holds it. At a position whose size never
 * varied, a smaller request is one inserted before it: taking p would leave
 * p's own request, and every one after it, one position behind. */
static size_t match_elsewhere(const stow_plan_layout_t *l, size_t base, size_t p,
                              const stow_stream_state_t *ss, size_t rounded)
{
    size_t q = look_ahead(l, base, p, ss, rounded);
    if (q != SIZE_MAX && l->entries[base + q].min_bytes == l->entries[base + q].max_bytes)
        return q;
    const stow_plan_entry_t *at = &l->entries[base + p];
    if (at->stream == ss && rounded <= at->max_bytes && at->min_bytes < at->max_bytes)
        return p;
    return q;
}

/* The request goes to the pool: counted once the pool served it
 * (stow__planned_pool_alloc), as a miss or only as a fallback. */
static void count_pool_request(stow_pool_t *pool, stow_planned_t *pl, bool miss)
{
    (void)pool;
    pl->pool_request = miss ? POOL_REQUEST_MISS : POOL_REQUEST_FALLBACK;
    if (miss)
        pl->step_misses++;
}

static void key_step_ends(stow_pool_t *pool, stow_planned_t *pl, bool closed);

/* A step without markers ends (its last position passed, or a request near
 * its end that matches its first position): the next one begins. Steps that
 * keep missing make the pool look for the period again. */
static void auto_wrap(stow_pool_t *pool, stow_planned_t *pl, stow_planned_key_t *k)
{
    key_step_ends(pool, pl, false);
    k->steps++;
    pl->cursor = pl->scanned = pl->step_allocs = 0;
    pl->step_hits = pl->step_misses = 0;
    if (k->bad_steps >= BAD_STEPS_REPLAN) {
        k->bad_steps = 0;
        k->state = KEY_RECORDING; /* looked for again; the layout serves meanwhile */
        stow__planned_auto_relook(pl);
    }
}

/* For the auto key: whether the request begins the next step. */
static bool auto_next_step(const stow_plan_layout_t *l, size_t p, const stow_stream_state_t *ss,
                           size_t rounded)
{
    size_t next = (size_t)((l->step + 1) % l->cycle_steps) * l->n;
    return p + STOW_PLANNED_LOOKAHEAD >= l->n && fits_exactly(&l->entries[next], ss, rounded);
}

static bool serve(stow_pool_t *pool, stow_stream_state_t *ss, size_t rounded, size_t requested,
                  void **out)
{
    stow_planned_t *pl = pool->planned;
    stow_planned_key_t *k = pl->cur;
    stow_plan_layout_t *l = k ? k->layout : NULL;
    pl->pool_request = POOL_REQUEST_NONE;
    if (!l)
        return false;
    size_t p = pl->cursor;
    size_t base = (size_t)(l->step % l->cycle_steps) * l->n;
    if (STOW_UNLIKELY(p >= l->n)) {
        if (!k->is_auto) {
            count_pool_request(pool, pl, true); /* a request past the step's end */
            return false;
        }
        auto_wrap(pool, pl, k);
        p = 0;
        base = (size_t)(l->step % l->cycle_steps) * l->n;
    } else if (STOW_UNLIKELY(k->is_auto) && !fits_exactly(&l->entries[base + p], ss, rounded) &&
               look_ahead(l, base, p, ss, rounded) == SIZE_MAX &&
               auto_next_step(l, p, ss, rounded)) {
        auto_wrap(pool, pl, k);
        p = 0;
        base = (size_t)(l->step % l->cycle_steps) * l->n;
    }
    size_t q = p;
    if (STOW_UNLIKELY(!fits_exactly(&l->entries[base + p], ss, rounded))) {
        q = match_elsewhere(l, base, p, ss, rounded);
        if (q == SIZE_MAX) {
            /* Larger than any seen at a position whose size varies: the
             * request of p, grown (a longer sequence). The next request is
             * p + 1's; left at p, the cursor would lag the step and pass the
             * due times of slots still busy when it caught up. */
            const stow_plan_entry_t *at = &l->entries[base + p];
            if (at->stream == ss && at->min_bytes < at->max_bytes && rounded > at->max_bytes)
                pl->cursor = p + 1;
            count_pool_request(pool, pl, true);
            return false;
        }
        pool->acct.s.num_planned_realignments += q != p;
    }
    pl->cursor = q + 1;
    if (pl->scanned <= q)
        scan_due(pl, l, q);
    stow_plan_entry_t *e = &l->entries[base + q];
    if (STOW_UNLIKELY(!e->life || e->busy || (l->overdue && blocked_by_overdue(l, e)) ||
                      ((pl->active != l || pl->busy_total != l->busy) &&
                       (!activate(pool, pl, l) || blocked_by_foreign(pl, e))) ||
                      stow__ptr_map_reserve_one(&pl->live) != STOW_OK)) {
        count_pool_request(pool, pl, false);
        return false;
    }
    if (STOW_UNLIKELY(pl->clear_count))
        cancel_clearance(pool, pl);
    uintptr_t addr = pl->base + e->offset;
    e->busy = 1;
    e->served_at = l->step * (uint64_t)l->n + q;
    e->requested_bytes = requested;
    e->tag = stow__current_tag;
    l->busy++;
    k->busy_count++;
    pl->busy_total++;
    pl->live_bytes += e->max_bytes;
    if (pl->live_bytes > pool->acct.s.arena_peak_bytes)
        pool->acct.s.arena_peak_bytes = pl->live_bytes;
    stow__ptr_map_put(&pl->live, addr, pack(pl, k, l->generation, base + q));
    unsigned size_class = stow__size_class_of(requested);
    stow__acct_alloc(&pool->acct, STOW_POOL_LARGE, e->max_bytes, requested, size_class, true);
    stow_tag_stats_t *t = &pool->tag_stats[e->tag];
    t->allocated_bytes += e->max_bytes;
    t->allocations++;
    if (t->allocated_bytes > t->allocated_bytes_peak)
        t->allocated_bytes_peak = t->allocated_bytes;
    stow__record(pool, STOW_REC_ALLOC, addr, requested, ss->index, e->tag);
    pool->acct.s.num_planned_hits++;
    pl->step_hits++;
    if (STOW_UNLIKELY(k->rec != NULL))
        stow__planned_rec_alloc(pl, k, addr, rounded, ss);
    if (STOW_UNLIKELY(pl->auto_on)) {
        stow__planned_auto_alloc(pool, addr, rounded, ss);
        pl->auto_allocs++;
    }
    pl->step_allocs++;
    *out = (void *)addr;
    return true;
}

bool stow__planned_alloc(stow_pool_t *pool, stow_stream_state_t *ss, size_t rounded,
                         size_t requested, void **out)
{
    stow_planned_t *pl = pool->planned;
    if (serve(pool, ss, rounded, requested, out)) {
        note_marks(pool, pl);
        return true;
    }
    /* The pool serves it: where that may take reserved memory past the
     * budget, the arena's idle bytes become the pool's first. */
    if (STOW_UNLIKELY(pl->arena != NULL) && may_pass_budget(pool, pl, rounded))
        (void)arena_dissolve(pool, pl);
    return false;
}

static void collect_job(stow_pool_t *pool, stow_planned_t *pl);

void stow__planned_pool_alloc(stow_pool_t *pool, stow_stream_state_t *ss, uintptr_t addr,
                              size_t rounded)
{
    stow_planned_t *pl = pool->planned;
    note_marks(pool, pl);
    if (STOW_UNLIKELY(pl->arena != NULL) && reserved_now(pool) > budget(pl))
        (void)arena_dissolve(pool, pl); /* the pool grew past it beside the arena */
    if (STOW_UNLIKELY(pl->auto_on)) {
        stow__planned_auto_alloc(pool, addr, rounded, ss);
        pl->auto_allocs++;
        if (pl->job.started) /* no markers: the helper thread's plan is taken here */
            collect_job(pool, pl);
    }
    stow_planned_key_t *k = pl->cur;
    if (!k)
        return;
    if (pl->pool_request != POOL_REQUEST_NONE) {
        pool->acct.s.num_planned_fallbacks++;
        pool->acct.s.num_planned_misses += pl->pool_request == POOL_REQUEST_MISS;
        pl->pool_request = POOL_REQUEST_NONE;
    }
    if (STOW_UNLIKELY(k->rec != NULL))
        stow__planned_rec_alloc(pl, k, addr, rounded, ss);
    pl->step_allocs++;
}

/* ---- frees ---- */

static void note_recorded_free(stow_planned_t *pl, uintptr_t addr)
{
    for (unsigned i = 0; pl->recording_keys && i < STOW_PLANNED_KEYS_MAX; i++)
        if (pl->keys[i].rec)
            stow__planned_rec_free_addr(pl, &pl->keys[i], addr);
}

void stow__planned_pool_free(stow_pool_t *pool, uintptr_t addr)
{
    note_recorded_free(pool->planned, addr);
    if (STOW_UNLIKELY(pool->planned->auto_on))
        stow__planned_auto_free(pool, addr);
}

/* Entry x stops being overdue: out of the list (which holds every overdue
 * entry after this only if it did before). */
static void unlist_overdue(stow_plan_layout_t *l, uint32_t x)
{
    for (size_t i = 0; i < l->overdue_listed; i++)
        if (l->overdue_list[i] == x) {
            l->overdue_list[i] = l->overdue_list[--l->overdue_listed];
            return;
        }
}

/* The slot of entry e is free again (its instance freed, and its events
 * complete). */
static void release_entry(stow_pool_t *pool, stow_planned_t *pl, stow_planned_key_t *k,
                          stow_plan_layout_t *l, stow_plan_entry_t *e, stow_ptr_slot_t *slot)
{
    e->busy = 0;
    if (e->overdue) {
        e->overdue = 0;
        unlist_overdue(l, (uint32_t)(e - l->entries));
        l->overdue--;
    }
    l->busy--;
    k->busy_count--;
    pl->busy_total--;
    if (pl->foreign_count && l != pl->active)
        unlist_foreign(pl, e->offset);
    pl->live_bytes -= e->max_bytes;
    stow__ptr_map_remove_slot(&pl->live, slot);
    if (l == k->retired && l->busy == 0) {
        k->retired = NULL;
        layout_drop(pool, pl, l);
    }
}

/* Records an event on each stream record_stream named; the slot waits for
 * them (PENDING in the books). */
static void defer_entry(stow_pool_t *pool, stow_planned_t *pl, stow_planned_key_t *k,
                        stow_plan_layout_t *l, stow_plan_entry_t *e, size_t x)
{
    stow_stream_uses_t *u = e->uses;
    bool need_sync = false;
    for (uint32_t i = 0; i < u->count; i++) {
        pool->acct.s.num_event_records++;
        if (stow__backend_status(pool, pool->backend->event_record(
                                           pool->backend->ctx, u->item[i].stream,
                                           &u->item[i].event)) == STOW_OK)
            u->events_outstanding++;
        else {
            u->item[i].event = NULL;
            need_sync = true;
        }
    }
    if (need_sync && !stow__pool_synchronize(pool))
        u->events_outstanding++; /* out of reach until a synchronize (empty_cache) */
    e->pending = 1;
    stow__acct_pending(&pool->acct, STOW_POOL_LARGE, e->max_bytes, true);
    (void)k, (void)l, (void)x;
    pl->pending_count++;
}

/* Entries waiting for events whose events completed (all of them after a
 * synchronize) become free. */
static void process_pending(stow_pool_t *pool, stow_planned_t *pl, bool synchronized)
{
    if (!pl->pending_count)
        return;
    for (size_t i = 0; i < pl->live.capacity && pl->pending_count; i++) {
        stow_ptr_slot_t *slot = &pl->live.slots[i];
        if (!slot->key)
            continue;
        stow_planned_key_t *k;
        size_t x;
        stow_plan_layout_t *l = unpack(pl, slot->value, &k, &x);
        stow_plan_entry_t *e = l ? &l->entries[x] : NULL;
        if (!e || !e->pending)
            continue;
        stow_stream_uses_t *u = e->uses;
        for (uint32_t j = 0; j < u->count; j++) {
            if (!u->item[j].event)
                continue;
            bool done = synchronized;
            if (!done) {
                pool->acct.s.num_event_queries++;
                if (stow__backend_status(pool, pool->backend->event_query(
                                                   pool->backend->ctx, u->item[j].event,
                                                   &done)) != STOW_OK)
                    done = false;
            }
            if (done) {
                stow__pool_destroy_event(pool, u->item[j].event);
                u->item[j].event = NULL;
                u->events_outstanding--;
            }
        }
        if (synchronized)
            u->events_outstanding = 0;
        if (u->events_outstanding)
            continue;
        free(e->uses);
        e->uses = NULL;
        e->pending = 0;
        pl->pending_count--;
        stow__acct_pending(&pool->acct, STOW_POOL_LARGE, e->max_bytes, false);
        release_entry(pool, pl, k, l, e, slot);
        i--; /* the map shifted an entry back into this slot */
    }
}

/* The slot of a busy entry at addr, or NULL. */
static stow_ptr_slot_t *busy_slot(stow_planned_t *pl, uintptr_t addr, stow_planned_key_t **k,
                                  stow_plan_layout_t **l, stow_plan_entry_t **e, size_t *x)
{
    stow_ptr_slot_t *slot = stow__ptr_map_find(&pl->live, addr);
    if (!slot)
        return NULL;
    *l = unpack(pl, slot->value, k, x);
    if (!*l)
        return NULL;
    *e = &(*l)->entries[*x];
    return slot;
}

stow_status_t stow__planned_free(stow_pool_t *pool, uintptr_t addr)
{
    stow_planned_t *pl = pool->planned;
    stow_planned_key_t *k;
    stow_plan_layout_t *l;
    stow_plan_entry_t *e;
    size_t x;
    stow_ptr_slot_t *slot = busy_slot(pl, addr, &k, &l, &e, &x);
    if (STOW_UNLIKELY(!slot || e->pending)) {
        pool->acct.s.num_invalid_frees++;
        return STOW_ENOTOWNED;
    }
    pool->op_count++;
    stow__acct_free(&pool->acct, STOW_POOL_LARGE, e->max_bytes, e->requested_bytes,
                    stow__size_class_of(e->requested_bytes));
    pool->tag_stats[e->tag].allocated_bytes -= e->max_bytes;
    pool->tag_stats[e->tag].allocations--;
    stow__record(pool, STOW_REC_FREE, addr, e->max_bytes, e->stream->index, e->tag);
    if (STOW_UNLIKELY(pl->recording_keys))
        note_recorded_free(pl, addr);
    if (STOW_UNLIKELY(pl->auto_on))
        stow__planned_auto_free(pool, addr);
    if (STOW_UNLIKELY(e->uses != NULL && pool->has_events))
        defer_entry(pool, pl, k, l, e, x);
    else
        release_entry(pool, pl, k, l, e, slot);
    return STOW_OK;
}

bool stow__planned_block_size(stow_pool_t *pool, uintptr_t addr, size_t *block_bytes,
                              size_t *requested_bytes)
{
    stow_planned_key_t *k;
    stow_plan_layout_t *l;
    stow_plan_entry_t *e;
    size_t x;
    if (!busy_slot(pool->planned, addr, &k, &l, &e, &x) || e->pending)
        return false;
    if (block_bytes)
        *block_bytes = e->max_bytes;
    if (requested_bytes)
        *requested_bytes = e->requested_bytes;
    return true;
}

stow_status_t stow__planned_record_stream(stow_pool_t *pool, uintptr_t addr,
                                          stow_stream_t stream)
{
    stow_planned_key_t *k;
    stow_plan_layout_t *l;
    stow_plan_entry_t *e;
    size_t x;
    if (!busy_slot(pool->planned, addr, &k, &l, &e, &x) || e->pending)
        return STOW_ENOTOWNED;
    if (!pool->has_events || stream == e->stream->stream)
        return STOW_OK;
    stow_stream_uses_t *u = e->uses;
    for (uint32_t i = 0; u && i < u->count; i++)
        if (u->item[i].stream == stream)
            return STOW_OK;
    if (!u || u->count == u->capacity) {
        uint32_t cap = u ? u->capacity * 2 : 2;
        stow_stream_uses_t *grown = realloc(u, sizeof *u + cap * sizeof u->item[0]);
        if (!grown)
            return STOW_EHOSTMEM;
        if (!u)
            grown->count = grown->events_outstanding = 0;
        grown->capacity = cap;
        e->uses = u = grown;
    }
    u->item[u->count].stream = stream;
    u->item[u->count].event = NULL;
    u->count++;
    return STOW_OK;
}

/* ---- steps ---- */

/* Takes layout l for key k (its old one retired), and counts it; its state
 * is KEY_PLANNED then. A key whose layout from two plans ago still has busy
 * slots cannot retire another: the new layout is dropped, and the key
 * records again. */
static void install(stow_pool_t *pool, stow_planned_t *pl, stow_planned_key_t *k,
                    stow_plan_layout_t *l, stow_plan_profile_t *sizes)
{
    if (k->retired && k->layout) {
        stow__planned_layout_free(l);
        stow__planned_profile_free(sizes);
        k->state = KEY_PLANNED;
        return;
    }
    layout_retire(pool, pl, k);
    l->generation = ++k->generation;
    k->layout = l;
    k->plans++;
    k->bad_steps = 0;
    k->failed_records = 0;
    stow__planned_profile_free(&k->sizes);
    k->sizes = *sizes;
    *sizes = (stow_plan_profile_t){0, NULL};
    pool->acct.s.num_plans++;
    pool->acct.s.planning_ns += l->planning_ns;
    pl->trim_due = true;
    k->state = KEY_PLANNED;
}

static void stop_recording(stow_planned_t *pl, stow_planned_key_t *k)
{
    stow__planned_rec_free(k->rec);
    k->rec = NULL;
    if (k->rec_counted) {
        pl->recording_keys--;
        k->rec_counted = false;
    }
}

/* A key that does not settle is not planned for a while, which doubles each
 * time: its layout goes (kept until its busy slots are freed) and it costs a
 * lookup a step. Not while a layout from before is still busy (it retires
 * at a later step). */
static void key_rest(stow_pool_t *pool, stow_planned_t *pl, stow_planned_key_t *k)
{
    if (k->retired && k->layout)
        return;
    stop_recording(pl, k);
    layout_retire(pool, pl, k);
    k->failed_records = 0;
    k->bad_steps = 0;
    k->unpaid = 0;
    k->backoff_steps = k->backoff_steps ? 2 * k->backoff_steps : BACKOFF_FIRST_STEPS;
    if (k->backoff_steps > BACKOFF_MAX_STEPS)
        k->backoff_steps = BACKOFF_MAX_STEPS;
    k->settle_after_step = k->steps + k->backoff_steps;
    k->state = KEY_UNSETTLED;
    pool->acct.s.num_plans_unsettled++;
}

/* A key's recording gave no plan (steps that do not repeat): record again,
 * or rest after RECORDS_FAILED_MAX in a row. */
static void record_failed(stow_pool_t *pool, stow_planned_t *pl, stow_planned_key_t *k)
{
    stop_recording(pl, k);
    if (++k->failed_records >= RECORDS_FAILED_MAX) {
        key_rest(pool, pl, k);
        return;
    }
    k->state = k->layout ? KEY_PLANNED : KEY_RECORDING;
}

static int by_offset(const void *a, const void *b)
{
    const stow_arena_slot_t *x = a, *y = b;
    return (x->offset > y->offset) - (x->offset < y->offset);
}

/* The busy slots of layout l into slots[] (its entries let go of them). */
static size_t take_slots(stow_planned_t *pl, stow_plan_layout_t *l, stow_arena_slot_t *slots)
{
    size_t n = 0;
    for (size_t x = 0; l && x < l->entry_count; x++) {
        stow_plan_entry_t *e = &l->entries[x];
        if (!e->busy)
            continue;
        slots[n++] = (stow_arena_slot_t){e->offset, e->max_bytes, e->requested_bytes, e->stream,
                                         e->uses, e->tag};
        e->uses = NULL;
        e->busy = e->overdue = 0;
    }
    (void)pl;
    return n;
}

/* The arena did not pay (the budget, above): it becomes the pool's, its busy
 * slots blocks of the pool and the rest free memory, and every layout goes.
 * A key whose plan this drops records again, to be planned with its grown
 * sizes; a second time it rests (key_rest). False, with nothing changed, when
 * the arena cannot be dissolved now: slots wait for events, the arena is of
 * the small pool kind (its slots count as large), a synchronize failed, or
 * no host memory. */
static bool arena_dissolve(stow_pool_t *pool, stow_planned_t *pl)
{
    stow_block_t *b = pl->arena;
    if (!b || pl->pending_count || b->pool_kind != STOW_POOL_LARGE)
        return false;
    size_t n = pl->busy_total;
    stow_arena_slot_t *slots = n ? malloc(n * sizeof *slots) : NULL;
    if ((n && !slots) || !stow__pool_dissolve_reserve(pool, n)) {
        free(slots);
        return false;
    }
    /* The arena's free bytes go back on its stream when one stream used it,
     * else to every stream after a synchronize: the pool's own rule. */
    bool one_owner = arena_one_owner(pl);
    if (!one_owner && pool->has_events && !stow__pool_synchronize(pool)) {
        free(slots);
        return false;
    }
    size_t got = 0;
    /* With no slot busy, slots is NULL and there is nothing to take. */
    for (unsigned i = 0; n && i < STOW_PLANNED_KEYS_MAX; i++) {
        stow_planned_key_t *k = &pl->keys[i];
        got += take_slots(pl, k->layout, slots + got);
        got += take_slots(pl, k->retired, slots + got);
    }
    stow_assert_internal(got == n);
    if (got > 1)
        qsort(slots, got, sizeof *slots, by_offset);
    for (unsigned i = 0; i < pl->clear_count; i++)
        stow__pool_destroy_event(pool, pl->clear_events[i]);
    pl->clear_count = 0;
    stow__pool_dissolve_arena(pool, b, slots, got, one_owner ? b->owner : pool->any,
                              pl->allocated_hw);
    free(slots);
    stow__ptr_map_destroy(&pl->live);
    (void)stow__ptr_map_init(&pl->live); /* fails only without host memory: then empty */
    pl->busy_total = 0;
    pl->live_bytes = 0;
    pl->arena_lent = false;
    set_arena(pool, pl, NULL);
    /* A page-mapped arena's bytes are granules the pool holds unused now:
     * they go back to the device at once (a granule a slot shares stays),
     * and the pool maps what it needs from here as it does alone. */
    if (pool->vmm)
        stow__pool_trim_for_plan(pool);
    for (unsigned i = 0; i < STOW_PLANNED_KEYS_MAX; i++) {
        stow_planned_key_t *k = &pl->keys[i];
        k->busy_count = 0;
        bool had_plan = k->layout || k->retired;
        layout_drop(pool, pl, k->retired);
        k->retired = NULL;
        if (!had_plan)
            continue;
        layout_drop(pool, pl, k->layout);
        k->layout = NULL;
        if (++k->unpaid >= UNPAID_MAX)
            key_rest(pool, pl, k);
        else if (k->state == KEY_PLANNED)
            k->state = KEY_RECORDING;
    }
    note_fine_handles(pool, pl);
    return true;
}

/* The recorded steps of k become a plan: now (planned_async false), or on the
 * helper thread, collected at a later step. */
static void plan_key(stow_pool_t *pool, stow_planned_t *pl, stow_planned_key_t *k)
{
    stow_plan_profile_t profile;
    if (!stow__planned_rec_profile(k, &profile)) {
        record_failed(pool, pl, k);
        return;
    }
    stop_recording(pl, k);
    if (pool->config.planned_async && stow__planned_job_submit(pl, k, &profile)) {
        k->state = KEY_WAITING;
        return;
    }
    if (pool->config.planned_async && pl->job.started) {
        /* The thread is busy with another key: record again later. */
        stow__planned_profile_free(&profile);
        k->state = k->layout ? KEY_PLANNED : KEY_RECORDING;
        return;
    }
    /* Inline: planned_async false, or no thread could be started. */
    stow_plan_layout_t *l = stow__planned_make_layout(&profile);
    if (!l) {
        stow__planned_profile_free(&profile);
        record_failed(pool, pl, k);
        return;
    }
    install(pool, pl, k, l, &profile);
}

/* The auto key's layout serves from now on, the step at position `cursor`. */
static void auto_begin(stow_planned_t *pl, stow_planned_key_t *k, size_t cursor)
{
    size_t n = k->layout->n;
    pl->cur = k;
    pl->cursor = pl->scanned = pl->step_allocs = cursor % n;
    pl->step_hits = pl->step_misses = 0;
}

/* A layout the helper thread finished goes to its key, if the key still waits. */
static void collect_job(stow_pool_t *pool, stow_planned_t *pl)
{
    stow_planned_key_t *k;
    uint32_t generation;
    stow_plan_layout_t *l;
    if (!stow__planned_job_collect(pl, &k, &generation, &l))
        return;
    if (!k || k->state != KEY_WAITING || k->generation != generation) {
        stow__planned_layout_free(l);
        return;
    }
    if (!l) {
        record_failed(pool, pl, k);
        return;
    }
    /* The profile went to the thread; the layout carries its sizes. */
    stow_plan_profile_t sizes = {l->n, calloc(l->n, sizeof(stow_plan_pos_t))};
    for (size_t p = 0; sizes.pos && p < l->n; p++)
        sizes.pos[p] = (stow_plan_pos_t){l->entries[p].seen_max_bytes, l->entries[p].min_bytes,
                                         l->entries[p].stream, l->entries[p].life};
    if (!sizes.pos)
        sizes.n = 0;
    install(pool, pl, k, l, &sizes);
    if (k->is_auto && k->layout == l)
        auto_begin(pl, k, pl->auto_cursor + (size_t)(pl->auto_allocs - pl->auto_allocs_at));
}

static void start_recording(stow_planned_t *pl, stow_planned_key_t *k)
{
    k->state = KEY_RECORDING;
    if (!k->rec_counted) {
        pl->recording_keys++;
        k->rec_counted = true;
    }
}

/* What a key does in the step that begins. */
static void key_step_begins(stow_pool_t *pool, stow_planned_t *pl, stow_planned_key_t *k)
{
    switch (k->state) {
    case KEY_UNSETTLED:
        if (k->steps < k->settle_after_step)
            return;
        k->state = KEY_RECORDING;
        k->plans = 0;
        /* fall through */
    case KEY_RECORDING:
        if (stow__planned_rec_complete(k)) {
            plan_key(pool, pl, k);
            if (k->state != KEY_RECORDING || k->layout)
                return;
        }
        /* Warm-up: the first steps of a loop (open steps) allocate what later
         * ones do not (optimizer state, autotuning); they are recorded and
         * dropped. A step ended by stow_pool_step(NULL) is planned at once. */
        if (k->rec && k->rec->count && !k->rec->steps[0].closed &&
            k->rec->steps[0].key_step <= pool->tuning.planned_warmup_steps)
            stop_recording(pl, k);
        start_recording(pl, k);
        if (!stow__planned_rec_step_begin(pl, k))
            stop_recording(pl, k);
        return;
    case KEY_PLANNED:
        if (k->unpaid >= UNPAID_MAX) {
            key_rest(pool, pl, k); /* its plans do not pay */
        } else if (k->bad_steps >= BAD_STEPS_REPLAN && k->plans < PLANS_MAX) {
            start_recording(pl, k); /* the plan serves while the steps are recorded */
            if (!stow__planned_rec_step_begin(pl, k))
                stop_recording(pl, k);
            k->bad_steps = 0;
        } else if (k->bad_steps >= BAD_STEPS_REPLAN) {
            key_rest(pool, pl, k); /* re-planned PLANS_MAX times and still missing */
        }
        return;
    default:
        return;
    }
}

/* Where a planned key in KEY_RECORDING goes on recording: a re-plan keeps its
 * state KEY_PLANNED while its rec records; see key_step_ends. */
static void key_step_ends(stow_pool_t *pool, stow_planned_t *pl, bool closed)
{
    stow_planned_key_t *k = pl->cur;
    stow_plan_layout_t *l = k->layout;
    if (l) {
        if (pl->scanned < l->n)
            scan_due(pl, l, l->n - 1);
        bool served = pl->step_hits > 0;
        bool bad = pl->step_misses > BAD_STEP_MISSES(l->n);
        k->bad_steps = bad ? k->bad_steps + 1 : 0;
        if (served && !bad && pl->trim_due && pl->active == l) {
            pl->trim_due = false;
            stow__pool_trim_for_plan(pool);
            pool->acct.s.num_plan_trims++;
        }
        l->step++;
    }
    if (k->rec) {
        stow__planned_rec_step_end(pl, k, closed);
        if (k->state == KEY_PLANNED && stow__planned_rec_complete(k)) {
            /* A re-plan: its recorded steps are done. */
            k->state = KEY_RECORDING;
        }
    }
}

/* The key named `name`, or a new one (the least recently used key with
 * nothing busy, recording or waiting goes); NULL when none can go. */
static stow_planned_key_t *key_get(stow_pool_t *pool, stow_planned_t *pl, const char *name)
{
    stow_planned_key_t *free_slot = NULL, *oldest = NULL;
    for (unsigned i = 0; i < STOW_PLANNED_KEYS_MAX; i++) {
        stow_planned_key_t *k = &pl->keys[i];
        if (!k->used) {
            if (!free_slot)
                free_slot = k;
            continue;
        }
        if (!strcmp(k->name, name))
            return k;
        if (k->busy_count == 0 && k->state != KEY_WAITING &&
            (!oldest || k->last_use < oldest->last_use))
            oldest = k;
    }
    stow_planned_key_t *k = free_slot ? free_slot : oldest;
    if (!k)
        return NULL;
    if (k->used)
        key_reset(pool, pl, k);
    k->used = true;
    snprintf(k->name, sizeof k->name, "%s", name);
    return k;
}

/* A marker: the program says where its steps are, which ends the steps
 * found without markers (the auto key's layout retires as its slots are
 * freed, and the key goes when nothing of it is busy). */
static void auto_off(stow_pool_t *pool, stow_planned_t *pl)
{
    pl->auto_on = false;
    stow__planned_auto_destroy(pl);
    stow_planned_key_t *k = pl->auto_key;
    pl->auto_key = NULL;
    if (!k)
        return;
    if (pl->cur == k)
        pl->cur = NULL;
    if (k->busy_count == 0) {
        key_reset(pool, pl, k);
        return;
    }
    if (!k->retired)
        layout_retire(pool, pl, k);
    k->state = KEY_UNSETTLED;
    k->settle_after_step = UINT64_MAX;
}

void stow__planned_step(stow_pool_t *pool, const char *key)
{
    stow_planned_t *pl = pool->planned;
    if (pl->auto_on)
        auto_off(pool, pl);
    if (!pool->config.planned_steps)
        return;
    if (pl->job.started)
        collect_job(pool, pl);
    if (pl->cur)
        key_step_ends(pool, pl, key == NULL);
    pl->cur = NULL;
    pl->cursor = pl->scanned = pl->step_allocs = 0;
    pl->step_hits = pl->step_misses = 0;
    process_pending(pool, pl, false);
    if (!key)
        return;
    stow_planned_key_t *k = key_get(pool, pl, key);
    if (!k)
        return;
    pl->clock++;
    k->last_use = pl->clock;
    k->steps++;
    pl->cur = k;
    key_step_begins(pool, pl, k);
    if (!k->layout && k->state != KEY_UNSETTLED)
        arena_lend(pool, pl);
    note_fine_handles(pool, pl);
}

/* ---- empty_cache and the out-of-memory retry ---- */

void stow__planned_release(stow_pool_t *pool)
{
    stow_planned_t *pl = pool->planned;
    process_pending(pool, pl, true);
    if (pl->busy_total == 0)
        (void)arena_give_back(pool, pl, true);
    pl->take_retry_step = 0;
    pl->take_backoff = 0;
}

size_t stow__planned_live_bytes(const stow_pool_t *pool)
{
    return pool->planned->live_bytes;
}

/* ---- for planned_auto.c ---- */

stow_planned_key_t *stow__planned_auto_key(stow_pool_t *pool, stow_planned_t *pl)
{
    if (!pl->auto_key) {
        /* "(auto)" breaks the key rule, so no marker can name it. */
        pl->auto_key = key_get(pool, pl, "(auto)");
        if (pl->auto_key)
            pl->auto_key->is_auto = true;
    }
    return pl->auto_key;
}

bool stow__planned_auto_wants_look(const stow_planned_t *pl)
{
    const stow_planned_key_t *k = pl->auto_key;
    return pl->auto_on && (!k || !k->layout || k->state == KEY_RECORDING);
}

void stow__planned_auto_plan(stow_pool_t *pool, stow_planned_t *pl, stow_planned_key_t *k,
                             stow_plan_profile_t *profile, size_t cursor)
{
    if (pool->config.planned_async) {
        if (stow__planned_job_submit(pl, k, profile)) {
            k->state = KEY_WAITING;
            pl->auto_cursor = cursor;
            pl->auto_allocs_at = pl->auto_allocs;
            return;
        }
        if (pl->job.started) { /* the thread is busy with a key: look again later */
            stow__planned_profile_free(profile);
            return;
        }
    }
    stow_plan_layout_t *l = stow__planned_make_layout(profile);
    if (!l) {
        stow__planned_profile_free(profile);
        return;
    }
    install(pool, pl, k, l, profile);
    if (k->layout == l)
        auto_begin(pl, k, cursor);
}
