/*
 * allocator/backend/cuda.c: the CUDA backend (stowage/cuda.h).
 *
 * Owns the run-time binding to the CUDA driver: libcuda.so.1 is dlopen'ed and
 * its versioned entry points resolved once, under pthread_once, so that the
 * library never links libcuda or libcudart and loads on machines without a GPU.
 * It must not cache anything about the calling thread: PyTorch calls the
 * allocator from autograd and data-loader threads, so every method checks the
 * current context itself.
 */
#include "stowage/cuda.h"

#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef STOW_HAVE_CUDA_HEADERS
#include <cuda.h>
#else
/* The few driver types and constants used here, with the layouts of cuda.h
 * (CUDA 11.2 and later; unchanged through 13.0). */
typedef int CUresult;
typedef int CUdevice;
typedef struct CUctx_st *CUcontext;
typedef struct CUevent_st *CUevent;
typedef struct CUstream_st *CUstream;
typedef unsigned long long CUdeviceptr;
typedef unsigned long long CUmemGenericAllocationHandle;
typedef int CUmemAllocationGranularity_flags;
typedef struct CUmemLocation {
    int type;
    int id;
} CUmemLocation;
typedef struct CUmemAllocationProp {
    int type;
    int requestedHandleTypes;
    CUmemLocation location;
    void *win32HandleMetaData;
    struct {
        unsigned char compressionType;
        unsigned char gpuDirectRDMACapable;
        unsigned short usage;
        unsigned char reserved[4];
    } allocFlags;
} CUmemAllocationProp;
typedef struct CUmemAccessDesc {
    CUmemLocation location;
    int flags;
} CUmemAccessDesc;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_OUT_OF_MEMORY 2
#define CUDA_ERROR_NOT_READY 600
#define CU_EVENT_DISABLE_TIMING 0x2
#define CU_MEM_ALLOCATION_TYPE_PINNED 0x1
#define CU_MEM_HANDLE_TYPE_NONE 0x0
#define CU_MEM_LOCATION_TYPE_DEVICE 0x1
#define CU_MEM_ACCESS_FLAGS_PROT_READWRITE 0x3
#define CU_MEM_ALLOC_GRANULARITY_MINIMUM 0x0
#endif

#define CUDA_MIN_GRANULARITY ((size_t)2 << 20)
#define CUDA_ERR_LEN 256

/* ---- the driver table ---- */

typedef struct driver {
    CUresult (*init)(unsigned int flags);
    CUresult (*device_get)(CUdevice *dev, int ordinal);
    CUresult (*device_get_count)(int *count);
    CUresult (*primary_ctx_retain)(CUcontext *ctx, CUdevice dev);
    CUresult (*primary_ctx_release)(CUdevice dev);
    CUresult (*ctx_get_current)(CUcontext *ctx);
    CUresult (*ctx_set_current)(CUcontext ctx);
    CUresult (*ctx_synchronize)(void);
    CUresult (*mem_alloc)(CUdeviceptr *dptr, size_t size);
    CUresult (*mem_free)(CUdeviceptr dptr);
    CUresult (*mem_get_info)(size_t *free_bytes, size_t *total_bytes);
    CUresult (*event_create)(CUevent *ev, unsigned int flags);
    CUresult (*event_record)(CUevent ev, CUstream stream);
    CUresult (*event_query)(CUevent ev);
    CUresult (*event_destroy)(CUevent ev);
    CUresult (*stream_query)(CUstream stream);
    /* optional */
    CUresult (*primary_ctx_get_state)(CUdevice dev, unsigned int *flags, int *active);
    CUresult (*get_error_name)(CUresult r, const char **out);
    CUresult (*get_error_string)(CUresult r, const char **out);
    CUresult (*mem_address_reserve)(CUdeviceptr *ptr, size_t size, size_t alignment,
                                    CUdeviceptr addr, unsigned long long flags);
    CUresult (*mem_address_free)(CUdeviceptr ptr, size_t size);
    CUresult (*mem_create)(CUmemGenericAllocationHandle *handle, size_t size,
                           const CUmemAllocationProp *prop, unsigned long long flags);
    CUresult (*mem_release)(CUmemGenericAllocationHandle handle);
    CUresult (*mem_map)(CUdeviceptr ptr, size_t size, size_t offset,
                        CUmemGenericAllocationHandle handle, unsigned long long flags);
    CUresult (*mem_unmap)(CUdeviceptr ptr, size_t size);
    CUresult (*mem_set_access)(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                               size_t count);
    CUresult (*memset_d8_async)(CUdeviceptr dst, unsigned char value, size_t n,
                                CUstream stream);
    CUresult (*mem_get_allocation_granularity)(size_t *granularity,
                                               const CUmemAllocationProp *prop,
                                               CUmemAllocationGranularity_flags option);
    CUresult (*event_synchronize)(CUevent ev);

    void *handle;           /* dlopen handle, kept for the life of the process */
    bool has_vmm;           /* every VMM entry point resolved */
    int probe;              /* STOW_CUDA_PROBE_* of the load */
    int device_count;
    char why[CUDA_ERR_LEN]; /* reason when probe != OK */
} driver_t;

