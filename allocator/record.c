/*
 * allocator/record.c: the event ring buffer of a live pool, allocation tags
 * with per-tag accounting, allocation sites, and stow_trace_dump
 * (stowage/record.h).
 *
 * Recording sits on the alloc/free fast path, so an event is 32 bytes written
 * into a preallocated ring with a cycle-counter timestamp (converted to
 * nanoseconds only when dumped); nothing is allocated or formatted per event.
 */
#include "allocator/lock.h"
#include "allocator/pool.h"
#include "allocator/ptr_map.h"
#include "allocator/recorder.h"
#include "stowage/record.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#endif

/* ---- tags ---- */

static pthread_mutex_t tag_lock = PTHREAD_MUTEX_INITIALIZER;
static char tag_names[STOW_TAG_MAX][STOW_TAG_NAME_MAX];
static unsigned tag_count = 1; /* 0 is "untagged" */
_Thread_local unsigned char stow__current_tag;

stow_status_t stow_tag_set(const char *name, unsigned *id_out)
{
    if (!name || !*name) {
        stow__current_tag = 0;
        if (id_out)
            *id_out = 0;
        return STOW_OK;
    }
    /* TRACE.tags holds a tag per line after "<id> ", and its reader drops the blanks there. */
    if (strlen(name) >= STOW_TAG_NAME_MAX || strpbrk(name, "\r\n") || strchr(" \t\v\f", name[0]))
        return STOW_EINVAL;
    pthread_mutex_lock(&tag_lock);
    unsigned id = 1;
    while (id < tag_count && strcmp(tag_names[id], name))
        id++;
    stow_status_t st = STOW_OK;
    if (id == tag_count) {
        if (tag_count == STOW_TAG_MAX)
            st = STOW_EBUSY;
        else
            snprintf(tag_names[tag_count++], STOW_TAG_NAME_MAX, "%s", name);
    }
    pthread_mutex_unlock(&tag_lock);
    if (st != STOW_OK)
        return st;
    stow__current_tag = (unsigned char)id;
    if (id_out)
        *id_out = id;
    return STOW_OK;
}

const char *stow_tag_name(unsigned id)
{
    /* Names are written once, before their id is published under the lock. */
    pthread_mutex_lock(&tag_lock);
    const char *name = id < tag_count ? tag_names[id] : "";
    pthread_mutex_unlock(&tag_lock);
    return name;
}

const char *stow_tag_current(void) { return stow_tag_name(stow__current_tag); }

stow_status_t stow_pool_tag_stats(stow_pool_t *pool, stow_tag_stats_t out[STOW_TAG_MAX])
{
    if (!pool || !out)
        return STOW_EINVAL;
    stow__lock(&pool->lock);
    memcpy(out, pool->tag_stats, sizeof pool->tag_stats);
    stow__unlock(&pool->lock);
    return STOW_OK;
}

/* ---- sites ---- */

/* Texts are copied once and never freed, so a pointer handed out stays valid
 * without the lock; the table that finds a text's id is open addressing over
 * the ids, grown to keep it at most half full. */
static pthread_mutex_t site_lock = PTHREAD_MUTEX_INITIALIZER;
static char **site_texts;         /* [0 .. site_cap); [0] unused; Synchronization: site_lock */
static uint32_t site_cap;
static _Atomic uint32_t site_count = 1; /* ids in use, 0 included */
static uint32_t *site_slots;      /* [site_slot_cap]: id, 0 = empty; Synchronization: site_lock */
static uint32_t site_slot_cap;
_Thread_local uint32_t stow__current_site;
_Atomic bool stow__sites_used;

static uint64_t site_hash(const char *s)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (; *s; s++)
        h = (h ^ (unsigned char)*s) * 1099511628211ull;
    return h;
}

/* The slot of text in site_slots: its id's, or the empty one it would take. */
static uint32_t *site_slot(const char *text, uint64_t h)
{
    uint32_t mask = site_slot_cap - 1, i = (uint32_t)h & mask;
    while (site_slots[i] && strcmp(site_texts[site_slots[i]], text))
        i = (i + 1) & mask;
    return &site_slots[i];
}

