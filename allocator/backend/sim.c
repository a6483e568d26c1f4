/*
 * allocator/backend/sim.c: the simulated device (stowage/sim.h).
 *
 * Fake addresses from a non-zero base, bumped and never reused (64-bit space
 * is plentiful, and a stale pointer can then never alias a new block); or, in
 * host-backed mode, real host memory at those same addresses where the host
 * lets us map there, so tests can write patterns into blocks and read them
 * back. A capacity makes out-of-memory paths run on a CPU; every call is
 * counted; faults are injected per call kind; events complete at once, or when
 * a test says their stream finished or the pool waits on one
 * (event_synchronize). Deterministic: no clocks, no global state.
 *
 * Page mapping follows the CUDA driver's rules in both modes: a handle maps
 * whole, at a granule boundary inside a reserved range, over no mapping; an
 * unmap covers whole mappings; a range is released with nothing mapped in it.
 * A call that breaks one is refused (STOW_EINVAL) and changes nothing. In
 * host-backed mode a reserved range is inaccessible address space, a handle
 * is a piece of one sparse memfd per device, map makes that piece appear at
 * the address (MAP_SHARED, so every mapping of a handle shows the same bytes)
 * and unmap makes the range inaccessible again: a touch of an unmapped
 * granule faults, as on a GPU.
 *
 * Queued work (stow_sim_launch, and scrubs with manual events) runs in stream
 * order with the device lock held, when its stream's work completes: so work
 * that the pool lets run late writes where it lands then.
 */
#include "allocator/ptr_map.h"
#include "allocator/types.h"
#include "stowage/sim.h"

#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define SIM_DEFAULT_CAPACITY ((size_t)1 << 46)
#define SIM_DEFAULT_GRANULARITY ((size_t)2 << 20)
/* Reservations are handed out downward from SIM_VA_BASE to SIM_ADDR_BASE, one
 * below the last, as cudaMalloc's addresses mostly come (docs/pytorch_model.md,
 * and the pytorch model's fake addresses): best fit breaks ties between free
 * blocks of one size by address, so the order decides which one a pool takes. */
#define SIM_ADDR_BASE ((uintptr_t)0x100000000000ull) /* reservations (lowest) */
#define SIM_VA_BASE ((uintptr_t)0x400000000000ull)   /* virtual ranges */

typedef struct sim_event {
    stow_stream_t stream;
    uint64_t seq;       /* order of recording (stream order within a stream) */
    uint32_t next_free; /* free-list link (index + 1), 0 = end */
    bool done;
    bool live;
} sim_event_t;

/* Work queued on a stream: a test's function, or a scrub (fn NULL). */
typedef struct sim_work {
    struct sim_work *next;
    uint64_t seq; /* shares the events' order */
    stow_sim_work_fn_t fn;
    void *arg;
    void *scrub_ptr;
    size_t scrub_bytes;
} sim_work_t;

typedef struct sim_queue {
    stow_stream_t stream;
    sim_work_t *head, *tail;
} sim_queue_t;

/* A physical handle. Released while mapped, it lives on (released) until its
 * last unmap, as the driver keeps such memory. */
typedef struct sim_handle {
    size_t size_bytes;
    uint64_t file_offset; /* host-backed: its memory in the device file */
    uint32_t maps;        /* live mappings of it */
    bool released;
} sim_handle_t;

/* A reserved virtual range; ranges are kept sorted by base. */
typedef struct sim_range {
    uintptr_t base;
    size_t size_bytes;
    size_t mapped_granules;
} sim_range_t;

/* A free piece of the device file (host-backed handles). */
typedef struct sim_extent {
    uint64_t offset, bytes;
} sim_extent_t;

