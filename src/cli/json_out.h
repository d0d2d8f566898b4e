/*
 * json_out.h - writing JSON strings and escaped text from the CLI.
 *
 * Model files are untrusted: names, producers and domains are arbitrary
 * bytes. kiln_json_write_string always emits a valid JSON string (control
 * characters escaped, invalid UTF-8 replaced by U+FFFD), and
 * kiln_text_write escapes control characters so a name cannot forge lines
 * in the text output.
 */
#ifndef KILN_CLI_JSON_OUT_H
#define KILN_CLI_JSON_OUT_H

#include <stdio.h>

/* Write s (NUL-terminated; NULL is written as "") as a quoted JSON string. */
void kiln_json_write_string(FILE *f, const char *s);
/* Write s for humans: printable bytes and UTF-8 as they are, control
 * characters as \n, \t or \xNN. */
void kiln_text_write(FILE *f, const char *s);

#endif
