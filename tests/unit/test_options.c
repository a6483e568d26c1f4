/*
 * tests/unit/test_options.c: allocator/options.c.
 *
 * Defaults; stow_config_parse on every documented key, the list syntax of
 * roundup_power2_divisions and surrounding whitespace; every bad input returns
 * STOW_EINVAL, names the key in err and leaves the config byte-for-byte
 * unchanged; the names of the pool's measured constants refused by it with
 * where docs/decisions.md measures each; stow_config_from_env and its
 * "STOWAGE_CONF: " prefix. The constants (stowage/tuning.h): their defaults,
 * stow_tuning_parse on each with its bounds, the settings it takes only with
 * a config, and every bad input leaving both unchanged.
 */
#define _POSIX_C_SOURCE 200809L

#include <criterion/criterion.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "allocator/options.h"
#include "test_support.h"

#define MIB ((size_t)1 << 20)

static void parse_ok(stow_config_t *c, const char *text)
{
    char err[256] = "garbage";
    stow_status_t st = stow_config_parse(c, text, err, sizeof err);
    cr_assert_eq(st, STOW_OK, "'%s' -> %d (%s)", text, (int)st, err);
    cr_assert_str_empty(err, "err must be cleared on success, got '%s'", err);
}

/* A config that is not the defaults. */
static void config_not_default(stow_config_t *c)
{
    stow_config_default(c);
    c->max_split_size_bytes = 64 * MIB;
    c->roundup_power2_divisions[3] = 2;
    c->memory_fraction = 0.5;
    c->garbage_collection_threshold = 0.25;
}

/* Parses `text` on a non-default config and expects EINVAL with `needle` in
 * the message and no change at all. */
static void parse_bad(const char *text, const char *needle)
{
    stow_config_t c, before;
    config_not_default(&c);
    memcpy(&before, &c, sizeof c);
    char err[256] = "";
    stow_status_t st = stow_config_parse(&c, text, err, sizeof err);
    cr_assert_eq(st, STOW_EINVAL, "'%s' -> %d", text, (int)st);
    cr_assert_eq(memcmp(&c, &before, sizeof c), 0, "'%s' changed the config", text);
    cr_assert(strstr(err, needle) != NULL, "'%s': err '%s' lacks '%s'", text, err, needle);
}

/* stow_tuning_parse of `text` on t alone; asserts STOW_OK and a cleared err. */
static void tuning_ok(stow_tuning_t *t, const char *text)
{
    char err[256] = "garbage";
    stow_status_t st = stow_tuning_parse(NULL, t, text, err, sizeof err);
    cr_assert_eq(st, STOW_OK, "'%s' -> %d (%s)", text, (int)st, err);
    cr_assert_str_empty(err, "err must be cleared on success, got '%s'", err);
}

/* Parses `text` with stow_tuning_parse on a non-default tuning, alone and with
 * a non-default config, and expects EINVAL with `needle` in the message and
 * neither changed. */
static void tuning_bad(const char *text, const char *needle)
{
    stow_tuning_t t, tbefore;
    stow_tuning_default(&t);
    t.quick_depth = 7;
    t.vmm_slack = 0.25;
    t.vmm_learn_step = false;
    t.planned_warmup_steps = 4;
    memcpy(&tbefore, &t, sizeof t);
    stow_config_t c, before;
    config_not_default(&c);
    memcpy(&before, &c, sizeof c);
    for (int with_config = 0; with_config < 2; with_config++) {
        char err[256] = "";
        stow_status_t st = stow_tuning_parse(with_config ? &c : NULL, &t, text, err, sizeof err);
        cr_assert_eq(st, STOW_EINVAL, "'%s' -> %d", text, (int)st);
        cr_assert_eq(memcmp(&t, &tbefore, sizeof t), 0, "'%s' changed the tuning", text);
        cr_assert_eq(memcmp(&c, &before, sizeof c), 0, "'%s' changed the config", text);
        cr_assert(strstr(err, needle) != NULL, "'%s': err '%s' lacks '%s'", text, err, needle);
    }
}

Test(options, defaults)
{
    stow_config_t c;
    memset(&c, 0xAB, sizeof c);
    stow_config_default(&c);
    cr_assert_eq(c.policy, STOW_POLICY_AUTO);
    cr_assert_eq(c.max_split_size_bytes, SIZE_MAX);
    cr_assert_eq(c.max_non_split_rounding_bytes, 20 * MIB);
    for (unsigned i = 0; i < STOW_ROUNDUP_INTERVALS; i++)
        cr_assert_eq(c.roundup_power2_divisions[i], 0);
    cr_assert(c.garbage_collection_threshold == 0.0);
    cr_assert(c.memory_fraction == 1.0);
    cr_assert(!c.release_idle_on_grow);
    cr_assert(!c.scrub_on_free);
    cr_assert_eq(c.record_events, 0);
    cr_assert(!c.planned_steps);
    cr_assert(c.planned_async);
    char err[64];
    cr_assert_eq(stow__config_validate(&c, err, sizeof err), STOW_OK);
}