typedef struct sim {
    stow_backend_t backend; /* first: the handle is a pointer to it */
    pthread_mutex_t lock;
    stow_sim_config_t config;
    uintptr_t next_addr; /* the last reservation's address: the next goes below */
    uintptr_t next_va;
    stow_phys_t next_phys;
    stow_ptr_map_t reservations; /* addr -> size */
    stow_ptr_map_t phys;         /* handle -> sim_handle_t (released ones until unmapped) */
    /* granule va -> handle << 1, | 1 on a mapping's first granule */
    stow_ptr_map_t mappings;
    sim_range_t *ranges;
    size_t range_count, range_capacity;
    uint64_t live_handles; /* created, not released */
    stow_sim_counters_t counters;
    uint64_t fail_countdown[STOW_SIM_CALL_KINDS];
    stow_status_t fail_status[STOW_SIM_CALL_KINDS];
    uint32_t fail_one_in[STOW_SIM_CALL_KINDS];
    uint64_t cost_ns[STOW_SIM_CALL_KINDS];      /* modelled cost of a call of up to 2 MiB */
    uint64_t cost_per_mib_ns[STOW_SIM_CALL_KINDS]; /* and of each MiB beyond */
    uint64_t rng[STOW_SIM_CALL_KINDS];
    sim_event_t *events;
    uint32_t event_count, event_capacity, event_free_head;
    uint64_t event_seq; /* events and work queued so far: the next one's order */
    sim_queue_t *queues;
    size_t queue_count, queue_capacity;
    /* host-backed page mapping: the device file and its free pieces */
    uintptr_t page_bytes; /* the host's */
    int device_fd; /* -1 until the first handle */
    uint64_t file_end, file_bytes; /* past the last piece in use; the file's size */
    sim_extent_t *extents;
    size_t extent_count, extent_capacity;
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

/* ---- host memory (host-backed mode) ---- */

/* Fresh anonymous memory of size_bytes (a multiple of align_bytes) at hint,
 * the address the fake mode would give, when the host puts it there (Linux
 * does when that range is free: both modes then hand out the same addresses);
 * else wherever the host puts it, aligned to align_bytes. A hint, not
 * MAP_FIXED_NOREPLACE: ThreadSanitizer turns an address outside its
 * application ranges into 0, which that flag would then take literally.
 * NULL when the host refuses. */
static void *host_map_fresh(uintptr_t hint, size_t size_bytes, size_t align_bytes, int prot)
{
    int flags = MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE;
    void *p = mmap((void *)hint, size_bytes, prot, flags, -1, 0);
    if (p != MAP_FAILED && (uintptr_t)p % align_bytes == 0)
        return p;
    if (p != MAP_FAILED)
        munmap(p, size_bytes);
    if (size_bytes > SIZE_MAX - align_bytes)
        return NULL;
    size_t span = size_bytes + align_bytes;
    p = mmap(NULL, span, prot, flags, -1, 0);
    if (p == MAP_FAILED)
        return NULL;
    uintptr_t lo = (uintptr_t)p, base = (lo + align_bytes - 1) & ~(uintptr_t)(align_bytes - 1);
    if (base > lo)
        munmap(p, base - lo);
    if (lo + span > base + size_bytes)
        munmap((void *)(base + size_bytes), lo + span - (base + size_bytes));
    return (void *)base;
}

/* Makes [va, va+size_bytes) inaccessible again, the address space kept. */
static bool host_make_inaccessible(uintptr_t va, size_t size_bytes)
{
    return mmap((void *)va, size_bytes, PROT_NONE,
                MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1,
                0) != MAP_FAILED;
}

/* The device file, created at the first host-backed handle. */
static bool device_file_open(sim_t *s)
{
    if (s->device_fd >= 0)
        return true;
    s->device_fd = memfd_create("stowage-sim-device", MFD_CLOEXEC);
    return s->device_fd >= 0;
}

static bool extents_insert(sim_t *s, size_t at, sim_extent_t e)
{
    if (s->extent_count == s->extent_capacity) {
        size_t cap = s->extent_capacity ? 2 * s->extent_capacity : 16;
        sim_extent_t *grown = realloc(s->extents, cap * sizeof *grown);
        if (!grown)
            return false;
        s->extents = grown;
        s->extent_capacity = cap;
    }
    memmove(&s->extents[at + 1], &s->extents[at], (s->extent_count - at) * sizeof *s->extents);
    s->extents[at] = e;
    s->extent_count++;
    return true;
}

static void extents_remove(sim_t *s, size_t at)
{
    memmove(&s->extents[at], &s->extents[at + 1],
            (s->extent_count - at - 1) * sizeof *s->extents);
    s->extent_count--;
}

/* First fit of bytes in the device file (growing it when none fits); false
 * when the host refuses. */
static bool file_take(sim_t *s, uint64_t bytes, uint64_t *offset)
{
    for (size_t i = 0; i < s->extent_count; i++) {
        sim_extent_t *e = &s->extents[i];
        if (e->bytes < bytes)
            continue;
        *offset = e->offset;
        e->offset += bytes;
        e->bytes -= bytes;
        if (!e->bytes)
            extents_remove(s, i);
        return true;
    }
    if (s->file_end + bytes > s->file_bytes) {
        uint64_t size = s->file_end + bytes;
        if (size < 2 * s->file_bytes)
            size = 2 * s->file_bytes;
        if (ftruncate(s->device_fd, (off_t)size) != 0)
            return false;
        s->file_bytes = size;
    }
    *offset = s->file_end;
    s->file_end += bytes;
    return true;
}

/* Gives a piece back: its pages go back to the host (reading zero if taken
 * again), and it merges with free neighbours. */
static void file_give(sim_t *s, uint64_t offset, uint64_t bytes)
{
    (void)fallocate(s->device_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)offset,
                    (off_t)bytes);
    size_t i = 0;
    while (i < s->extent_count && s->extents[i].offset < offset)
        i++;
    if (i > 0 && s->extents[i - 1].offset + s->extents[i - 1].bytes == offset) {
        s->extents[i - 1].bytes += bytes;
        i--;
    } else if (!extents_insert(s, i, (sim_extent_t){offset, bytes})) {
        return; /* no room to remember it: the piece is lost to reuse, not to correctness */
    }
    sim_extent_t *e = &s->extents[i];
    if (i + 1 < s->extent_count && e->offset + e->bytes == s->extents[i + 1].offset) {
        e->bytes += s->extents[i + 1].bytes;
        extents_remove(s, i + 1);
    }
    if (e->offset + e->bytes == s->file_end) {
        s->file_end = e->offset;
        extents_remove(s, i);
    }
}

