/*
 * cli/cli.h: the subcommands of build/stowage. Each takes argv starting at the
 * subcommand's name and returns the process exit status (0 ok, 1 "no/does not
 * fit/regression", 2 bad input or usage).
 */
#ifndef STOWAGE_CLI_H
#define STOWAGE_CLI_H

int stow__cli_replay(int argc, char **argv); /* cli/cmd_replay.c */
int stow__cli_plan(int argc, char **argv);   /* cli/cmd_plan.c */
int stow__cli_peak(int argc, char **argv);   /* cli/cmd_peak.c */
int stow__cli_report(int argc, char **argv); /* cli/cmd_report.c */
int stow__cli_diff(int argc, char **argv);   /* cli/cmd_diff.c */
int stow__cli_import(int argc, char **argv); /* cli/cmd_import.c */

#endif
