/*
 * stowage/fake_cuda.c: an emulated CUDA device for `stowage predict`, built by
 * stowage/fake_gpu.py into libcuda.so.1 and loaded before PyTorch.
 *
 * It owns the answers that PyTorch's C++ side gets about the device when a
 * model runs on fake tensors: one device, the target card's properties
 * (cudaGetDeviceProperties, cudaDeviceGetAttribute, cudaMemGetInfo), the
 * current device, streams and events as opaque handles, stream capture off.
 * With them, torch.cuda.is_available() is true, the autograd engine runs the
 * backward pass on its device thread as on a GPU, and C++ choices made on the
 * device (scaled_dot_product_attention's backend, cuBLAS workspace sizes) are
 * the target card's.
 *
 * It must not compute, copy or allocate device memory: nothing of the model
 * runs on it (FakeTensorMode computes shapes only). cudaMalloc and the other
 * calls that would need real memory or a kernel return an error, and say so on
 * stderr once, so that an allocation outside the recorder is never silent.
 *
 * Symbols: the CUDA runtime functions PyTorch calls (interposed over
 * libcudart.so: this library is loaded first, globally) and the driver
 * functions that c10's driver API and cudaGetDriverEntryPointByVersion look up
 * (the library's soname is libcuda.so.1, so a dlopen of the driver finds it).
 * The layout of cudaDeviceProp is CUDA 13's (fake_gpu.py refuses other CUDA
 * builds of PyTorch). Only the C library is used; no CUDA header is needed.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define API __attribute__((visibility("default")))

typedef int cuda_status_t; /* cudaError_t and CUresult: 0 is success */
enum {
    OK = 0,
    ERR_INVALID_VALUE = 1,
    ERR_MEMORY_ALLOCATION = 2,
    ERR_INVALID_DEVICE = 101,
    ERR_NOT_SUPPORTED = 801,
};

/* cudaDeviceProp of CUDA 13 (1008 bytes): every field up to the reserved tail. */
struct device_prop {
    char name[256];
    unsigned char uuid[16];
    char luid[8];
    unsigned int luidDeviceNodeMask;
    size_t totalGlobalMem;
    size_t sharedMemPerBlock;
    int regsPerBlock;
    int warpSize;
    size_t memPitch;
    int maxThreadsPerBlock;
    int maxThreadsDim[3];
    int maxGridSize[3];
    size_t totalConstMem;
    int major;
    int minor;
    size_t textureAlignment;
    size_t texturePitchAlignment;
    int multiProcessorCount;
    int integrated;
    int canMapHostMemory;
    int maxTexture1D;
    int maxTexture1DMipmap;
    int maxTexture2D[2];
    int maxTexture2DMipmap[2];
    int maxTexture2DLinear[3];
    int maxTexture2DGather[2];
    int maxTexture3D[3];
    int maxTexture3DAlt[3];
    int maxTextureCubemap;
    int maxTexture1DLayered[2];
    int maxTexture2DLayered[3];
    int maxTextureCubemapLayered[2];
    int maxSurface1D;
    int maxSurface2D[2];
    int maxSurface3D[3];
    int maxSurface1DLayered[2];
    int maxSurface2DLayered[3];
    int maxSurfaceCubemap;
    int maxSurfaceCubemapLayered[2];
    size_t surfaceAlignment;
    int concurrentKernels;
    int ECCEnabled;
    int pciBusID;
    int pciDeviceID;
    int pciDomainID;
    int tccDriver;
    int asyncEngineCount;
    int unifiedAddressing;
    int memoryBusWidth;
    int l2CacheSize;
    int persistingL2CacheMaxSize;
    int maxThreadsPerMultiProcessor;
    int streamPrioritiesSupported;
    int globalL1CacheSupported;
    int localL1CacheSupported;
    size_t sharedMemPerMultiprocessor;
    int regsPerMultiprocessor;
    int managedMemory;
    int isMultiGpuBoard;
    int multiGpuBoardGroupID;
    int hostNativeAtomicSupported;
    int pageableMemoryAccess;
    int concurrentManagedAccess;
    int computePreemptionSupported;
    int canUseHostPointerForRegisteredMem;
    int cooperativeLaunch;
    size_t sharedMemPerBlockOptin;
    int pageableMemoryAccessUsesHostPageTables;
    int directManagedMemAccessFromHost;
    int maxBlocksPerMultiProcessor;
    int accessPolicyMaxWindowSize;
    size_t reservedSharedMemPerBlock;
    int hostRegisterSupported;
    int sparseCudaArraySupported;
    int hostRegisterReadOnlySupported;
    int timelineSemaphoreInteropSupported;
    int memoryPoolsSupported;
    int gpuDirectRDMASupported;
    unsigned int gpuDirectRDMAFlushWritesOptions;
    int gpuDirectRDMAWritesOrdering;
    unsigned int memoryPoolSupportedHandleTypes;
    int deferredMappingCudaArraySupported;
    int ipcEventSupported;
    int clusterLaunch;
    int unifiedFunctionPointers;
    int deviceNumaConfig;
    int deviceNumaId;
    int mpsEnabled;
    int hostNumaId;
    unsigned int gpuPciDeviceID;
    unsigned int gpuPciSubsystemID;
    int hostNumaMultinodeIpcSupported;
    int reserved[56];
};
_Static_assert(sizeof(struct device_prop) == 1008, "cudaDeviceProp of CUDA 13 is 1008 bytes");
_Static_assert(offsetof(struct device_prop, totalGlobalMem) == 288, "cudaDeviceProp layout");
_Static_assert(offsetof(struct device_prop, major) == 360, "cudaDeviceProp layout");
_Static_assert(offsetof(struct device_prop, multiProcessorCount) == 384, "cudaDeviceProp layout");
_Static_assert(offsetof(struct device_prop, reserved) == 784, "cudaDeviceProp layout");

