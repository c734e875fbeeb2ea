/* log.c — see log.h. */
#include "log.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

/* Written once by main() before threads start (log.h). */
static int log_level = SBX_LOG_INFO;
static char log_tag[32] = "sbx";

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
sbx_log_enabled(int level)
{
    return level <= log_level;
}

void
sbx_log(int level, const char *fmt, ...)
{
    static const char lv[] = "EWID";
    char line[2048];
    struct timeval tv;
    struct tm tm;
    size_t n;
    va_list ap;

    if (level > log_level)
        return;
    gettimeofday(&tv, NULL);
    gmtime_r(&tv.tv_sec, &tm);
    n = strftime(line, sizeof(line), "%Y-%m-%dT%H:%M:%S", &tm);
    n += (size_t)snprintf(line + n, sizeof(line) - n, ".%03ldZ %s[%d] %c: ",
                          (long)(tv.tv_usec / 1000), log_tag, (int)getpid(), lv[level & 3]);
    va_start(ap, fmt);
    if (n < sizeof(line))
        vsnprintf(line + n, sizeof(line) - n, fmt, ap);
    va_end(ap);
    n = strlen(line);
    if (n > sizeof(line) - 2)
        n = sizeof(line) - 2;
    line[n++] = '\n';
    /* One write() per line so lines from many processes do not interleave. */
    ssize_t w = write(STDERR_FILENO, line, n);
    (void)w;
}
