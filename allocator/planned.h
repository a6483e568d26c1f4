/*
 * allocator/planned.h: the planned layer's data (planned_record.c,
 * planned_plan.c, planned_serve.c, planned_check.c; docs/planned.md).
 *
 * A pool with planned_steps learns, per step key, the requests of one step
 * (record), lays the step's buffers out in one arena with the offline
 * planner (plan), and serves later steps of the key from fixed offsets in
 * that arena (serve), in front of the pool's own layers.
 *
 * Terms. A key's step makes n allocations; position p is the p-th. A plan
 * has a cycle of c steps (1, or 2 when a buffer lives longer than a step:
 * an input batch replaced each step) and one entry per (instance, position),
 * entry e = instance * n + p, C = c * n entries. Time counts allocations of
 * the key: T = (step of the key) * n + position. An entry served at T is
 * due at T + life: it must be free before the key's allocation T + life is
 * served, which the plan's offsets assume.
 *
 * Invariants (planned_check.c checks them from scratch):
 *   an entry is busy (its instance live, or freed and waiting for events)
 *     iff the layer's live map holds its address; busy entries never
 *     overlap in the arena, and lie inside it;
 *   key->busy_count == busy entries of the key; busy_total == their sum;
 *   overdue == busy entries marked overdue (each was found busy when its
 *     due position was passed); overdue_listed of them are in overdue_list;
 *   live_bytes == sum of busy entries' slot bytes <= arena bytes;
 *   while a layout is active, every busy entry of the other layouts is in
 *     the layer's foreign list (none when no layout is);
 *   allocated_hw >= the pool's allocated bytes (the budget's mark).
 * Safety: an entry is served only at its own position, when it is not busy,
 * when no overdue entry shares a byte with it (checked against each when all
 * are listed, else none may be overdue) and when no busy entry of another
 * layout (key, generation) does (a layout takes over with at most
 * STOW_PLANNED_FOREIGN_LISTED of them, each listed); the plan gives
 * byte-overlapping entries disjoint times on the cycle, and every due position is passed in
 * order, so no entry that is not overdue is live on bytes another is served
 * on (docs/planned.md).
 */
#ifndef STOWAGE_ALLOCATOR_PLANNED_H
#define STOWAGE_ALLOCATOR_PLANNED_H

#include <pthread.h>
#include <stdatomic.h>

#include "allocator/ptr_map.h"
#include "allocator/types.h"

#define STOW_PLANNED_KEYS_MAX 8      /* keys tracked per pool; least recently used dropped */
#define STOW_PLANNED_LOOKAHEAD 8     /* positions looked at past the cursor to re-align */
#define STOW_PLANNED_RECORD_STEPS 2  /* steps recorded per plan (1 for steps ended by NULL) */
#define STOW_PLANNED_STREAMS 8       /* streams a layout may use (regions of the arena) */
#define STOW_PLANNED_MAX_POSITIONS ((size_t)1 << 20) /* allocations a planned step may make */
#define STOW_PLANNED_OVERDUE_LISTED 8 /* overdue entries checked one by one; more: none served */
#define STOW_PLANNED_FOREIGN_LISTED 16 /* other layouts' busy slots a layout takes over beside */
#define STOW_PLANNED_NONE UINT32_MAX

/* ---- what a plan is made from (planned_record.c, the auto mode) ---- */

/* One position of a key's step, as recorded. */
typedef struct stow_plan_pos {
    size_t max_bytes;             /* largest rounded request seen here: the slot's size */
    size_t min_bytes;             /* smallest rounded request seen here */
    stow_stream_state_t *stream;  /* the stream every recorded request here was made on */
    uint32_t life;                /* allocations of the key until it is free; 0: not
                                     planned (it outlives two steps: the pool serves it) */
} stow_plan_pos_t;

typedef struct stow_plan_profile {
    size_t n;                     /* positions */
    stow_plan_pos_t *pos;         /* [n], owned */
} stow_plan_profile_t;

/* ---- a plan (planned_plan.c) ---- */

