/*
 * cmd_warmup_from_log.c - `kiln warmup-from-log LOG... -o FILE [--max N]`:
 * a TF Serving warmup file (assets.extra/tf_serving_warmup_requests) from
 * request logs that `kiln serve` wrote (logging_config, PredictionLog
 * TFRecords; docs/REQUEST_LOG.md).
 *
 * The logs are read in the order given (their names sort oldest first),
 * each record's request kept without its response and metadata
 * (src/serve/reqlog/fromlog.c), up to --max records (TF Serving reads at
 * most 1000). The result is checked with the server's own warmup reader
 * (src/serve/warmup.c) before it replaces FILE, through a temporary file
 * and a rename, so a server never sees half a warmup file.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli/cli.h"
#include "serve/json.h"
#include "serve/reqlog/fromlog.h"
#include "serve/warmup.h"

#define KILN_LOG_MAX_BYTES ((size_t)4 << 30)

static const char warmup_from_log_help[] =
    "usage: kiln warmup-from-log LOG... -o FILE [--max N]\n"
    "Writes a TF Serving warmup file (a TFRecord of PredictionLog requests, the\n"
    "format of assets.extra/tf_serving_warmup_requests) from request logs that\n"
    "`kiln serve` wrote as PredictionLog TFRecords (logging_config). Records are\n"
    "taken in the order of the LOG files, the first N (default and at most 1000,\n"
    "TF Serving's limit); responses and metadata are left out. The result is read\n"
    "back with the server's warmup reader before FILE is replaced.\n";

/* Read a whole file; *out is malloc'd. */
static int read_all(const char *path, uint8_t **out, size_t *len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return kiln_cli_fail("%s: %s", path, strerror(errno)), 0;
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return kiln_cli_fail("%s: not a regular file", path), 0;
    }
    if ((uint64_t)sb.st_size > KILN_LOG_MAX_BYTES) {
        close(fd);
        return kiln_cli_fail("%s: %lld bytes, more than the %zu this command reads", path,
                             (long long)sb.st_size, KILN_LOG_MAX_BYTES), 0;
    }
    size_t size = (size_t)sb.st_size, got = 0;
    uint8_t *buf = malloc(size ? size : 1);
    if (!buf) {
        close(fd);
        return kiln_cli_fail("%s: out of memory", path), 0;
    }
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) break; /* shrank while reading: take what is there */
        got += (size_t)r;
    }
    close(fd);
    *out = buf;
    *len = got;
    return 1;
}

/* Write data to path through path.tmp and a rename. */
static int write_atomic(const char *path, const char *data, size_t len)
{
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.tmp", path) >= sizeof tmp)
        return kiln_cli_fail("%s: path too long", path), 0;
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) return kiln_cli_fail("%s: %s", tmp, strerror(errno)), 0;
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(fd, data + off, len - off);
        if (w < 0 && errno == EINTR) continue;
        if (w <= 0) break;
        off += (size_t)w;
    }
    int e = errno;
    if (close(fd) != 0 || off != len || rename(tmp, path) != 0) {
        if (off == len) e = errno;
        unlink(tmp);
        return kiln_cli_fail("%s: %s", path, strerror(e)), 0;
    }
    return 1;
}

int kiln_cmd_warmup_from_log(int argc, char **argv)
{
    if (kiln_cli_wants_help(argc, argv))
        return fputs(warmup_from_log_help, stdout), KILN_CLI_EXIT_OK;
    const char *out_path = NULL, *max_s = NULL;
    int n_logs = 0;
    char **logs = calloc((size_t)argc + 1, sizeof *logs);
    if (!logs) return kiln_cli_fail("out of memory");
    for (int i = 0; i < argc; i++) {
        int r = kiln_cli_option("warmup-from-log", argc, argv, &i, "-o", &out_path);
        if (r == 0) r = kiln_cli_option("warmup-from-log", argc, argv, &i, "--output", &out_path);
        if (r == 0) r = kiln_cli_option("warmup-from-log", argc, argv, &i, "--max", &max_s);
        if (r < 0) {
            free(logs);
            return KILN_CLI_EXIT_USAGE;
        }
        if (r > 0) continue;
        if (argv[i][0] == '-') {
            free(logs);
            return kiln_cli_usage_error("warmup-from-log", "unexpected argument '%s'", argv[i]);
        }
        logs[n_logs++] = argv[i];
    }
    int max = KILN_WARMUP_MAX_RECORDS;
    if (max_s && !kiln_cli_parse_int(max_s, 1, KILN_WARMUP_MAX_RECORDS, &max)) {
        free(logs);
        return kiln_cli_usage_error("warmup-from-log", "--max needs an integer in [1, %d], got "
                                    "'%s'", KILN_WARMUP_MAX_RECORDS, max_s);
    }
    if (!n_logs || !out_path) {
        free(logs);
        return kiln_cli_usage_error("warmup-from-log", "LOG and -o FILE are required");
    }
    kiln_sbuf out = {0};
    kiln_fromlog_stats st = {0};
    int rc = KILN_CLI_EXIT_FAIL;
    for (int i = 0; i < n_logs && st.written < max; i++) {
        uint8_t *data;
        size_t len;
        if (!read_all(logs[i], &data, &len)) goto out;
        char err[KILN_FROMLOG_ERR_LEN];
        st.truncated = 0;
        kiln_status s = kiln_fromlog_convert(data, len, max, &out, &st, err);
        free(data);
        if (s != KILN_OK) {
            kiln_cli_fail("%s: %s", logs[i], s == KILN_ERR_OUT_OF_MEMORY ? "out of memory" : err);
            goto out;
        }
        if (st.truncated)
            fprintf(stderr, "kiln warmup-from-log: %s: the last record is cut short (a log being "
                    "written?); it is left out\n", logs[i]);
    }
    if (out.oom) {
        kiln_cli_fail("out of memory");
        goto out;
    }
    if (st.written == 0) {
        kiln_cli_fail("no predict, classify or regress records in the logs; nothing written");
        goto out;
    }
    /* what the server will read: Kiln's own warmup reader must take it */
    kiln_warmup *w = NULL;
    char werr[KILN_WARMUP_ERR_LEN];
    if (kiln_warmup_parse((const uint8_t *)out.p, out.len, &w, werr) != KILN_OK) {
        kiln_cli_fail("the warmup file would not load: %s", werr);
        goto out;
    }
    kiln_warmup_free(w);
    if (!write_atomic(out_path, out.p, out.len)) goto out;
    printf("wrote %d warmup records to %s", st.written, out_path);
    if (st.skipped) printf(" (%d records of other types skipped)", st.skipped);
    printf("\n");
    rc = KILN_CLI_EXIT_OK;
out:
    kiln_sbuf_free(&out);
    free(logs);
    return rc;
}