/* ---- queued work ---- */

static sim_queue_t *queue_of(sim_t *s, stow_stream_t stream, bool create)
{
    for (size_t i = 0; i < s->queue_count; i++)
        if (s->queues[i].stream == stream)
            return &s->queues[i];
    if (!create)
        return NULL;
    if (s->queue_count == s->queue_capacity) {
        size_t cap = s->queue_capacity ? 2 * s->queue_capacity : 8;
        sim_queue_t *grown = realloc(s->queues, cap * sizeof *grown);
        if (!grown)
            return NULL;
        s->queues = grown;
        s->queue_capacity = cap;
    }
    sim_queue_t *q = &s->queues[s->queue_count++];
    *q = (sim_queue_t){.stream = stream};
    return q;
}

static bool work_queue(sim_t *s, stow_stream_t stream, const sim_work_t *proto)
{
    sim_queue_t *q = queue_of(s, stream, true);
    sim_work_t *w = q ? malloc(sizeof *w) : NULL;
    if (!w)
        return false;
    *w = *proto;
    w->next = NULL;
    w->seq = ++s->event_seq;
    if (q->tail)
        q->tail->next = w;
    else
        q->head = w;
    q->tail = w;
    s->counters.queued_work++;
    return true;
}

static void host_zero(sim_t *s, uintptr_t lo, uintptr_t hi);

static void work_run(sim_t *s, const sim_work_t *w)
{
    if (w->fn)
        w->fn(w->arg);
    else
        host_zero(s, (uintptr_t)w->scrub_ptr, (uintptr_t)w->scrub_ptr + w->scrub_bytes);
}