/* Room for one more id (lock held). */
static stow_status_t site_reserve(void)
{
    uint32_t n = atomic_load_explicit(&site_count, memory_order_relaxed);
    if (n >= site_cap) {
        uint32_t cap = site_cap ? 2 * site_cap : 256;
        char **texts = realloc(site_texts, cap * sizeof *texts);
        if (!texts)
            return STOW_EHOSTMEM;
        site_texts = texts;
        site_cap = cap;
    }
    if (2 * (size_t)n >= site_slot_cap) {
        uint32_t cap = site_slot_cap ? 2 * site_slot_cap : 512;
        uint32_t *slots = calloc(cap, sizeof *slots), *old = site_slots;
        if (!slots)
            return STOW_EHOSTMEM;
        site_slots = slots;
        site_slot_cap = cap;
        for (uint32_t id = 1; id < n; id++)
            *site_slot(site_texts[id], site_hash(site_texts[id])) = id;
        free(old);
    }
    return STOW_OK;
}

stow_status_t stow_record_site_intern(const char *text, uint32_t *id_out)
{
    /* TRACE.tags holds a site per line after "<id> ", and its reader drops the blanks there. */
    if (!text || !id_out || !*text ||
        strnlen(text, STOW_RECORD_SITE_TEXT_MAX) >= STOW_RECORD_SITE_TEXT_MAX ||
        strpbrk(text, "\r\n") || strchr(" \t\v\f", text[0]))
        return STOW_EINVAL;
    uint64_t h = site_hash(text);
    pthread_mutex_lock(&site_lock);
    stow_status_t st = STOW_OK;
    uint32_t id = site_slot_cap ? *site_slot(text, h) : 0;
    if (!id) {
        uint32_t n = atomic_load_explicit(&site_count, memory_order_relaxed);
        char *copy = NULL;
        if (n >= STOW_RECORD_SITES_MAX)
            st = STOW_EBUSY;
        else if ((st = site_reserve()) == STOW_OK && !(copy = strdup(text)))
            st = STOW_EHOSTMEM;
        if (st == STOW_OK) {
            id = n;
            site_texts[id] = copy;
            *site_slot(text, h) = id;
            atomic_store_explicit(&site_count, n + 1, memory_order_release);
            atomic_store_explicit(&stow__sites_used, true, memory_order_relaxed);
        }
    }
    pthread_mutex_unlock(&site_lock);
    if (st == STOW_OK)
        *id_out = id;
    return st;
}

stow_status_t stow_record_site_set(uint32_t id)
{
    if (id >= atomic_load_explicit(&site_count, memory_order_acquire))
        return STOW_EINVAL;
    stow__current_site = id;
    return STOW_OK;
}

uint32_t stow_record_site_current(void) { return stow__current_site; }

const char *stow_record_site_text(uint32_t id)
{
    if (!id || id >= atomic_load_explicit(&site_count, memory_order_acquire))
        return "";
    pthread_mutex_lock(&site_lock); /* site_texts may move while an intern grows it */
    const char *text = site_texts[id];
    pthread_mutex_unlock(&site_lock);
    return text;
}

/* ---- the ring buffer ---- */

uint64_t stow__record_clock(void)
{
#if defined(__x86_64__) || defined(__i386__)
    return __rdtsc();
#else
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
#endif
}

static uint64_t wall_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void recorder_free(stow_recorder_t *rec)
{
    if (!rec)
        return;
    for (uint32_t i = 0; i < rec->key_count; i++)
        free(rec->keys[i]);
    free(rec->keys);
    free(rec->events);
    free(rec);
}