static driver_t D;
static pthread_once_t driver_once = PTHREAD_ONCE_INIT;

#define DRV_FIELD(f) offsetof(driver_t, f)
static const struct {
    const char *name;
    size_t offset;
    bool required;
    bool vmm;
} driver_symbols[] = {
    {"cuInit", DRV_FIELD(init), true, false},
    {"cuDeviceGet", DRV_FIELD(device_get), true, false},
    {"cuDeviceGetCount", DRV_FIELD(device_get_count), true, false},
    {"cuDevicePrimaryCtxRetain", DRV_FIELD(primary_ctx_retain), true, false},
    {"cuDevicePrimaryCtxRelease_v2", DRV_FIELD(primary_ctx_release), true, false},
    {"cuCtxGetCurrent", DRV_FIELD(ctx_get_current), true, false},
    {"cuCtxSetCurrent", DRV_FIELD(ctx_set_current), true, false},
    {"cuCtxSynchronize", DRV_FIELD(ctx_synchronize), true, false},
    {"cuMemAlloc_v2", DRV_FIELD(mem_alloc), true, false},
    {"cuMemFree_v2", DRV_FIELD(mem_free), true, false},
    {"cuMemGetInfo_v2", DRV_FIELD(mem_get_info), true, false},
    {"cuEventCreate", DRV_FIELD(event_create), true, false},
    {"cuEventRecord", DRV_FIELD(event_record), true, false},
    {"cuEventQuery", DRV_FIELD(event_query), true, false},
    {"cuEventDestroy_v2", DRV_FIELD(event_destroy), true, false},
    {"cuStreamQuery", DRV_FIELD(stream_query), true, false},
    {"cuDevicePrimaryCtxGetState", DRV_FIELD(primary_ctx_get_state), false, false},
    {"cuGetErrorName", DRV_FIELD(get_error_name), false, false},
    {"cuGetErrorString", DRV_FIELD(get_error_string), false, false},
    {"cuMemAddressReserve", DRV_FIELD(mem_address_reserve), false, true},
    {"cuMemAddressFree", DRV_FIELD(mem_address_free), false, true},
    {"cuMemCreate", DRV_FIELD(mem_create), false, true},
    {"cuMemRelease", DRV_FIELD(mem_release), false, true},
    {"cuMemMap", DRV_FIELD(mem_map), false, true},
    {"cuMemUnmap", DRV_FIELD(mem_unmap), false, true},
    {"cuMemSetAccess", DRV_FIELD(mem_set_access), false, true},
    {"cuMemGetAllocationGranularity", DRV_FIELD(mem_get_allocation_granularity), false, true},
    {"cuMemsetD8Async", DRV_FIELD(memset_d8_async), false, false},
    {"cuEventSynchronize", DRV_FIELD(event_synchronize), false, false},
};

#if defined(STOW_HAVE_CUDA_HEADERS) && defined(__GNUC__)
/* With the toolkit's cuda.h, check every pointer type against the official
 * prototype. Unevaluated: no reference to libcuda is emitted. */