typedef struct stow_plan_entry {
    size_t offset;                /* in the arena */
    size_t max_bytes;             /* the slot's size: the position's largest, and its
                                     margin where its size varied (planned_plan.c) */
    size_t min_bytes;             /* as the position's */
    size_t seen_max_bytes;        /* the position's largest, which a re-plan starts from */
    stow_stream_state_t *stream;
    uint32_t life;                /* 0: not planned */
    uint32_t due_next;            /* next entry due at the same entry index; NONE: last */
    /* The live instance (planned_serve.c): */
    uint64_t served_at;           /* T when served */
    size_t requested_bytes;
    stow_stream_uses_t *uses;     /* record_stream users, or NULL */
    uint8_t busy;                 /* served and not yet free (pending included) */
    uint8_t overdue;              /* busy past its due time */
    uint8_t pending;              /* freed, waiting for events on record_stream's streams */
    uint8_t tag;
} stow_plan_entry_t;

typedef struct stow_plan_layout {
    uint32_t generation;          /* the key's generation when it was taken */
    uint64_t step;                /* steps of the key served since it was taken */
    size_t busy;                  /* busy entries */
    size_t overdue;               /* busy entries found past their due time */
    size_t overdue_listed;        /* of them, in overdue_list (all of them, or not) */
    uint32_t overdue_list[STOW_PLANNED_OVERDUE_LISTED]; /* entry indices */
    stow_stream_state_t *streams[STOW_PLANNED_STREAMS]; /* of its regions, in arena order */
    unsigned stream_count;
    size_t n;                     /* positions per step */
    unsigned cycle_steps;         /* 1 or 2 */
    size_t entry_count;           /* n * cycle_steps */
    stow_plan_entry_t *entries;   /* [entry_count] */
    uint32_t *due_first;          /* [entry_count]: first entry due at each entry index */
    size_t height_bytes;          /* highest offset + slot size */
    uint64_t planning_ns;         /* host time the plan took */
} stow_plan_layout_t;

/* ---- recording a key's steps (planned_record.c) ---- */

typedef struct stow_rec_alloc {
    size_t rounded;
    stow_stream_state_t *stream;
    uint32_t free_pos;            /* allocations of the step the free came in, before it */
    uint8_t how;                  /* stow_rec_how_t */
} stow_rec_alloc_t;

typedef enum {
    REC_LIVE = 0,                 /* not freed yet */
    REC_FREED_IN_STEP = 1,        /* freed in its own step, at free_pos */
    REC_FREED_BETWEEN = 2,        /* freed after its step ended, before the key's next one */
    REC_FREED_NEXT = 3,           /* freed in the key's next step, at free_pos */
    REC_FREED_LATER = 4           /* freed later than that: not planned */
} stow_rec_how_t;

typedef struct stow_rec_step {
    stow_rec_alloc_t *a;          /* [n] */
    size_t n, capacity;
    uint64_t key_step;            /* the key's step number it was */
    bool closed;                  /* ended by stow_pool_step(NULL) */
    bool done;                    /* ended */
} stow_rec_step_t;

typedef struct stow_planned_rec {
    stow_rec_step_t steps[STOW_PLANNED_RECORD_STEPS];
    unsigned count;               /* steps begun */
    stow_ptr_map_t live;          /* addr -> 1 + (recorded step << 32 | position), still live */
} stow_planned_rec_t;

/* ---- keys ---- */

typedef enum {
    KEY_RECORDING = 0,            /* recording its steps (a plan may still serve them) */
    KEY_WAITING = 1,              /* recorded; the helper thread is planning */
    KEY_PLANNED = 2,              /* a plan serves it; not recording */
    KEY_UNSETTLED = 3             /* not planned until settle_after_step (back-off) */
} stow_key_state_t;

typedef struct stow_planned_key {
    char name[STOW_STEP_KEY_MAX + 1];
    bool used;
    uint8_t state;                /* stow_key_state_t */
    uint64_t last_use;            /* the layer's clock at its last step: LRU */
    uint64_t steps;               /* steps of the key begun */
    uint64_t settle_after_step;   /* KEY_UNSETTLED: recorded again from this step on */
    uint64_t backoff_steps;       /* the next back-off, doubled each time */
    unsigned failed_records;      /* recordings in a row that gave no plan */
    unsigned unpaid;              /* its plans dropped for what the arena cost (budget) */
    unsigned plans;               /* plans taken for the key */
    unsigned bad_steps;           /* planned steps in a row that missed too often */
    stow_planned_rec_t *rec;      /* while recording */
    stow_plan_profile_t sizes;    /* positions of the last plan: its sizes grow a re-plan */
    bool rec_counted;             /* counted in recording_keys */
    bool is_auto;                 /* the steps found without markers (planned_auto.c) */
    stow_plan_layout_t *layout;   /* the plan in use, or NULL */
    stow_plan_layout_t *retired;  /* the plan before it, while some of its slots are busy */
    uint32_t generation;          /* bumped at each plan taken and when the slot is reused */
    size_t busy_count;            /* busy entries of both layouts */
} stow_planned_key_t;