void stow__record_step(stow_pool_t *pool, const char *key)
{
    stow_recorder_t *r = pool->rec;
    if (!r)
        return;
    uint32_t i = 0;
    if (key) {
        /* Markers come once a step and keys are few: a linear search. */
        while (i < r->key_count && strcmp(r->keys[i], key))
            i++;
        if (i == r->key_count) {
            if (r->key_count == r->key_capacity) {
                uint32_t cap = r->key_capacity ? 2 * r->key_capacity : 8;
                char **grown = realloc(r->keys, cap * sizeof *grown);
                if (!grown)
                    return;
                r->keys = grown;
                r->key_capacity = cap;
            }
            char *copy = strdup(key);
            if (!copy)
                return;
            r->keys[r->key_count++] = copy;
        }
        i++;
    }
    stow__record(pool, STOW_REC_STEP, i, 0, 0, 0);
}

/* Events a ring starts with: a recording as large as PyTorch's unlimited
 * history asks for (STOW_RECORD_EVENTS_MAX, 512 MiB) holds host memory only
 * as its events come, in every pool that records. */
#define RECORD_FIRST_EVENTS ((size_t)1 << 12)

void stow__record_ring_end(stow_recorder_t *r)
{
    if (r->allocated < r->capacity) {
        size_t grown = r->allocated * 2 < r->capacity ? r->allocated * 2 : r->capacity;
        stow_rec_event_t *events = realloc(r->events, grown * sizeof *events);
        if (events) {
            /* Touch the new pages here rather than on the fast path. */
            memset(events + r->allocated, 0, (grown - r->allocated) * sizeof *events);
            r->events = events;
            r->allocated = grown;
            return; /* next stays: the ring goes on filling */
        }
        r->capacity = r->allocated; /* no host memory: the ring is what it holds */
    }
    r->next = 0;
}

stow_status_t stow_record_start(stow_pool_t *pool, size_t capacity_events)
{
    if (!pool || capacity_events > STOW_RECORD_EVENTS_MAX)
        return STOW_EINVAL;
    stow_recorder_t *rec = NULL;
    if (capacity_events) {
        size_t first = capacity_events < RECORD_FIRST_EVENTS ? capacity_events
                                                             : RECORD_FIRST_EVENTS;
        rec = calloc(1, sizeof *rec);
        if (rec)
            rec->events = malloc(first * sizeof *rec->events);
        if (!rec || !rec->events) {
            if (rec)
                free(rec->events);
            free(rec);
            return STOW_EHOSTMEM;
        }
        /* Touch every page now rather than on the fast path. */
        memset(rec->events, 0, first * sizeof *rec->events);
        rec->capacity = capacity_events;
        rec->allocated = first;
        rec->start_ticks = stow__record_clock();
        rec->last_ticks = rec->start_ticks;
        rec->start_ns = wall_ns();
    }
    stow__lock(&pool->lock);
    stow_recorder_t *old = pool->rec;
    pool->rec = rec;
    stow__unlock(&pool->lock);
    recorder_free(old);
    return STOW_OK;
}

void stow_record_counts(stow_pool_t *pool, uint64_t *recorded, uint64_t *kept)
{
    uint64_t r = 0, k = 0;
    if (pool) {
        stow__lock(&pool->lock);
        if (pool->rec) {
            r = pool->rec->count;
            k = r < pool->rec->capacity ? r : pool->rec->capacity;
        }
        stow__unlock(&pool->lock);
    }
    if (recorded)
        *recorded = r;
    if (kept)
        *kept = k;
}

void stow__record_free(stow_pool_t *pool)
{
    recorder_free(pool->rec);
    pool->rec = NULL;
}

/* ---- dump ---- */

static const char *const kind_names[] = {
    [STOW_REC_ALLOC] = "alloc",       [STOW_REC_FREE] = "free",
    [STOW_REC_SEGMENT_RESERVE] = "segment_reserve", [STOW_REC_SEGMENT_RELEASE] = "segment_release",
    [STOW_REC_MAP] = "map",           [STOW_REC_UNMAP] = "unmap",
    [STOW_REC_OOM] = "oom",           [STOW_REC_STEP] = "step",
};

