/* config.c — see config.h. */
#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

void
sbx_strv_free(char **v)
{
    if (!v)
        return;
    for (char **p = v; *p; p++)
        free(*p);
    free(v);
}

static const struct sbx_opt *
find(const struct sbx_opt *opts, const char *name, size_t n)
{
    for (const struct sbx_opt *o = opts; o->name; o++) {
        if (strlen(o->name) == n && !strncmp(o->name, name, n))
            return o;
    }
    return NULL;
}

static void
list_append(char ***lp, const char *v)
{
    size_t n = 0;
    char **l = *lp;
    while (l && l[n])
        n++;
    l = sbx_xrealloc(l, (n + 2) * sizeof(char *));
    l[n] = sbx_xstrdup(v);
    l[n + 1] = NULL;
    *lp = l;
}

static int
apply(const struct sbx_opt *o, const char *v, bool from_file, char *why, size_t whylen)
{
    int rc = 0;
    switch (o->type) {
    case SBX_OPT_STR:
        free(*(char **)o->ptr);
        *(char **)o->ptr = sbx_xstrdup(v);
        break;
    case SBX_OPT_INT: {
        char *end;
        errno = 0;
        long long x = strtoll(v, &end, 10);
        if (errno || end == v || *end)
            rc = -EINVAL;
        else
            *(int64_t *)o->ptr = x;
        break;
    }
    case SBX_OPT_SIZE:
        rc = sbx_parse_size(v, (uint64_t *)o->ptr);
        break;
    case SBX_OPT_MS:
        rc = sbx_parse_duration_ms(v, (int64_t *)o->ptr);
        break;
    case SBX_OPT_BOOL:
        if (!strcmp(v, "1") || !strcmp(v, "true") || !strcmp(v, "yes") || !strcmp(v, "on"))
            *(bool *)o->ptr = true;
        else if (!strcmp(v, "0") || !strcmp(v, "false") || !strcmp(v, "no") || !strcmp(v, "off"))
            *(bool *)o->ptr = false;
        else
            rc = -EINVAL;
        break;
    case SBX_OPT_LIST:
        if (from_file) {
            char *copy = sbx_xstrdup(v), *save, *tok;
            for (tok = strtok_r(copy, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
                while (isspace((unsigned char)*tok))
                    tok++;
                char *e = tok + strlen(tok);
                while (e > tok && isspace((unsigned char)e[-1]))
                    *--e = '\0';
                if (*tok)
                    list_append((char ***)o->ptr, tok);
            }
            free(copy);
        } else {
            list_append((char ***)o->ptr, v);
        }
        break;
    }
    if (rc)
        snprintf(why, whylen, "invalid value '%s' for --%s", v, o->name);
    return rc;
}

static int
load_file(const struct sbx_opt *opts, const char *path, char *why, size_t whylen)
{
    char *buf = NULL;
    size_t n;
    int rc = sbx_fs_read(path, 1 << 20, &buf, &n);
    if (rc) {
        snprintf(why, whylen, "cannot read config file %s: %s", path, strerror(-rc));
        return rc;
    }
    int lineno = 0;
    for (char *line = buf; line && *line;) {
        char *nl = strchr(line, '\n');
        if (nl)
            *nl = '\0';
        lineno++;
        char *h = strchr(line, '#');
        if (h)
            *h = '\0';
        char *eq = strchr(line, '=');
        char *k = line;
        while (isspace((unsigned char)*k))
            k++;
        if (*k) {
            if (!eq) {
                snprintf(why, whylen, "%s:%d: expected 'name = value'", path, lineno);
                rc = -EINVAL;
                break;
            }
            char *ke = eq;
            while (ke > k && isspace((unsigned char)ke[-1]))
                ke--;
            char *v = eq + 1;
            while (isspace((unsigned char)*v))
                v++;
            char *ve = v + strlen(v);
            while (ve > v && isspace((unsigned char)ve[-1]))
                *--ve = '\0';
            const struct sbx_opt *o = find(opts, k, (size_t)(ke - k));
            if (!o) {
                snprintf(why, whylen, "%s:%d: unknown option '%.*s'", path, lineno, (int)(ke - k), k);
                rc = -EINVAL;
                break;
            }
            if ((rc = apply(o, v, true, why, whylen)) != 0)
                break;
        }
        line = nl ? nl + 1 : NULL;
    }
    free(buf);
    return rc;
}

int
sbx_config_parse(const struct sbx_opt *opts, int argc, char **argv, int first, char ***rest,
                 char *why, size_t whylen)
{
    int rc = 0;
    size_t nrest = 0;
    char **r = sbx_xcalloc((size_t)argc + 1, sizeof(char *));

    /* 1. the config file, wherever --config appears */
    for (int i = first; i < argc; i++) {
        const char *f = NULL;
        if (!strcmp(argv[i], "--config") && i + 1 < argc)
            f = argv[i + 1];
        else if (!strncmp(argv[i], "--config=", 9))
            f = argv[i] + 9;
        if (f && (rc = load_file(opts, f, why, whylen)) != 0)
            goto out;
    }
    /* 2. the environment */
    for (const struct sbx_opt *o = opts; o->name; o++) {
        char env[96] = "SBX_";
        size_t k = 4;
        for (const char *p = o->name; *p && k < sizeof(env) - 1; p++)
            env[k++] = (*p == '-') ? '_' : (char)toupper((unsigned char)*p);
        env[k] = '\0';
        const char *v = getenv(env);
        if (v && *v && (rc = apply(o, v, true, why, whylen)) != 0)
            goto out;
    }
    /* 3. flags */
    for (int i = first; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--")) {
            for (i++; i < argc; i++)
                r[nrest++] = argv[i];
            break;
        }
        if (strncmp(a, "--", 2) != 0 || a[2] == '\0') {
            r[nrest++] = argv[i];
            continue;
        }
        const char *name = a + 2, *eq = strchr(name, '=');
        size_t nl = eq ? (size_t)(eq - name) : strlen(name);
        if (nl == 6 && !strncmp(name, "config", 6)) {
            if (!eq)
                i++;
            continue;
        }
        const struct sbx_opt *o = find(opts, name, nl);
        if (!o) {
            snprintf(why, whylen, "unknown option --%.*s", (int)nl, name);
            rc = -EINVAL;
            goto out;
        }
        const char *v;
        if (eq)
            v = eq + 1;
        else if (o->type == SBX_OPT_BOOL)
            v = "true";
        else if (i + 1 < argc)
            v = argv[++i];
        else {
            snprintf(why, whylen, "option --%s needs a value", o->name);
            rc = -EINVAL;
            goto out;
        }
        if ((rc = apply(o, v, false, why, whylen)) != 0)
            goto out;
    }
out:
    if (rc) {
        free(r);
        return rc;
    }
    r[nrest] = NULL;
    *rest = r;
    return 0;
}

void
sbx_config_usage(const struct sbx_opt *opts, const char *cmd, const char *summary)
{
    printf("usage: %s [options]\n%s\n\noptions (also SBX_<NAME> environment variables and "
           "`name = value` lines in --config FILE):\n",
           cmd, summary);
    for (const struct sbx_opt *o = opts; o->name; o++)
        printf("  --%-18s %s\n", o->name, o->help);
}