/* The measured constants, as docs/decisions.md measured them. */
Test(options, tuning_defaults)
{
    stow_tuning_t t;
    memset(&t, 0xAB, sizeof t);
    stow_tuning_default(&t);
    cr_assert_eq(t.quick_depth, STOW_QUICK_DEPTH_DEFAULT);
    cr_assert_eq(t.quick_depth, 64);
    cr_assert_eq(t.quick_mid_slots, STOW_QUICK_MID_SLOTS_MAX);
    cr_assert(t.keep_idle_max == 0.05);
    cr_assert(!t.reuse_other_streams_on_miss);
    cr_assert(t.vmm_slack == 0.0095);
    cr_assert(t.vmm_slack_max == 0.05);
    cr_assert_eq(t.vmm_small_kb, 128);
    cr_assert_eq(t.vmm_small_kb, STOW_VMM_SMALL_KB_DEFAULT);
    cr_assert_eq(t.vmm_handle_mb, STOW_VMM_HANDLE_MB_DEFAULT);
    cr_assert_eq(t.vmm_handle_mb, 20);
    cr_assert(t.vmm_learn_step);
    cr_assert_eq(t.planned_warmup_steps, 1);
    cr_assert(t.planned_headroom == 0.0);
    cr_assert(!t.planned_auto);
    char err[64];
    cr_assert_eq(stow__tuning_validate(&t, err, sizeof err), STOW_OK);
}

Test(options, empty_text_changes_nothing)
{
    stow_config_t c, before;
    stow_config_default(&c);
    before = c;
    parse_ok(&c, "");
    parse_ok(&c, "  ,, , ");
    cr_assert_eq(memcmp(&c, &before, sizeof c), 0);
}

Test(options, every_key)
{
    stow_config_t c;
    stow_config_default(&c);
    parse_ok(&c, "max_split_size_mb:20");
    cr_assert_eq(c.max_split_size_bytes, 20 * MIB);
    parse_ok(&c, "max_split_size_mb:512");
    cr_assert_eq(c.max_split_size_bytes, 512 * MIB);
    parse_ok(&c, "max_non_split_rounding_mb:0");
    cr_assert_eq(c.max_non_split_rounding_bytes, 0);
    parse_ok(&c, "max_non_split_rounding_mb:64");
    cr_assert_eq(c.max_non_split_rounding_bytes, 64 * MIB);
    parse_ok(&c, "garbage_collection_threshold:0.6");
    cr_assert(c.garbage_collection_threshold == 0.6);
    parse_ok(&c, "per_process_memory_fraction:0.75");
    cr_assert(c.memory_fraction == 0.75);
    parse_ok(&c, "per_process_memory_fraction:1");
    cr_assert(c.memory_fraction == 1.0);
    parse_ok(&c, "memory_fraction:0.5");
    cr_assert(c.memory_fraction == 0.5);
    parse_ok(&c, "scrub_on_free:true");
    cr_assert(c.scrub_on_free);
    parse_ok(&c, "scrub_on_free:False");
    cr_assert(!c.scrub_on_free);
    parse_ok(&c, "record_events:1000");
    cr_assert_eq(c.record_events, 1000);
    parse_ok(&c, "record_events:0");
    cr_assert_eq(c.record_events, 0);
    parse_ok(&c, "planned_steps:true");
    cr_assert(c.planned_steps);
    cr_assert(c.planned_async, "the other flag untouched");
    parse_ok(&c, "planned_async:0");
    cr_assert(!c.planned_async);
    cr_assert(c.planned_steps, "the other flag untouched");
    parse_ok(&c, "planned_steps:false,planned_async:1");
    cr_assert(!c.planned_steps && c.planned_async);
    parse_ok(&c, "policy:vmm");
    cr_assert_eq(c.policy, STOW_POLICY_VMM);
    parse_ok(&c, "policy:classic");
    cr_assert_eq(c.policy, STOW_POLICY_CLASSIC);
    parse_ok(&c, "expandable_segments:True");
    cr_assert_eq(c.policy, STOW_POLICY_VMM);
    parse_ok(&c, "expandable_segments:False");
    cr_assert_eq(c.policy, STOW_POLICY_CLASSIC);
    parse_ok(&c, "roundup_power2_divisions:4");
    for (unsigned i = 0; i < STOW_ROUNDUP_INTERVALS; i++)
        cr_assert_eq(c.roundup_power2_divisions[i], 4);
    parse_ok(&c, "roundup_power2_divisions:0");
    for (unsigned i = 0; i < STOW_ROUNDUP_INTERVALS; i++)
        cr_assert_eq(c.roundup_power2_divisions[i], 0);
}

Test(options, several_keys_and_whitespace)
{
    stow_config_t c;
    stow_config_default(&c);
    parse_ok(&c, "  max_split_size_mb : 128 ,\tgarbage_collection_threshold:0.5,"
                 " roundup_power2_divisions: 8 ,scrub_on_free :true  ");
    cr_assert_eq(c.max_split_size_bytes, 128 * MIB);
    cr_assert(c.garbage_collection_threshold == 0.5);
    cr_assert_eq(c.roundup_power2_divisions[0], 8);
    cr_assert_eq(c.roundup_power2_divisions[STOW_ROUNDUP_INTERVALS - 1], 8);
    cr_assert(c.scrub_on_free);
}

Test(options, later_key_wins)
{
    stow_config_t c;
    stow_config_default(&c);
    parse_ok(&c, "max_split_size_mb:100,max_split_size_mb:200");
    cr_assert_eq(c.max_split_size_bytes, 200 * MIB);
}

Test(options, parse_applies_on_top_of_config)
{
    stow_config_t c;
    stow_config_default(&c);
    c.memory_fraction = 0.5;
    parse_ok(&c, "max_split_size_mb:40");
    cr_assert(c.memory_fraction == 0.5);
    cr_assert_eq(c.max_split_size_bytes, 40 * MIB);
}

