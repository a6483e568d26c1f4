/*
 * allocator/backend/sim.c: the simulated device (stowage/sim.h).
 *
 * Fake addresses from a non-zero base, bumped and never reused (64-bit space
 * is plentiful, and a stale pointer can then never alias a new block); or, in
 * host-backed mode, real host memory so tests can write patterns into blocks.
 * A capacity makes out-of-memory paths run on a CPU; every call is counted;
 * faults are injected per call kind; events complete at once, or when a test
 * says their stream finished or the pool waits on one (event_synchronize).
 * Deterministic: no clocks, no global state.
 */
#include "allocator/internal.h"
#include "stowage/sim.h"

#include <string.h>

#define SIM_DEFAULT_CAPACITY ((size_t)1 << 46)
#define SIM_DEFAULT_GRANULARITY ((size_t)2 << 20)
#define SIM_ADDR_BASE ((uintptr_t)0x100000000000ull) /* reservations */
#define SIM_VA_BASE ((uintptr_t)0x400000000000ull)   /* virtual ranges */

typedef struct sim_event {
    stow_stream_t stream;
    uint64_t seq;       /* order of recording (stream order within a stream) */
    uint32_t next_free; /* free-list link (index + 1), 0 = end */
    bool done;
    bool live;
} sim_event_t;

typedef struct sim {
    stow_backend_t backend; /* first: the handle is a pointer to it */
    pthread_mutex_t lock;
    stow_sim_config_t config;
    uintptr_t next_addr;
    uintptr_t next_va;
    stow_phys_t next_phys;
    stow_ptr_map_t reservations; /* addr -> size */
    stow_ptr_map_t va_ranges;    /* va -> size */
    stow_ptr_map_t phys;         /* handle -> size */
    stow_ptr_map_t mappings;     /* va -> handle */
    stow_sim_counters_t counters;
    uint64_t fail_countdown[STOW_SIM_CALL_KINDS];
    stow_status_t fail_status[STOW_SIM_CALL_KINDS];
    uint32_t fail_one_in[STOW_SIM_CALL_KINDS];
    uint64_t cost_ns[STOW_SIM_CALL_KINDS];      /* modelled cost of a call of up to 2 MiB */
    uint64_t cost_per_mib_ns[STOW_SIM_CALL_KINDS]; /* and of each MiB beyond */
    uint64_t rng[STOW_SIM_CALL_KINDS];
    sim_event_t *events;
    uint32_t event_count, event_capacity, event_free_head;
    uint64_t event_seq; /* events recorded so far: the next one's order */
} sim_t;

static sim_t *sim_of(void *ctx) { return (sim_t *)ctx; }

/* Default modelled costs (stowage/sim.h, ../shared/notes/h200-costs.md). */
static const uint64_t h200_cost_ns[STOW_SIM_CALL_KINDS] = {
    [STOW_SIM_RESERVE] = 55000,     [STOW_SIM_RELEASE] = 50000,
    [STOW_SIM_MEM_INFO] = 3900,     [STOW_SIM_SYNCHRONIZE] = 10000,
    [STOW_SIM_EVENT_RECORD] = 157,  [STOW_SIM_EVENT_QUERY] = 130,
    [STOW_SIM_EVENT_DESTROY] = 126, [STOW_SIM_VA_RESERVE] = 16000,
    [STOW_SIM_VA_RELEASE] = 16000,  [STOW_SIM_PHYS_CREATE] = 9800,
    [STOW_SIM_PHYS_RELEASE] = 9400, [STOW_SIM_MAP] = 24000,
    [STOW_SIM_UNMAP] = 15000,       [STOW_SIM_SCRUB] = 2000,
    [STOW_SIM_EVENT_SYNCHRONIZE] = 10000,
};

