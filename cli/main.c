/*
 * cli/main.c: build/stowage, the command-line tool. Dispatches to one
 * subcommand per file (cli/cli.h).
 */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "stowage.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: stowage <command> [options]\n"
            "\n"
            "commands:\n"
            "  replay   replay allocation traces on the simulated device under a policy\n"
            "  plan     plan offsets for buffers with known lifetimes (CSV)\n"
            "  peak     exact peak memory of an op schedule\n"
            "  report   memory report of a trace (HTML page, growth, JSON)\n"
            "  diff     compare the memory of two traces; exit 1 on regression\n"
            "  import   convert an RMM log (CSV) to a .rep trace\n"
            "  version  print the library version\n"
            "\n"
            "'stowage <command> --help' describes each command.\n");
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "replay"))
        return stow__cli_replay(argc - 1, argv + 1);
    if (!strcmp(cmd, "plan"))
        return stow__cli_plan(argc - 1, argv + 1);
    if (!strcmp(cmd, "peak"))
        return stow__cli_peak(argc - 1, argv + 1);
    if (!strcmp(cmd, "report"))
        return stow__cli_report(argc - 1, argv + 1);
    if (!strcmp(cmd, "diff"))
        return stow__cli_diff(argc - 1, argv + 1);
    if (!strcmp(cmd, "import"))
        return stow__cli_import(argc - 1, argv + 1);
    if (!strcmp(cmd, "version") || !strcmp(cmd, "--version")) {
        unsigned v = stow_version();
        printf("stowage %u.%u.%u\n", v >> 16, (v >> 8) & 0xff, v & 0xff);
        return 0;
    }
    if (!strcmp(cmd, "help") || !strcmp(cmd, "--help") || !strcmp(cmd, "-h")) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "stowage: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