Test(options, divisions_list)
{
    /* Interval i covers [2^(20+i), 2^(21+i)) bytes; "M:v" sets the interval of
     * M MiB (and every not-yet-set interval below it) to v; ">:v" the rest. */
    stow_config_t c;
    stow_config_default(&c);
    parse_ok(&c, "roundup_power2_divisions:[256:1,512:2,>:8]");
    for (unsigned i = 0; i <= 8; i++) /* 1 MiB .. [256 MiB, 512 MiB) */
        cr_assert_eq(c.roundup_power2_divisions[i], 1, "interval %u", i);
    cr_assert_eq(c.roundup_power2_divisions[9], 2); /* [512 MiB, 1 GiB) */
    for (unsigned i = 10; i < STOW_ROUNDUP_INTERVALS; i++)
        cr_assert_eq(c.roundup_power2_divisions[i], 8, "interval %u", i);
}

Test(options, divisions_list_without_tail_repeats_last)
{
    stow_config_t c;
    stow_config_default(&c);
    parse_ok(&c, "roundup_power2_divisions:[1:4,64:16]");
    cr_assert_eq(c.roundup_power2_divisions[0], 4);
    for (unsigned i = 1; i <= 6; i++)
        cr_assert_eq(c.roundup_power2_divisions[i], 16, "interval %u", i);
    for (unsigned i = 7; i < STOW_ROUNDUP_INTERVALS; i++)
        cr_assert_eq(c.roundup_power2_divisions[i], 16, "interval %u", i);
}

Test(options, divisions_list_with_other_keys)
{
    /* Commas inside [...] belong to the list, not to the key list. */
    stow_config_t c;
    stow_config_default(&c);
    parse_ok(&c, "max_split_size_mb:64,roundup_power2_divisions:[2:2,>:4],per_process_memory_fraction:0.5");
    cr_assert_eq(c.max_split_size_bytes, 64 * MIB);
    cr_assert_eq(c.roundup_power2_divisions[0], 2);
    cr_assert_eq(c.roundup_power2_divisions[1], 2);
    cr_assert_eq(c.roundup_power2_divisions[2], 4);
    cr_assert(c.memory_fraction == 0.5);
}

Test(options, divisions_list_huge_interval_clamps)
{
    stow_config_t c;
    stow_config_default(&c);
    parse_ok(&c, "roundup_power2_divisions:[1048576:2]");
    for (unsigned i = 0; i < STOW_ROUNDUP_INTERVALS; i++)
        cr_assert_eq(c.roundup_power2_divisions[i], 2);
}

Test(options, unknown_key)
{
    parse_bad("max_split_size:20", "max_split_size");
    parse_bad("bogus:1", "unknown key 'bogus'");
    parse_bad("max_split_size_mb:30,bogus:1", "bogus");
    tuning_bad("bogus:1", "unknown key 'bogus'");
    tuning_bad("vmm_slack:0.02,bogus:1", "unknown key 'bogus'");
}

/* Each measured constant, by its name, is refused by stow_config_parse (and
 * so by STOWAGE_CONF), with the heading of docs/decisions.md that measures
 * it (what the message says after it is not pinned here); the config is left
 * as it was. release_idle_on_grow, a field of the C API
 * alone, is refused the same way. */
static const struct {
    const char *text, *heading;
} constants[] = {
    {"quick_depth:0", "Quick lists"},
    {"quick_mid_slots:0", "Quick lists"},
    {"keep_idle_max:0.1", "keep_idle_max 0.05"},
    {"release_idle_on_grow:true", "release_idle_on_grow false"},
    {"reuse_other_streams_on_miss:true", "reuse_other_streams_on_miss false"},
    {"vmm_slack:0.02", "vmm_slack 0.0095"},
    {"vmm_slack_max:0.1", "vmm_slack_max 0.05"},
    {"vmm_small_kb:64", "vmm_small_kb 128"},
    {"vmm_handle_mb:2", "vmm_handle_mb 20"},
    {"vmm_learn_step:false", "vmm_learn_step true"},
    {"planned_warmup_steps:3", "Planned steps"},
    {"planned_headroom:0.5", "Planned steps"},
    {"planned_auto:true", "planned_steps and planned_auto false"},
};

Test(options, config_parse_refuses_each_constant_naming_its_measurement)
{
    for (size_t i = 0; i < sizeof constants / sizeof constants[0]; i++) {
        char key[64], want[512];
        snprintf(key, sizeof key, "%.*s", (int)strcspn(constants[i].text, ":"),
                 constants[i].text);
        snprintf(want, sizeof want,
                 "key '%s' is not a setting: it is one of the pool's measured constants "
                 "(docs/decisions.md, \"%s\"); ",
                 key, constants[i].heading);
        parse_bad(constants[i].text, want);
        /* Among settings, before or after them: refused all the same. */
        char text[256];
        snprintf(text, sizeof text, "policy:classic,%s", constants[i].text);
        parse_bad(text, want);
        snprintf(text, sizeof text, "%s,max_split_size_mb:64", constants[i].text);
        parse_bad(text, want);
        /* A bad value of it gets the same answer: no value makes it a setting. */
        snprintf(text, sizeof text, "%s:junk", key);
        parse_bad(text, want);
    }
}

/* The headings the refusals name are headings of docs/decisions.md (backquotes
 * aside, and a heading may go on after the words named). */
