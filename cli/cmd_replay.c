/*
 * cli/cmd_replay.c: `stowage replay`: replays allocation traces under one or
 * more policies (stow__replay_policies: classic, vmm, the PyTorch models,
 * naive, the jemalloc references, or all) and reports peak live bytes (the
 * lower bound), peak reserved bytes, their ratio, the minimum device capacity
 * (--min-capacity), backend calls, OOM errors and host nanoseconds per event.
 * The settings (--conf, STOWAGE_CONF) pick the policy when --policy is not
 * given, and a setting or option that no policy of the run applies is a usage
 * error (stow__replay_conf_resolve). OOM errors exit 1 unless --allow-oom.
 *
 * Only argument handling and printing live here; the engine, the policies and
 * the search are in replay/replay_engine.h, where the tests reach them.
 *
 * Timing: the measured replay (and the minimum-capacity search) gives every
 * figure but the time. Then every policy of the trace gets a fresh instance and
 * `repeats` rounds, each policy in turn replaying the trace untimed and then
 * timed (stow__replay_time); ns/event is the median of its timed passes. The
 * policies' passes alternate so that their ratio is taken on the same machine:
 * this VM's speed changes from one second to the next.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "cli/cli.h"
#include "replay/replay_engine.h"
#include "stowage.h"
#include "stowage/trace.h"

/* Progress on stderr for long runs, only on a terminal. */
static void progress_tty(void *arg, const char *trace, const char *policy, const char *stage)
{
    (void)arg;
    const char *base = trace;
    for (const char *c = trace; *c; c++)
        if (*c == '/')
            base = c + 1;
    fprintf(stderr, "\r\033[K%s %s: %s", base, policy, stage);
    fflush(stderr);
}

static void progress_clear(void)
{
    fputs("\r\033[K", stderr);
    fflush(stderr);
}

static void print_summary(const stow_replay_result_t *r)
{
    size_t n = stow_stats_summary(&r->stats, NULL, 0);
    char *buf = malloc(n + 1);
    if (buf) {
        stow_stats_summary(&r->stats, buf, n + 1);
        fputs(buf, stdout);
        free(buf);
    }
}

/* Times the policies whose replay succeeded, side by side (their passes
 * interleaved: stow__replay_time), and sets their ns_per_event and repeats. */
static stow_status_t time_side_by_side(const stow_replay_opts_t *o, const stow_trace_t *t,
                                       const stow_config_t *config, stow_replay_result_t *res,
                                       const bool *ok, bool tty)
{
    const stow_replay_policy_t *timed[STOW_REPLAY_MAX_POLICIES];
    unsigned of[STOW_REPLAY_MAX_POLICIES], n = 0;
    for (unsigned k = 0; k < o->policy_count; k++)
        if (ok[k]) {
            of[n] = k;
            timed[n++] = o->policies[k];
        }
    if (!n || !o->repeats)
        return STOW_OK;
    double ns[STOW_REPLAY_MAX_POLICIES];
    stow_status_t st = stow__replay_time(timed, n, t, config, o->capacity_bytes, o->repeats,
                                         tty ? progress_tty : NULL, NULL, ns);
    if (st != STOW_OK) {
        if (tty)
            progress_clear();
        fprintf(stderr, "stowage replay: %s: timing: %s\n", t->path ? t->path : "",
                stow_strerror(st));
        return st;
    }
    for (unsigned j = 0; j < n; j++) {
        res[of[j]].ns_per_event = ns[j];
        res[of[j]].repeats = o->repeats;
    }
    return STOW_OK;
}

/* Settings and options that some of the policies cannot apply: an error when
 * none of them can, a note for the others. Returns 2 or 0. */
static int check_policies(stow_replay_opts_t *o, const stow_config_t *config)
{
    char err[512];
    if (stow__replay_conf_resolve(o->conf, config, o->policy_given, o->policies, &o->policy_count,
                                  stderr, "stowage replay", err, sizeof err) != STOW_OK)
        return stow__cli_usage_error("replay", "%s", err);
    unsigned host = 0;
    for (unsigned k = 0; k < o->policy_count; k++) {
        const stow_replay_policy_t *p = o->policies[k];
        host += !p->device;
        /* The summary is a Stowage pool's: classic, vmm and their planned variants. */
        if (o->summary && !stow__replay_planned_base(p) && p != &stow__replay_policy_classic &&
            p != &stow__replay_policy_vmm)
            return stow__cli_usage_error("replay",
                                         "--summary prints a Stowage pool's summary; policy %s "
                                         "has none: drop --summary or that policy",
                                         p->name);
    }
    if (o->capacity_bytes && host) {
        if (host == o->policy_count)
            return stow__cli_usage_error("replay",
                                         "--capacity sets the simulated device; policy %s runs "
                                         "on host memory: drop --capacity or add a device "
                                         "policy",
                                         o->policies[0]->name);
        for (unsigned k = 0; k < o->policy_count; k++)
            if (!o->policies[k]->device)
                fprintf(stderr,
                        "stowage replay: note: %s runs on host memory, without --capacity\n",
                        o->policies[k]->name);
    }
    if (o->min_capacity && host == o->policy_count)
        return stow__cli_usage_error("replay",
                                     "--min-capacity searches the simulated device; policy %s "
                                     "runs on host memory: drop --min-capacity or add a device "
                                     "policy",
                                     o->policies[0]->name);
    return 0;
}