/* What each MiB beyond the first 2 costs, fitted to the same notes: cudaMalloc
 * 55 -> 242 us and cudaFree 50 -> 610 us at 1 GiB; cuMemCreate 9.8 -> 16.7 us,
 * cuMemRelease 9.4 -> 179 us, cuMemMap + cuMemSetAccess 24 -> 41 us and
 * cuMemUnmap 15 -> 23 us at 512 MiB. Large physical handles are cheap per byte
 * but not free: releasing one of 512 MiB costs what 18 of 2 MiB do. */
static const uint64_t h200_cost_per_mib_ns[STOW_SIM_CALL_KINDS] = {
    [STOW_SIM_RESERVE] = 183,     [STOW_SIM_RELEASE] = 548,  [STOW_SIM_PHYS_CREATE] = 14,
    [STOW_SIM_PHYS_RELEASE] = 332, [STOW_SIM_MAP] = 33,      [STOW_SIM_UNMAP] = 16,
};

#define SIM_COST_FLAT_BYTES ((size_t)2 << 20)

/* The modelled cost of one call of `kind` over size_bytes. Lock held. */
static uint64_t call_cost(const sim_t *s, stow_sim_call_t kind, size_t size_bytes)
{
    uint64_t ns = s->cost_ns[kind];
    if (size_bytes > SIM_COST_FLAT_BYTES)
        ns += s->cost_per_mib_ns[kind] * (uint64_t)((size_bytes - SIM_COST_FLAT_BYTES) >> 20);
    return ns;
}