static stow_status_t write_dump(const char *path, const stow_rec_event_t *ev, size_t n,
                                double ns_per_tick, uint64_t start_ticks, char *const *keys,
                                uint32_t key_count)
{
    /* Ids: one per allocation whose event is kept, in order; frees find
     * theirs by address. Pass 1 counts, pass 2 writes. */
    stow_ptr_map_t ids;
    if (stow__ptr_map_init(&ids) != STOW_OK)
        return STOW_EHOSTMEM;
    uint32_t *id_of = malloc((n ? n : 1) * sizeof *id_of); /* per event; UINT32_MAX = skip */
    unsigned char *tag_of_id = malloc(n ? n : 1);
    uint32_t *site_of_id = malloc((n ? n : 1) * sizeof *site_of_id);
    if (!id_of || !tag_of_id || !site_of_id) {
        free(id_of);
        free(tag_of_id);
        free(site_of_id);
        stow__ptr_map_destroy(&ids);
        return STOW_EHOSTMEM;
    }
    uint32_t next_id = 0;
    size_t lines = 0;
    bool tagged = false;
    stow_status_t st = STOW_OK;
    for (size_t i = 0; i < n && st == STOW_OK; i++) {
        id_of[i] = UINT32_MAX;
        if (ev[i].kind == STOW_REC_ALLOC) {
            if ((st = stow__ptr_map_reserve_one(&ids)) != STOW_OK)
                break;
            stow__ptr_map_put(&ids, (uintptr_t)ev[i].addr, (void *)(uintptr_t)(next_id + 1));
            tag_of_id[next_id] = ev[i].tag;
            site_of_id[next_id] = ev[i].site;
            tagged |= ev[i].tag != 0 || ev[i].site != 0;
            id_of[i] = next_id++;
            lines++;
        } else if (ev[i].kind == STOW_REC_FREE) {
            uintptr_t v = (uintptr_t)stow__ptr_map_remove(&ids, (uintptr_t)ev[i].addr);
            if (v) {
                id_of[i] = (uint32_t)(v - 1);
                lines++;
            }
        }
    }
    FILE *f = st == STOW_OK ? fopen(path, "w") : NULL;
    if (st == STOW_OK && !f)
        st = STOW_EIO;
    /* Streams are numbered in order of first use, from 0, as in the traces
     * PyTorch recordings give (the pool's own numbering starts at 1). */
    uint16_t *stream_no = calloc(65536, sizeof *stream_no); /* recorded -> 1 + dense */
    uint16_t streams_seen = 0;
    if (!stream_no && st == STOW_OK)
        st = STOW_EHOSTMEM;
    if (f && st != STOW_OK) {
        fclose(f);
        f = NULL;
    }
    if (f) {
        fprintf(f, "%u %zu\n", next_id, lines);
        fprintf(f, "# recorded by stowage: %zu events; times in ns from the recording start\n", n);
        for (size_t i = 0; i < n; i++) {
            const stow_rec_event_t *e = &ev[i];
            if (e->kind == STOW_REC_ALLOC) {
                if (!stream_no[e->stream])
                    stream_no[e->stream] = ++streams_seen;
                fprintf(f, "a %u %llu %u\n", id_of[i], (unsigned long long)e->size,
                        stream_no[e->stream] - 1u);
            }
            else if (e->kind == STOW_REC_FREE && id_of[i] != UINT32_MAX)
                fprintf(f, "f %u\n", id_of[i]);
            else if (e->kind == STOW_REC_STEP && e->addr == 0)
                fprintf(f, "e\n");
            else if (e->kind == STOW_REC_STEP && e->addr <= key_count)
                fprintf(f, "m %s\n", keys[e->addr - 1]);
            else if (e->kind != STOW_REC_FREE && e->kind != STOW_REC_STEP)
                fprintf(f, "# %s %#llx %llu t=%.0f\n", kind_names[e->kind],
                        (unsigned long long)e->addr, (unsigned long long)e->size,
                        (double)(e->ticks - start_ticks) * ns_per_tick);
        }
        if (fclose(f) != 0)
            st = STOW_EIO;
    }
    if (st == STOW_OK && tagged) {
        char tags_path[4096];
        int tags_len = snprintf(tags_path, sizeof tags_path, "%s.tags", path);
        bool fits = tags_len > 0 && (size_t)tags_len < sizeof tags_path;
        FILE *tf = fits ? fopen(tags_path, "w") : NULL;
        if (!tf)
            st = STOW_EIO;
        /* An allocation's site says more than its thread's tag: it wins. */
        for (uint32_t id = 0; tf && id < next_id; id++)
            if (site_of_id[id])
                fprintf(tf, "%u %s\n", id, stow_record_site_text(site_of_id[id]));
            else if (tag_of_id[id])
                fprintf(tf, "%u %s\n", id, stow_tag_name(tag_of_id[id]));
        if (tf && fclose(tf) != 0)
            st = STOW_EIO;
    }
    free(stream_no);
    free(id_of);
    free(tag_of_id);
    free(site_of_id);
    stow__ptr_map_destroy(&ids);
    return st;
}