int stow__cli_replay(int argc, char **argv)
{
    stow_replay_opts_t o;
    char err[512];
    if (stow__replay_opts_parse(argc, argv, &o, err, sizeof err) != STOW_OK)
        return stow__cli_usage_error("replay", "%s", err);
    if (o.help) {
        stow__replay_usage(stdout);
        return 0;
    }
    stow_config_t config;
    if (stow__replay_load_config(o.conf, &config, err, sizeof err) != STOW_OK)
        return stow__cli_usage_error("replay", "%s", err);
    if (check_policies(&o, &config) != 0)
        return 2;
    if (o.tuning) {
        stow_tuning_t tuning;
        if (stow__replay_tuning_resolve(o.tuning, o.policies, o.policy_count, &config, &tuning,
                                        err, sizeof err) != STOW_OK)
            return stow__cli_usage_error("replay", "%s", err);
        stow__replay_set_tuning(&tuning);
    }
    bool table = o.all && !o.json;
    bool tty = !o.json && isatty(STDERR_FILENO);
    int rc = 0;
    if (table)
        stow__replay_print_table_header(stdout, o.min_capacity);
    for (int i = o.first_trace; i < argc; i++) {
        stow_trace_t *t = NULL;
        if (stow_trace_load(argv[i], &t, err, sizeof err) != STOW_OK) {
            fprintf(stderr, "stowage replay: %s\n", err);
            return 2;
        }
        stow_replay_result_t res[STOW_REPLAY_MAX_POLICIES];
        bool ok[STOW_REPLAY_MAX_POLICIES];
        for (unsigned k = 0; k < o.policy_count; k++) {
            ok[k] = false;
            if (o.all && o.policies[k]->markers_only && t->marker_count == 0)
                continue; /* no row: nothing to plan */
            stow__replay_note_no_steps(stderr, "stowage replay", t, o.policies[k], &config);
            stow_status_t st =
                stow__replay_run(o.policies[k], t, &config, o.capacity_bytes, 0, o.min_capacity,
                                 tty ? progress_tty : NULL, NULL, &res[k]);
            ok[k] = st == STOW_OK;
            if (!ok[k]) {
                if (tty)
                    progress_clear();
                fprintf(stderr, "stowage replay: %s, policy %s: %s\n", argv[i],
                        o.policies[k]->name, stow_strerror(st));
                rc = 1;
            }
        }
        if (time_side_by_side(&o, t, &config, res, ok, tty) != STOW_OK)
            rc = 1;
        if (tty)
            progress_clear();
        for (unsigned k = 0; k < o.policy_count; k++) {
            if (!ok[k])
                continue;
            const stow_replay_result_t *r = &res[k];
            if (o.json) {
                stow__replay_print_json(stdout, argv[i], r);
            } else if (table) {
                stow__replay_print_table_row(stdout, argv[i], r, o.min_capacity);
            } else {
                stow__replay_print_text(stdout, argv[i], r, o.min_capacity);
                if (o.summary && r->has_stats)
                    print_summary(r);
            }
            fflush(stdout);
        }
        /* Out-of-memory errors fail the replay unless --allow-oom accepts them. */
        for (unsigned k = 0; k < o.policy_count; k++) {
            if (!ok[k] || !res[k].ooms)
                continue;
            fprintf(stderr,
                    "stowage replay: %s: %" PRIu64 " out-of-memory error%s under policy %s on "
                    "a %zu-byte device%s\n",
                    argv[i], res[k].ooms, res[k].ooms == 1 ? "" : "s", o.policies[k]->name,
                    o.capacity_bytes,
                    o.allow_oom ? " (--allow-oom)" : "; --allow-oom accepts them");
            if (!o.allow_oom)
                rc = 1;
        }
        stow_trace_free(t);
    }
    return rc;
}