/* Runs q's work queued at or before seq_upto, in order. */
static void queue_run_before(sim_t *s, sim_queue_t *q, uint64_t seq_upto)
{
    while (q->head && q->head->seq <= seq_upto) {
        sim_work_t *w = q->head;
        q->head = w->next;
        if (!q->head)
            q->tail = NULL;
        s->counters.queued_work--;
        work_run(s, w);
        free(w);
    }
}

/* ---- events ---- */

/* Completes the live events on `stream` (every stream: all_streams) recorded
 * at or before sequence number seq_upto, after running the work queued there
 * before them. */
static void complete_events_before(sim_t *s, stow_stream_t stream, bool all_streams,
                                   uint64_t seq_upto)
{
    for (size_t i = 0; i < s->queue_count; i++)
        if (all_streams || s->queues[i].stream == stream)
            queue_run_before(s, &s->queues[i], seq_upto);
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

/* Waits for every queued piece of work, as cuMemFree waits for the device:
 * each stream's work runs, in order. Events stay as the test left them (one
 * recorded before the work may now report late, never early), so that a pool
 * sees no event complete that it would not have seen without queued work. */
static void wait_for_work(sim_t *s)
{
    for (size_t i = 0; i < s->queue_count; i++)
        queue_run_before(s, &s->queues[i], UINT64_MAX);
}

/* ---- reservations ---- */

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

static void *host_reserve(sim_t *s, uintptr_t hint, size_t size_bytes)
{
    if (s->config.host_alloc)
        return s->config.host_alloc(size_bytes, 4096, s->config.host_arg);
    return host_map_fresh(hint, size_bytes, s->config.granularity_bytes, PROT_READ | PROT_WRITE);
}

static void host_release(sim_t *s, void *ptr, size_t size_bytes)
{
    if (s->config.host_free)
        s->config.host_free(ptr, size_bytes, s->config.host_arg);
    else
        munmap(ptr, size_bytes);
}

static stow_status_t sim_reserve(void *ctx, size_t size_bytes, stow_stream_t stream, void **out)
{
    (void)stream;
    sim_t *s = sim_of(ctx);
    pthread_mutex_lock(&s->lock);
    stow_status_t st = sim_enter_sized(s, STOW_SIM_RESERVE, size_bytes);
    if (st == STOW_OK && (size_bytes == 0 || size_bytes % s->config.granularity_bytes))
        st = sim_fail(s, STOW_SIM_RESERVE, STOW_EINVAL);
    /* Addresses are never reused: past the floor the device is out of them. */
    if (st == STOW_OK &&
        (!capacity_allows(s, size_bytes) || size_bytes > s->next_addr - SIM_ADDR_BASE))
        st = sim_fail(s, STOW_SIM_RESERVE, STOW_ENOMEM);
    if (st == STOW_OK)
        st = stow__ptr_map_reserve_one(&s->reservations);
    uintptr_t addr = st == STOW_OK ? s->next_addr - size_bytes : 0;
    if (st == STOW_OK && s->config.host_backed) {
        addr = (uintptr_t)host_reserve(s, addr, size_bytes);
        if (!addr)
            st = sim_fail(s, STOW_SIM_RESERVE, STOW_ENOMEM);
    }
    if (st == STOW_OK) {
        s->next_addr -= size_bytes;
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
        wait_for_work(s);
        stow__ptr_map_remove(&s->reservations, (uintptr_t)ptr);
        s->counters.reserved_bytes -= size_bytes;
        s->counters.live_reservations--;
        if (s->config.host_backed)
            host_release(s, ptr, size_bytes);
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
 * stream (stream order), after the work queued there before it ran; later
 * ones and other streams' stay pending. */
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

/* ---- virtual ranges ---- */

/* Index of the first range whose base is above va. */
static size_t range_after(const sim_t *s, uintptr_t va)
{
    size_t lo = 0, hi = s->range_count;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (s->ranges[mid].base <= va)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

/* The range holding [va, va+size_bytes) when va is on a granule boundary of
 * it and size_bytes whole granules; else NULL. */
static sim_range_t *range_holding(sim_t *s, uintptr_t va, size_t size_bytes)
{
    size_t i = range_after(s, va);
    if (i == 0 || size_bytes == 0 || size_bytes % s->config.granularity_bytes)
        return NULL;
    sim_range_t *r = &s->ranges[i - 1];
    size_t off = va - r->base;
    if (off % s->config.granularity_bytes || off >= r->size_bytes ||
        size_bytes > r->size_bytes - off)
        return NULL;
    return r;
}

static bool ranges_insert(sim_t *s, sim_range_t r)
{
    if (s->range_count == s->range_capacity) {
        size_t cap = s->range_capacity ? 2 * s->range_capacity : 8;
        sim_range_t *grown = realloc(s->ranges, cap * sizeof *grown);
        if (!grown)
            return false;
        s->ranges = grown;
        s->range_capacity = cap;
    }
    size_t at = range_after(s, r.base);
    memmove(&s->ranges[at + 1], &s->ranges[at], (s->range_count - at) * sizeof *s->ranges);
    s->ranges[at] = r;
    s->range_count++;
    return true;
}

static stow_status_t sim_va_reserve(void *ctx, size_t size_bytes, void **out)
{
    sim_t *s = sim_of(ctx);
    pthread_mutex_lock(&s->lock);
    stow_status_t st = sim_enter(s, STOW_SIM_VA_RESERVE);
    if (st == STOW_OK && (size_bytes == 0 || size_bytes % s->config.granularity_bytes))
        st = sim_fail(s, STOW_SIM_VA_RESERVE, STOW_EINVAL);
    uintptr_t va = s->next_va;
    if (st == STOW_OK && s->config.host_backed) {
        va = (uintptr_t)host_map_fresh(va, size_bytes, s->config.granularity_bytes, PROT_NONE);
        if (!va)
            st = sim_fail(s, STOW_SIM_VA_RESERVE, STOW_ENOMEM);
    }
    if (st == STOW_OK && !ranges_insert(s, (sim_range_t){va, size_bytes, 0})) {
        if (s->config.host_backed)
            munmap((void *)va, size_bytes);
        st = sim_fail(s, STOW_SIM_VA_RESERVE, STOW_EHOSTMEM);
    }
    if (st == STOW_OK) {
        s->next_va += size_bytes;
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
    size_t i = range_after(s, (uintptr_t)va);
    const sim_range_t *r = i ? &s->ranges[i - 1] : NULL;
    /* The exact pair va_reserve returned, with nothing mapped in it. */
    if (st == STOW_OK && (!r || r->base != (uintptr_t)va || r->size_bytes != size_bytes ||
                          r->mapped_granules))
        st = sim_fail(s, STOW_SIM_VA_RELEASE, STOW_EINVAL);
    if (st == STOW_OK) {
        if (s->config.host_backed)
            munmap(va, size_bytes);
        memmove(&s->ranges[i - 1], &s->ranges[i], (s->range_count - i) * sizeof *s->ranges);
        s->range_count--;
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* ---- physical handles ---- */

/* The handle behind h (a released one too, with any_state), or NULL. */
static sim_handle_t *handle_of(const sim_t *s, stow_phys_t h, bool any_state)
{
    sim_handle_t *rec = h ? stow__ptr_map_get(&s->phys, (uintptr_t)h) : NULL;
    return rec && (any_state || !rec->released) ? rec : NULL;
}

/* Forgets a handle that is released and unmapped; its memory goes back. */
static void handle_free(sim_t *s, stow_phys_t h, sim_handle_t *rec)
{
    if (s->config.host_backed)
        file_give(s, rec->file_offset, rec->size_bytes);
    stow__ptr_map_remove(&s->phys, (uintptr_t)h);
    free(rec);
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
    sim_handle_t *rec = NULL;
    if (st == STOW_OK && !(rec = calloc(1, sizeof *rec)))
        st = sim_fail(s, STOW_SIM_PHYS_CREATE, STOW_EHOSTMEM);
    if (st == STOW_OK && s->config.host_backed &&
        !(device_file_open(s) && file_take(s, size_bytes, &rec->file_offset))) {
        free(rec);
        st = sim_fail(s, STOW_SIM_PHYS_CREATE, STOW_ENOMEM);
    }
    if (st == STOW_OK) {
        stow_phys_t h = ++s->next_phys;
        rec->size_bytes = size_bytes;
        stow__ptr_map_put(&s->phys, (uintptr_t)h, rec);
        add_reserved(s, size_bytes);
        s->live_handles++;
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
    sim_handle_t *rec = handle_of(s, handle, false);
    if (st == STOW_OK && (!rec || rec->size_bytes != size_bytes))
        st = sim_fail(s, STOW_SIM_PHYS_RELEASE, STOW_EINVAL);
    if (st == STOW_OK) {
        s->counters.reserved_bytes -= size_bytes;
        s->live_handles--;
        rec->released = true;
        if (!rec->maps)
            handle_free(s, handle, rec);
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* ---- mapping ---- */

#define MAPPING_VALUE(h, first) ((void *)(uintptr_t)(((uint64_t)(h) << 1) | (first)))

static bool granules_unmapped(const sim_t *s, uintptr_t va, size_t size_bytes)
{
    for (size_t off = 0; off < size_bytes; off += s->config.granularity_bytes)
        if (stow__ptr_map_get(&s->mappings, va + off))
            return false;
    return true;
}

static void mapping_forget(sim_t *s, uintptr_t va, size_t size_bytes)
{
    for (size_t off = 0; off < size_bytes; off += s->config.granularity_bytes)
        stow__ptr_map_remove(&s->mappings, va + off);
}

static stow_status_t sim_map(void *ctx, void *va, size_t size_bytes, stow_phys_t handle)
{
    sim_t *s = sim_of(ctx);
    uintptr_t at = (uintptr_t)va;
    size_t g = 0;
    pthread_mutex_lock(&s->lock);
    stow_status_t st = sim_enter_sized(s, STOW_SIM_MAP, size_bytes);
    sim_handle_t *rec = handle_of(s, handle, false);
    sim_range_t *r = range_holding(s, at, size_bytes);
    /* The whole handle, at a granule of a reserved range, over no mapping. */
    if (st == STOW_OK &&
        (!rec || rec->size_bytes != size_bytes || !r || !granules_unmapped(s, at, size_bytes)))
        st = sim_fail(s, STOW_SIM_MAP, STOW_EINVAL);
    if (st == STOW_OK && s->config.host_backed &&
        mmap(va, size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, s->device_fd,
             (off_t)rec->file_offset) == MAP_FAILED)
        st = sim_fail(s, STOW_SIM_MAP, STOW_EBACKEND);
    for (size_t off = 0; st == STOW_OK && off < size_bytes; off += s->config.granularity_bytes) {
        if (stow__ptr_map_reserve_one(&s->mappings) != STOW_OK) {
            mapping_forget(s, at, off);
            if (s->config.host_backed)
                (void)host_make_inaccessible(at, size_bytes);
            st = sim_fail(s, STOW_SIM_MAP, STOW_EHOSTMEM);
            break;
        }
        stow__ptr_map_put(&s->mappings, at + off, MAPPING_VALUE(handle, off == 0));
        g++;
    }
    if (st == STOW_OK) {
        rec->maps++;
        r->mapped_granules += g;
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* Whether [va, va+size_bytes) is made of whole mappings. */
static bool whole_mappings(const sim_t *s, uintptr_t va, size_t size_bytes)
{
    for (size_t off = 0; off < size_bytes;) {
        uint64_t v = (uint64_t)(uintptr_t)stow__ptr_map_get(&s->mappings, va + off);
        const sim_handle_t *rec = (v & 1) ? handle_of(s, v >> 1, true) : NULL;
        if (!rec || rec->size_bytes > size_bytes - off)
            return false;
        off += rec->size_bytes;
    }
    return true;
}

static stow_status_t sim_unmap(void *ctx, void *va, size_t size_bytes)
{
    sim_t *s = sim_of(ctx);
    uintptr_t at = (uintptr_t)va;
    pthread_mutex_lock(&s->lock);
    stow_status_t st = sim_enter_sized(s, STOW_SIM_UNMAP, size_bytes);
    sim_range_t *r = range_holding(s, at, size_bytes);
    if (st == STOW_OK && (!r || !whole_mappings(s, at, size_bytes)))
        st = sim_fail(s, STOW_SIM_UNMAP, STOW_EINVAL);
    /* Not stream-ordered: queued work that touches the range later faults. */
    if (st == STOW_OK && s->config.host_backed && !host_make_inaccessible(at, size_bytes))
        st = sim_fail(s, STOW_SIM_UNMAP, STOW_EBACKEND);
    for (size_t off = 0; st == STOW_OK && off < size_bytes;) {
        uint64_t v = (uint64_t)(uintptr_t)stow__ptr_map_get(&s->mappings, at + off);
        stow_phys_t h = v >> 1;
        sim_handle_t *rec = handle_of(s, h, true);
        size_t bytes = rec->size_bytes;
        mapping_forget(s, at + off, bytes);
        r->mapped_granules -= bytes / s->config.granularity_bytes;
        if (--rec->maps == 0 && rec->released)
            handle_free(s, h, rec);
        off += bytes;
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

/* The file offset of the handle byte mapped at va, or false when no handle
 * is mapped there. */
static bool mapped_file_offset(const sim_t *s, uintptr_t va, uint64_t *offset)
{
    size_t g = s->config.granularity_bytes;
    uintptr_t at = va & ~(uintptr_t)(g - 1);
    uint64_t v = (uint64_t)(uintptr_t)stow__ptr_map_get(&s->mappings, at);
    if (!v)
        return false;
    while (!(v & 1)) { /* back to the mapping's first granule */
        at -= g;
        v = (uint64_t)(uintptr_t)stow__ptr_map_get(&s->mappings, at);
    }
    const sim_handle_t *rec = handle_of(s, v >> 1, true);
    *offset = rec->file_offset + (va - at);
    return true;
}

/* Zeroes [lo, hi) of host-backed memory as the device would, without writing
 * whole host pages: an anonymous reservation's are dropped (they read zero
 * again) and a handle's are punched out of the device file; the rest, and
 * memory the caller's host_alloc gave, is written (where nothing is mapped
 * that faults, as the device's access would). Lock held. */
static void host_zero(sim_t *s, uintptr_t lo, uintptr_t hi)
{
    uintptr_t page = s->page_bytes, plo = (lo + page - 1) & ~(page - 1), phi = hi & ~(page - 1);
    if (plo >= phi || s->config.host_alloc) {
        memset((void *)lo, 0, hi - lo);
        return;
    }
    memset((void *)lo, 0, plo - lo);
    memset((void *)phi, 0, hi - phi);
    if (!range_holding(s, plo & ~(uintptr_t)(s->config.granularity_bytes - 1),
                       s->config.granularity_bytes)) {
        (void)madvise((void *)plo, phi - plo, MADV_DONTNEED);
        return;
    }
    size_t g = s->config.granularity_bytes;
    for (uintptr_t at = plo; at < phi;) {
        uintptr_t stop = (at & ~(uintptr_t)(g - 1)) + g;
        if (stop > phi)
            stop = phi;
        uint64_t off;
        if (mapped_file_offset(s, at, &off))
            (void)fallocate(s->device_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)off,
                            (off_t)(stop - at));
        else
            memset((void *)at, 0, stop - at);
        at = stop;
    }
}

static stow_status_t sim_scrub(void *ctx, void *ptr, size_t size_bytes, stow_stream_t stream)
{
    sim_t *s = sim_of(ctx);
    pthread_mutex_lock(&s->lock);
    stow_status_t st = sim_enter(s, STOW_SIM_SCRUB);
    if (st == STOW_OK && s->config.host_backed) {
        /* With manual events the zeroing is work on its stream, done when the
         * stream's work before it is; otherwise the device runs it at once. */
        sim_work_t w = {.scrub_ptr = ptr, .scrub_bytes = size_bytes};
        if (!s->config.manual_events)
            work_run(s, &w);
        else if (!work_queue(s, stream, &w))
            st = sim_fail(s, STOW_SIM_SCRUB, STOW_EHOSTMEM);
    }
    pthread_mutex_unlock(&s->lock);
    return st;
}

void stow_sim_config_default(stow_sim_config_t *config)
{
    memset(config, 0, sizeof *config);
}

static void sim_free_state(sim_t *s)
{
    for (size_t i = 0; i < s->phys.capacity && s->phys.slots; i++)
        if (s->phys.slots[i].key)
            free(s->phys.slots[i].value);
    for (size_t i = 0; i < s->queue_count; i++)
        for (sim_work_t *w = s->queues[i].head, *next; w; w = next) {
            next = w->next;
            free(w);
        }
    stow__ptr_map_destroy(&s->reservations);
    stow__ptr_map_destroy(&s->phys);
    stow__ptr_map_destroy(&s->mappings);
    free(s->ranges);
    free(s->queues);
    free(s->extents);
    free(s->events);
    if (s->device_fd >= 0)
        close(s->device_fd);
    free(s);
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
    long page = sysconf(_SC_PAGESIZE);
    if (cfg.granularity_bytes & (cfg.granularity_bytes - 1) ||
        cfg.granularity_bytes < STOW_MIN_BLOCK_BYTES ||
        (cfg.host_alloc == NULL) != (cfg.host_free == NULL) ||
        (cfg.host_backed && (page <= 0 || cfg.granularity_bytes % (size_t)page)))
        return STOW_EINVAL;
    sim_t *s = calloc(1, sizeof *s);
    if (!s)
        return STOW_EHOSTMEM;
    s->device_fd = -1;
    if (stow__ptr_map_init(&s->reservations) || stow__ptr_map_init(&s->phys) ||
        stow__ptr_map_init(&s->mappings)) {
        sim_free_state(s);
        return STOW_EHOSTMEM;
    }
    pthread_mutex_init(&s->lock, NULL);
    s->config = cfg;
    s->page_bytes = (uintptr_t)page;
    memcpy(s->cost_ns, h200_cost_ns, sizeof s->cost_ns);
    memcpy(s->cost_per_mib_ns, h200_cost_per_mib_ns, sizeof s->cost_per_mib_ns);
    s->next_addr = SIM_VA_BASE;
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
    stow_status_t st = s->counters.live_reservations || s->live_handles ? STOW_EBUSY : STOW_OK;
    if (s->config.host_backed) {
        for (size_t i = 0; i < s->reservations.capacity; i++) {
            uintptr_t addr = s->reservations.slots[i].key;
            if (addr)
                host_release(s, (void *)addr,
                             (size_t)(uintptr_t)s->reservations.slots[i].value);
        }
        for (size_t i = 0; i < s->range_count; i++)
            munmap((void *)s->ranges[i].base, s->ranges[i].size_bytes);
    }
    pthread_mutex_destroy(&s->lock);
    sim_free_state(s);
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

stow_status_t stow_sim_launch(stow_backend_t *backend, stow_stream_t stream,
                              stow_sim_work_fn_t fn, void *arg)
{
    if (!backend || !fn)
        return STOW_EINVAL;
    sim_t *s = sim_of(backend->ctx);
    sim_work_t w = {.fn = fn, .arg = arg};
    stow_status_t st = STOW_OK;
    pthread_mutex_lock(&s->lock);
    if (!s->config.manual_events)
        work_run(s, &w);
    else if (!work_queue(s, stream, &w))
        st = STOW_EHOSTMEM;
    pthread_mutex_unlock(&s->lock);
    return st;
}
