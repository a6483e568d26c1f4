/*
 * stowage/plan.h: the offline memory planner (dynamic storage allocation) and the
 * exact peak of an operator schedule.
 *
 * Planner. Each buffer has a half-open lifetime [lower, upper), a size and an
 * alignment. A plan gives each buffer an offset inside one arena such that
 * offset % alignment == 0 and any two buffers whose lifetimes overlap
 * (lower_i < upper_j && lower_j < upper_i) occupy disjoint byte ranges. The arena
 * height is max(offset + size). A buffer that ends at t may share memory with one
 * that starts at t. The load lower bound (largest total size alive at one time)
 * bounds every plan's height from below. The CSV format, the algorithm and
 * measured results are in docs/planner.md.
 *
 * Schedule peak. A schedule lists tensors and operators in execution order; the
 * peak is the exact largest number of bytes alive while an operator runs (its
 * inputs and outputs are alive together). Rules are in docs/planner.md.
 *
 * All sizes, times and offsets are uint64_t; every sum is checked, and a result
 * that would not fit in 64 bits is STOW_EOVERFLOW, never a wrapped value.
 */
#ifndef STOWAGE_PLAN_H
#define STOWAGE_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "stowage/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------- problem -- */

/* One buffer to place. Invariants checked by every entry point:
 * size > 0, upper > lower, alignment >= 1. */
typedef struct stow_plan_buffer {
    const char *id;     /* name from the CSV; NULL means "use the index" */
    uint64_t lower;     /* first time step it is alive (inclusive) */
    uint64_t upper;     /* first time step it is dead (exclusive) */
    uint64_t size;      /* bytes */
    uint64_t alignment; /* the offset must be a multiple of this; 1 = none */
} stow_plan_buffer_t;

/* A planning problem: `count` buffers. Fill it by parsing a CSV, or call
 * stow_plan_problem_init and set the fields of `buffers` directly.
 * Ownership: the problem owns `buffers` and the id strings; release them with
 *   stow_plan_problem_free.
 * Thread safety: a problem is plain data; concurrent readers are fine. */
typedef struct stow_plan_problem {
    size_t count;                /* number of buffers */
    stow_plan_buffer_t *buffers; /* count entries */
    char *id_storage;            /* private: backing store of the id strings */
} stow_plan_problem_t;

/* Allocates `count` buffers, all zero except alignment = 1 and id = NULL.
 * Ownership: the caller frees the problem with stow_plan_problem_free.
 * Thread safety: reentrant.
 * Errors: STOW_EINVAL (problem NULL), STOW_EOVERFLOW (count too large),
 *   STOW_EHOSTMEM. */
STOW_API stow_status_t stow_plan_problem_init(stow_plan_problem_t *problem, size_t count);

/* Releases what a problem owns and zeroes it. NULL is a no-op.
 * Ownership: ids returned earlier become dangling.
 * Thread safety: not with concurrent readers of the same problem.
 * Errors: none. */
STOW_API void stow_plan_problem_free(stow_plan_problem_t *problem);

/* Parses CSV text with a header line. Known columns, in any order: id, lower,
 * upper, size (all required), alignment (optional, default 1), offset, hint
 * (optional, read and ignored). Blank lines and lines starting with '#' are
 * skipped; CRLF is accepted. `name` is used in messages ("NAME:LINE: reason").
 * Ownership: on success *out owns new memory (stow_plan_problem_free); `text`
 *   is not kept. On error *out is untouched.
 * Thread safety: reentrant.
 * Errors: STOW_EINVAL (NULL argument), STOW_EPARSE (malformed text: unknown or
 *   missing column, bad number, value above UINT64_MAX, size 0, upper <= lower,
 *   alignment 0, duplicate id; `err` gets "NAME:LINE: reason"), STOW_EHOSTMEM. */
STOW_API stow_status_t stow_plan_parse_csv(const char *name, const char *text, size_t len,
                                           stow_plan_problem_t *out, char *err, size_t errlen);

/* Reads the file at `path` and parses it with stow_plan_parse_csv.
 * Ownership: as stow_plan_parse_csv.
 * Thread safety: reentrant.
 * Errors: as stow_plan_parse_csv, plus STOW_EIO ("PATH: strerror") when the
 *   file cannot be read. */
STOW_API stow_status_t stow_plan_load_csv(const char *path, stow_plan_problem_t *out, char *err,
                                          size_t errlen);

/* Writes `id,lower,upper,size,offset` (plus `alignment` when any buffer has
 * one above 1) with a header line to `path`.
 * Ownership: borrows everything.
 * Thread safety: reentrant.
 * Errors: STOW_EINVAL (NULL argument), STOW_EIO. */