/* The card, set by stow_fake_cuda_configure before PyTorch's first query.
 * Defaults: an H100 80GB, so that a load without configuration is coherent. */
static struct {
    char name[256];
    int major, minor;
    int sm_count;
    size_t total_bytes;
    size_t context_bytes;     /* outside the allocator: what mem_get_info does not offer */
    int l2_bytes;
    size_t smem_per_block_optin;
    size_t smem_per_sm;
    int bus_width_bits;
} card = {"NVIDIA H100 80GB HBM3", 9, 0, 132, (size_t)81559 << 20, (size_t)512 << 20,
          50 << 20, 232448, 233472, 5120};

static __thread int current_device;
static uintptr_t next_handle = 0x5100; /* fake stream and event handles */
static int warned_alloc;

/* Sets the emulated card. Called from Python (ctypes) before torch asks. */
API void stow_fake_cuda_configure(const char *name, int major, int minor, int sm_count,
                                  unsigned long long total_bytes,
                                  unsigned long long context_bytes, int l2_bytes,
                                  unsigned long long smem_per_block_optin,
                                  unsigned long long smem_per_sm, int bus_width_bits)
{
    snprintf(card.name, sizeof card.name, "%s", name);
    card.major = major;
    card.minor = minor;
    card.sm_count = sm_count;
    card.total_bytes = (size_t)total_bytes;
    card.context_bytes = (size_t)context_bytes;
    card.l2_bytes = l2_bytes;
    card.smem_per_block_optin = (size_t)smem_per_block_optin;
    card.smem_per_sm = (size_t)smem_per_sm;
    card.bus_width_bits = bus_width_bits;
}

/* How many calls tried to allocate or move real device memory (0 in a sound run). */
static unsigned long long refused_calls;
API unsigned long long stow_fake_cuda_refused_calls(void) { return refused_calls; }

static cuda_status_t refuse(const char *what)
{
    refused_calls++;
    if (!warned_alloc) {
        warned_alloc = 1;
        fprintf(stderr, "stowage predict: %s was called on the emulated device; nothing runs "
                        "on it (a tensor made outside the recorder?)\n", what);
    }
    return ERR_MEMORY_ALLOCATION;
}

static void *new_handle(void)
{
    next_handle += 16;
    return (void *)next_handle;
}

/* ---- runtime: device ---- */

API cuda_status_t cudaGetDeviceCount(int *count)
{
    *count = 1;
    return OK;
}

API cuda_status_t cudaGetDevice(int *device)
{
    *device = current_device;
    return OK;
}

API cuda_status_t cudaSetDevice(int device)
{
    if (device != 0)
        return ERR_INVALID_DEVICE;
    current_device = device;
    return OK;
}

API cuda_status_t cudaDriverGetVersion(int *version)
{
    *version = 13000;
    return OK;
}

API cuda_status_t cudaRuntimeGetVersion(int *version)
{
    *version = 13000;
    return OK;
}

