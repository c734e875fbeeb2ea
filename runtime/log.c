/* log.c — see log.h. */
#include "log.h"
#include "json.h"

#include <errno.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* Written once by main() before threads start (log.h). */
static int log_level = SBX_LOG_INFO;
static int log_json = 0;
static char log_tag[32] = "sbx";

#define LOG_LINE_MAX 4096

void
sbx_log_init(const char *tag, int level)
{
    if (tag)
        snprintf(log_tag, sizeof(log_tag), "%s", tag);
    if (level < 0) {
        const char *e = getenv("SBX_LOG");
        level = SBX_LOG_INFO;
        if (e) {
            if (!strcmp(e, "error")) level = SBX_LOG_ERROR;
            else if (!strcmp(e, "warn")) level = SBX_LOG_WARN;
            else if (!strcmp(e, "debug")) level = SBX_LOG_DEBUG;
        }
    }
    log_level = level;
}

int
sbx_log_set_format(const char *format)
{
    if (!format || !*format)
        format = getenv("SBX_LOG_FORMAT");
    if (!format || !*format || !strcmp(format, "text"))
        log_json = 0;
    else if (!strcmp(format, "json"))
        log_json = 1;
    else
        return -EINVAL;
    return 0;
}

void
sbx_log_env(const char **level, const char **format)
{
    static const char *const levels[] = {"SBX_LOG=error", "SBX_LOG=warn", "SBX_LOG=info",
                                         "SBX_LOG=debug"};
    *level = levels[log_level >= SBX_LOG_ERROR && log_level <= SBX_LOG_DEBUG ? log_level
                                                                               : SBX_LOG_INFO];
    *format = log_json ? "SBX_LOG_FORMAT=json" : "SBX_LOG_FORMAT=text";
}

int
sbx_log_enabled(int level)
{
    return level <= log_level;
}

/* A bounded writer: never past cap - 2 (room for '\n' and NUL). */
struct w {
    char *p;
    size_t n, cap;
};

static void
put(struct w *w, const char *s, size_t n)
{
    if (w->n + n > w->cap - 2)
        n = w->cap - 2 - w->n;
    memcpy(w->p + w->n, s, n);
    w->n += n;
}

static void
puts_(struct w *w, const char *s)
{
    put(w, s, strlen(s));
}

/* s[0..n) as a JSON string, quotes included; a sequence that would not fit
 * is left out whole, so the string stays valid when the line is cut. */
static void
put_jstr(struct w *w, const char *s, size_t n)
{
    const unsigned char *u = (const unsigned char *)s;
    put(w, "\"", 1);
    for (size_t i = 0; i < n;) {
        char esc[8];
        const char *out = esc;
        size_t on, adv = 1;
        if (u[i] == '"' || u[i] == '\\') {
            esc[0] = '\\', esc[1] = (char)u[i], on = 2;
        } else if (u[i] == '\n') {
            out = "\\n", on = 2;
        } else if (u[i] == '\t') {
            out = "\\t", on = 2;
        } else if (u[i] == '\r') {
            out = "\\r", on = 2;
        } else if (u[i] < 0x20 || u[i] == 0x7f) {
            snprintf(esc, sizeof(esc), "\\u%04x", u[i]);
            on = 6;
        } else if (u[i] < 0x80) {
            out = s + i, on = 1;
        } else if ((adv = sbx_utf8_seq((const char *)u + i, n - i)) != 0) {
            out = s + i, on = adv;
        } else {
            out = "\\ufffd", on = 6, adv = 1;
        }
        if (w->n + on + 1 > w->cap - 2)
            break; /* keep room for the closing quote */
        put(w, out, on);
        i += adv;
    }
    put(w, "\"", 1);
}

size_t
sbx_log_format_line(char *out, size_t cap, int json, long long wall_ms, int level,
                    const char *tag, int pid, const struct sbx_log_req *r, const char *msg)
{
    static const char lv[] = "EWID";
    static const char *const lvname[] = {"error", "warn", "info", "debug"};
    struct w w = {out, 0, cap};
    char ts[48], num[32];
    time_t sec = (time_t)(wall_ms / 1000);
    struct tm tm;
    if (cap < 16) {
        if (cap)
            out[0] = 0;
        return 0;
    }
    gmtime_r(&sec, &tm);
    size_t tn = strftime(ts, sizeof(ts), "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(ts + tn, sizeof(ts) - tn, ".%03dZ", (int)(wall_ms % 1000));
    bool have_r = r && (r->rid_n || r->sandbox_n || r->op_n);
    if (json) {
        puts_(&w, "{\"time\":\"");
        puts_(&w, ts);
        puts_(&w, "\",\"level\":\"");
        puts_(&w, lvname[level & 3]);
        puts_(&w, "\",\"component\":");
        put_jstr(&w, tag, strlen(tag));
        snprintf(num, sizeof(num), ",\"pid\":%d", pid);
        puts_(&w, num);
        if (r && r->sandbox_n) {
            puts_(&w, ",\"sandbox\":");
            put_jstr(&w, r->sandbox, r->sandbox_n);
        }
        if (r && r->op_n) {
            puts_(&w, ",\"op\":");
            put_jstr(&w, r->op, r->op_n);
        }
        if (r && r->rid_n) {
            puts_(&w, ",\"requestId\":");
            put_jstr(&w, r->rid, r->rid_n);
        }
        puts_(&w, ",\"message\":");
        /* Room for the closing brace: the message is cut before it. */
        w.cap -= 1;
        put_jstr(&w, msg, strlen(msg));
        w.cap += 1;
        put(&w, "}", 1);
    } else {
        snprintf(num, sizeof(num), "[%d] %c: ", pid, lv[level & 3]);
        puts_(&w, ts);
        puts_(&w, " ");
        puts_(&w, tag);
        puts_(&w, num);
        if (have_r) {
            char f[200];
            snprintf(f, sizeof(f), "[rid=%.*s sandbox=%.*s op=%.*s] ", (int)r->rid_n,
                     r->rid ? r->rid : "", (int)r->sandbox_n, r->sandbox ? r->sandbox : "",
                     (int)r->op_n, r->op ? r->op : "");
            puts_(&w, f);
        }
        puts_(&w, msg);
    }
    out[w.n++] = '\n';
    out[w.n] = 0;
    return w.n;
}

static void
vlog(int level, const struct sbx_log_req *r, const char *fmt, va_list ap)
{
    char msg[LOG_LINE_MAX], line[LOG_LINE_MAX + 512];
    struct timeval tv;
    vsnprintf(msg, sizeof(msg), fmt, ap);
    gettimeofday(&tv, NULL);
    size_t n = sbx_log_format_line(line, sizeof(line), log_json,
                                   (long long)tv.tv_sec * 1000 + tv.tv_usec / 1000, level,
                                   log_tag, (int)getpid(), r, msg);
    /* One write() per line so lines from many processes do not interleave. */
    ssize_t wr = write(STDERR_FILENO, line, n);
    (void)wr;
}

void
sbx_log(int level, const char *fmt, ...)
{
    va_list ap;
    if (level > log_level)
        return;
    va_start(ap, fmt);
    vlog(level, NULL, fmt, ap);
    va_end(ap);
}

void
sbx_log_req(int level, const struct sbx_log_req *r, const char *fmt, ...)
{
    va_list ap;
    if (level > log_level)
        return;
    va_start(ap, fmt);
    vlog(level, r, fmt, ap);
    va_end(ap);
}
