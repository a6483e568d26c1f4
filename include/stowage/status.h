/*
 * stowage/status.h: status codes shared by every Stowage API.
 *
 * One X-macro, STOW_STATUS_MAP, generates the enum and the strings returned by
 * stow_strerror() and stow_status_name() (allocator/status.c), so that a new code
 * cannot be added without its message.
 */
#ifndef STOWAGE_STATUS_H
#define STOWAGE_STATUS_H

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the public API: the library is built with hidden visibility, so only
 * these functions are exported from libstowage.so. Internal calls then bind
 * inside the library and can be inlined, and a Python process that loads it
 * sees no stow__ internals. */
#if defined(__GNUC__)
#define STOW_API __attribute__((visibility("default")))
#else
#define STOW_API
#endif

#define STOW_STATUS_MAP(XX)                                                   \
    XX(OK, "success")                                                         \
    XX(EINVAL, "invalid argument")                                            \
    XX(ENOMEM, "out of device memory after freeing the cache")                \
    XX(EBUSY, "pool still has live allocations")                              \
    XX(ENOTOWNED, "pointer not allocated by this pool, or already freed")     \
    XX(EBACKEND, "backend call failed")                                       \
    XX(ENODEV, "no usable device or driver")                                  \
    XX(EOVERFLOW, "size arithmetic would overflow")                           \
    XX(EPARSE, "malformed input")                                             \
    XX(EIO, "input/output error")                                             \
    XX(ENOSYS, "operation not supported by this backend or build")            \
    XX(EHOSTMEM, "out of host memory for allocator metadata")

typedef enum {
#define STOW_STATUS_ENUM_(code, msg) STOW_##code,
    STOW_STATUS_MAP(STOW_STATUS_ENUM_)
#undef STOW_STATUS_ENUM_
    STOW_STATUS_COUNT_
} stow_status_t;

/* A static, human-readable message for `status`; never free it. Unknown codes
 * give "unknown status". Thread safety: pure. */
STOW_API const char *stow_strerror(stow_status_t status);

/* The code's name without prefix ("ENOMEM"); static; never free. */
STOW_API const char *stow_status_name(stow_status_t status);

#ifdef __cplusplus
}
#endif
#endif /* STOWAGE_STATUS_H */
