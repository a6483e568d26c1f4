/*
 * tests/support/fake_cuda.c: a host emulation of the part of the CUDA driver
 * API that Stowage calls, built as build/fake_cuda/libcuda.so.1 so that the
 * CUDA backend (allocator/backend/cuda.c), the PyTorch entry points and the
 * GPU tests run, dlopen included, on a machine without a GPU.
 *
 * It is a strict driver, not a permissive stub: every call that breaks a rule
 * of the driver API returns the driver's error *and* counts as a violation
 * (fake_cuda_counters, tests/support/fake_cuda.h), which the tests require to
 * stay at zero. Rules checked: cuInit first; a current context for every call
 * that needs one (the retained primary context); cuMemFree of cuMemAlloc'ed
 * bases only; copies and memsets only into memory that is allocated, or
 * mapped with access set; cuMemAddressReserve / cuMemCreate / cuMemMap sizes,
 * offsets and addresses in whole granules; no mapping over a mapping;
 * cuMemUnmap of whole mappings; no cuMemAddressFree over live mappings; no
 * double release; known stream and event handles; the primary context
 * released no more often than retained.
 *
 * Memory is real host memory: cuMemAlloc is an anonymous mapping, and
 * physical handles (cuMemCreate) are pieces of one sparse memfd ("device
 * memory") that cuMemMap maps MAP_SHARED|MAP_FIXED into a PROT_NONE
 * reservation, inaccessible until cuMemSetAccess (as on a GPU, where touching
 * it before is an illegal address). So data written through one mapping reads
 * back through another mapping of the same handle, and unmapped memory faults.
 * Capacity is counted as the driver does: cuMemAlloc in 2 MiB pages,
 * cuMemCreate in granules; past FAKE_CUDA_TOTAL_MB both return
 * CUDA_ERROR_OUT_OF_MEMORY (not a violation).
 *
 * Stream order: work queued on a stream (cuMemcpyHtoDAsync, cuMemsetD8Async)
 * is done at once on the host but completes, as far as queries can tell, only
 * FAKE_CUDA_LAG ticks later; every cuEventQuery / cuStreamQuery is one tick.
 * So events recorded after queued work answer CUDA_ERROR_NOT_READY a few times
 * before they complete, and the pool's deferred-free path is exercised. The
 * granules such work touches stay busy meanwhile: a cuMemUnmap of a busy
 * granule, which on a GPU succeeds and leaves the queued work writing into
 * whatever is mapped there next (unmapping is not stream-ordered), succeeds
 * here too but counts as a violation.
 *
 * Environment: FAKE_CUDA_TOTAL_MB (default 4096), FAKE_CUDA_DEVICES (default
 * 1; 0 emulates a driver without a device), FAKE_CUDA_INIT_ERROR (cuInit
 * returns this code), FAKE_CUDA_NO_VMM (the granularity query answers
 * CUDA_ERROR_NOT_SUPPORTED), FAKE_CUDA_LAG (default 3), FAKE_CUDA_QUIET
 * (violations are not printed to stderr).
 *
 * What it cannot check: kernels, real concurrency between streams, device
 * addresses (they are host addresses), timing. It is for the call protocol.
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "cuda_abi.h"
#include "fake_cuda.h"

#define EXPORT __attribute__((visibility("default")))
/* The driver's own prototypes are in cuda.h, which this file must not need. */
#pragma GCC diagnostic ignored "-Wmissing-prototypes"

/* Driver ABI types and codes: cuda_abi.h. */

#define MiB ((uint64_t)1 << 20)
#define PAGE_BYTES (2 * MiB)         /* cuMemAlloc's rounding */
#define GRAN_BYTES (2 * MiB)         /* cuMemGetAllocationGranularity, minimum */
#define MAX_DEVICES 8
#define LOCATION_DEVICE 1            /* CU_MEM_LOCATION_TYPE_DEVICE */
#define ALLOCATION_PINNED 1          /* CU_MEM_ALLOCATION_TYPE_PINNED */

/* ---- state ---- */

typedef struct context {
    int device;
    int retains;
} context_t;

typedef struct alloc {
    struct alloc *next;
    uint64_t base, size, charged;
} alloc_t;

typedef struct handle {
    struct handle *next;
    uint64_t file_offset, size;
    int maps;
    bool released;
} handle_t;

typedef struct mapping {
    uint64_t base, size, offset;
    handle_t *handle;
} mapping_t;

typedef struct granule {
    mapping_t *map; /* NULL: not mapped */
    bool access;
    uint64_t busy_until; /* tick at which queued work that touches it completes */
} granule_t;

typedef struct reservation {
    struct reservation *next;
    uint64_t base, size;
    granule_t *granules;
} reservation_t;

/* A stream or an event: both are a point in the queue of work, and the
 * tick at which the work queued before it completes. Their handles are the
 * records' addresses, looked up in one registry by kind, so that an event
 * passed as a stream (or a destroyed one) is an unknown handle. */
typedef enum work_kind { WORK_STREAM, WORK_EVENT } work_kind_t;

typedef struct work {
    struct work *next;
    work_kind_t kind;
    uint64_t done_at; /* tick at which the work queued so far completes */
} work_t;
typedef work_t stream_t;
typedef work_t event_t;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static _Thread_local context_t *current; /* cuCtxGetCurrent: per thread */
static struct {
    bool initialized, configured;
    int devices, init_error, lag;
    bool no_vmm, quiet;
    uint64_t total_bytes;
    context_t primary[MAX_DEVICES];
    alloc_t *allocs;
    handle_t *handles;
    reservation_t *reservations;
    work_t *works; /* every live stream and event */
    stream_t default_stream;
    uint64_t tick;
    int device_fd;          /* the memfd physical handles live in */
    uint64_t file_granules; /* its size in granules */
    uint8_t *file_used;     /* one byte per granule of it */
    fake_cuda_counters_t c;
} S;

