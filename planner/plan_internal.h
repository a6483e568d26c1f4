/*
 * planner/plan_internal.h: helpers shared by the planner's files. Nothing here
 * is public; the solver and the validator deliberately share only these
 * arithmetic and I/O helpers, never placement logic.
 */
#ifndef STOWAGE_PLAN_INTERNAL_H
#define STOWAGE_PLAN_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "stowage/plan.h"

/* a + b into *out; false (and *out untouched) when it would wrap. */
static inline bool stow__plan_add(uint64_t a, uint64_t b, uint64_t *out)
{
    if (a > UINT64_MAX - b)
        return false;
    *out = a + b;
    return true;
}

/* Smallest multiple of `align` (>= 1) that is >= x; false when it would wrap. */
static inline bool stow__plan_align_up(uint64_t x, uint64_t align, uint64_t *out)
{
    if (align == 1) { /* the common case; skips a 64-bit division in hot loops */
        *out = x;
        return true;
    }
    uint64_t rem = x % align;
    if (rem == 0) {
        *out = x;
        return true;
    }
    return stow__plan_add(x, align - rem, out);
}

/* snprintf into err (if err && errlen) without ever failing. */
void stow__plan_errf(char *err, size_t errlen, const char *fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 3, 4)))
#endif
    ;

/* Reads a whole file into a NUL-terminated malloc'd buffer.
 * STOW_EIO ("PATH: reason" in err) or STOW_EHOSTMEM. */
stow_status_t stow__plan_read_file(const char *path, char **text, size_t *len, char *err,
                                   size_t errlen);

/* Monotonic wall clock in seconds. */
double stow__plan_now(void);

#endif