STOW_API stow_status_t stow_plan_write_csv(const char *path, const stow_plan_problem_t *problem,
                                           const uint64_t *offsets);

struct stow_trace; /* stowage/trace.h */

/* Turns an allocation trace (stowage/trace.h) into a planning problem with the
 * event index as time: an allocation made by event a and released by event f
 * lives in [a, f); one never released lives until event_count. Zero-byte
 * allocations are left out. Ids are the trace's allocation ids in decimal.
 * The problem's lower bound equals the trace's peak_live_bytes.
 * Ownership: on success *out owns new memory (stow_plan_problem_free); the
 *   trace is borrowed. On error *out is untouched.
 * Thread safety: reentrant.
 * Errors: STOW_EINVAL (NULL argument, event id out of range), STOW_EHOSTMEM. */
STOW_API stow_status_t stow_plan_problem_from_trace(const struct stow_trace *trace,
                                                    stow_plan_problem_t *out);

/* Checks the buffer invariants of a hand-built problem (size > 0,
 * upper > lower, alignment >= 1). `why` gets the first violation.
 * Ownership: borrows. Thread safety: reentrant.
 * Errors: STOW_EINVAL (NULL argument or a violated invariant). */
STOW_API stow_status_t stow_plan_problem_check(const stow_plan_problem_t *problem, char *why,
                                               size_t len);

/* The load lower bound: max over t of the total size of buffers alive at t,
 * computed by an O(n log n) sweep (ends before starts at equal times).
 * Ownership: borrows. Thread safety: reentrant.
 * Errors: STOW_EINVAL (NULL or invalid problem), STOW_EOVERFLOW (the load does
 *   not fit in 64 bits), STOW_EHOSTMEM. */
STOW_API stow_status_t stow_plan_lower_bound(const stow_plan_problem_t *problem, uint64_t *out);

/* ------------------------------------------------------------------ solve -- */

/* Solver options; start from stow_plan_options_default(). */
typedef struct stow_plan_options {
    uint64_t capacity;         /* arena bytes to fit; 0 = none, minimise height */
    double time_limit_seconds; /* wall-clock budget of the improvement search;
                                  0 = greedy only */
    uint64_t seed;             /* seed of the randomised improvement search */
} stow_plan_options_t;

/* capacity 0, time_limit_seconds 10, seed 1. Thread safety: pure. */
STOW_API stow_plan_options_t stow_plan_options_default(void);

/* A solved plan. offsets[i] belongs to problem->buffers[i]. */
typedef struct stow_plan_result {
    size_t count;           /* number of offsets */
    uint64_t *offsets;      /* count entries; owned by the result */
    uint64_t height;        /* max(offset + size) of the plan */
    uint64_t lower_bound;   /* load lower bound of the problem */
    uint64_t greedy_height; /* best height of the greedy phase alone */
    bool fits;              /* capacity == 0 || height <= capacity */
    bool optimal;           /* height == lower_bound (proved optimal) */
    double seconds;         /* wall-clock time of the whole solve */
    const char *method;     /* static string: which phase produced the plan */
} stow_plan_result_t;

/* Plans `problem`. Runs several greedy best-/first-fit orders, then, within the
 * time limit, an exact branch-and-bound (up to 4000 buffers) or, for larger
 * problems, a promotion search (buffers that end near the top move to the front
 * of the greedy order) and a randomised ruin-and-recreate search. Stops early when the height equals the lower
 * bound, or when a capacity is given and the plan fits it. When the capacity
 * is not met in time the lowest plan found is returned with fits == false.
 * `opts` NULL means the defaults. The plan always satisfies the validator.
 * Ownership: on success *out owns `offsets` (stow_plan_result_free); on error
 *   *out is untouched.
 * Thread safety: reentrant; no global state.
 * Errors: STOW_EINVAL (NULL argument, invalid problem, negative time limit),
 *   STOW_EOVERFLOW (an offset + size would not stay below UINT64_MAX),
 *   STOW_EHOSTMEM. */
STOW_API stow_status_t stow_plan_solve(const stow_plan_problem_t *problem,
                                       const stow_plan_options_t *opts, stow_plan_result_t *out);

/* Releases a result's offsets and zeroes it. NULL is a no-op.
 * Ownership: frees what stow_plan_solve allocated.
 * Thread safety: not with concurrent readers of the same result.
 * Errors: none. */
STOW_API void stow_plan_result_free(stow_plan_result_t *result);