Test(options, the_headings_named_are_in_decisions_md)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/docs/decisions.md", STOW_SOURCE_DIR);
    FILE *f = fopen(path, "r");
    if (!f)
        cr_skip_test("%s not found", path);
    static char headings[64][256];
    size_t n = 0;
    char line[1024];
    while (n < 64 && fgets(line, sizeof line, f)) {
        if (line[0] != '#')
            continue;
        const char *s = line + strspn(line, "#");
        s += strspn(s, " ");
        size_t k = 0;
        for (; *s && *s != '\n' && k + 1 < sizeof headings[n]; s++)
            if (*s != '`')
                headings[n][k++] = *s;
        headings[n][k] = 0;
        n++;
    }
    fclose(f);
    for (size_t i = 0; i < sizeof constants / sizeof constants[0]; i++) {
        const char *h = constants[i].heading;
        bool found = false;
        for (size_t j = 0; j < n && !found; j++)
            found = !strncmp(headings[j], h, strlen(h));
        cr_assert(found, "docs/decisions.md has no heading \"%s\"", h);
    }
}

/* Each constant through stow_tuning_parse, with its bounds; the other
 * constants are left as they were. */
Test(options, every_tuning_key)
{
    stow_tuning_t t;
    stow_tuning_default(&t);
    tuning_ok(&t, "quick_depth:0");
    cr_assert_eq(t.quick_depth, 0);
    tuning_ok(&t, "quick_depth:255");
    cr_assert_eq(t.quick_depth, 255);
    tuning_ok(&t, "quick_mid_slots:0");
    cr_assert_eq(t.quick_mid_slots, 0);
    tuning_ok(&t, "quick_mid_slots:8");
    cr_assert_eq(t.quick_mid_slots, 8);
    tuning_ok(&t, "reuse_other_streams_on_miss:true");
    cr_assert(t.reuse_other_streams_on_miss);
    cr_assert(t.vmm_learn_step, "the other flag untouched");
    tuning_ok(&t, "reuse_other_streams_on_miss:0");
    cr_assert(!t.reuse_other_streams_on_miss);
    tuning_ok(&t, "vmm_slack:0.02,vmm_slack_max:0.1");
    cr_assert(t.vmm_slack == 0.02 && t.vmm_slack_max == 0.1);
    tuning_ok(&t, "keep_idle_max:0.2");
    cr_assert(t.keep_idle_max == 0.2 && t.vmm_slack_max == 0.1, "the other keys untouched");
    tuning_ok(&t, "keep_idle_max:0");
    cr_assert(t.keep_idle_max == 0.0);
    tuning_ok(&t, "keep_idle_max:1");
    cr_assert(t.keep_idle_max == 1.0);
    tuning_ok(&t, "vmm_slack_max:0");
    cr_assert(t.vmm_slack_max == 0.0 && t.vmm_slack == 0.02, "the other key untouched");
    tuning_ok(&t, "vmm_small_kb:0");
    cr_assert_eq(t.vmm_small_kb, 0);
    tuning_ok(&t, "vmm_small_kb:1024");
    cr_assert_eq(t.vmm_small_kb, 1024);
    tuning_ok(&t, "vmm_handle_mb:2");
    cr_assert_eq(t.vmm_handle_mb, 2);
    tuning_ok(&t, "vmm_handle_mb:65536");
    cr_assert_eq(t.vmm_handle_mb, 65536);
    tuning_ok(&t, "vmm_learn_step:false");
    cr_assert(!t.vmm_learn_step);
    tuning_ok(&t, "vmm_learn_step:True");
    cr_assert(t.vmm_learn_step);
    tuning_ok(&t, "planned_warmup_steps:0");
    cr_assert_eq(t.planned_warmup_steps, 0);
    tuning_ok(&t, "planned_warmup_steps:1000");
    cr_assert_eq(t.planned_warmup_steps, 1000);
    tuning_ok(&t, "planned_headroom:0.25");
    cr_assert(t.planned_headroom == 0.25);
    tuning_ok(&t, "planned_headroom:1");
    cr_assert(t.planned_headroom == 1.0);
    tuning_ok(&t, "planned_auto:true");
    cr_assert(t.planned_auto);
    tuning_ok(&t, "planned_auto:0");
    cr_assert(!t.planned_auto);
    /* Whitespace and empty items as in the settings; the later key wins. */
    tuning_ok(&t, "  quick_depth : 9 ,, \tvmm_slack:0.5 , quick_depth:10 ");
    cr_assert_eq(t.quick_depth, 10);
    cr_assert(t.vmm_slack == 0.5);
    stow_tuning_t before = t;
    tuning_ok(&t, "");
    tuning_ok(&t, "  ,, , ");
    cr_assert_eq(memcmp(&t, &before, sizeof t), 0, "empty text changes nothing");
    char err[64];
    cr_assert_eq(stow__tuning_validate(&t, err, sizeof err), STOW_OK, "%s", err);
}