static uint64_t splitmix64(uint64_t *state)
{
    uint64_t z = (*state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static stow_status_t default_failure(stow_sim_call_t kind)
{
    return (kind == STOW_SIM_RESERVE || kind == STOW_SIM_PHYS_CREATE) ? STOW_ENOMEM
                                                                       : STOW_EBACKEND;
}

/* Counts a call over size_bytes (0: a call without a size) and decides whether
 * an injected fault fires. Lock held. */
static stow_status_t sim_enter_sized(sim_t *s, stow_sim_call_t kind, size_t size_bytes)
{
    s->counters.calls[kind]++;
    s->counters.modelled_ns += call_cost(s, kind, size_bytes);
    stow_status_t st = STOW_OK;
    if (s->fail_countdown[kind] && --s->fail_countdown[kind] == 0)
        st = s->fail_status[kind];
    else if (s->fail_one_in[kind] && splitmix64(&s->rng[kind]) % s->fail_one_in[kind] == 0)
        st = default_failure(kind);
    if (st != STOW_OK)
        s->counters.failures[kind]++;
    return st;
}

static stow_status_t sim_enter(sim_t *s, stow_sim_call_t kind)
{
    return sim_enter_sized(s, kind, 0);
}

static stow_status_t sim_fail(sim_t *s, stow_sim_call_t kind, stow_status_t st)
{
    s->counters.failures[kind]++;
    return st;
}

static bool capacity_allows(const sim_t *s, size_t size_bytes)
{
    return size_bytes <= s->config.capacity_bytes &&
           s->counters.reserved_bytes <= s->config.capacity_bytes - size_bytes;
}

static void add_reserved(sim_t *s, size_t size_bytes)
{
    s->counters.reserved_bytes += size_bytes;
    if (s->counters.reserved_bytes > s->counters.reserved_bytes_peak)
        s->counters.reserved_bytes_peak = s->counters.reserved_bytes;
}

static stow_status_t sim_reserve(void *ctx, size_t size_bytes, stow_stream_t stream, void **out)
{
    (void)stream;
    sim_t *s = sim_of(ctx);
    pthread_mutex_lock(&s->lock);
    stow_status_t st = sim_enter_sized(s, STOW_SIM_RESERVE, size_bytes);
    if (st == STOW_OK && (size_bytes == 0 || size_bytes % s->config.granularity_bytes))
        st = sim_fail(s, STOW_SIM_RESERVE, STOW_EINVAL);
    if (st == STOW_OK && !capacity_allows(s, size_bytes))
        st = sim_fail(s, STOW_SIM_RESERVE, STOW_ENOMEM);
    if (st == STOW_OK)
        st = stow__ptr_map_reserve_one(&s->reservations);
    uintptr_t addr = 0;
    if (st == STOW_OK && s->config.host_backed) {
        void *p = s->config.host_alloc
                      ? s->config.host_alloc(size_bytes, 4096, s->config.host_arg)
                      : aligned_alloc(4096, size_bytes);
        if (!p)
            st = sim_fail(s, STOW_SIM_RESERVE, STOW_ENOMEM);
        addr = (uintptr_t)p;
    } else if (st == STOW_OK) {
        addr = s->next_addr;
        s->next_addr += size_bytes;
    }
    if (st == STOW_OK) {
        stow__ptr_map_put(&s->reservations, addr, (void *)(uintptr_t)size_bytes);
        add_reserved(s, size_bytes);
        s->counters.live_reservations++;
        *out = (void *)addr;
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

static stow_status_t sim_release(void *ctx, void *ptr, size_t size_bytes)
{
    sim_t *s = sim_of(ctx);
    pthread_mutex_lock(&s->lock);
    stow_status_t st = sim_enter_sized(s, STOW_SIM_RELEASE, size_bytes);
    /* A release of a pair reserve never returned is a pool bug: report it
     * rather than corrupting the capacity books. */
    if (st == STOW_OK &&
        (uintptr_t)stow__ptr_map_get(&s->reservations, (uintptr_t)ptr) != size_bytes)
        st = sim_fail(s, STOW_SIM_RELEASE, STOW_EINVAL);
    if (st == STOW_OK) {
        stow__ptr_map_remove(&s->reservations, (uintptr_t)ptr);
        s->counters.reserved_bytes -= size_bytes;
        s->counters.live_reservations--;
        if (s->config.host_backed) {
            if (s->config.host_free)
                s->config.host_free(ptr, size_bytes, s->config.host_arg);
            else
                free(ptr);
        }
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

static stow_status_t sim_mem_info(void *ctx, size_t *free_bytes, size_t *total_bytes)
{
    sim_t *s = sim_of(ctx);
    pthread_mutex_lock(&s->lock);
    stow_status_t st = sim_enter(s, STOW_SIM_MEM_INFO);
    if (st == STOW_OK) {
        size_t used = (size_t)s->counters.reserved_bytes;
        *total_bytes = s->config.capacity_bytes;
        *free_bytes = used < s->config.capacity_bytes ? s->config.capacity_bytes - used : 0;
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* Completes the live events on `stream` (every stream: all_streams) recorded
 * at or before sequence number seq_upto. */
static void complete_events_before(sim_t *s, stow_stream_t stream, bool all_streams,
                                   uint64_t seq_upto)
{
    for (uint32_t i = 0; i < s->event_count; i++) {
        sim_event_t *e = &s->events[i];
        if (e->live && !e->done && (all_streams || e->stream == stream) && e->seq <= seq_upto) {
            e->done = true;
            s->counters.pending_events--;
        }
    }
}

static void complete_events(sim_t *s, stow_stream_t stream, bool all_streams)
{
    complete_events_before(s, stream, all_streams, UINT64_MAX);
}

static stow_status_t sim_synchronize(void *ctx)
{
    sim_t *s = sim_of(ctx);
    pthread_mutex_lock(&s->lock);
    stow_status_t st = sim_enter(s, STOW_SIM_SYNCHRONIZE);
    if (st == STOW_OK)
        complete_events(s, NULL, true);
    pthread_mutex_unlock(&s->lock);
    return st;
}

static sim_event_t *event_of(sim_t *s, stow_event_t ev)
{
    uintptr_t i = (uintptr_t)ev;
    if (i == 0 || i > s->event_count || !s->events[i - 1].live)
        return NULL;
    return &s->events[i - 1];
}

static stow_status_t sim_event_record(void *ctx, stow_stream_t stream, stow_event_t *out)
{
    sim_t *s = sim_of(ctx);
    pthread_mutex_lock(&s->lock);
    stow_status_t st = sim_enter(s, STOW_SIM_EVENT_RECORD);
    if (st == STOW_OK && !s->event_free_head && s->event_count == s->event_capacity) {
        uint32_t cap = s->event_capacity ? s->event_capacity * 2 : 64;
        sim_event_t *grown = realloc(s->events, cap * sizeof *grown);
        if (!grown)
            st = sim_fail(s, STOW_SIM_EVENT_RECORD, STOW_EHOSTMEM);
        else {
            s->events = grown;
            s->event_capacity = cap;
        }
    }
    if (st == STOW_OK) {
        uint32_t i;
        if (s->event_free_head) {
            i = s->event_free_head - 1;
            s->event_free_head = s->events[i].next_free;
        } else {
            i = s->event_count++;
        }
        sim_event_t *e = &s->events[i];
        e->stream = stream;
        e->seq = ++s->event_seq;
        e->live = true;
        e->next_free = 0;
        e->done = !s->config.manual_events;
        if (!e->done)
            s->counters.pending_events++;
        *out = (stow_event_t)(uintptr_t)(i + 1);
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

static stow_status_t sim_event_query(void *ctx, stow_event_t ev, bool *done)
{
    sim_t *s = sim_of(ctx);
    pthread_mutex_lock(&s->lock);
    stow_status_t st = sim_enter(s, STOW_SIM_EVENT_QUERY);
    sim_event_t *e = event_of(s, ev);
    if (st == STOW_OK && !e)
        st = sim_fail(s, STOW_SIM_EVENT_QUERY, STOW_EINVAL);
    if (st == STOW_OK)
        *done = e->done;
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* The event completes, and with it every event recorded before it on its
 * stream (stream order); later ones and other streams' stay pending. */
static stow_status_t sim_event_synchronize(void *ctx, stow_event_t ev)
{
    sim_t *s = sim_of(ctx);
    pthread_mutex_lock(&s->lock);
    stow_status_t st = sim_enter(s, STOW_SIM_EVENT_SYNCHRONIZE);
    const sim_event_t *e = event_of(s, ev);
    if (st == STOW_OK && !e)
        st = sim_fail(s, STOW_SIM_EVENT_SYNCHRONIZE, STOW_EINVAL);
    if (st == STOW_OK)
        complete_events_before(s, e->stream, false, e->seq);
    pthread_mutex_unlock(&s->lock);
    return st;
}

static stow_status_t sim_event_destroy(void *ctx, stow_event_t ev)
{
    sim_t *s = sim_of(ctx);
    pthread_mutex_lock(&s->lock);
    stow_status_t st = sim_enter(s, STOW_SIM_EVENT_DESTROY);
    sim_event_t *e = event_of(s, ev);
    if (!e && st == STOW_OK)
        st = sim_fail(s, STOW_SIM_EVENT_DESTROY, STOW_EINVAL);
    else if (e) {
        /* Destroying always succeeds in effect (cuEventDestroy does not wait),
         * even when a fault is injected, so nothing leaks in either case. */
        if (!e->done)
            s->counters.pending_events--;
        e->live = false;
        e->next_free = s->event_free_head;
        s->event_free_head = (uint32_t)((uintptr_t)ev);
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

static stow_status_t sim_va_reserve(void *ctx, size_t size_bytes, void **out)
{
    sim_t *s = sim_of(ctx);
    pthread_mutex_lock(&s->lock);
    stow_status_t st = sim_enter(s, STOW_SIM_VA_RESERVE);
    if (st == STOW_OK && (size_bytes == 0 || size_bytes % s->config.granularity_bytes))
        st = sim_fail(s, STOW_SIM_VA_RESERVE, STOW_EINVAL);
    if (st == STOW_OK)
        st = stow__ptr_map_reserve_one(&s->va_ranges);
    if (st == STOW_OK) {
        uintptr_t va = s->next_va;
        s->next_va += size_bytes;
        stow__ptr_map_put(&s->va_ranges, va, (void *)(uintptr_t)size_bytes);
        *out = (void *)va;
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

static stow_status_t sim_va_release(void *ctx, void *va, size_t size_bytes)
{
    sim_t *s = sim_of(ctx);
    pthread_mutex_lock(&s->lock);
    stow_status_t st = sim_enter(s, STOW_SIM_VA_RELEASE);
    if (st == STOW_OK &&
        (uintptr_t)stow__ptr_map_get(&s->va_ranges, (uintptr_t)va) != size_bytes)
        st = sim_fail(s, STOW_SIM_VA_RELEASE, STOW_EINVAL);
    if (st == STOW_OK)
        stow__ptr_map_remove(&s->va_ranges, (uintptr_t)va);
    pthread_mutex_unlock(&s->lock);
    return st;
}

static stow_status_t sim_phys_create(void *ctx, size_t size_bytes, stow_phys_t *out)
{
    sim_t *s = sim_of(ctx);
    pthread_mutex_lock(&s->lock);
    stow_status_t st = sim_enter_sized(s, STOW_SIM_PHYS_CREATE, size_bytes);
    if (st == STOW_OK && (size_bytes == 0 || size_bytes % s->config.granularity_bytes))
        st = sim_fail(s, STOW_SIM_PHYS_CREATE, STOW_EINVAL);
    if (st == STOW_OK && !capacity_allows(s, size_bytes))
        st = sim_fail(s, STOW_SIM_PHYS_CREATE, STOW_ENOMEM);
    if (st == STOW_OK)
        st = stow__ptr_map_reserve_one(&s->phys);
    if (st == STOW_OK) {
        stow_phys_t h = ++s->next_phys;
        stow__ptr_map_put(&s->phys, (uintptr_t)h, (void *)(uintptr_t)size_bytes);
        add_reserved(s, size_bytes);
        *out = h;
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

static stow_status_t sim_phys_release(void *ctx, stow_phys_t handle, size_t size_bytes)
{
    sim_t *s = sim_of(ctx);
    pthread_mutex_lock(&s->lock);
    stow_status_t st = sim_enter_sized(s, STOW_SIM_PHYS_RELEASE, size_bytes);
    if (st == STOW_OK &&
        (uintptr_t)stow__ptr_map_get(&s->phys, (uintptr_t)handle) != size_bytes)
        st = sim_fail(s, STOW_SIM_PHYS_RELEASE, STOW_EINVAL);
    if (st == STOW_OK) {
        stow__ptr_map_remove(&s->phys, (uintptr_t)handle);
        s->counters.reserved_bytes -= size_bytes;
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

static stow_status_t sim_map(void *ctx, void *va, size_t size_bytes, stow_phys_t handle)
{
    sim_t *s = sim_of(ctx);
    pthread_mutex_lock(&s->lock);
    stow_status_t st = sim_enter_sized(s, STOW_SIM_MAP, size_bytes);
    if (st == STOW_OK &&
        ((uintptr_t)stow__ptr_map_get(&s->phys, (uintptr_t)handle) != size_bytes ||
         stow__ptr_map_get(&s->mappings, (uintptr_t)va)))
        st = sim_fail(s, STOW_SIM_MAP, STOW_EINVAL);
    if (st == STOW_OK)
        st = stow__ptr_map_reserve_one(&s->mappings);
    if (st == STOW_OK)
        stow__ptr_map_put(&s->mappings, (uintptr_t)va, (void *)(uintptr_t)handle);
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* Unmaps one whole mapping, as cuMemUnmap must (a part of one is refused). */
static stow_status_t sim_unmap(void *ctx, void *va, size_t size_bytes)
{
    sim_t *s = sim_of(ctx);
    pthread_mutex_lock(&s->lock);
    stow_status_t st = sim_enter_sized(s, STOW_SIM_UNMAP, size_bytes);
    stow_phys_t h = (stow_phys_t)(uintptr_t)stow__ptr_map_get(&s->mappings, (uintptr_t)va);
    /* (s->phys holds the handles not released: one released while mapped is not there.) */
    size_t handle_bytes = h ? (size_t)(uintptr_t)stow__ptr_map_get(&s->phys, (uintptr_t)h) : 0;
    if (st == STOW_OK && (!h || (handle_bytes && handle_bytes != size_bytes) ||
                          !stow__ptr_map_remove(&s->mappings, (uintptr_t)va)))
        st = sim_fail(s, STOW_SIM_UNMAP, STOW_EINVAL);
    pthread_mutex_unlock(&s->lock);
    return st;
}

static stow_status_t sim_scrub(void *ctx, void *ptr, size_t size_bytes, stow_stream_t stream)
{
    (void)stream; /* the simulated device runs everything at once */
    sim_t *s = sim_of(ctx);
    pthread_mutex_lock(&s->lock);
    stow_status_t st = sim_enter(s, STOW_SIM_SCRUB);
    pthread_mutex_unlock(&s->lock);
    if (st == STOW_OK && s->config.host_backed)
        memset(ptr, 0, size_bytes);
    return st;
}

void stow_sim_config_default(stow_sim_config_t *config)
{
    memset(config, 0, sizeof *config);
}

stow_status_t stow_sim_create(const stow_sim_config_t *config, stow_backend_t **out)
{
    if (!out)
        return STOW_EINVAL;
    stow_sim_config_t cfg;
    if (config)
        cfg = *config;
    else
        stow_sim_config_default(&cfg);
    if (!cfg.capacity_bytes)
        cfg.capacity_bytes = SIM_DEFAULT_CAPACITY;
    if (!cfg.granularity_bytes)
        cfg.granularity_bytes = SIM_DEFAULT_GRANULARITY;
    if (cfg.granularity_bytes & (cfg.granularity_bytes - 1) ||
        cfg.granularity_bytes < STOW_MIN_BLOCK_BYTES || (cfg.host_alloc == NULL) != (cfg.host_free == NULL))
        return STOW_EINVAL;
    sim_t *s = calloc(1, sizeof *s);
    if (!s)
        return STOW_EHOSTMEM;
    if (stow__ptr_map_init(&s->reservations) || stow__ptr_map_init(&s->va_ranges) ||
        stow__ptr_map_init(&s->phys) || stow__ptr_map_init(&s->mappings)) {
        stow__ptr_map_destroy(&s->reservations);
        stow__ptr_map_destroy(&s->va_ranges);
        stow__ptr_map_destroy(&s->phys);
        stow__ptr_map_destroy(&s->mappings);
        free(s);
        return STOW_EHOSTMEM;
    }
    pthread_mutex_init(&s->lock, NULL);
    s->config = cfg;
    memcpy(s->cost_ns, h200_cost_ns, sizeof s->cost_ns);
    memcpy(s->cost_per_mib_ns, h200_cost_per_mib_ns, sizeof s->cost_per_mib_ns);
    s->next_addr = SIM_ADDR_BASE;
    s->next_va = SIM_VA_BASE;
    stow_backend_t *b = &s->backend;
    b->abi_version = STOW_BACKEND_ABI;
    b->name = cfg.host_backed ? "sim-host" : "sim";
    b->ctx = s;
    b->granularity_bytes = cfg.granularity_bytes;
    b->reserve = sim_reserve;
    b->release = sim_release;
    b->mem_info = sim_mem_info;
    b->synchronize = sim_synchronize;
    b->event_record = sim_event_record;
    b->event_query = sim_event_query;
    b->event_destroy = sim_event_destroy;
    b->event_synchronize = sim_event_synchronize;
    b->va_reserve = sim_va_reserve;
    b->va_release = sim_va_release;
    b->phys_create = sim_phys_create;
    b->phys_release = sim_phys_release;
    b->map = sim_map;
    b->unmap = sim_unmap;
    b->scrub = sim_scrub;
    *out = b;
    return STOW_OK;
}

stow_status_t stow_sim_destroy(stow_backend_t *backend)
{
    if (!backend)
        return STOW_OK;
    sim_t *s = sim_of(backend->ctx);
    stow_status_t st = s->counters.live_reservations || s->phys.count ? STOW_EBUSY : STOW_OK;
    if (s->config.host_backed) {
        for (size_t i = 0; i < s->reservations.capacity; i++) {
            uintptr_t addr = s->reservations.slots[i].key;
            if (!addr)
                continue;
            size_t size = (size_t)(uintptr_t)s->reservations.slots[i].value;
            if (s->config.host_free)
                s->config.host_free((void *)addr, size, s->config.host_arg);
            else
                free((void *)addr);
        }
    }
    stow__ptr_map_destroy(&s->reservations);
    stow__ptr_map_destroy(&s->va_ranges);
    stow__ptr_map_destroy(&s->phys);
    stow__ptr_map_destroy(&s->mappings);
    free(s->events);
    pthread_mutex_destroy(&s->lock);
    free(s);
    return st;
}

const char *stow_sim_call_name(stow_sim_call_t kind)
{
    switch (kind) {
#define SIM_CALL_NAME_(up, low) \
    case STOW_SIM_##up:         \
        return #low;
        STOW_SIM_CALL_MAP(SIM_CALL_NAME_)
#undef SIM_CALL_NAME_
    default:
        return "unknown";
    }
}

void stow_sim_counters(stow_backend_t *backend, stow_sim_counters_t *out)
{
    sim_t *s = sim_of(backend->ctx);
    pthread_mutex_lock(&s->lock);
    *out = s->counters;
    pthread_mutex_unlock(&s->lock);
}

void stow_sim_fail_nth(stow_backend_t *backend, stow_sim_call_t kind, uint64_t n,
                       stow_status_t status)
{
    if ((unsigned)kind >= STOW_SIM_CALL_KINDS)
        return;
    sim_t *s = sim_of(backend->ctx);
    pthread_mutex_lock(&s->lock);
    s->fail_countdown[kind] = n;
    s->fail_status[kind] = status == STOW_OK ? default_failure(kind) : status;
    pthread_mutex_unlock(&s->lock);
}

void stow_sim_fail_random(stow_backend_t *backend, stow_sim_call_t kind, uint32_t one_in,
                          uint64_t seed)
{
    if ((unsigned)kind >= STOW_SIM_CALL_KINDS)
        return;
    sim_t *s = sim_of(backend->ctx);
    pthread_mutex_lock(&s->lock);
    s->fail_one_in[kind] = one_in;
    s->rng[kind] = seed;
    pthread_mutex_unlock(&s->lock);
}

void stow_sim_set_call_cost(stow_backend_t *backend, stow_sim_call_t kind, uint64_t cost_ns)
{
    if ((unsigned)kind >= STOW_SIM_CALL_KINDS)
        return;
    sim_t *s = sim_of(backend->ctx);
    pthread_mutex_lock(&s->lock);
    s->cost_ns[kind] = cost_ns;
    s->cost_per_mib_ns[kind] = 0;
    pthread_mutex_unlock(&s->lock);
}

uint64_t stow_sim_call_cost(stow_backend_t *backend, stow_sim_call_t kind, size_t size_bytes)
{
    if ((unsigned)kind >= STOW_SIM_CALL_KINDS)
        return 0;
    sim_t *s = sim_of(backend->ctx);
    pthread_mutex_lock(&s->lock);
    uint64_t ns = call_cost(s, kind, size_bytes);
    pthread_mutex_unlock(&s->lock);
    return ns;
}

void stow_sim_complete_stream(stow_backend_t *backend, stow_stream_t stream)
{
    sim_t *s = sim_of(backend->ctx);
    pthread_mutex_lock(&s->lock);
    complete_events(s, stream, false);
    pthread_mutex_unlock(&s->lock);
}

void stow_sim_set_capacity(stow_backend_t *backend, size_t capacity_bytes)
{
    sim_t *s = sim_of(backend->ctx);
    pthread_mutex_lock(&s->lock);
    s->config.capacity_bytes = capacity_bytes ? capacity_bytes : SIM_DEFAULT_CAPACITY;
    pthread_mutex_unlock(&s->lock);
}