/* Independent validator (shares no code with the solver). Checks every offset
 * is aligned, offset + size fits in 64 bits and, if capacity != 0, within the
 * capacity; and that no two time-overlapping buffers overlap in memory. Runs in
 * O(n log n + n * k) for k buffers alive at once, by a sweep over time that keeps
 * the live buffers ordered by offset. `why` gets the first violation, naming the
 * buffers by id.
 * Ownership: borrows. Thread safety: reentrant.
 * Errors: STOW_OK (valid), STOW_EINVAL (NULL argument, invalid problem or
 *   invalid plan), STOW_EHOSTMEM. */
STOW_API stow_status_t stow_plan_validate(const stow_plan_problem_t *problem,
                                          const uint64_t *offsets, uint64_t capacity, char *why,
                                          size_t len);

/* --------------------------------------------------------- schedule peak -- */

/* One tensor of a schedule. */
typedef struct stow_schedule_tensor {
    const char *id;   /* token from the file */
    const char *name; /* optional name; "" when absent */
    uint64_t bytes;   /* size */
    size_t line;      /* 1-based line of its declaration */
} stow_schedule_tensor_t;

/* One operator: tensor indices (into `tensors`) it reads and writes. */
typedef struct stow_schedule_op {
    const char *name;
    size_t input_count;
    size_t *inputs;
    size_t output_count;
    size_t *outputs;
    size_t line; /* 1-based line */
} stow_schedule_op_t;

/* A parsed schedule.
 * Ownership: owns every array and string; stow_schedule_free releases them.
 * Thread safety: plain data; concurrent readers are fine. */
typedef struct stow_schedule {
    size_t tensor_count;
    stow_schedule_tensor_t *tensors;
    size_t op_count;
    stow_schedule_op_t *ops;
    void *storage; /* private */
} stow_schedule_t;

/* Parses a schedule:
 *     tensor <id> <bytes> [name]
 *     op <name> <inputs|-> <outputs|->     (ids comma-separated, '-' = none)
 * '#' starts a comment line; blank lines are skipped. A tensor must be declared
 * before an op names it; it is produced by at most one op; an op may not both
 * read and write it nor list it twice; a tensor read before the op that
 * produces it is an error.
 * Ownership: on success *out owns new memory (stow_schedule_free); on error
 *   *out is untouched.
 * Thread safety: reentrant.
 * Errors: STOW_EINVAL (NULL argument), STOW_EPARSE ("NAME:LINE: reason" in
 *   `err`), STOW_EHOSTMEM. */
STOW_API stow_status_t stow_schedule_parse(const char *name, const char *text, size_t len,
                                           stow_schedule_t *out, char *err, size_t errlen);

/* Reads `path` and parses it with stow_schedule_parse.
 * Ownership: as stow_schedule_parse. Thread safety: reentrant.
 * Errors: as stow_schedule_parse, plus STOW_EIO. */
STOW_API stow_status_t stow_schedule_load(const char *path, stow_schedule_t *out, char *err,
                                          size_t errlen);

/* Releases a schedule and zeroes it; NULL is a no-op.
 * Ownership: frees what the parser allocated. Thread safety: not with readers.
 * Errors: none. */
STOW_API void stow_schedule_free(stow_schedule_t *schedule);

/* The exact memory profile of a schedule. A tensor produced by op k is alive
 * from the start of op k until the end of its last consumer (or of op k when
 * nothing reads it). A tensor that no op produces but some op reads (a weight or
 * graph input) is alive from before op 0 until the end of its last consumer. A
 * tensor neither produced nor read takes no memory. */
typedef struct stow_schedule_peak {
    size_t op_count;
    uint64_t *memory_during_op; /* op_count: bytes alive while op k runs */
    uint64_t *memory_after_op;  /* op_count: bytes alive after op k frees */
    uint64_t peak_bytes;        /* max of memory_during_op (0 if no ops) */
    size_t peak_op;             /* first op reaching peak_bytes */
    size_t alive_count;         /* tensors alive during peak_op */
    size_t *alive_at_peak;      /* tensor indices, largest first, ties by index */
} stow_schedule_peak_t;

/* Computes the profile in O(tensors + references + alive_count log alive_count).
 * Ownership: on success *out owns its arrays (stow_schedule_peak_free); on
 *   error *out is untouched.
 * Thread safety: reentrant.
 * Errors: STOW_EINVAL (NULL argument), STOW_EOVERFLOW (live bytes exceed 64
 *   bits), STOW_EHOSTMEM. */
STOW_API stow_status_t stow_schedule_peak(const stow_schedule_t *schedule,
                                          stow_schedule_peak_t *out);

/* Releases a profile and zeroes it; NULL is a no-op.
 * Ownership: frees what stow_schedule_peak allocated. Thread safety: not with
 *   readers. Errors: none. */
STOW_API void stow_schedule_peak_free(stow_schedule_peak_t *peak);

#ifdef __cplusplus
}
#endif
#endif /* STOWAGE_PLAN_H */