Test(options, bad_tuning_values)
{
    tuning_bad("vmm_slack_max:1.5", "key 'vmm_slack_max'");
    tuning_bad("vmm_slack_max:-0.1", "key 'vmm_slack_max'");
    tuning_bad("vmm_slack_max:x", "key 'vmm_slack_max'");
    tuning_bad("vmm_handle_mb:65537", "key 'vmm_handle_mb'");
    tuning_bad("vmm_handle_mb:big", "key 'vmm_handle_mb'");
    tuning_bad("vmm_handle_mb:-1", "key 'vmm_handle_mb'");
    tuning_bad("keep_idle_max:1.5", "key 'keep_idle_max'");
    tuning_bad("keep_idle_max:-0.1", "key 'keep_idle_max'");
    tuning_bad("keep_idle_max:nan", "key 'keep_idle_max'");
    tuning_bad("vmm_small_kb:1025", "key 'vmm_small_kb': '1025' is not a count up to 1024");
    tuning_bad("vmm_small_kb:-1", "key 'vmm_small_kb'");
    tuning_bad("vmm_small_kb:64k", "key 'vmm_small_kb'");
    tuning_bad("quick_depth:256", "key 'quick_depth'");
    tuning_bad("quick_depth:-1", "key 'quick_depth'");
    tuning_bad("quick_depth:", "key 'quick_depth'");
    tuning_bad("quick_mid_slots:9", "key 'quick_mid_slots'");
    tuning_bad("planned_warmup_steps:1001", "key 'planned_warmup_steps'");
    tuning_bad("planned_warmup_steps:2.5", "key 'planned_warmup_steps'");
    tuning_bad("planned_headroom:1.5", "key 'planned_headroom': '1.5' is not a number in [0, 1]");
    tuning_bad("planned_headroom:inf", "key 'planned_headroom'");
    tuning_bad("reuse_other_streams_on_miss:maybe", "key 'reuse_other_streams_on_miss'");
    tuning_bad("vmm_learn_step:yes", "key 'vmm_learn_step'");
    tuning_bad("planned_auto:2", "key 'planned_auto'");
    tuning_bad("quick_depth", "'quick_depth' is not key:value");
    /* Parsing commits only when every key is valid. */
    tuning_bad("quick_depth:0,vmm_slack:0.5,planned_headroom:2", "key 'planned_headroom'");
}

/* Settings go through stow_tuning_parse only when it is given a config: then
 * one text sets both, and a bad setting, like a bad constant, changes
 * neither. Without a config a setting is an unknown key. */
Test(options, tuning_parse_takes_settings_only_with_a_config)
{
    stow_config_t c;
    stow_config_default(&c);
    stow_tuning_t t;
    stow_tuning_default(&t);
    char err[256] = "garbage";
    cr_assert_eq(stow_tuning_parse(&c, &t,
                                   "policy:classic,quick_depth:0,max_split_size_mb:64,"
                                   "vmm_slack:0,planned_steps:true,planned_auto:true,"
                                   "release_idle_on_grow:true",
                                   err, sizeof err),
                 STOW_OK, "%s", err);
    cr_assert_str_empty(err);
    cr_assert_eq(c.policy, STOW_POLICY_CLASSIC);
    cr_assert_eq(c.max_split_size_bytes, 64 * MIB);
    cr_assert(c.planned_steps);
    cr_assert(c.release_idle_on_grow, "the C API's field, set beside the constants");
    cr_assert_eq(t.quick_depth, 0);
    cr_assert(t.vmm_slack == 0.0);
    cr_assert(t.planned_auto);

    /* Without a config: the settings are unknown keys; nothing changes. */
    const char *settings[] = {"policy:classic", "max_split_size_mb:64", "scrub_on_free:true",
                              "record_events:16", "planned_steps:true", "planned_async:false",
                              "expandable_segments:True", "garbage_collection_threshold:0.5",
                              "per_process_memory_fraction:0.5", "roundup_power2_divisions:4",
                              "release_idle_on_grow:false"};
    for (size_t i = 0; i < sizeof settings / sizeof settings[0]; i++) {
        stow_tuning_t before = t;
        char key[64], want[96];
        snprintf(key, sizeof key, "%.*s", (int)strcspn(settings[i], ":"), settings[i]);
        snprintf(want, sizeof want, "key '%s'", key);
        cr_assert_eq(stow_tuning_parse(NULL, &t, settings[i], err, sizeof err), STOW_EINVAL,
                     "%s", settings[i]);
        cr_assert(strstr(err, want), "%s: %s", settings[i], err);
        cr_assert_eq(memcmp(&t, &before, sizeof t), 0, "%s changed the tuning", settings[i]);
        /* With a config, each is taken. */
        stow_config_t with = c;
        cr_assert_eq(stow_tuning_parse(&with, &t, settings[i], err, sizeof err), STOW_OK,
                     "%s: %s", settings[i], err);
        cr_assert_eq(memcmp(&t, &before, sizeof t), 0, "%s changed the tuning", settings[i]);
    }
    cr_assert_eq(stow_tuning_parse(NULL, &t, "policy:vmm", err, sizeof err), STOW_EINVAL);
    cr_assert_str_eq(err, "unknown key 'policy'");

    /* A bad setting among constants: neither changes. */
    tuning_bad("quick_depth:0,policy:fast", "key 'policy'");
    stow_config_t c2, c2before;
    config_not_default(&c2);
    c2before = c2;
    stow_tuning_t t2, t2before;
    stow_tuning_default(&t2);
    t2before = t2;
    cr_assert_eq(stow_tuning_parse(&c2, &t2, "quick_depth:0,policy:fast", err, sizeof err),
                 STOW_EINVAL);
    cr_assert_eq(memcmp(&c2, &c2before, sizeof c2), 0);
    cr_assert_eq(memcmp(&t2, &t2before, sizeof t2), 0);
    cr_assert_eq(stow_tuning_parse(&c2, &t2, "max_split_size_mb:10,vmm_slack:0", err, sizeof err),
                 STOW_EINVAL);
    cr_assert(strstr(err, "max_split_size_mb"), "%s", err);
    cr_assert_eq(memcmp(&c2, &c2before, sizeof c2), 0);
    cr_assert_eq(memcmp(&t2, &t2before, sizeof t2), 0);
}