API cuda_status_t cudaGetLastError(void) { return OK; }
API cuda_status_t cudaPeekAtLastError(void) { return OK; }
API cuda_status_t cudaDeviceSynchronize(void) { return OK; }

API cuda_status_t cudaGetDeviceProperties(struct device_prop *p, int device)
{
    if (device != 0)
        return ERR_INVALID_DEVICE;
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", card.name);
    memcpy(p->uuid, "stowage-emulated", 16);
    p->totalGlobalMem = card.total_bytes;
    p->sharedMemPerBlock = 49152;
    p->regsPerBlock = 65536;
    p->warpSize = 32;
    p->memPitch = 2147483647;
    p->maxThreadsPerBlock = 1024;
    p->maxThreadsDim[0] = 1024;
    p->maxThreadsDim[1] = 1024;
    p->maxThreadsDim[2] = 64;
    p->maxGridSize[0] = 2147483647;
    p->maxGridSize[1] = 65535;
    p->maxGridSize[2] = 65535;
    p->totalConstMem = 65536;
    p->major = card.major;
    p->minor = card.minor;
    p->textureAlignment = 512;
    p->texturePitchAlignment = 32;
    p->multiProcessorCount = card.sm_count;
    p->canMapHostMemory = 1;
    p->concurrentKernels = 1;
    p->ECCEnabled = 1;
    p->pciBusID = 1;
    p->asyncEngineCount = 2;
    p->unifiedAddressing = 1;
    p->memoryBusWidth = card.bus_width_bits;
    p->l2CacheSize = card.l2_bytes;
    p->maxThreadsPerMultiProcessor = 2048;
    p->streamPrioritiesSupported = 1;
    p->globalL1CacheSupported = 1;
    p->localL1CacheSupported = 1;
    p->sharedMemPerMultiprocessor = card.smem_per_sm;
    p->regsPerMultiprocessor = 65536;
    p->managedMemory = 1;
    p->concurrentManagedAccess = 1;
    p->computePreemptionSupported = 1;
    p->cooperativeLaunch = 1;
    p->sharedMemPerBlockOptin = card.smem_per_block_optin;
    p->maxBlocksPerMultiProcessor = 32;
    p->reservedSharedMemPerBlock = 1024;
    p->hostRegisterSupported = 1;
    p->memoryPoolsSupported = 1;
    p->clusterLaunch = card.major >= 9;
    p->hostNumaId = -1;
    return OK;
}

/* cudaDeviceAttr values (driver_types.h) of the attributes PyTorch reads. */
API cuda_status_t cudaDeviceGetAttribute(int *value, int attr, int device)
{
    if (device != 0)
        return ERR_INVALID_DEVICE;
    switch (attr) {
    case 1: *value = 1024; break;                        /* max threads per block */
    case 8: *value = 49152; break;                       /* shared memory per block */
    case 10: *value = 32; break;                         /* warp size */
    case 16: *value = card.sm_count; break;              /* multiprocessor count */
    case 38: *value = card.l2_bytes; break;              /* L2 cache size */
    case 39: *value = 2048; break;                       /* max threads per SM */
    case 75: *value = card.major; break;                 /* compute capability major */
    case 76: *value = card.minor; break;                 /* compute capability minor */
    case 81: *value = (int)card.smem_per_sm; break;      /* shared memory per SM */
    case 97: *value = (int)card.smem_per_block_optin; break;
    default: *value = 0; break;
    }
    return OK;
}

API cuda_status_t cudaDeviceGetPCIBusId(char *out, int len, int device)
{
    (void)device;
    snprintf(out, (size_t)len, "0000:01:00.0");
    return OK;
}

API cuda_status_t cudaDeviceCanAccessPeer(int *can, int device, int peer)
{
    (void)device;
    (void)peer;
    *can = 0;
    return OK;
}

API cuda_status_t cudaDeviceEnablePeerAccess(int peer, unsigned flags)
{
    (void)peer;
    (void)flags;
    return ERR_INVALID_DEVICE;
}

API cuda_status_t cudaDeviceGetStreamPriorityRange(int *least, int *greatest)
{
    if (least)
        *least = 0;
    if (greatest)
        *greatest = -5;
    return OK;
}

API cuda_status_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    *total_bytes = card.total_bytes;
    *free_bytes = card.total_bytes - card.context_bytes;
    return OK;
}

/* ---- runtime: streams and events (opaque handles; all work is complete) ---- */

API cuda_status_t cudaStreamCreate(void **stream)
{
    *stream = new_handle();
    return OK;
}