#define DRV_CHECK(f, sym)                                                              \
    _Static_assert(__builtin_types_compatible_p(__typeof__(D.f), __typeof__(&sym)), \
                   "driver prototype mismatch: " #sym)
DRV_CHECK(init, cuInit);
DRV_CHECK(device_get, cuDeviceGet);
DRV_CHECK(device_get_count, cuDeviceGetCount);
DRV_CHECK(primary_ctx_retain, cuDevicePrimaryCtxRetain);
DRV_CHECK(primary_ctx_release, cuDevicePrimaryCtxRelease_v2);
DRV_CHECK(ctx_get_current, cuCtxGetCurrent);
DRV_CHECK(ctx_set_current, cuCtxSetCurrent);
DRV_CHECK(ctx_synchronize, cuCtxSynchronize);
DRV_CHECK(mem_alloc, cuMemAlloc_v2);
DRV_CHECK(mem_free, cuMemFree_v2);
DRV_CHECK(mem_get_info, cuMemGetInfo_v2);
DRV_CHECK(event_create, cuEventCreate);
DRV_CHECK(event_record, cuEventRecord);
DRV_CHECK(event_query, cuEventQuery);
DRV_CHECK(event_destroy, cuEventDestroy_v2);
DRV_CHECK(stream_query, cuStreamQuery);
DRV_CHECK(primary_ctx_get_state, cuDevicePrimaryCtxGetState);
DRV_CHECK(get_error_name, cuGetErrorName);
DRV_CHECK(get_error_string, cuGetErrorString);
DRV_CHECK(mem_address_reserve, cuMemAddressReserve);
DRV_CHECK(mem_address_free, cuMemAddressFree);
DRV_CHECK(mem_create, cuMemCreate);
DRV_CHECK(mem_release, cuMemRelease);
DRV_CHECK(mem_map, cuMemMap);
DRV_CHECK(mem_unmap, cuMemUnmap);
DRV_CHECK(mem_set_access, cuMemSetAccess);
DRV_CHECK(mem_get_allocation_granularity, cuMemGetAllocationGranularity);
DRV_CHECK(memset_d8_async, cuMemsetD8Async);
DRV_CHECK(event_synchronize, cuEventSynchronize);
#endif

/* "NAME: message" for a driver result; both lookups may fail (the stub
 * library answers cuGetErrorName with an error and a NULL name). */
static void describe_result(CUresult r, char *buf, size_t len)
{
    const char *name = NULL, *msg = NULL;
    if (D.get_error_name && D.get_error_name(r, &name) != CUDA_SUCCESS)
        name = NULL;
    if (D.get_error_string && D.get_error_string(r, &msg) != CUDA_SUCCESS)
        msg = NULL;
    if (name)
        snprintf(buf, len, "%s: %s", name, msg ? msg : "(no message)");
    else if ((int)r == 34) /* the toolkit's stub libcuda.so found instead of a driver */
        snprintf(buf, len, "CUresult 34 (CUDA_ERROR_STUB_LIBRARY: libcuda.so.1 is a stub)");
    else
        snprintf(buf, len, "CUresult %d", (int)r);
}

static void driver_load(void)
{
    D.probe = STOW_CUDA_PROBE_OK;
    /* The SONAME, not "libcuda.so" (a development symlink only). */
    D.handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!D.handle) {
        const char *e = dlerror();
        snprintf(D.why, sizeof D.why, "dlopen(libcuda.so.1) failed: %s", e ? e : "unknown");
        D.probe = STOW_CUDA_PROBE_NO_DRIVER;
        return;
    }
    D.has_vmm = true;
    for (size_t i = 0; i < sizeof driver_symbols / sizeof driver_symbols[0]; i++) {
        void *sym = dlsym(D.handle, driver_symbols[i].name);
        if (!sym && driver_symbols[i].required) {
            snprintf(D.why, sizeof D.why, "libcuda.so.1 lacks %s", driver_symbols[i].name);
            D.probe = STOW_CUDA_PROBE_NO_SYMBOL;
            return;
        }
        if (!sym && driver_symbols[i].vmm)
            D.has_vmm = false;
        /* ISO C has no object-to-function pointer conversion; POSIX guarantees
         * the representation, so copy the bytes. */
        memcpy((char *)&D + driver_symbols[i].offset, &sym, sizeof sym);
    }
    CUresult r = D.init(0);
    if (r != CUDA_SUCCESS) {
        char desc[160];
        describe_result(r, desc, sizeof desc);
        snprintf(D.why, sizeof D.why, "cuInit failed: %s", desc);
        D.probe = STOW_CUDA_PROBE_INIT;
        return;
    }
    int n = 0;
    r = D.device_get_count(&n);
    if (r != CUDA_SUCCESS || n <= 0) {
        char desc[160];
        if (r != CUDA_SUCCESS)
            describe_result(r, desc, sizeof desc);
        snprintf(D.why, sizeof D.why, "no CUDA device: %s",
                 r != CUDA_SUCCESS ? desc : "cuDeviceGetCount returned 0");
        D.probe = STOW_CUDA_PROBE_NO_DEVICE;
        return;
    }
    D.device_count = n;
}