Test(options, tuning_parse_null_arguments_and_small_err)
{
    stow_tuning_t t, before;
    stow_tuning_default(&t);
    before = t;
    stow_config_t c;
    stow_config_default(&c);
    char err[8] = "xxxxxxx";
    cr_assert_eq(stow_tuning_parse(NULL, NULL, "quick_depth:0", err, sizeof err), STOW_EINVAL);
    cr_assert_eq(stow_tuning_parse(&c, NULL, "policy:vmm", err, sizeof err), STOW_EINVAL);
    cr_assert_eq(c.policy, STOW_POLICY_AUTO, "no tuning: nothing parsed");
    cr_assert_eq(stow_tuning_parse(NULL, &t, NULL, err, sizeof err), STOW_EINVAL);
    /* A short err is truncated, NUL-terminated. */
    cr_assert_eq(stow_tuning_parse(NULL, &t, "bogus_key_name:1", err, sizeof err), STOW_EINVAL);
    cr_assert_eq(strlen(err), sizeof err - 1);
    /* No err buffer at all. */
    cr_assert_eq(stow_tuning_parse(NULL, &t, "bogus:1", NULL, 0), STOW_EINVAL);
    cr_assert_eq(memcmp(&t, &before, sizeof t), 0);
    cr_assert_eq(stow_tuning_parse(NULL, &t, "quick_depth:3", NULL, 0), STOW_OK);
    cr_assert_eq(t.quick_depth, 3);
}

Test(options, not_key_value)
{
    parse_bad("max_split_size_mb", "max_split_size_mb");
    parse_bad("max_split_size_mb:64,oops", "oops");
}

Test(options, bad_sizes)
{
    parse_bad("max_split_size_mb:19", "max_split_size_mb");
    parse_bad("max_split_size_mb:0", "max_split_size_mb");
    parse_bad("max_split_size_mb:", "max_split_size_mb");
    parse_bad("max_split_size_mb:-20", "max_split_size_mb");
    parse_bad("max_split_size_mb:+20", "max_split_size_mb");
    parse_bad("max_split_size_mb:20.5", "max_split_size_mb");
    parse_bad("max_split_size_mb:20MB", "max_split_size_mb");
    parse_bad("max_split_size_mb:99999999999999999999999", "max_split_size_mb");
    parse_bad("max_split_size_mb:18446744073709551615", "max_split_size_mb");
    parse_bad("max_non_split_rounding_mb:abc", "max_non_split_rounding_mb");
    parse_bad("max_non_split_rounding_mb:2000000000", "max_non_split_rounding_mb");
    /* A ring past 2^24 events (512 MiB) is refused, not attempted (fuzz_config found
     * record_events:120504803, a 3.6 GiB ring). */
    parse_bad("record_events:16777217", "record_events");
    parse_bad("record_events:120504803", "record_events");
    parse_bad("record_events:18446744073709551616", "record_events");
    parse_bad("record_events:-1", "record_events");
}

Test(options, record_events_up_to_the_maximum)
{
    stow_config_t c;
    stow_config_default(&c);
    parse_ok(&c, "record_events:16777216");
    cr_assert_eq(c.record_events, STOW_RECORD_EVENTS_MAX);
    c.record_events = STOW_RECORD_EVENTS_MAX + 1;
    char err[128];
    cr_assert_eq(stow__config_validate(&c, err, sizeof err), STOW_EINVAL);
    cr_assert(strstr(err, "record_events"), "%s", err);
}

Test(options, bad_fractions)
{
    parse_bad("per_process_memory_fraction:0", "per_process_memory_fraction");
    parse_bad("per_process_memory_fraction:1.5", "per_process_memory_fraction");
    parse_bad("per_process_memory_fraction:-0.5", "per_process_memory_fraction");
    parse_bad("per_process_memory_fraction:nan", "per_process_memory_fraction");
    parse_bad("per_process_memory_fraction:inf", "per_process_memory_fraction");
    parse_bad("per_process_memory_fraction:0.5x", "per_process_memory_fraction");
    parse_bad("per_process_memory_fraction:", "per_process_memory_fraction");
    parse_bad("garbage_collection_threshold:0", "garbage_collection_threshold");
    parse_bad("garbage_collection_threshold:1", "garbage_collection_threshold");
    parse_bad("garbage_collection_threshold:1.5", "garbage_collection_threshold");
    parse_bad("garbage_collection_threshold:x", "garbage_collection_threshold");
}

Test(options, bad_enums_and_bools)
{
    parse_bad("policy:fast", "policy");
    parse_bad("policy:", "policy");
    parse_bad("expandable_segments:yes", "expandable_segments");
    parse_bad("scrub_on_free:2", "scrub_on_free");
    parse_bad("planned_steps:maybe", "planned_steps");
    parse_bad("planned_async:", "planned_async");
    /* release_idle_on_grow where stow_tuning_parse takes it (with a config). */
    stow_config_t c, before;
    config_not_default(&c);
    before = c;
    stow_tuning_t t;
    stow_tuning_default(&t);
    char err[256];
    cr_assert_eq(stow_tuning_parse(&c, &t, "release_idle_on_grow:2", err, sizeof err),
                 STOW_EINVAL);
    cr_assert(strstr(err, "key 'release_idle_on_grow'"), "%s", err);
    cr_assert_eq(memcmp(&c, &before, sizeof c), 0);
    cr_assert_eq(stow_tuning_parse(&c, &t, "release_idle_on_grow:False", err, sizeof err),
                 STOW_OK, "%s", err);
    cr_assert(!c.release_idle_on_grow);
    cr_assert_eq(stow_tuning_parse(&c, &t, "release_idle_on_grow:1", err, sizeof err), STOW_OK,
                 "%s", err);
    cr_assert(c.release_idle_on_grow);
}

