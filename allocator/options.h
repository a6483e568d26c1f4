/*
 * allocator/options.h: validation of a configuration and of the measured
 * constants (options.c), for pool creation and the tests.
 */
#ifndef STOWAGE_ALLOCATOR_OPTIONS_H
#define STOWAGE_ALLOCATOR_OPTIONS_H

#include <stddef.h>

#include "stowage.h"

/* Checks a configuration; on error writes the offending key into err. */
stow_status_t stow__config_validate(const stow_config_t *config, char *err, size_t err_len);
/* Checks the measured constants (stowage/tuning.h) against their bounds. */
stow_status_t stow__tuning_validate(const stow_tuning_t *tuning, char *err, size_t err_len);

#endif /* STOWAGE_ALLOCATOR_OPTIONS_H */