static int driver_ready(char *why, size_t why_len)
{
    pthread_once(&driver_once, driver_load);
    if (D.probe != STOW_CUDA_PROBE_OK && why && why_len)
        snprintf(why, why_len, "%s", D.why);
    return D.probe;
}

int stow_cuda_probe(char *why, size_t why_len)
{
    int p = driver_ready(why, why_len);
    if (p == STOW_CUDA_PROBE_OK && why && why_len)
        why[0] = '\0';
    return p;
}

int stow_cuda_device_count(void)
{
    return driver_ready(NULL, 0) == STOW_CUDA_PROBE_OK ? D.device_count : 0;
}

void *stow_cuda_driver_symbol(const char *name)
{
    pthread_once(&driver_once, driver_load);
    if (!name || D.probe != STOW_CUDA_PROBE_OK)
        return NULL;
    return dlsym(D.handle, name);
}

/* ---- one backend ---- */

typedef struct cuda {
    stow_backend_t backend; /* first: the handle is a pointer to it */
    int ordinal;
    CUdevice dev;
    CUcontext ctx;            /* the retained primary context */
    pthread_mutex_t lock;     /* guards events[] and last_error */
    CUevent *events;          /* pooled, idle events */
    size_t event_count, event_capacity;
    char last_error[CUDA_ERR_LEN];
} cuda_t;

static const char cuda_name[] = "cuda";

static cuda_t *cuda_of(void *ctx) { return (cuda_t *)ctx; }