static uint64_t env_u64(const char *name, uint64_t dflt)
{
    const char *v = getenv(name);
    if (!v || !*v)
        return dflt;
    char *end = NULL;
    unsigned long long x = strtoull(v, &end, 10);
    return end && *end == '\0' ? (uint64_t)x : dflt;
}

static void configure(void)
{
    if (S.configured)
        return;
    S.configured = true;
    S.devices = (int)env_u64("FAKE_CUDA_DEVICES", 1);
    if (S.devices > MAX_DEVICES)
        S.devices = MAX_DEVICES;
    S.init_error = (int)env_u64("FAKE_CUDA_INIT_ERROR", 0);
    S.lag = (int)env_u64("FAKE_CUDA_LAG", 3);
    S.no_vmm = getenv("FAKE_CUDA_NO_VMM") != NULL;
    S.quiet = getenv("FAKE_CUDA_QUIET") != NULL;
    S.total_bytes = env_u64("FAKE_CUDA_TOTAL_MB", 4096) * MiB;
    S.c.total_bytes = S.total_bytes;
    for (int d = 0; d < MAX_DEVICES; d++)
        S.primary[d].device = d;
    S.device_fd = -1;
}

/* A broken rule: counted, remembered, printed (unless quiet), and returned. */
static CUresult violation(CUresult r, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(S.c.last_violation, sizeof S.c.last_violation, fmt, ap);
    va_end(ap);
    S.c.violations++;
    if (!S.quiet)
        fprintf(stderr, "fake libcuda: violation: %s\n", S.c.last_violation);
    return r;
}

/* Calls after cuInit that need the calling thread's context. */
static CUresult need_context(const char *fn)
{
    if (!S.initialized)
        return violation(CUDA_ERROR_NOT_INITIALIZED, "%s before cuInit", fn);
    if (!current)
        return violation(CUDA_ERROR_INVALID_CONTEXT, "%s with no current context", fn);
    if (current->retains <= 0)
        return violation(CUDA_ERROR_INVALID_CONTEXT,
                         "%s with a released primary context current", fn);
    return CUDA_SUCCESS;
}

static CUresult need_init(const char *fn)
{
    if (!S.initialized)
        return violation(CUDA_ERROR_NOT_INITIALIZED, "%s before cuInit", fn);
    return CUDA_SUCCESS;
}

/* Calls per entry point, and the failure a test asked for (fake_cuda_fail_nth). */
#define MAX_FNS 48
static struct fn_count {
    const char *name; /* __func__ of the entry point: a static string */
    uint64_t calls, fail_at;
    CUresult code;
} fns[MAX_FNS];

static struct fn_count *fn_slot(const char *name)
{
    for (int i = 0; i < MAX_FNS; i++) {
        if (fns[i].name && !strcmp(fns[i].name, name))
            return &fns[i];
        if (!fns[i].name) {
            fns[i].name = name;
            return &fns[i];
        }
    }
    return NULL;
}

/* Counts the call; the requested failure when this is the call asked for. A
 * failed call has no effect, as the driver's do not. */
static CUresult injected(const char *fn)
{
    struct fn_count *f = fn_slot(fn);
    if (!f)
        return CUDA_SUCCESS;
    f->calls++;
    if (f->fail_at && f->calls == f->fail_at) {
        f->fail_at = 0;
        S.c.faults_injected++;
        return f->code;
    }
    return CUDA_SUCCESS;
}

/* Every entry point: the lock, the rule it needs first (a violation), then the
 * call counted and a requested failure returned. */
#define ENTER(check)                                                                   \
    pthread_mutex_lock(&lock);                                                         \
    configure();                                                                       \
    CUresult r_ = (check);                                                             \
    if (r_ == CUDA_SUCCESS)                                                            \
        r_ = injected(__func__);                                                       \
    if (r_ != CUDA_SUCCESS) {                                                          \
        pthread_mutex_unlock(&lock);                                                   \
        return r_;                                                                     \
    }
#define LEAVE(r)                                                                       \
    do {                                                                               \
        CUresult out_ = (r);                                                           \
        pthread_mutex_unlock(&lock);                                                   \
        return out_;                                                                   \
    } while (0)

