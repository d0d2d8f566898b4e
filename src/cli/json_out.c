/*
 * json_out.c - JSON string escaping and safe text output for the CLI.
 *
 * The JSON writer validates UTF-8 as it goes (RFC 3629: no overlongs, no
 * surrogates, nothing above U+10FFFF) and replaces each bad byte with
 * U+FFFD, so whatever a model file holds, `kiln inspect --json` prints a
 * document any JSON parser accepts.
 */
#include "cli/json_out.h"

#include <stddef.h>
#include <stdint.h>

/* Length of the valid UTF-8 sequence at s (1..4), or 0 if it is not one. */
static size_t utf8_valid_len(const unsigned char *s)
{
    unsigned char c = s[0];
    if (c < 0x80) return 1;
    size_t n;
    uint32_t cp;
    if (c >= 0xc2 && c <= 0xdf) {
        n = 2;
        cp = c & 0x1f;
    } else if (c >= 0xe0 && c <= 0xef) {
        n = 3;
        cp = c & 0x0f;
    } else if (c >= 0xf0 && c <= 0xf4) {
        n = 4;
        cp = c & 0x07;
    } else {
        return 0;
    }
    for (size_t i = 1; i < n; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0; /* also stops at the NUL */
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if ((n == 3 && cp < 0x800) || (n == 4 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return n;
}

void kiln_json_write_string(FILE *f, const char *s)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    fputc('"', f);
    while (*p) {
        unsigned char c = *p;
        if (c == '"' || c == '\\') {
            fputc('\\', f);
            fputc(c, f);
            p++;
        } else if (c == '\n') {
            fputs("\\n", f);
            p++;
        } else if (c == '\t') {
            fputs("\\t", f);
            p++;
        } else if (c == '\r') {
            fputs("\\r", f);
            p++;
        } else if (c < 0x20 || c == 0x7f) {
            fprintf(f, "\\u%04x", c);
            p++;
        } else {
            size_t n = utf8_valid_len(p);
            if (n == 0) {
                fputs("\\ufffd", f);
                p++;
            } else {
                fwrite(p, 1, n, f);
                p += n;
            }
        }
    }
    fputc('"', f);
}

void kiln_text_write(FILE *f, const char *s)
{
    const unsigned char *p = (const unsigned char *)(s ? s : "");
    for (; *p; p++) {
        if (*p == '\n') fputs("\\n", f);
        else if (*p == '\t') fputs("\\t", f);
        else if (*p < 0x20 || *p == 0x7f) fprintf(f, "\\x%02x", *p);
        else fputc(*p, f);
    }
}