/* Records the failure of `what` and maps it to a status. */
static stow_status_t cuda_fail(cuda_t *c, CUresult r, const char *fmt, ...)
{
    char what[96], desc[128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    describe_result(r, desc, sizeof desc);
    pthread_mutex_lock(&c->lock);
    snprintf(c->last_error, sizeof c->last_error, "%s: %s", what, desc);
    pthread_mutex_unlock(&c->lock);
    return r == CUDA_ERROR_OUT_OF_MEMORY ? STOW_ENOMEM : STOW_EBACKEND;
}

/* Makes the primary context current for one call. A thread with no context
 * keeps ours afterwards (what cudart's lazy init would do); a thread that had
 * another context (another device) gets it back in ctx_leave. */
typedef struct ctx_guard {
    CUcontext prev;
    bool restore;
} ctx_guard_t;

static stow_status_t ctx_enter(cuda_t *c, ctx_guard_t *g)
{
    g->prev = NULL;
    g->restore = false;
    CUcontext cur = NULL;
    CUresult r = D.ctx_get_current(&cur);
    if (r != CUDA_SUCCESS)
        return cuda_fail(c, r, "cuCtxGetCurrent");
    if (cur == c->ctx)
        return STOW_OK;
    r = D.ctx_set_current(c->ctx);
    if (r != CUDA_SUCCESS)
        return cuda_fail(c, r, "cuCtxSetCurrent");
    if (cur) {
        g->prev = cur;
        g->restore = true;
    }
    return STOW_OK;
}

static void ctx_leave(const ctx_guard_t *g)
{
    if (g->restore)
        (void)D.ctx_set_current(g->prev);
}

static stow_status_t cuda_reserve(void *ctx, size_t size_bytes, stow_stream_t stream, void **out)
{
    (void)stream; /* cuMemAlloc is not stream-ordered */
    cuda_t *c = cuda_of(ctx);
    if (size_bytes == 0 || !out)
        return STOW_EINVAL;
    ctx_guard_t g;
    stow_status_t st = ctx_enter(c, &g);
    if (st != STOW_OK)
        return st;
    CUdeviceptr p = 0;
    CUresult r = D.mem_alloc(&p, size_bytes);
    if (r == CUDA_SUCCESS)
        *out = (void *)(uintptr_t)p;
    else
        st = cuda_fail(c, r, "cuMemAlloc_v2(%zu)", size_bytes);
    ctx_leave(&g);
    return st;
}

static stow_status_t cuda_release(void *ctx, void *ptr, size_t size_bytes)
{
    cuda_t *c = cuda_of(ctx);
    ctx_guard_t g;
    stow_status_t st = ctx_enter(c, &g);
    if (st != STOW_OK)
        return st;
    CUresult r = D.mem_free((CUdeviceptr)(uintptr_t)ptr);
    if (r != CUDA_SUCCESS)
        st = cuda_fail(c, r, "cuMemFree_v2(%p, %zu)", ptr, size_bytes);
    ctx_leave(&g);
    return st;
}

/* scrub_on_free: a memset queued on the freeing stream, so the next user of
 * the block on that stream (or on another, after the pool's clearance event)
 * sees zeros. */
static stow_status_t cuda_scrub(void *ctx, void *ptr, size_t size_bytes, stow_stream_t stream)
{
    cuda_t *c = cuda_of(ctx);
    ctx_guard_t g;
    stow_status_t st = ctx_enter(c, &g);
    if (st != STOW_OK)
        return st;
    CUresult r = D.memset_d8_async((CUdeviceptr)(uintptr_t)ptr, 0, size_bytes, (CUstream)stream);
    if (r != CUDA_SUCCESS)
        st = cuda_fail(c, r, "cuMemsetD8Async(%p, 0, %zu)", ptr, size_bytes);
    ctx_leave(&g);
    return st;
}

static stow_status_t cuda_mem_info(void *ctx, size_t *free_bytes, size_t *total_bytes)
{
    cuda_t *c = cuda_of(ctx);
    ctx_guard_t g;
    stow_status_t st = ctx_enter(c, &g);
    if (st != STOW_OK)
        return st;
    size_t f = 0, t = 0;
    CUresult r = D.mem_get_info(&f, &t);
    if (r == CUDA_SUCCESS) {
        *free_bytes = f;
        *total_bytes = t;
    } else {
        st = cuda_fail(c, r, "cuMemGetInfo_v2");
    }
    ctx_leave(&g);
    return st;
}

static stow_status_t cuda_synchronize(void *ctx)
{
    cuda_t *c = cuda_of(ctx);
    ctx_guard_t g;
    stow_status_t st = ctx_enter(c, &g);
    if (st != STOW_OK)
        return st;
    CUresult r = D.ctx_synchronize();
    if (r != CUDA_SUCCESS)
        st = cuda_fail(c, r, "cuCtxSynchronize");
    ctx_leave(&g);
    return st;
}

/* ---- events: a mutex-protected free list of idle events ---- */

static CUevent event_pop(cuda_t *c)
{
    CUevent ev = NULL;
    pthread_mutex_lock(&c->lock);
    if (c->event_count)
        ev = c->events[--c->event_count];
    pthread_mutex_unlock(&c->lock);
    return ev;
}

/* Returns false when the list cannot grow (the caller destroys the event). */
static bool event_push(cuda_t *c, CUevent ev)
{
    bool ok = true;
    pthread_mutex_lock(&c->lock);
    if (c->event_count == c->event_capacity) {
        size_t cap = c->event_capacity ? 2 * c->event_capacity : 64;
        CUevent *grown = realloc(c->events, cap * sizeof *grown);
        if (grown) {
            c->events = grown;
            c->event_capacity = cap;
        } else {
            ok = false;
        }
    }
    if (ok)
        c->events[c->event_count++] = ev;
    pthread_mutex_unlock(&c->lock);
    return ok;
}

static stow_status_t cuda_event_record(void *ctx, stow_stream_t stream, stow_event_t *out)
{
    cuda_t *c = cuda_of(ctx);
    ctx_guard_t g;
    stow_status_t st = ctx_enter(c, &g);
    if (st != STOW_OK)
        return st;
    CUevent ev = event_pop(c);
    CUresult r = CUDA_SUCCESS;
    if (!ev) {
        r = D.event_create(&ev, CU_EVENT_DISABLE_TIMING);
        if (r != CUDA_SUCCESS)
            st = cuda_fail(c, r, "cuEventCreate");
    }
    if (st == STOW_OK) {
        r = D.event_record(ev, (CUstream)stream);
        if (r == CUDA_SUCCESS) {
            *out = (stow_event_t)ev;
        } else {
            st = cuda_fail(c, r, "cuEventRecord(stream %p)", stream);
            if (!event_push(c, ev))
                (void)D.event_destroy(ev);
        }
    }
    ctx_leave(&g);
    return st;
}

static stow_status_t cuda_event_query(void *ctx, stow_event_t event, bool *done)
{
    cuda_t *c = cuda_of(ctx);
    ctx_guard_t g;
    stow_status_t st = ctx_enter(c, &g);
    if (st != STOW_OK)
        return st;
    CUresult r = D.event_query((CUevent)event);
    if (r == CUDA_SUCCESS)
        *done = true;
    else if (r == CUDA_ERROR_NOT_READY)
        *done = false;
    else
        st = cuda_fail(c, r, "cuEventQuery");
    ctx_leave(&g);
    return st;
}

/* Blocks the calling thread until the event's work completed; work queued
 * after it keeps running (what a remap waits for, vmm_epochs.c). */
static stow_status_t cuda_event_synchronize(void *ctx, stow_event_t event)
{
    cuda_t *c = cuda_of(ctx);
    ctx_guard_t g;
    stow_status_t st = ctx_enter(c, &g);
    if (st != STOW_OK)
        return st;
    CUresult r = D.event_synchronize((CUevent)event);
    if (r != CUDA_SUCCESS)
        st = cuda_fail(c, r, "cuEventSynchronize");
    ctx_leave(&g);
    return st;
}

static stow_status_t cuda_event_destroy(void *ctx, stow_event_t event)
{
    cuda_t *c = cuda_of(ctx);
    if (!event)
        return STOW_OK;
    if (event_push(c, (CUevent)event))
        return STOW_OK;
    ctx_guard_t g;
    stow_status_t st = ctx_enter(c, &g);
    if (st != STOW_OK)
        return st;
    CUresult r = D.event_destroy((CUevent)event);
    if (r != CUDA_SUCCESS)
        st = cuda_fail(c, r, "cuEventDestroy_v2");
    ctx_leave(&g);
    return st;
}

/* ---- virtual memory management ---- */

static void device_location(const cuda_t *c, CUmemLocation *loc)
{
    memset(loc, 0, sizeof *loc);
    loc->type = CU_MEM_LOCATION_TYPE_DEVICE;
    loc->id = c->dev;
}

static void alloc_prop(const cuda_t *c, CUmemAllocationProp *prop)
{
    memset(prop, 0, sizeof *prop);
    prop->type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop->requestedHandleTypes = CU_MEM_HANDLE_TYPE_NONE;
    device_location(c, &prop->location);
}

static stow_status_t cuda_va_reserve(void *ctx, size_t size_bytes, void **out)
{
    cuda_t *c = cuda_of(ctx);
    ctx_guard_t g;
    stow_status_t st = ctx_enter(c, &g);
    if (st != STOW_OK)
        return st;
    CUdeviceptr p = 0;
    CUresult r = D.mem_address_reserve(&p, size_bytes, c->backend.granularity_bytes, 0, 0);
    if (r == CUDA_SUCCESS)
        *out = (void *)(uintptr_t)p;
    else
        st = cuda_fail(c, r, "cuMemAddressReserve(%zu)", size_bytes);
    ctx_leave(&g);
    return st;
}

static stow_status_t cuda_va_release(void *ctx, void *va, size_t size_bytes)
{
    cuda_t *c = cuda_of(ctx);
    ctx_guard_t g;
    stow_status_t st = ctx_enter(c, &g);
    if (st != STOW_OK)
        return st;
    CUresult r = D.mem_address_free((CUdeviceptr)(uintptr_t)va, size_bytes);
    if (r != CUDA_SUCCESS)
        st = cuda_fail(c, r, "cuMemAddressFree(%p, %zu)", va, size_bytes);
    ctx_leave(&g);
    return st;
}

static stow_status_t cuda_phys_create(void *ctx, size_t size_bytes, stow_phys_t *out)
{
    cuda_t *c = cuda_of(ctx);
    ctx_guard_t g;
    stow_status_t st = ctx_enter(c, &g);
    if (st != STOW_OK)
        return st;
    CUmemAllocationProp prop;
    alloc_prop(c, &prop);
    CUmemGenericAllocationHandle h = 0;
    CUresult r = D.mem_create(&h, size_bytes, &prop, 0);
    if (r == CUDA_SUCCESS)
        *out = (stow_phys_t)h;
    else
        st = cuda_fail(c, r, "cuMemCreate(%zu)", size_bytes);
    ctx_leave(&g);
    return st;
}

static stow_status_t cuda_phys_release(void *ctx, stow_phys_t handle, size_t size_bytes)
{
    cuda_t *c = cuda_of(ctx);
    ctx_guard_t g;
    stow_status_t st = ctx_enter(c, &g);
    if (st != STOW_OK)
        return st;
    CUresult r = D.mem_release((CUmemGenericAllocationHandle)handle);
    if (r != CUDA_SUCCESS)
        st = cuda_fail(c, r, "cuMemRelease(%zu bytes)", size_bytes);
    ctx_leave(&g);
    return st;
}

static stow_status_t cuda_map(void *ctx, void *va, size_t size_bytes, stow_phys_t handle)
{
    cuda_t *c = cuda_of(ctx);
    ctx_guard_t g;
    stow_status_t st = ctx_enter(c, &g);
    if (st != STOW_OK)
        return st;
    CUdeviceptr p = (CUdeviceptr)(uintptr_t)va;
    CUresult r = D.mem_map(p, size_bytes, 0, (CUmemGenericAllocationHandle)handle, 0);
    if (r != CUDA_SUCCESS) {
        st = cuda_fail(c, r, "cuMemMap(%p, %zu)", va, size_bytes);
    } else {
        CUmemAccessDesc desc;
        memset(&desc, 0, sizeof desc);
        device_location(c, &desc.location);
        desc.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
        r = D.mem_set_access(p, size_bytes, &desc, 1);
        if (r != CUDA_SUCCESS) {
            st = cuda_fail(c, r, "cuMemSetAccess(%p, %zu)", va, size_bytes);
            (void)D.mem_unmap(p, size_bytes);
        }
    }
    ctx_leave(&g);
    return st;
}

static stow_status_t cuda_unmap(void *ctx, void *va, size_t size_bytes)
{
    cuda_t *c = cuda_of(ctx);
    ctx_guard_t g;
    stow_status_t st = ctx_enter(c, &g);
    if (st != STOW_OK)
        return st;
    CUresult r = D.mem_unmap((CUdeviceptr)(uintptr_t)va, size_bytes);
    if (r != CUDA_SUCCESS)
        st = cuda_fail(c, r, "cuMemUnmap(%p, %zu)", va, size_bytes);
    ctx_leave(&g);
    return st;
}

/* ---- create / destroy ---- */

static size_t round_pow2(size_t x)
{
    size_t p = CUDA_MIN_GRANULARITY;
    while (p < x && p <= SIZE_MAX / 2)
        p *= 2;
    return p;
}

stow_status_t stow_cuda_backend_create(int device, stow_backend_t **out, char *why,
                                       size_t why_len)
{
    if (why && why_len)
        why[0] = '\0';
    if (!out || device < 0) {
        if (why && why_len)
            snprintf(why, why_len, "invalid argument (device %d)", device);
        return STOW_EINVAL;
    }
    if (driver_ready(why, why_len) != STOW_CUDA_PROBE_OK)
        return STOW_ENODEV;
    if (device >= D.device_count) {
        if (why && why_len)
            snprintf(why, why_len, "CUDA device %d out of range (%d device%s)", device,
                     D.device_count, D.device_count == 1 ? "" : "s");
        return STOW_ENODEV;
    }
    char desc[160];
    CUdevice dev = 0;
    CUresult r = D.device_get(&dev, device);
    if (r != CUDA_SUCCESS) {
        describe_result(r, desc, sizeof desc);
        if (why && why_len)
            snprintf(why, why_len, "cuDeviceGet(%d): %s", device, desc);
        return STOW_ENODEV;
    }
    cuda_t *c = calloc(1, sizeof *c);
    if (!c)
        return STOW_EHOSTMEM;
    r = D.primary_ctx_retain(&c->ctx, dev);
    if (r != CUDA_SUCCESS) {
        describe_result(r, desc, sizeof desc);
        if (why && why_len)
            snprintf(why, why_len, "cuDevicePrimaryCtxRetain(%d): %s", device, desc);
        free(c);
        return STOW_ENODEV;
    }
    pthread_mutex_init(&c->lock, NULL);
    c->ordinal = device;
    c->dev = dev;

    stow_backend_t *b = &c->backend;
    b->abi_version = STOW_BACKEND_ABI;
    b->name = cuda_name;
    b->ctx = c;
    b->granularity_bytes = CUDA_MIN_GRANULARITY;
    b->reserve = cuda_reserve;
    b->release = cuda_release;
    b->mem_info = cuda_mem_info;
    b->synchronize = cuda_synchronize;
    b->event_record = cuda_event_record;
    b->event_query = cuda_event_query;
    b->event_destroy = cuda_event_destroy;
    if (D.event_synchronize)
        b->event_synchronize = cuda_event_synchronize;

    if (D.memset_d8_async)
        b->scrub = cuda_scrub;
    if (D.has_vmm) {
        /* VMM is usable when the device answers the granularity query. */
        CUmemAllocationProp prop;
        alloc_prop(c, &prop);
        size_t gran = 0;
        ctx_guard_t g;
        if (ctx_enter(c, &g) == STOW_OK) {
            r = D.mem_get_allocation_granularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM);
            ctx_leave(&g);
            if (r == CUDA_SUCCESS && gran > 0) {
                b->granularity_bytes = round_pow2(gran);
                b->va_reserve = cuda_va_reserve;
                b->va_release = cuda_va_release;
                b->phys_create = cuda_phys_create;
                b->phys_release = cuda_phys_release;
                b->map = cuda_map;
                b->unmap = cuda_unmap;
            }
        }
    }
    *out = b;
    return STOW_OK;
}