/* Events between two clock samples carry the earlier sample: spread them
 * evenly up to the next one. */
static void interpolate_ticks(stow_rec_event_t *ev, size_t n)
{
    size_t i = 0;
    while (i < n) {
        size_t j = i + 1;
        while (j < n && ev[j].ticks == ev[i].ticks)
            j++;
        if (j < n && ev[j].ticks > ev[i].ticks) {
            uint64_t span = ev[j].ticks - ev[i].ticks;
            for (size_t k = i + 1; k < j; k++)
                ev[k].ticks = ev[i].ticks + span * (k - i) / (j - i);
        }
        i = j;
    }
}

stow_status_t stow_trace_dump(stow_pool_t *pool, const char *path)
{
    if (!pool || !path)
        return STOW_EINVAL;
    stow__lock(&pool->lock);
    stow_recorder_t *rec = pool->rec;
    if (!rec) {
        stow__unlock(&pool->lock);
        return STOW_EINVAL;
    }
    size_t n = rec->count < rec->capacity ? (size_t)rec->count : rec->capacity;
    stow_rec_event_t *copy = malloc((n ? n : 1) * sizeof *copy);
    if (!copy) {
        stow__unlock(&pool->lock);
        return STOW_EHOSTMEM;
    }
    /* Oldest first: after a wrap the oldest sits at the write position. */
    size_t first = rec->count <= rec->capacity ? 0 : (size_t)(rec->count % rec->capacity);
    for (size_t i = 0; i < n; i++)
        copy[i] = rec->events[(first + i) % rec->capacity];
    uint64_t t0 = rec->start_ticks, ns0 = rec->start_ns;
    /* The keys too: once unlocked, stow_record_start may free them. */
    uint32_t key_count = 0;
    char **keys = rec->key_count ? calloc(rec->key_count, sizeof *keys) : NULL;
    bool keys_ok = !rec->key_count || keys;
    for (uint32_t i = 0; keys && i < rec->key_count; i++, key_count++)
        if (!(keys[i] = strdup(rec->keys[i]))) {
            keys_ok = false;
            break;
        }
    stow__unlock(&pool->lock);
    stow_status_t st = keys_ok ? STOW_OK : STOW_EHOSTMEM;
    if (st == STOW_OK) {
        interpolate_ticks(copy, n);
        uint64_t t1 = stow__record_clock(), ns1 = wall_ns();
        double ns_per_tick = t1 > t0 ? (double)(ns1 - ns0) / (double)(t1 - t0) : 1.0;
        st = write_dump(path, copy, n, ns_per_tick, t0, keys, key_count);
    }
    for (uint32_t i = 0; i < key_count; i++)
        free(keys[i]);
    free(keys);
    free(copy);
    return st;
}
