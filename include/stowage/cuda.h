/*
 * stowage/cuda.h: the CUDA backend (allocator/backend/cuda.c).
 *
 * The backend drives the CUDA *driver* API, loaded at run time with
 * dlopen("libcuda.so.1"): libstowage has no link-time dependency on libcuda or
 * libcudart, builds on machines without the toolkit, and on machines without a
 * driver or a GPU every call here fails cleanly with STOW_ENODEV and a reason.
 *
 * Memory comes from the device's *primary* context, the one the CUDA runtime
 * (and therefore PyTorch) uses, so pointers and streams are shared with the
 * runtime: a CUstream is a cudaStream_t. Every backend method makes that
 * context current on the calling thread for the duration of the call; when the
 * thread had no current context it is left current, as the runtime would do.
 *
 * Mapping of the backend vtable (stowage/backend.h):
 *   reserve/release   cuMemAlloc_v2 / cuMemFree_v2 (granularity 2 MiB)
 *   mem_info          cuMemGetInfo_v2          synchronize  cuCtxSynchronize
 *   event_*           cuEventRecord / cuEventQuery on pooled events (timing off)
 *   va_reserve/...    cuMemAddressReserve, cuMemCreate (pinned, this device),
 *                     cuMemMap + cuMemSetAccess (read/write, this device),
 *                     cuMemUnmap, cuMemRelease, cuMemAddressFree
 *                     (NULL when the driver or device lacks virtual memory mgmt)
 * CUDA_ERROR_OUT_OF_MEMORY maps to STOW_ENOMEM (so the pool frees its cache
 * and retries); any other driver error to STOW_EBACKEND, with the driver's
 * name and message kept for stow_cuda_last_error().
 */
#ifndef STOWAGE_CUDA_H
#define STOWAGE_CUDA_H

#include <stddef.h>

#include "stowage/backend.h"
#include "stowage/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* stow_cuda_probe() results. */
#define STOW_CUDA_PROBE_OK 0
#define STOW_CUDA_PROBE_NO_DRIVER (-1)  /* dlopen("libcuda.so.1") failed */
#define STOW_CUDA_PROBE_NO_SYMBOL (-2)  /* a required entry point is missing */
#define STOW_CUDA_PROBE_INIT (-3)       /* cuInit failed (stub library, bad driver...) */
#define STOW_CUDA_PROBE_NO_DEVICE (-4)  /* cuDeviceGetCount failed or returned 0 */

/*
 * Loads and initialises the driver (once per process) and counts devices.
 * Returns STOW_CUDA_PROBE_OK when at least one device is usable, else one of
 * the negative codes above with a human-readable reason in why (always
 * NUL-terminated when why_len > 0), e.g. "dlopen(libcuda.so.1) failed: ...".
 * Thread safety: safe (the driver is resolved under pthread_once).
 */
STOW_API int stow_cuda_probe(char *why, size_t why_len);

/* Number of CUDA devices (0 when the driver is unusable). Thread safety: safe. */
STOW_API int stow_cuda_device_count(void);

/*
 * Creates a backend on device `device` (0-based): retains its primary context
 * and sizes the granularity (2 MiB, or the VMM granularity if larger).
 * Ownership: destroy with stow_cuda_backend_destroy after every pool on it.
 * Thread safety: safe; the backend locks internally and may be shared.
 * Errors: STOW_ENODEV (no driver, no device, device out of range; the reason
 * goes into why), STOW_EBACKEND (the driver failed otherwise), STOW_EINVAL,
 * STOW_EHOSTMEM.
 */
STOW_API stow_status_t stow_cuda_backend_create(int device, stow_backend_t **out, char *why,
                                                size_t why_len);

/*
 * DESTRUCTOR. Destroys the pooled events and releases the primary context.
 * Device memory still reserved through it is not freed (destroy pools first).
 * NULL is a harmless no-op. Thread safety: no other call on it may run or follow.
 */
STOW_API void stow_cuda_backend_destroy(stow_backend_t *backend);

/* Device ordinal of a CUDA backend; -1 if `backend` is not one. */
STOW_API int stow_cuda_backend_device(const stow_backend_t *backend);

/*
 * The last driver error seen by this backend ("" if none), e.g.
 * "cuMemAlloc_v2(4294967296): CUDA_ERROR_OUT_OF_MEMORY: out of memory".
 * Writes at most buf_len bytes, NUL-terminated; returns the full length.
 * Thread safety: safe.
 */
STOW_API size_t stow_cuda_last_error(const stow_backend_t *backend, char *buf, size_t buf_len);

/*
 * The address of a driver entry point ("cuMemcpyHtoD_v2"...), from the same
 * dlopen'ed libcuda, or NULL when the driver is unusable or lacks it. For tests
 * and benchmarks that need driver calls Stowage does not wrap.
 * Thread safety: safe.
 */
STOW_API void *stow_cuda_driver_symbol(const char *name);

#ifdef __cplusplus
}
#endif
#endif /* STOWAGE_CUDA_H */