API cuda_status_t cudaStreamCreateWithFlags(void **stream, unsigned flags)
{
    (void)flags;
    *stream = new_handle();
    return OK;
}

API cuda_status_t cudaStreamCreateWithPriority(void **stream, unsigned flags, int priority)
{
    (void)flags;
    (void)priority;
    *stream = new_handle();
    return OK;
}

API cuda_status_t cudaStreamDestroy(void *stream) { (void)stream; return OK; }
API cuda_status_t cudaStreamQuery(void *stream) { (void)stream; return OK; }
API cuda_status_t cudaStreamSynchronize(void *stream) { (void)stream; return OK; }

API cuda_status_t cudaStreamWaitEvent(void *stream, void *event, unsigned flags)
{
    (void)stream;
    (void)event;
    (void)flags;
    return OK;
}

API cuda_status_t cudaStreamGetPriority(void *stream, int *priority)
{
    (void)stream;
    *priority = 0;
    return OK;
}

API cuda_status_t cudaStreamIsCapturing(void *stream, int *status)
{
    (void)stream;
    *status = 0; /* cudaStreamCaptureStatusNone */
    return OK;
}

API cuda_status_t cudaStreamGetCaptureInfo(void *stream, int *status, unsigned long long *id,
                                           void **graph, const void **deps,
                                           const void **edge_data, size_t *dep_count)
{
    (void)stream;
    if (status)
        *status = 0;
    if (id)
        *id = 0;
    if (graph)
        *graph = NULL;
    if (deps)
        *deps = NULL;
    if (edge_data)
        *edge_data = NULL;
    if (dep_count)
        *dep_count = 0;
    return OK;
}

API cuda_status_t cudaThreadExchangeStreamCaptureMode(int *mode)
{
    (void)mode;
    return OK;
}

API cuda_status_t cudaEventCreate(void **event)
{
    *event = new_handle();
    return OK;
}

API cuda_status_t cudaEventCreateWithFlags(void **event, unsigned flags)
{
    (void)flags;
    *event = new_handle();
    return OK;
}

API cuda_status_t cudaEventDestroy(void *event) { (void)event; return OK; }
API cuda_status_t cudaEventQuery(void *event) { (void)event; return OK; }
API cuda_status_t cudaEventSynchronize(void *event) { (void)event; return OK; }

API cuda_status_t cudaEventRecord(void *event, void *stream)
{
    (void)event;
    (void)stream;
    return OK;
}

API cuda_status_t cudaEventRecordWithFlags(void *event, void *stream, unsigned flags)
{
    (void)event;
    (void)stream;
    (void)flags;
    return OK;
}

API cuda_status_t cudaEventElapsedTime(float *ms, void *start, void *end)
{
    (void)start;
    (void)end;
    *ms = 0.0f;
    return OK;
}

API cuda_status_t cudaFuncGetAttributes(void *attr, const void *func)
{
    (void)attr;
    (void)func;
    return ERR_NOT_SUPPORTED;
}

API cuda_status_t cudaFuncSetAttribute(const void *func, int attr, int value)
{
    (void)func;
    (void)attr;
    (void)value;
    return OK;
}

API cuda_status_t cudaProfilerStart(void) { return OK; }
API cuda_status_t cudaProfilerStop(void) { return OK; }

/* ---- runtime: what needs real memory or kernels: refused ---- */

API cuda_status_t cudaMalloc(void **ptr, size_t size)
{
    (void)size;
    *ptr = NULL;
    return refuse("cudaMalloc");
}

API cuda_status_t cudaMallocAsync(void **ptr, size_t size, void *stream)
{
    (void)size;
    (void)stream;
    *ptr = NULL;
    return refuse("cudaMallocAsync");
}

API cuda_status_t cudaHostAlloc(void **ptr, size_t size, unsigned flags)
{
    (void)size;
    (void)flags;
    *ptr = NULL;
    return refuse("cudaHostAlloc");
}

API cuda_status_t cudaFree(void *ptr)
{
    return ptr ? refuse("cudaFree") : OK; /* cudaFree(NULL) creates the context */
}

API cuda_status_t cudaFreeAsync(void *ptr, void *stream)
{
    (void)stream;
    return ptr ? refuse("cudaFreeAsync") : OK;
}

API cuda_status_t cudaMemcpy(void *dst, const void *src, size_t n, int kind)
{
    (void)dst;
    (void)src;
    (void)n;
    (void)kind;
    return refuse("cudaMemcpy");
}

