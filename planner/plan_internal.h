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
#include <stdio.h>

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

/* Reads a whole file into a NUL-terminated malloc'd buffer. `what` names the
 * file's kind in the message for a directory ("a CSV file").
 * STOW_EIO ("PATH: reason" in err) or STOW_EHOSTMEM. */
stow_status_t stow__plan_read_file(const char *path, const char *what, char **text, size_t *len,
                                   char *err, size_t errlen);

/* Writes the plan as CSV to f: id,lower,upper,size[,alignment],offset (the
 * alignment column when a buffer has one above 1), as stow_plan_write_csv.
 * STOW_EIO when a write fails (f stays open). */
stow_status_t stow__plan_write_csv_to(FILE *f, const stow_plan_problem_t *problem,
                                      const uint64_t *offsets);

/* Whether a buffer of the problem has an alignment above 1 (the CSV then has
 * the alignment column). */
bool stow__plan_has_alignment(const stow_plan_problem_t *problem);

/* Why the unsigned decimal [s, e) is not a number in [0, 2^64): "is negative",
 * "is beyond 2^64 - 1", "is empty" or "is not a decimal number"; NULL when it
 * is one. */
const char *stow__plan_number_error(const char *s, const char *e);

/* Monotonic wall clock in seconds. */
double stow__plan_now(void);

#endif