/* ---- the helper thread (planned_plan.c) ---- */

typedef struct stow_planner_job {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    pthread_t thread;
    bool started, stop;
    bool queued;                  /* a profile waits for the thread */
    _Atomic bool done;            /* a layout (or a failure) waits for the pool */
    stow_planned_key_t *key;      /* whom the job is for */
    uint32_t generation;          /* the key's generation when submitted */
    stow_plan_profile_t profile;  /* owned by the job while queued */
    stow_plan_layout_t *result;   /* NULL: no plan */
} stow_planner_job_t;

/* ---- steps found without markers (planned_auto.c) ---- */

typedef struct stow_planned_auto {
    bool looking;                 /* logging operations and searching their period */
    uint64_t *sigs;               /* looking: each operation's signature (allocator/period.h) */
    uint64_t *coarse;             /* looking: the same with the sizes left out */
    uint32_t *lives;              /* looking: an allocation's operations until freed; 0: live */
    size_t count;
    uint64_t first_op;            /* ops at sigs[0] */
    uint64_t ops;                 /* operations seen */
    uint64_t look_after_op;       /* no looking before this operation (back-off) */
    uint64_t backoff_ops;         /* the next back-off, doubled each time */
    stow_ptr_map_t born;          /* looking: addr -> 1 + the operation that allocated it */
} stow_planned_auto_t;

/* ---- the layer ---- */

enum { POOL_REQUEST_NONE = 0, POOL_REQUEST_FALLBACK = 1, POOL_REQUEST_MISS = 2 };

typedef struct stow_planned {
    stow_planned_key_t keys[STOW_PLANNED_KEYS_MAX];
    uint64_t clock;               /* steps begun over all keys */
    stow_planned_key_t *cur;      /* the key of the step in progress; NULL: none */
    bool closed_last;             /* the last step ended by stow_pool_step(NULL) */
    size_t step_allocs;           /* allocations made in the step in progress */
    size_t step_hits, step_misses;
    uint8_t pool_request;         /* what the request going to the pool is, for its count */
    /* Serving the current key's layout. */
    size_t cursor;                /* the next position expected (of the current key's layout) */
    size_t scanned;               /* positions of this step whose due lists were scanned */
    size_t busy_total;            /* busy entries of every key */
    size_t pending_count;         /* of those, freed and waiting for events */
    unsigned recording_keys;      /* keys with a recorder (frees are looked up there) */
    stow_plan_layout_t *active;   /* the layout the arena's bytes follow; NULL: none yet */
    /* The arena. */
    stow_block_t *arena;          /* BLOCK_ARENA block of the pool, or NULL */
    bool arena_lent;              /* the arena went back for a step the pool served
                                     (arena_lend) and is not taken again yet */
    uintptr_t base;
    size_t bytes;
    size_t live_bytes;
    stow_ptr_map_t live;          /* addr -> 1 + (key index << 32 | entry) of busy entries */
    stow_stream_state_t *users[STOW_PLANNED_STREAMS]; /* streams whose work may use the
                                     arena's bytes: the active layout's (the pool's stream
                                     when it was taken) */
    unsigned user_count;
    stow_event_t clear_events[STOW_PLANNED_STREAMS]; /* clearance in flight */
    unsigned clear_count;
    /* Busy slots of other layouts when the active one took over (the last
     * step of another key, a re-plan's retired layout): it serves no slot
     * that shares a byte with one. Each leaves the list when freed. */
    struct {
        size_t offset, bytes;
    } foreign[STOW_PLANNED_FOREIGN_LISTED];
    size_t foreign_count;
    bool trim_due;                /* a plan was taken: trim the pool once it serves a step */
    /* What the pool alone reaches (planned_serve.c, the budget): the arena
     * is held only while reserved memory stays within the larger of the two. */
    uint64_t alone_reserved_hw;   /* reserved high-water mark while no arena was held */
    uint64_t allocated_hw;        /* allocated high-water mark (the layer's own: a reset
                                     of the statistics' peaks leaves it) */
    uint64_t take_retry_step;     /* after a failed take, no other before this clock */
    uint64_t take_backoff;
    stow_planner_job_t job;
    /* Steps without markers (planned_auto.c). */
    bool auto_on;                 /* planned_auto and no marker seen yet */
    stow_planned_auto_t autom;
    stow_planned_key_t *auto_key; /* the key its layouts serve as; NULL: none yet */
    size_t auto_cursor;           /* async: the step's position when the profile was made */
    uint64_t auto_allocs;         /* allocations seen since the layer began */
    uint64_t auto_allocs_at;      /* async: auto_allocs when the profile was made */
} stow_planned_t;

