/* prom.c — see prom.h. */
#include "prom.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const double sbx_prom_latency_s[] = {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01,
                                     0.025,  0.05,    0.1,    0.25,  0.5,    1,     2.5,
                                     10,     30};
const int sbx_prom_latency_n = (int)(sizeof(sbx_prom_latency_s) / sizeof(double));
const double sbx_prom_batch_sizes[] = {1, 2, 4, 8, 16, 32, 64, 128, 256, 512};
const int sbx_prom_batch_n = (int)(sizeof(sbx_prom_batch_sizes) / sizeof(double));

struct sbx_prom_family {
    char name[128];
    char type[12];
    char *help;  /* owned */
    sbx_buf body;
};

void
sbx_hist_observe(struct sbx_hist *h, const double *bounds, int nb, double v)
{
    int i = 0;
    while (i < nb && v > bounds[i])
        i++;
    if (i < nb)
        h->counts[i]++;
    h->count++;
    h->sum += v;
}

void
sbx_prom_init(sbx_prom *p)
{
    memset(p, 0, sizeof(*p));
}

void
sbx_prom_free(sbx_prom *p)
{
    for (size_t i = 0; i < p->n; i++) {
        free(p->fam[i].help);
        sbx_buf_free(&p->fam[i].body);
    }
    free(p->fam);
    memset(p, 0, sizeof(*p));
}

static int
name_ok(const char *s, int metric)
{
    if (!*s)
        return 0;
    for (const char *c = s; *c; c++) {
        int alpha = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || *c == '_' ||
                    (metric && *c == ':');
        int digit = *c >= '0' && *c <= '9';
        if (!alpha && !(digit && c != s))
            return 0;
    }
    return 1;
}

static struct sbx_prom_family *
find(const sbx_prom *p, const char *name)
{
    for (size_t i = 0; i < p->n; i++)
        if (!strcmp(p->fam[i].name, name))
            return &p->fam[i];
    return NULL;
}

int
sbx_prom_family(sbx_prom *p, const char *name, const char *type, const char *help)
{
    if (!name_ok(name, 1) || strlen(name) >= sizeof(p->fam->name))
        return -EINVAL;
    if (strcmp(type, "counter") && strcmp(type, "gauge") && strcmp(type, "histogram") &&
        strcmp(type, "untyped"))
        return -EINVAL;
    struct sbx_prom_family *f = find(p, name);
    if (f)
        return strcmp(f->type, type) ? -EEXIST : 0;
    if (p->n == p->cap) {
        p->cap = p->cap ? p->cap * 2 : 32;
        p->fam = sbx_xrealloc(p->fam, p->cap * sizeof(*p->fam));
    }
    f = &p->fam[p->n++];
    memset(f, 0, sizeof(*f));
    snprintf(f->name, sizeof(f->name), "%s", name);
    snprintf(f->type, sizeof(f->type), "%s", type);
    f->help = sbx_xstrdup(help ? help : "");
    sbx_buf_init(&f->body);
    return 0;
}

int
sbx_prom_labels(char *out, size_t n, ...)
{
    va_list ap;
    size_t o = 0;
    int rc = 0;
    va_start(ap, n);
    for (const char *k; (k = va_arg(ap, const char *)) != NULL;) {
        const char *v = va_arg(ap, const char *);
        if (!name_ok(k, 0)) {
            rc = -EINVAL;
            break;
        }
        size_t kn = strlen(k);
        /* worst case: ',' k '="' every byte doubled '"' NUL */
        if (o + 1 + kn + 2 + (v ? 2 * strlen(v) : 0) + 2 > n) {
            rc = -ENOSPC;
            break;
        }
        if (o)
            out[o++] = ',';
        memcpy(out + o, k, kn);
        o += kn;
        out[o++] = '=';
        out[o++] = '"';
        for (const char *c = v ? v : ""; *c; c++) {
            if (*c == '\\' || *c == '"') {
                out[o++] = '\\';
                out[o++] = *c;
            } else if (*c == '\n') {
                out[o++] = '\\';
                out[o++] = 'n';
            } else {
                out[o++] = *c;
            }
        }
        out[o++] = '"';
    }
    va_end(ap);
    if (n)
        out[rc ? 0 : o] = '\0';
    return rc;
}