Test(options, bad_divisions)
{
    parse_bad("roundup_power2_divisions:3", "roundup_power2_divisions");
    parse_bad("roundup_power2_divisions:2048", "roundup_power2_divisions");
    parse_bad("roundup_power2_divisions:-4", "roundup_power2_divisions");
    parse_bad("roundup_power2_divisions:[256:3]", "roundup_power2_divisions");
    parse_bad("roundup_power2_divisions:[300:2]", "roundup_power2_divisions");
    parse_bad("roundup_power2_divisions:[0:2]", "roundup_power2_divisions");
    parse_bad("roundup_power2_divisions:[256:2", "roundup_power2_divisions");
    parse_bad("roundup_power2_divisions:256:2]", "roundup_power2_divisions");
    parse_bad("roundup_power2_divisions:[256]", "roundup_power2_divisions");
    parse_bad("roundup_power2_divisions:[256:]", "roundup_power2_divisions");
    parse_bad("roundup_power2_divisions:[<:2]", "roundup_power2_divisions");
    parse_bad("roundup_power2_divisions:[256:2048]", "roundup_power2_divisions");
}

Test(options, bad_key_after_good_keys_applies_nothing)
{
    /* Parsing commits only when every key is valid. */
    parse_bad("max_split_size_mb:100,roundup_power2_divisions:4,per_process_memory_fraction:2",
              "per_process_memory_fraction");
}

Test(options, too_long)
{
    char text[1024];
    memset(text, 'k', 200);
    strcpy(text + 200, ":1");
    parse_bad(text, "too long");
    snprintf(text, sizeof text, "max_split_size_mb:%0300d", 64);
    parse_bad(text, "max_split_size_mb");
}

Test(options, null_arguments_and_small_err)
{
    stow_config_t c, before;
    stow_config_default(&c);
    before = c;
    char err[8] = "xxxxxxx";
    cr_assert_eq(stow_config_parse(NULL, "policy:vmm", err, sizeof err), STOW_EINVAL);
    cr_assert_eq(stow_config_parse(&c, NULL, err, sizeof err), STOW_EINVAL);
    /* A short err is truncated, NUL-terminated. */
    cr_assert_eq(stow_config_parse(&c, "bogus_key_name:1", err, sizeof err), STOW_EINVAL);
    cr_assert_eq(strlen(err), sizeof err - 1);
    /* No err buffer at all. */
    cr_assert_eq(stow_config_parse(&c, "bogus:1", NULL, 0), STOW_EINVAL);
    cr_assert_eq(stow_config_parse(&c, "policy:vmm", NULL, 0), STOW_OK);
    cr_assert_eq(c.policy, STOW_POLICY_VMM);
    c.policy = before.policy;
    cr_assert_eq(memcmp(&c, &before, sizeof c), 0);
}

Test(options, validate_direct)
{
    stow_config_t c;
    char err[128];
    stow_config_default(&c);
    c.max_split_size_bytes = 20 * MIB - 1;
    cr_assert_eq(stow__config_validate(&c, err, sizeof err), STOW_EINVAL);
    cr_assert(strstr(err, "max_split_size_mb"));
    stow_config_default(&c);
    c.roundup_power2_divisions[7] = 6;
    cr_assert_eq(stow__config_validate(&c, err, sizeof err), STOW_EINVAL);
    cr_assert(strstr(err, "roundup_power2_divisions"));
    stow_config_default(&c);
    c.memory_fraction = 0.0;
    cr_assert_eq(stow__config_validate(&c, err, sizeof err), STOW_EINVAL);
    stow_config_default(&c);
    c.policy = (stow_policy_t)7;
    cr_assert_eq(stow__config_validate(&c, err, sizeof err), STOW_EINVAL);
    cr_assert(strstr(err, "policy"));
    stow_tuning_t t;
    stow_tuning_default(&t);
    t.vmm_slack_max = 2.0;
    cr_assert_eq(stow__tuning_validate(&t, err, sizeof err), STOW_EINVAL);
    cr_assert(strstr(err, "vmm_slack_max"));
    stow_tuning_default(&t);
    t.keep_idle_max = -1.0;
    cr_assert_eq(stow__tuning_validate(&t, err, sizeof err), STOW_EINVAL);
    cr_assert(strstr(err, "keep_idle_max"));
    stow_tuning_default(&t);
    t.vmm_small_kb = 2048;
    cr_assert_eq(stow__tuning_validate(&t, err, sizeof err), STOW_EINVAL);
    cr_assert(strstr(err, "vmm_small_kb"));
    stow_tuning_default(&t);
    t.planned_headroom = NAN;
    cr_assert_eq(stow__tuning_validate(&t, err, sizeof err), STOW_EINVAL);
    cr_assert(strstr(err, "planned_headroom"));
    stow_tuning_default(&t);
    t.planned_warmup_steps = STOW_PLANNED_WARMUP_MAX + 1;
    cr_assert_eq(stow__tuning_validate(&t, err, sizeof err), STOW_EINVAL);
    cr_assert(strstr(err, "planned_warmup_steps"));
    stow_tuning_default(&t);
    t.vmm_handle_mb = STOW_VMM_HANDLE_MB_MAX + 1;
    cr_assert_eq(stow__tuning_validate(&t, err, sizeof err), STOW_EINVAL);
    cr_assert(strstr(err, "vmm_handle_mb"));
}