API cuda_status_t cudaMemcpyAsync(void *dst, const void *src, size_t n, int kind, void *stream)
{
    (void)dst;
    (void)src;
    (void)n;
    (void)kind;
    (void)stream;
    return refuse("cudaMemcpyAsync");
}

API cuda_status_t cudaMemsetAsync(void *dst, int value, size_t n, void *stream)
{
    (void)dst;
    (void)value;
    (void)n;
    (void)stream;
    return refuse("cudaMemsetAsync");
}

API cuda_status_t cudaPointerGetAttributes(void *attr, const void *ptr)
{
    (void)attr;
    (void)ptr;
    return ERR_INVALID_VALUE;
}

/* ---- driver API (found by a dlopen of libcuda.so.1) ---- */

API cuda_status_t cuInit(unsigned flags) { (void)flags; return OK; }

API cuda_status_t cuDriverGetVersion(int *version)
{
    *version = 13000;
    return OK;
}

API cuda_status_t cuDeviceGetCount(int *count)
{
    *count = 1;
    return OK;
}

API cuda_status_t cuDeviceGet(int *device, int ordinal)
{
    if (ordinal != 0)
        return ERR_INVALID_DEVICE;
    *device = 0;
    return OK;
}

API cuda_status_t cuDeviceGetAttribute(int *value, int attr, int device)
{
    return cudaDeviceGetAttribute(value, attr, device);
}

API cuda_status_t cuDeviceGetName(char *name, int len, int device)
{
    (void)device;
    snprintf(name, (size_t)len, "%s", card.name);
    return OK;
}

API cuda_status_t cuDeviceTotalMem_v2(size_t *bytes, int device)
{
    (void)device;
    *bytes = card.total_bytes;
    return OK;
}

/* The primary context counts as active: the autograd engine then keeps the
 * caller's stream for the device, as on a GPU that has run a kernel. */
API cuda_status_t cuDevicePrimaryCtxGetState(int device, unsigned *flags, int *active)
{
    (void)device;
    if (flags)
        *flags = 0;
    if (active)
        *active = 1;
    return OK;
}

API cuda_status_t cuDevicePrimaryCtxRetain(void **ctx, int device)
{
    (void)device;
    *ctx = (void *)0x5000;
    return OK;
}

API cuda_status_t cuDevicePrimaryCtxRelease_v2(int device) { (void)device; return OK; }

API cuda_status_t cuCtxGetCurrent(void **ctx)
{
    *ctx = (void *)0x5000;
    return OK;
}

API cuda_status_t cuCtxSetCurrent(void *ctx) { (void)ctx; return OK; }

API cuda_status_t cuCtxGetDevice(int *device)
{
    *device = 0;
    return OK;
}

API cuda_status_t cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes)
{
    return cudaMemGetInfo(free_bytes, total_bytes);
}

API cuda_status_t cuGetErrorString(int code, const char **text)
{
    (void)code;
    *text = "not available on the emulated device (stowage predict)";
    return OK;
}

API cuda_status_t cuGetErrorName(int code, const char **text)
{
    (void)code;
    *text = "CUDA_ERROR_NOT_SUPPORTED";
    return OK;
}

API cuda_status_t cuMemAlloc_v2(void **ptr, size_t size)
{
    (void)size;
    *ptr = NULL;
    return refuse("cuMemAlloc");
}

API cuda_status_t cuMemCreate(void *handle, size_t size, const void *prop, unsigned long long f)
{
    (void)handle;
    (void)size;
    (void)prop;
    (void)f;
    return refuse("cuMemCreate");
}

/* A driver function by name, for cudaGetDriverEntryPointByVersion: this
 * library's own, or not found. */
API cuda_status_t cudaGetDriverEntryPointByVersion(const char *symbol, void **fn,
                                                   unsigned version, unsigned long long flags,
                                                   int *status)
{
    (void)version;
    (void)flags;
    Dl_info self;
    void *found = NULL;
    if (dladdr((void *)cuInit, &self) && self.dli_fname) {
        void *h = dlopen(self.dli_fname, RTLD_NOW | RTLD_NOLOAD);
        if (h) {
            found = dlsym(h, symbol);
            dlclose(h);
        }
    }
    *fn = found;
    if (status)
        *status = found ? 0 : 1; /* cudaDriverEntryPointSuccess / SymbolNotFound */
    return OK;
}