int stow_cuda_backend_device(const stow_backend_t *backend)
{
    if (!backend || backend->name != cuda_name)
        return -1;
    return ((const cuda_t *)backend->ctx)->ordinal;
}

size_t stow_cuda_last_error(const stow_backend_t *backend, char *buf, size_t buf_len)
{
    if (stow_cuda_backend_device(backend) < 0) {
        if (buf && buf_len)
            buf[0] = '\0';
        return 0;
    }
    cuda_t *c = (cuda_t *)backend->ctx;
    pthread_mutex_lock(&c->lock);
    size_t n = strlen(c->last_error);
    if (buf && buf_len)
        snprintf(buf, buf_len, "%s", c->last_error);
    pthread_mutex_unlock(&c->lock);
    return n;
}

void stow_cuda_backend_destroy(stow_backend_t *backend)
{
    if (stow_cuda_backend_device(backend) < 0)
        return;
    cuda_t *c = (cuda_t *)backend->ctx;
    ctx_guard_t g;
    if (ctx_enter(c, &g) == STOW_OK) {
        for (size_t i = 0; i < c->event_count; i++)
            (void)D.event_destroy(c->events[i]);
        ctx_leave(&g);
    }
    (void)D.primary_ctx_release(c->dev);
    /* If that was the last retain (nobody else, e.g. the CUDA runtime, holds
     * the primary context), do not leave this thread with a dead context. */
    unsigned int flags = 0;
    int active = 1;
    CUcontext cur = NULL;
    if (D.primary_ctx_get_state &&
        D.primary_ctx_get_state(c->dev, &flags, &active) == CUDA_SUCCESS && !active &&
        D.ctx_get_current(&cur) == CUDA_SUCCESS && cur == c->ctx)
        (void)D.ctx_set_current(NULL);
    free(c->events);
    pthread_mutex_destroy(&c->lock);
    free(c);
}
