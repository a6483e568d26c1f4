/*
 * cli/cli.h: the subcommands of build/stowage. Each takes argv starting at the
 * subcommand's name and returns the process exit status (0 ok, 1 "no/does not
 * fit/regression/out of memory", 2 bad input or usage). A usage error is one
 * line saying what is wrong and one pointing at the command's --help.
 */
#ifndef STOWAGE_CLI_H
#define STOWAGE_CLI_H

int stow__cli_replay(int argc, char **argv); /* cli/cmd_replay.c */
int stow__cli_plan(int argc, char **argv);   /* cli/cmd_plan.c */
int stow__cli_peak(int argc, char **argv);   /* cli/cmd_peak.c */
int stow__cli_report(int argc, char **argv); /* cli/cmd_report.c */
int stow__cli_diff(int argc, char **argv);   /* cli/cmd_diff.c */
int stow__cli_import(int argc, char **argv); /* cli/cmd_import.c */

/* cli/main.c: shared by the subcommands. */

/* A usage error: writes "stowage CMD: MESSAGE" and "see 'stowage CMD --help'"
 * (two lines) to stderr and returns 2. */
int stow__cli_usage_error(const char *cmd, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Whether an output path names standard output ("-"). */
int stow__cli_is_stdout(const char *path);

/* Opens an output file for writing, or standard output for "-"; NULL with
 * errno set when it cannot be opened. */
FILE *stow__cli_open_out(const char *path, const char *mode);

/* The tags file beside a trace, the first that is readable of TRACE.tags and
 * TRACE.tags.gz, and for TRACE.gz also STEM.tags.gz and STEM.tags (bench/zoo
 * keeps X.rep.gz beside X.rep.tags.gz), written into buf; NULL when none is. */
const char *stow__cli_tags_beside(const char *trace_path, char *buf, size_t len);

/* Closes what stow__cli_open_out returned (standard output is flushed, not
 * closed). Returns 0, or -1 when a write or the close failed. */
int stow__cli_close_out(FILE *f);

#endif