/* The shortest of %.15g and %.17g that reads back as v (0.1, not
 * 0.10000000000000001), or +Inf, -Inf, NaN. */
static void
fmt_value(char out[40], double v)
{
    if (isnan(v))
        snprintf(out, 40, "NaN");
    else if (isinf(v))
        snprintf(out, 40, "%s", v > 0 ? "+Inf" : "-Inf");
    else if (snprintf(out, 40, "%.15g", v), strtod(out, NULL) != v)
        snprintf(out, 40, "%.17g", v);
}

static void
append_value(sbx_buf *b, double v)
{
    char s[40];
    fmt_value(s, v);
    sbx_buf_appendf(b, "%s", s);
}

static void
sample(struct sbx_prom_family *f, const char *suffix, const char *labels, const char *extra,
       double v)
{
    bool lab = labels && *labels;
    sbx_buf_appendf(&f->body, "%s%s", f->name, suffix ? suffix : "");
    if (lab || extra)
        sbx_buf_appendf(&f->body, "{%s%s%s}", lab ? labels : "", lab && extra ? "," : "",
                        extra ? extra : "");
    sbx_buf_append(&f->body, " ", 1);
    append_value(&f->body, v);
    sbx_buf_append(&f->body, "\n", 1);
}

int
sbx_prom_add(sbx_prom *p, const char *family, const char *suffix, const char *labels,
             double value)
{
    struct sbx_prom_family *f = find(p, family);
    if (!f)
        return -ENOENT;
    sample(f, suffix, labels, NULL, value);
    return 0;
}

int
sbx_prom_add_hist(sbx_prom *p, const char *family, const char *labels, const double *bounds,
                  int nb, const struct sbx_hist *h)
{
    struct sbx_prom_family *f = find(p, family);
    if (!f)
        return -ENOENT;
    uint64_t cum = 0;
    char le[48], v[40];
    for (int i = 0; i < nb && i < SBX_HIST_MAX; i++) {
        cum += h->counts[i];
        fmt_value(v, bounds[i]);
        snprintf(le, sizeof(le), "le=\"%s\"", v);
        sample(f, "_bucket", labels, le, (double)cum);
    }
    sample(f, "_bucket", labels, "le=\"+Inf\"", (double)h->count);
    sample(f, "_sum", labels, NULL, h->sum);
    sample(f, "_count", labels, NULL, (double)h->count);
    return 0;
}

int
sbx_prom_add_raw(sbx_prom *p, const char *name, const char *type, const char *help,
                 const char *body, size_t len)
{
    if (len && body[len - 1] != '\n')
        return -EINVAL;
    int rc = sbx_prom_family(p, name, type, help);
    if (rc)
        return rc;
    sbx_buf_append(&find(p, name)->body, body, len);
    return 0;
}

void
sbx_prom_get(const sbx_prom *p, size_t i, const char **name, const char **type,
             const char **help, const char **body, size_t *len)
{
    const struct sbx_prom_family *f = &p->fam[i];
    *name = f->name;
    *type = f->type;
    *help = f->help;
    *body = f->body.p ? f->body.p : "";
    *len = f->body.len;
}

void
sbx_prom_render(const sbx_prom *p, sbx_buf *out)
{
    for (size_t i = 0; i < p->n; i++) {
        const struct sbx_prom_family *f = &p->fam[i];
        sbx_buf_appendf(out, "# HELP %s ", f->name);
        for (const char *c = f->help; *c; c++) {
            if (*c == '\\')
                sbx_buf_append(out, "\\\\", 2);
            else if (*c == '\n')
                sbx_buf_append(out, "\\n", 2);
            else
                sbx_buf_append(out, c, 1);
        }
        sbx_buf_appendf(out, "\n# TYPE %s %s\n", f->name, f->type);
        if (f->body.len)
            sbx_buf_append(out, f->body.p, f->body.len);
    }
}