/* vmm_slack is a fraction of the live peak in [0, 1]: outside it (or NaN,
 * which every comparison refuses) a tuning is refused where it is checked,
 * by stow__tuning_validate and so by stow_pool_create_tuned (a struct filled
 * in by hand never meets the parser), and by the parser's key. A negative
 * slack would hold the allowance below the live peak, and NaN is no fraction:
 * the allowance would convert it to a granule count. */
Test(options, vmm_slack_outside_0_to_1_is_refused)
{
    const double bad[] = {-0.5, 2.0, NAN};
    stow_backend_t *sim = ts_sim(0, false, false);
    cr_assert_not_null(sim);
    stow_config_t c;
    stow_config_default(&c);
    c.policy = STOW_POLICY_VMM;
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        stow_tuning_t t;
        stow_tuning_default(&t);
        t.vmm_slack = bad[i];
        char err[128] = "";
        cr_assert_eq(stow__tuning_validate(&t, err, sizeof err), STOW_EINVAL, "vmm_slack %g",
                     bad[i]);
        cr_assert(strstr(err, "key 'vmm_slack'"), "vmm_slack %g: err '%s'", bad[i], err);
        stow_pool_t *p = (stow_pool_t *)0x1;
        cr_assert_eq(stow_pool_create_tuned(&c, &t, sim, &p), STOW_EINVAL, "vmm_slack %g",
                     bad[i]);
        cr_assert_eq(p, (stow_pool_t *)0x1, "vmm_slack %g: out untouched", bad[i]);
    }
    /* The ends of the range are taken. */
    stow_tuning_t t;
    stow_tuning_default(&t);
    char err[128];
    t.vmm_slack = 0.0;
    cr_assert_eq(stow__tuning_validate(&t, err, sizeof err), STOW_OK, "%s", err);
    t.vmm_slack = 1.0;
    cr_assert_eq(stow__tuning_validate(&t, err, sizeof err), STOW_OK, "%s", err);
    stow_pool_t *p = NULL;
    cr_assert_eq(stow_pool_create_tuned(&c, &t, sim, &p), STOW_OK);
    cr_assert_eq(stow_pool_destroy(p), STOW_OK);
    /* NULL: the defaults. */
    cr_assert_eq(stow_pool_create_tuned(&c, NULL, sim, &p), STOW_OK);
    cr_assert_eq(stow_pool_destroy(p), STOW_OK);
    cr_assert_eq(stow_sim_destroy(sim), STOW_OK);
    tuning_bad("vmm_slack:1.5", "key 'vmm_slack'");
    tuning_bad("vmm_slack:-0.1", "key 'vmm_slack'");
    tuning_bad("vmm_slack:nan", "key 'vmm_slack'");
    tuning_bad("vmm_slack:x", "key 'vmm_slack'");
}

Test(options, from_env_unset_is_noop)
{
    unsetenv("STOWAGE_CONF");
    stow_config_t c, before;
    stow_config_default(&c);
    before = c;
    char err[64] = "junk";
    cr_assert_eq(stow_config_from_env(&c, err, sizeof err), STOW_OK);
    cr_assert_str_empty(err);
    cr_assert_eq(memcmp(&c, &before, sizeof c), 0);
}

Test(options, from_env_good)
{
    cr_assert_eq(setenv("STOWAGE_CONF", "max_split_size_mb:256, roundup_power2_divisions:[64:2,>:4]", 1), 0);
    stow_config_t c;
    stow_config_default(&c);
    char err[64];
    cr_assert_eq(stow_config_from_env(&c, err, sizeof err), STOW_OK, "%s", err);
    cr_assert_eq(c.max_split_size_bytes, 256 * MIB);
    cr_assert_eq(c.roundup_power2_divisions[6], 2);
    cr_assert_eq(c.roundup_power2_divisions[7], 4);
}

Test(options, from_env_bad_has_prefix)
{
    cr_assert_eq(setenv("STOWAGE_CONF", "max_split_size_mb:256,nope:1", 1), 0);
    stow_config_t c, before;
    stow_config_default(&c);
    before = c;
    char err[128];
    cr_assert_eq(stow_config_from_env(&c, err, sizeof err), STOW_EINVAL);
    cr_assert_eq(strncmp(err, "STOWAGE_CONF: ", 14), 0, "err '%s'", err);
    cr_assert(strstr(err, "nope"), "err '%s'", err);
    cr_assert_eq(memcmp(&c, &before, sizeof c), 0);
    /* Short buffers still get a NUL-terminated prefix. */
    char small[10];
    cr_assert_eq(stow_config_from_env(&c, small, sizeof small), STOW_EINVAL);
    cr_assert_str_eq(small, "STOWAGE_C");
    cr_assert_eq(stow_config_from_env(&c, NULL, 0), STOW_EINVAL);
}

Test(options, divisions_list_with_spaces)
{
    /* PyTorch's tokenizer ignores blanks everywhere, and stow_config_parse
     * documents the PYTORCH_CUDA_ALLOC_CONF syntax: blanks after the list's
     * commas must be accepted like blanks after the key list's commas. */
    stow_config_t c;
    stow_config_default(&c);
    parse_ok(&c, "roundup_power2_divisions:[256:1, 512:2, >:8]");
    cr_assert_eq(c.roundup_power2_divisions[8], 1);
    cr_assert_eq(c.roundup_power2_divisions[9], 2);
    cr_assert_eq(c.roundup_power2_divisions[10], 8);
}