static uint64_t round_up(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

/* ---- initialization, devices, contexts ---- */

EXPORT CUresult cuInit(unsigned int flags)
{
    ENTER(CUDA_SUCCESS);
    if (flags != 0)
        LEAVE(violation(CUDA_ERROR_INVALID_VALUE, "cuInit(flags %u): flags must be 0", flags));
    if (S.init_error)
        LEAVE(S.init_error);
    S.initialized = true;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuDeviceGetCount(int *count)
{
    ENTER(need_init("cuDeviceGetCount"));
    if (!count)
        LEAVE(violation(CUDA_ERROR_INVALID_VALUE, "cuDeviceGetCount(NULL)"));
    *count = S.devices;
    LEAVE(CUDA_SUCCESS);
}

static bool valid_device(CUdevice dev) { return dev >= 0 && dev < S.devices; }

EXPORT CUresult cuDeviceGet(CUdevice *dev, int ordinal)
{
    ENTER(need_init("cuDeviceGet"));
    if (!dev)
        LEAVE(violation(CUDA_ERROR_INVALID_VALUE, "cuDeviceGet(NULL)"));
    if (!valid_device(ordinal))
        LEAVE(violation(CUDA_ERROR_INVALID_DEVICE, "cuDeviceGet(%d): no such device", ordinal));
    *dev = ordinal;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuDevicePrimaryCtxRetain(context_t **ctx, CUdevice dev)
{
    ENTER(need_init("cuDevicePrimaryCtxRetain"));
    if (!ctx || !valid_device(dev))
        LEAVE(violation(CUDA_ERROR_INVALID_DEVICE, "cuDevicePrimaryCtxRetain(device %d)", dev));
    S.primary[dev].retains++;
    *ctx = &S.primary[dev];
    S.c.primary_retains = S.primary[0].retains;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    ENTER(need_init("cuDevicePrimaryCtxRelease_v2"));
    if (!valid_device(dev))
        LEAVE(violation(CUDA_ERROR_INVALID_DEVICE, "cuDevicePrimaryCtxRelease(device %d)", dev));
    if (S.primary[dev].retains <= 0)
        LEAVE(violation(CUDA_ERROR_INVALID_CONTEXT,
                        "cuDevicePrimaryCtxRelease(device %d) more often than retained", dev));
    S.primary[dev].retains--;
    S.c.primary_retains = S.primary[0].retains;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    ENTER(need_init("cuDevicePrimaryCtxGetState"));
    if (!flags || !active || !valid_device(dev))
        LEAVE(violation(CUDA_ERROR_INVALID_VALUE, "cuDevicePrimaryCtxGetState(device %d)", dev));
    *flags = 0;
    *active = S.primary[dev].retains > 0;
    LEAVE(CUDA_SUCCESS);
}

static bool known_context(const context_t *ctx)
{
    return ctx >= &S.primary[0] && ctx < &S.primary[MAX_DEVICES] && valid_device(ctx->device);
}

EXPORT CUresult cuCtxGetCurrent(context_t **ctx)
{
    ENTER(need_init("cuCtxGetCurrent"));
    if (!ctx)
        LEAVE(violation(CUDA_ERROR_INVALID_VALUE, "cuCtxGetCurrent(NULL)"));
    *ctx = current;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuCtxSetCurrent(context_t *ctx)
{
    ENTER(need_init("cuCtxSetCurrent"));
    if (ctx && !known_context(ctx))
        LEAVE(violation(CUDA_ERROR_INVALID_CONTEXT, "cuCtxSetCurrent(%p): not a context",
                        (void *)ctx));
    if (ctx && ctx->retains <= 0)
        LEAVE(violation(CUDA_ERROR_INVALID_CONTEXT,
                        "cuCtxSetCurrent: primary context of device %d is not retained",
                        ctx->device));
    current = ctx;
    LEAVE(CUDA_SUCCESS);
}

static void complete_all(void)
{
    for (work_t *w = S.works; w; w = w->next)
        if (w->done_at > S.tick)
            S.tick = w->done_at;
    if (S.default_stream.done_at > S.tick)
        S.tick = S.default_stream.done_at;
}

EXPORT CUresult cuCtxSynchronize(void)
{
    ENTER(need_context("cuCtxSynchronize"));
    complete_all();
    LEAVE(CUDA_SUCCESS);
}

/* ---- error strings ---- */

static const struct {
    CUresult code;
    const char *name, *text;
} errors[] = {
    {CUDA_SUCCESS, "CUDA_SUCCESS", "no error"},
    {CUDA_ERROR_INVALID_VALUE, "CUDA_ERROR_INVALID_VALUE", "invalid argument"},
    {CUDA_ERROR_OUT_OF_MEMORY, "CUDA_ERROR_OUT_OF_MEMORY", "out of memory"},
    {CUDA_ERROR_NOT_INITIALIZED, "CUDA_ERROR_NOT_INITIALIZED", "initialization error"},
    {CUDA_ERROR_NO_DEVICE, "CUDA_ERROR_NO_DEVICE", "no CUDA-capable device is detected"},
    {CUDA_ERROR_INVALID_DEVICE, "CUDA_ERROR_INVALID_DEVICE", "invalid device ordinal"},
    {CUDA_ERROR_INVALID_CONTEXT, "CUDA_ERROR_INVALID_CONTEXT", "invalid device context"},
    {CUDA_ERROR_INVALID_HANDLE, "CUDA_ERROR_INVALID_HANDLE", "invalid resource handle"},
    {CUDA_ERROR_NOT_READY, "CUDA_ERROR_NOT_READY", "device not ready"},
    {CUDA_ERROR_NOT_SUPPORTED, "CUDA_ERROR_NOT_SUPPORTED", "operation not supported"},
    {CUDA_ERROR_UNKNOWN, "CUDA_ERROR_UNKNOWN", "unknown error"},
};

static CUresult error_lookup(CUresult code, const char **out, bool name)
{
    for (size_t i = 0; i < sizeof errors / sizeof errors[0]; i++)
        if (errors[i].code == code) {
            *out = name ? errors[i].name : errors[i].text;
            return CUDA_SUCCESS;
        }
    *out = NULL;
    return CUDA_ERROR_INVALID_VALUE; /* as the driver answers an unknown code */
}

EXPORT CUresult cuGetErrorName(CUresult code, const char **out)
{
    return out ? error_lookup(code, out, true) : CUDA_ERROR_INVALID_VALUE;
}

EXPORT CUresult cuGetErrorString(CUresult code, const char **out)
{
    return out ? error_lookup(code, out, false) : CUDA_ERROR_INVALID_VALUE;
}

/* ---- device memory: cuMemAlloc ---- */

static bool charge(uint64_t bytes)
{
    if (S.c.used_bytes + bytes > S.total_bytes || S.c.used_bytes + bytes < bytes)
        return false;
    S.c.used_bytes += bytes;
    return true;
}

EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t size)
{
    ENTER(need_context("cuMemAlloc_v2"));
    S.c.calls_alloc++;
    if (!dptr || size == 0)
        LEAVE(violation(CUDA_ERROR_INVALID_VALUE, "cuMemAlloc_v2(%zu bytes)", size));
    uint64_t charged = round_up(size, PAGE_BYTES);
    if (charged < size || !charge(charged))
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    alloc_t *a = calloc(1, sizeof *a);
    void *p = a ? mmap(NULL, size, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
                : MAP_FAILED;
    if (p == MAP_FAILED) {
        free(a);
        S.c.used_bytes -= charged;
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    }
    a->base = (uint64_t)(uintptr_t)p;
    a->size = size;
    a->charged = charged;
    a->next = S.allocs;
    S.allocs = a;
    S.c.allocations++;
    *dptr = a->base;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    ENTER(need_context("cuMemFree_v2"));
    S.c.calls_free++;
    for (alloc_t **link = &S.allocs; *link; link = &(*link)->next) {
        alloc_t *a = *link;
        if (a->base != dptr)
            continue;
        *link = a->next;
        munmap((void *)(uintptr_t)a->base, a->size);
        S.c.used_bytes -= a->charged;
        S.c.allocations--;
        free(a);
        LEAVE(CUDA_SUCCESS);
    }
    LEAVE(violation(CUDA_ERROR_INVALID_VALUE, "cuMemFree_v2(0x%llx): not a cuMemAlloc base", dptr));
}

EXPORT CUresult cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    ENTER(need_context("cuMemGetInfo_v2"));
    if (!free_bytes || !total_bytes)
        LEAVE(violation(CUDA_ERROR_INVALID_VALUE, "cuMemGetInfo_v2(NULL)"));
    *free_bytes = (size_t)(S.total_bytes - S.c.used_bytes);
    *total_bytes = (size_t)S.total_bytes;
    LEAVE(CUDA_SUCCESS);
}

/* ---- virtual memory management ---- */

static reservation_t *reservation_of(uint64_t addr)
{
    for (reservation_t *v = S.reservations; v; v = v->next)
        if (addr >= v->base && addr - v->base < v->size)
            return v;
    return NULL;
}

static CUresult check_prop(const char *fn, const CUmemAllocationProp *prop)
{
    if (!prop)
        return violation(CUDA_ERROR_INVALID_VALUE, "%s: no allocation properties", fn);
    if (prop->type != ALLOCATION_PINNED || prop->location.type != LOCATION_DEVICE ||
        !valid_device(prop->location.id))
        return violation(CUDA_ERROR_INVALID_VALUE,
                         "%s: properties type %d, location type %d id %d", fn, prop->type,
                         prop->location.type, prop->location.id);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity,
                                              const CUmemAllocationProp *prop, int option)
{
    ENTER(need_init("cuMemGetAllocationGranularity"));
    CUresult r = check_prop("cuMemGetAllocationGranularity", prop);
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    if (!granularity || (option != 0 && option != 1))
        LEAVE(violation(CUDA_ERROR_INVALID_VALUE, "cuMemGetAllocationGranularity(option %d)",
                        option));
    if (S.no_vmm)
        LEAVE(CUDA_ERROR_NOT_SUPPORTED);
    *granularity = GRAN_BYTES;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                    CUdeviceptr addr, unsigned long long flags)
{
    (void)addr; /* a hint the driver may ignore */
    ENTER(need_context("cuMemAddressReserve"));
    if (!ptr || size == 0 || size % GRAN_BYTES || flags ||
        (alignment & (alignment - 1)) != 0)
        LEAVE(violation(CUDA_ERROR_INVALID_VALUE,
                        "cuMemAddressReserve(%zu bytes, alignment %zu, flags %llu): sizes are "
                        "whole granules, alignment a power of two",
                        size, alignment, flags));
    uint64_t align = alignment > GRAN_BYTES ? alignment : GRAN_BYTES;
    reservation_t *v = calloc(1, sizeof *v);
    granule_t *g = v ? calloc(size / GRAN_BYTES, sizeof *g) : NULL;
    void *raw = g ? mmap(NULL, size + align, PROT_NONE,
                         MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0)
                  : MAP_FAILED;
    if (raw == MAP_FAILED) {
        free(g);
        free(v);
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    }
    uint64_t lo = (uint64_t)(uintptr_t)raw, base = round_up(lo, align);
    if (base > lo)
        munmap(raw, base - lo);
    if (lo + size + align > base + size)
        munmap((void *)(uintptr_t)(base + size), lo + size + align - (base + size));
    v->base = base;
    v->size = size;
    v->granules = g;
    v->next = S.reservations;
    S.reservations = v;
    S.c.reservations++;
    *ptr = base;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    ENTER(need_context("cuMemAddressFree"));
    for (reservation_t **link = &S.reservations; *link; link = &(*link)->next) {
        reservation_t *v = *link;
        if (v->base != ptr)
            continue;
        if (v->size != size)
            LEAVE(violation(CUDA_ERROR_INVALID_VALUE,
                            "cuMemAddressFree(0x%llx, %zu): reserved with %llu bytes", ptr, size,
                            (unsigned long long)v->size));
        for (uint64_t i = 0; i < size / GRAN_BYTES; i++)
            if (v->granules[i].map)
                LEAVE(violation(CUDA_ERROR_INVALID_VALUE,
                                "cuMemAddressFree(0x%llx): granule %llu still mapped", ptr,
                                (unsigned long long)i));
        *link = v->next;
        munmap((void *)(uintptr_t)v->base, v->size);
        free(v->granules);
        free(v);
        S.c.reservations--;
        LEAVE(CUDA_SUCCESS);
    }
    LEAVE(violation(CUDA_ERROR_INVALID_VALUE, "cuMemAddressFree(0x%llx): not a reservation", ptr));
}

/* The sparse file physical handles are carved from, created at first use. */
static bool device_file(void)
{
    if (S.device_fd >= 0)
        return true;
    S.file_granules = 2 * (S.total_bytes / GRAN_BYTES) + 1;
    S.file_used = calloc(S.file_granules, 1);
    S.device_fd = memfd_create("fake-cuda-device-memory", MFD_CLOEXEC);
    if (!S.file_used || S.device_fd < 0 ||
        ftruncate(S.device_fd, (off_t)(S.file_granules * GRAN_BYTES)) != 0) {
        free(S.file_used);
        S.file_used = NULL;
        if (S.device_fd >= 0)
            close(S.device_fd);
        S.device_fd = -1;
        return false;
    }
    return true;
}

/* First fit of n granules in the device file; the first granule, or -1. */
static int64_t file_take(uint64_t n)
{
    uint64_t run = 0;
    for (uint64_t i = 0; i < S.file_granules; i++) {
        run = S.file_used[i] ? 0 : run + 1;
        if (run == n) {
            memset(&S.file_used[i + 1 - n], 1, n);
            return (int64_t)(i + 1 - n);
        }
    }
    return -1;
}

static void handle_free(handle_t *h)
{
    for (handle_t **link = &S.handles; *link; link = &(*link)->next)
        if (*link == h) {
            *link = h->next;
            break;
        }
    /* Give the pages back to the host, as freed device memory would be. */
    (void)fallocate(S.device_fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE,
                    (off_t)h->file_offset, (off_t)h->size);
    memset(&S.file_used[h->file_offset / GRAN_BYTES], 0, h->size / GRAN_BYTES);
    S.c.used_bytes -= h->size;
    S.c.handles--;
    free(h);
}

static handle_t *handle_of(CUmemGenericAllocationHandle value)
{
    for (handle_t *h = S.handles; h; h = h->next)
        if ((CUmemGenericAllocationHandle)(uintptr_t)h == value)
            return h;
    return NULL;
}

EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                            const CUmemAllocationProp *prop, unsigned long long flags)
{
    ENTER(need_context("cuMemCreate"));
    S.c.calls_create++;
    CUresult r = check_prop("cuMemCreate", prop);
    if (r != CUDA_SUCCESS)
        LEAVE(r);
    if (!handle || size == 0 || size % GRAN_BYTES || flags)
        LEAVE(violation(CUDA_ERROR_INVALID_VALUE,
                        "cuMemCreate(%zu bytes, flags %llu): whole granules only", size, flags));
    if (!device_file())
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    if (!charge(size))
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    handle_t *h = calloc(1, sizeof *h);
    int64_t first = h ? file_take(size / GRAN_BYTES) : -1;
    if (first < 0) {
        free(h);
        S.c.used_bytes -= size;
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    }
    h->file_offset = (uint64_t)first * GRAN_BYTES;
    h->size = size;
    h->next = S.handles;
    S.handles = h;
    S.c.handles++;
    *handle = (CUmemGenericAllocationHandle)(uintptr_t)h;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle value)
{
    ENTER(need_context("cuMemRelease"));
    S.c.calls_release++;
    handle_t *h = handle_of(value);
    if (!h || h->released)
        LEAVE(violation(CUDA_ERROR_INVALID_VALUE, "cuMemRelease(0x%llx): %s", value,
                        h ? "released twice" : "not a handle"));
    h->released = true;
    if (h->maps == 0) /* else freed at its last unmap, as the driver does */
        handle_free(h);
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                         CUmemGenericAllocationHandle value, unsigned long long flags)
{
    ENTER(need_context("cuMemMap"));
    S.c.calls_map++;
    handle_t *h = handle_of(value);
    if (!h || h->released)
        LEAVE(violation(CUDA_ERROR_INVALID_VALUE, "cuMemMap(0x%llx): handle %s", ptr,
                        h ? "already released" : "unknown"));
    reservation_t *v = reservation_of(ptr);
    if (flags || size == 0 || size % GRAN_BYTES || offset % GRAN_BYTES ||
        (ptr - (v ? v->base : 0)) % GRAN_BYTES || offset + size > h->size || offset + size < size)
        LEAVE(violation(CUDA_ERROR_INVALID_VALUE,
                        "cuMemMap(0x%llx, %zu, offset %zu): handle of %llu bytes; address, size "
                        "and offset must be whole granules",
                        ptr, size, offset, (unsigned long long)h->size));
    if (!v || size > v->size - (ptr - v->base))
        LEAVE(violation(CUDA_ERROR_INVALID_VALUE, "cuMemMap(0x%llx, %zu): not inside a reservation",
                        ptr, size));
    uint64_t first = (ptr - v->base) / GRAN_BYTES, n = size / GRAN_BYTES;
    for (uint64_t i = first; i < first + n; i++)
        if (v->granules[i].map)
            LEAVE(violation(CUDA_ERROR_INVALID_VALUE,
                            "cuMemMap(0x%llx, %zu): granule at 0x%llx already mapped", ptr, size,
                            (unsigned long long)(v->base + i * GRAN_BYTES)));
    mapping_t *m = calloc(1, sizeof *m);
    if (!m || mmap((void *)(uintptr_t)ptr, size, PROT_NONE, MAP_SHARED | MAP_FIXED, S.device_fd,
                   (off_t)(h->file_offset + offset)) == MAP_FAILED) {
        free(m);
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    }
    m->base = ptr;
    m->size = size;
    m->offset = offset;
    m->handle = h;
    h->maps++;
    for (uint64_t i = first; i < first + n; i++)
        v->granules[i] = (granule_t){m, false, 0};
    S.c.mappings++;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    ENTER(need_context("cuMemUnmap"));
    S.c.calls_unmap++;
    reservation_t *v = reservation_of(ptr);
    if (!v || size == 0 || size > v->size - (ptr - v->base) || (ptr - v->base) % GRAN_BYTES ||
        size % GRAN_BYTES)
        LEAVE(violation(CUDA_ERROR_INVALID_VALUE,
                        "cuMemUnmap(0x%llx, %zu): not whole granules of a reservation", ptr, size));
    uint64_t first = (ptr - v->base) / GRAN_BYTES, n = size / GRAN_BYTES;
    for (uint64_t i = first; i < first + n; i++)
        if (v->granules[i].busy_until > S.tick) {
            (void)violation(CUDA_SUCCESS,
                            "cuMemUnmap(0x%llx, %zu): granule at 0x%llx is still used by queued "
                            "work (done at tick %llu, now %llu)",
                            ptr, size, (unsigned long long)(v->base + i * GRAN_BYTES),
                            (unsigned long long)v->granules[i].busy_until,
                            (unsigned long long)S.tick);
            break;
        }
    /* The range must be whole mappings, each mapped and wholly inside it. */
    for (uint64_t i = first; i < first + n;) {
        mapping_t *m = v->granules[i].map;
        if (!m || m->base != v->base + i * GRAN_BYTES || m->size > (first + n - i) * GRAN_BYTES)
            LEAVE(violation(CUDA_ERROR_INVALID_VALUE,
                            "cuMemUnmap(0x%llx, %zu): granule at 0x%llx is %s", ptr, size,
                            (unsigned long long)(v->base + i * GRAN_BYTES),
                            m ? "part of a mapping that the range does not cover"
                              : "not mapped"));
        i += m->size / GRAN_BYTES;
    }
    for (uint64_t i = first; i < first + n;) {
        mapping_t *m = v->granules[i].map;
        uint64_t k = m->size / GRAN_BYTES;
        for (uint64_t j = i; j < i + k; j++)
            v->granules[j] = (granule_t){NULL, false, 0};
        (void)mmap((void *)(uintptr_t)m->base, m->size, PROT_NONE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_FIXED, -1, 0);
        handle_t *h = m->handle;
        if (--h->maps == 0 && h->released)
            handle_free(h);
        free(m);
        S.c.mappings--;
        i += k;
    }
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                               size_t count)
{
    ENTER(need_context("cuMemSetAccess"));
    if (!desc || count == 0)
        LEAVE(violation(CUDA_ERROR_INVALID_VALUE, "cuMemSetAccess: no access descriptor"));
    int prot = -1;
    for (size_t i = 0; i < count; i++) {
        if (desc[i].location.type != LOCATION_DEVICE || !valid_device(desc[i].location.id) ||
            (desc[i].flags != 0 && desc[i].flags != 1 && desc[i].flags != 3))
            LEAVE(violation(CUDA_ERROR_INVALID_VALUE,
                            "cuMemSetAccess: descriptor %zu (location %d/%d, flags %d)", i,
                            desc[i].location.type, desc[i].location.id, desc[i].flags));
        /* One host address space stands for every device: the widest access
         * any descriptor grants (copies reach any device's memory). */
        int p = desc[i].flags == 3 ? PROT_READ | PROT_WRITE
                                   : desc[i].flags == 1 ? PROT_READ : PROT_NONE;
        if (p > prot)
            prot = p;
    }
    reservation_t *v = reservation_of(ptr);
    if (!v || size == 0 || size > v->size - (ptr - v->base) || (ptr - v->base) % GRAN_BYTES ||
        size % GRAN_BYTES)
        LEAVE(violation(CUDA_ERROR_INVALID_VALUE,
                        "cuMemSetAccess(0x%llx, %zu): not whole granules of a reservation", ptr,
                        size));
    uint64_t first = (ptr - v->base) / GRAN_BYTES, n = size / GRAN_BYTES;
    for (uint64_t i = first; i < first + n; i++)
        if (!v->granules[i].map)
            LEAVE(violation(CUDA_ERROR_INVALID_VALUE,
                            "cuMemSetAccess(0x%llx, %zu): granule at 0x%llx not mapped", ptr,
                            size, (unsigned long long)(v->base + i * GRAN_BYTES)));
    if (prot >= 0) {
        (void)mprotect((void *)(uintptr_t)ptr, size, prot);
        for (uint64_t i = first; i < first + n; i++)
            v->granules[i].access = prot & PROT_WRITE;
    }
    LEAVE(CUDA_SUCCESS);
}

/* ---- streams and events ---- */

static uint64_t *work_count(work_kind_t kind)
{
    return kind == WORK_STREAM ? &S.c.streams : &S.c.events;
}

static work_t *work_new(work_kind_t kind)
{
    work_t *w = calloc(1, sizeof *w);
    if (!w)
        return NULL;
    w->kind = kind;
    w->next = S.works;
    S.works = w;
    ++*work_count(kind);
    return w;
}

static work_t **work_link(work_kind_t kind, const void *value)
{
    for (work_t **link = &S.works; *link; link = &(*link)->next)
        if (*link == value && (*link)->kind == kind)
            return link;
    return NULL;
}

/* False if value is not a live object of that kind. */
static bool work_destroy(work_kind_t kind, const void *value)
{
    work_t **link = work_link(kind, value);
    if (!link)
        return false;
    work_t *w = *link;
    *link = w->next;
    free(w);
    --*work_count(kind);
    return true;
}

/* NULL and the two special handles are the default stream. */
static stream_t *stream_of(void *value)
{
    if ((uintptr_t)value <= 2)
        return &S.default_stream;
    work_t **link = work_link(WORK_STREAM, value);
    return link ? *link : NULL;
}

static event_t *event_of(void *value)
{
    work_t **link = work_link(WORK_EVENT, value);
    return link ? *link : NULL;
}

static void queue_work(stream_t *s)
{
    uint64_t done = S.tick + (uint64_t)S.lag;
    if (done > s->done_at)
        s->done_at = done;
}

EXPORT CUresult cuStreamCreate(stream_t **out, unsigned int flags)
{
    ENTER(need_context("cuStreamCreate"));
    if (!out || flags > 1)
        LEAVE(violation(CUDA_ERROR_INVALID_VALUE, "cuStreamCreate(flags %u)", flags));
    stream_t *s = work_new(WORK_STREAM);
    if (!s)
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    *out = s;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuStreamDestroy_v2(void *value)
{
    ENTER(need_context("cuStreamDestroy_v2"));
    if (work_destroy(WORK_STREAM, value))
        LEAVE(CUDA_SUCCESS);
    LEAVE(violation(CUDA_ERROR_INVALID_HANDLE, "cuStreamDestroy_v2(%p): not a stream", value));
}

EXPORT CUresult cuStreamQuery(void *value)
{
    ENTER(need_context("cuStreamQuery"));
    stream_t *s = stream_of(value);
    if (!s)
        LEAVE(violation(CUDA_ERROR_INVALID_HANDLE, "cuStreamQuery(%p): not a stream", value));
    S.tick++;
    LEAVE(s->done_at <= S.tick ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY);
}

EXPORT CUresult cuStreamSynchronize(void *value)
{
    ENTER(need_context("cuStreamSynchronize"));
    stream_t *s = stream_of(value);
    if (!s)
        LEAVE(violation(CUDA_ERROR_INVALID_HANDLE, "cuStreamSynchronize(%p): not a stream", value));
    if (s->done_at > S.tick)
        S.tick = s->done_at;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuEventCreate(event_t **out, unsigned int flags)
{
    ENTER(need_context("cuEventCreate"));
    if (!out || flags > 0xF)
        LEAVE(violation(CUDA_ERROR_INVALID_VALUE, "cuEventCreate(flags %u)", flags));
    event_t *e = work_new(WORK_EVENT);
    if (!e)
        LEAVE(CUDA_ERROR_OUT_OF_MEMORY);
    *out = e;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuEventRecord(void *ev, void *stream)
{
    ENTER(need_context("cuEventRecord"));
    S.c.calls_event_record++;
    event_t *e = event_of(ev);
    stream_t *s = stream_of(stream);
    if (!e || !s)
        LEAVE(violation(CUDA_ERROR_INVALID_HANDLE, "cuEventRecord(%p, stream %p): unknown %s", ev,
                        stream, e ? "stream" : "event"));
    e->done_at = s->done_at;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuEventQuery(void *ev)
{
    ENTER(need_context("cuEventQuery"));
    event_t *e = event_of(ev);
    if (!e)
        LEAVE(violation(CUDA_ERROR_INVALID_HANDLE, "cuEventQuery(%p): not an event", ev));
    S.tick++;
    if (e->done_at > S.tick) {
        S.c.calls_event_query_not_ready++;
        LEAVE(CUDA_ERROR_NOT_READY);
    }
    LEAVE(CUDA_SUCCESS);
}

/* Time runs on to the event's completion, and no further: work queued after
 * it (on its stream or another) stays pending. */
EXPORT CUresult cuEventSynchronize(void *ev)
{
    ENTER(need_context("cuEventSynchronize"));
    event_t *e = event_of(ev);
    if (!e)
        LEAVE(violation(CUDA_ERROR_INVALID_HANDLE, "cuEventSynchronize(%p): not an event", ev));
    if (e->done_at > S.tick)
        S.tick = e->done_at;
    LEAVE(CUDA_SUCCESS);
}

EXPORT CUresult cuEventDestroy_v2(void *ev)
{
    ENTER(need_context("cuEventDestroy_v2"));
    if (work_destroy(WORK_EVENT, ev))
        LEAVE(CUDA_SUCCESS);
    LEAVE(violation(CUDA_ERROR_INVALID_HANDLE, "cuEventDestroy_v2(%p): not an event", ev));
}

/* ---- copies and memset: only into memory a kernel could touch ---- */

/* [addr, addr + n) lies in one cuMemAlloc block, or in granules of one
 * reservation that are mapped with write access. */
static bool device_range_ok(uint64_t addr, uint64_t n)
{
    if (n == 0 || addr + n < addr)
        return n == 0;
    for (alloc_t *a = S.allocs; a; a = a->next)
        if (addr >= a->base && addr - a->base <= a->size && n <= a->size - (addr - a->base))
            return true;
    reservation_t *v = reservation_of(addr);
    if (!v || n > v->size - (addr - v->base))
        return false;
    for (uint64_t i = (addr - v->base) / GRAN_BYTES; i <= (addr + n - 1 - v->base) / GRAN_BYTES;
         i++)
        if (!v->granules[i].map || !v->granules[i].access)
            return false;
    return true;
}

/* Work queued on s now touches [addr, addr+n) of a reservation, if it lies in one. */
static void mark_busy(uint64_t addr, uint64_t n, const stream_t *s)
{
    reservation_t *v = reservation_of(addr);
    if (!v || !n)
        return;
    for (uint64_t i = (addr - v->base) / GRAN_BYTES; i <= (addr + n - 1 - v->base) / GRAN_BYTES;
         i++)
        if (v->granules[i].busy_until < s->done_at)
            v->granules[i].busy_until = s->done_at;
}

static CUresult copy_check(const char *fn, uint64_t dev, const void *host, size_t n)
{
    if (!host && n)
        return violation(CUDA_ERROR_INVALID_VALUE, "%s: NULL host pointer", fn);
    if (!device_range_ok(dev, n))
        return violation(CUDA_ERROR_INVALID_VALUE,
                         "%s(0x%llx, %zu bytes): not allocated, or not mapped with access", fn,
                         (unsigned long long)dev, n);
    return CUDA_SUCCESS;
}

EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t n)
{
    ENTER(need_context("cuMemcpyHtoD_v2"));
    CUresult r = copy_check("cuMemcpyHtoD_v2", dst, src, n);
    if (r == CUDA_SUCCESS && n)
        memcpy((void *)(uintptr_t)dst, src, n);
    LEAVE(r);
}

EXPORT CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t n)
{
    ENTER(need_context("cuMemcpyDtoH_v2"));
    CUresult r = copy_check("cuMemcpyDtoH_v2", src, dst, n);
    if (r == CUDA_SUCCESS && n)
        memcpy(dst, (const void *)(uintptr_t)src, n);
    LEAVE(r);
}

EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t n, void *stream)
{
    ENTER(need_context("cuMemcpyHtoDAsync_v2"));
    stream_t *s = stream_of(stream);
    if (!s)
        LEAVE(violation(CUDA_ERROR_INVALID_HANDLE, "cuMemcpyHtoDAsync_v2: stream %p", stream));
    CUresult r = copy_check("cuMemcpyHtoDAsync_v2", dst, src, n);
    if (r == CUDA_SUCCESS && n) {
        memcpy((void *)(uintptr_t)dst, src, n);
        queue_work(s);
        mark_busy(dst, n, s);
    }
    LEAVE(r);
}

EXPORT CUresult cuMemsetD8Async(CUdeviceptr dst, unsigned char value, size_t n, void *stream)
{
    ENTER(need_context("cuMemsetD8Async"));
    stream_t *s = stream_of(stream);
    if (!s)
        LEAVE(violation(CUDA_ERROR_INVALID_HANDLE, "cuMemsetD8Async: stream %p", stream));
    static const char one = 1; /* any non-NULL host pointer for the check */
    CUresult r = copy_check("cuMemsetD8Async", dst, &one, n);
    if (r == CUDA_SUCCESS && n) {
        memset((void *)(uintptr_t)dst, value, n);
        queue_work(s);
        mark_busy(dst, n, s);
    }
    LEAVE(r);
}

/* ---- introspection for the tests ---- */

EXPORT void fake_cuda_counters(fake_cuda_counters_t *out)
{
    pthread_mutex_lock(&lock);
    configure();
    *out = S.c;
    pthread_mutex_unlock(&lock);
}

/* Makes the nth call from now of entry point `fn` ("cuMemMap") fail with
 * `code`, without effect; n = 0 cancels. Not a violation: the driver failed. */
EXPORT void fake_cuda_fail_nth(const char *fn, uint64_t n, int code)
{
    pthread_mutex_lock(&lock);
    configure();
    struct fn_count *f = fn_slot(fn);
    if (f) {
        f->fail_at = n ? f->calls + n : 0;
        f->code = code;
    }
    pthread_mutex_unlock(&lock);
}

/* Calls of entry point `fn` so far (failed ones included). */
EXPORT uint64_t fake_cuda_calls(const char *fn)
{
    pthread_mutex_lock(&lock);
    struct fn_count *f = fn_slot(fn);
    uint64_t n = f ? f->calls : 0;
    pthread_mutex_unlock(&lock);
    return n;
}

/* The same two figures for callers without the struct (Python's ctypes). */
EXPORT uint64_t fake_cuda_violations(void)
{
    fake_cuda_counters_t c;
    fake_cuda_counters(&c);
    return c.violations;
}

EXPORT uint64_t fake_cuda_used_bytes(void)
{
    fake_cuda_counters_t c;
    fake_cuda_counters(&c);
    return c.used_bytes;
}