/* ---- planned_record.c ---- */
void stow__planned_rec_free(stow_planned_rec_t *rec);
/* A new recorded step of key k begins; false without host memory. */
bool stow__planned_rec_step_begin(stow_planned_t *pl, stow_planned_key_t *k);
/* The recorded step in progress ends (closed: by stow_pool_step(NULL)). */
void stow__planned_rec_step_end(stow_planned_t *pl, stow_planned_key_t *k, bool closed);
/* An allocation of the key's step in progress (at position pl->step_allocs). */
void stow__planned_rec_alloc(stow_planned_t *pl, stow_planned_key_t *k, uintptr_t addr,
                             size_t rounded, stow_stream_state_t *ss);
/* A free of addr: ends a recorded allocation's life, if it is one. */
void stow__planned_rec_free_addr(stow_planned_t *pl, stow_planned_key_t *k, uintptr_t addr);
/* Whether the key has recorded enough steps for a plan. */
bool stow__planned_rec_complete(const stow_planned_key_t *k);
/* The profile of the recorded steps, merged with the sizes of the key's
 * last plan when the steps match; false (nothing made) when the steps do not
 * agree (other counts or streams) or without host memory. */
bool stow__planned_rec_profile(const stow_planned_key_t *k, stow_plan_profile_t *out);
void stow__planned_profile_free(stow_plan_profile_t *p);

/* ---- planned_plan.c ---- */
/* Lays the profile out: a pure function of it (any thread). NULL when
 * nothing is plannable or without host memory. */
stow_plan_layout_t *stow__planned_make_layout(const stow_plan_profile_t *profile);
void stow__planned_layout_free(stow_plan_layout_t *layout);
/* Hands the profile (taken over) to the helper thread; false when the thread
 * cannot be started or is busy (the caller keeps the profile). */
bool stow__planned_job_submit(stow_planned_t *pl, stow_planned_key_t *k,
                              stow_plan_profile_t *profile);
/* A finished job: whom it was for (the key and its generation then) and its
 * layout (NULL: no plan; the caller owns it); false while none is finished. */
bool stow__planned_job_collect(stow_planned_t *pl, stow_planned_key_t **key,
                               uint32_t *generation, stow_plan_layout_t **out);
/* Stops and joins the thread, dropping what it holds. */
void stow__planned_job_stop(stow_planned_t *pl);

/* ---- planned_auto.c ---- */
void stow__planned_auto_destroy(stow_planned_t *pl);
/* An allocation (whoever served it) and a free, for the log. */
void stow__planned_auto_alloc(stow_pool_t *pool, uintptr_t addr, size_t rounded,
                              const stow_stream_state_t *ss);
void stow__planned_auto_free(stow_pool_t *pool, uintptr_t addr);
/* Look for the period again from the next allocation (steps that keep missing). */
void stow__planned_auto_relook(stow_planned_t *pl);

/* ---- planned_serve.c, for planned_auto.c ---- */
/* The key the steps found without markers serve as (made when needed). */
stow_planned_key_t *stow__planned_auto_key(stow_pool_t *pool, stow_planned_t *pl);
/* Whether the layer wants a period looked for now. */
bool stow__planned_auto_wants_look(const stow_planned_t *pl);
/* The profile found (taken over) becomes the auto key's layout; the step is
 * at position `cursor` now. */
void stow__planned_auto_plan(stow_pool_t *pool, stow_planned_t *pl, stow_planned_key_t *k,
                             stow_plan_profile_t *profile, size_t cursor);

#endif /* STOWAGE_ALLOCATOR_PLANNED_H */
