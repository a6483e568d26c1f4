/*
 * planner/plan_trace.c: a planning problem from an allocation trace
 * (stow_plan_problem_from_trace). The event index is the time: an allocation
 * made by event a and released by event f lives in [a, f); one never released
 * lives until the end of the trace. Zero-byte allocations take no memory and
 * are left out. The problem's load lower bound then equals the trace's peak
 * live bytes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/plan_internal.h"
#include "stowage/trace.h"

stow_status_t stow_plan_problem_from_trace(const stow_trace_t *trace, stow_plan_problem_t *out)
{
    if (trace == NULL || out == NULL || (trace->event_count > 0 && trace->events == NULL))
        return STOW_EINVAL;
    size_t ids = trace->id_count;
    uint64_t *start = malloc((ids ? ids : 1) * sizeof *start);
    uint64_t *end = malloc((ids ? ids : 1) * sizeof *end);
    uint64_t *size = calloc(ids ? ids : 1, sizeof *size);
    if (start == NULL || end == NULL || size == NULL) {
        free(start);
        free(end);
        free(size);
        return STOW_EHOSTMEM;
    }
    uint64_t horizon = (uint64_t)trace->event_count;
    for (size_t i = 0; i < ids; i++)
        end[i] = UINT64_MAX; /* not allocated */
    stow_status_t rc = STOW_OK;
    for (size_t e = 0; e < trace->event_count; e++) {
        const stow_trace_event_t *ev = &trace->events[e];
        if (ev->id >= ids) {
            rc = STOW_EINVAL;
            break;
        }
        if (ev->kind == STOW_TRACE_ALLOC) {
            start[ev->id] = e;
            end[ev->id] = horizon;
            size[ev->id] = ev->size_bytes;
        } else if (ev->kind == STOW_TRACE_FREE && end[ev->id] != UINT64_MAX) {
            end[ev->id] = e;
        }
    }
    size_t count = 0;
    for (size_t i = 0; rc == STOW_OK && i < ids; i++)
        if (end[i] != UINT64_MAX && size[i] > 0 && end[i] > start[i])
            count++;
    stow_plan_problem_t p;
    if (rc == STOW_OK)
        rc = stow_plan_problem_init(&p, count);
    char *names = NULL;
    if (rc == STOW_OK && (names = malloc(count * 11 + 1)) == NULL) {
        stow_plan_problem_free(&p);
        rc = STOW_EHOSTMEM;
    }
    if (rc == STOW_OK) {
        size_t k = 0, used = 0;
        for (size_t i = 0; i < ids; i++) {
            if (end[i] == UINT64_MAX || size[i] == 0 || end[i] <= start[i])
                continue;
            stow_plan_buffer_t *b = &p.buffers[k++];
            b->lower = start[i];
            b->upper = end[i];
            b->size = size[i];
            b->alignment = 1;
            b->id = names + used;
            used += (size_t)snprintf(names + used, 11, "%zu", i) + 1;
        }
        free(p.id_storage);
        p.id_storage = names;
        *out = p;
    }
    free(start);
    free(end);
    free(size);
    return rc;
}
