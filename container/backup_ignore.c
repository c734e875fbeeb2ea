/*
 * backup_ignore.c — git's ignore rules for a backup's walk (backup_ignore.h;
 * gitignore(5) is the source of the rules).
 */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "backup_ignore.h"

/* One line of an ignore file. */
struct gi_pat {
    char *pat;     /* without `!`, the leading '/' and the trailing '/' */
    bool neg;      /* `!pattern`: re-includes */
    bool dir_only; /* `pattern/`: only directories */
    bool anchored; /* a '/' at its start or middle: matched against the path
                      relative to its file's directory, else the base name */
};

/* The patterns of one ignore file (or none), and how a walked path is
 * turned into a path relative to that file's directory: skip the first
 * `strip` bytes of it (its directory inside the walk, "a/b/"), prefix it
 * with `prefix` (the walk's root relative to a directory above it). */
struct gi_level {
    char *dir; /* inner levels: the directory relative to the walk's root ("" for the root) */
    char *prefix;
    size_t strip;
    struct gi_pat *p;
    size_t n;
};

struct sbx_gi {
    struct gi_level *lv; /* [0, nfixed): info/exclude and the root's ancestors; then the walk's */
    size_t n, cap, nfixed;
    bool all; /* the root or a directory between it and <top> is ignored: so is everything */
};

/* ------------------------------------------------------------------------------ */
/* wildmatch */

/* Steps of one match before it is given up as no match (a pathological
 * pattern of the sandbox's tree must not hang its backup). */
#define GI_MATCH_BUDGET 1000000

/* The class at *pp ('['): 1 if c is in it (*pp past its ']'), 0 if not, -1
 * if it is malformed. */
static int
class_match(const char **pp, unsigned char c)
{
    const unsigned char *q = (const unsigned char *)*pp + 1;
    bool neg = *q == '!' || *q == '^';
    if (neg)
        q++;
    bool hit = false, first = true;
    while (*q && (first || *q != ']')) {
        first = false;
        if (*q == '[' && q[1] == ':') {
            const char *e = strstr((const char *)q + 2, ":]");
            if (!e)
                return -1;
            size_t len = (size_t)(e - (const char *)q - 2);
            const char *nm = (const char *)q + 2;
#define GI_CLASS(s, f) (len == sizeof(s) - 1 && !memcmp(nm, s, len) && f(c))
            if (GI_CLASS("alnum", isalnum) || GI_CLASS("alpha", isalpha) ||
                GI_CLASS("blank", isblank) || GI_CLASS("cntrl", iscntrl) ||
                GI_CLASS("digit", isdigit) || GI_CLASS("graph", isgraph) ||
                GI_CLASS("lower", islower) || GI_CLASS("print", isprint) ||
                GI_CLASS("punct", ispunct) || GI_CLASS("space", isspace) ||
                GI_CLASS("upper", isupper) || GI_CLASS("xdigit", isxdigit))
                hit = true;
#undef GI_CLASS
            q = (const unsigned char *)e + 2;
            continue;
        }
        unsigned char lo = *q;
        if (lo == '\\') {
            if (!*++q)
                return -1;
            lo = *q;
        }
        q++;
        if (*q == '-' && q[1] && q[1] != ']') {
            unsigned char hi = *++q;
            if (hi == '\\') {
                if (!*++q)
                    return -1;
                hi = *q;
            }
            q++;
            if (c >= lo && c <= hi)
                hit = true;
        } else if (c == lo) {
            hit = true;
        }
    }
    if (*q != ']')
        return -1;
    *pp = (const char *)q + 1;
    return hit != neg;
}

static bool
wm(const char *p, const char *s, const char *pstart, long *budget)
{
    while (*p) {
        if (--*budget < 0)
            return false;
        switch (*p) {
        case '\\':
            if (!p[1] || *s != p[1])
                return false;
            p += 2;
            s++;
            break;
        case '?':
            if (!*s || *s == '/')
                return false;
            p++;
            s++;
            break;
        case '[': {
            if (!*s || *s == '/' || class_match(&p, (unsigned char)*s) <= 0)
                return false;
            s++;
            break;
        }
        case '*':
            if (p[1] == '*' && (p == pstart || p[-1] == '/') && (p[2] == '\0' || p[2] == '/')) {
                if (p[2] == '\0') /* "x/" + "**": everything below */
                    return true;
                /* "**" + "/": zero or more directories */
                for (const char *t = s;;) {
                    if (wm(p + 3, t, pstart, budget))
                        return true;
                    if (!(t = strchr(t, '/')))
                        return false;
                    t++;
                }
            }
            while (*p == '*')
                p++;
            if (!*p)
                return !strchr(s, '/');
            for (const char *t = s;; t++) {
                if (wm(p, t, pstart, budget))
                    return true;
                if (!*t || *t == '/' || *budget < 0)
                    return false;
            }
        default:
            if (*s != *p)
                return false;
            p++;
            s++;
        }
    }
    return *s == '\0';
}

bool
sbx_gi_wildmatch(const char *pat, const char *path)
{
    long budget = GI_MATCH_BUDGET;
    return wm(pat, path, pat, &budget);
}

/* ------------------------------------------------------------------------------ */
/* ignore files */

/* Ignore files larger than this are read up to it (git reads them whole;
 * a sandbox's tree should not make its backup allocate without bound). */
#define GI_FILE_MAX (4 << 20)

/* Parse one line (NUL-terminated, modified in place) into lv; 0 or -ENOMEM. */
static int
add_line(struct gi_level *lv, char *s)
{
    size_t n = strlen(s);
    if (n && s[n - 1] == '\r')
        s[--n] = '\0';
    /* Trailing spaces go unless quoted with a backslash. */
    while (n && s[n - 1] == ' ' && !(n >= 2 && s[n - 2] == '\\'))
        s[--n] = '\0';
    if (!n || s[0] == '#')
        return 0;
    struct gi_pat g = {0};
    if (s[0] == '!') {
        g.neg = true;
        s++;
        n--;
    }
    if (n && s[n - 1] == '/') {
        g.dir_only = true;
        s[--n] = '\0';
    }
    if (!n)
        return 0;
    if (strchr(s, '/')) {
        g.anchored = true;
        if (s[0] == '/')
            s++;
    }
    if (!*s)
        return 0;
    struct gi_pat *np = realloc(lv->p, (lv->n + 1) * sizeof(*np));
    if (!np || !(g.pat = strdup(s))) {
        if (np)
            lv->p = np;
        return -ENOMEM;
    }
    lv->p = np;
    lv->p[lv->n++] = g;
    return 0;
}

/* Read the ignore file at path (relative to the cwd or absolute) into lv;
 * a missing or unreadable one adds nothing.  0 or -ENOMEM. */
static int
load_file(struct gi_level *lv, const char *path)
{
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0)
        return 0;
    struct stat st;
    char *buf = NULL;
    int rc = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
        goto out;
    size_t cap = st.st_size < GI_FILE_MAX ? (size_t)st.st_size : GI_FILE_MAX, len = 0;
    if (!(buf = malloc(cap + 1))) {
        rc = -ENOMEM;
        goto out;
    }
    ssize_t r;
    while (len < cap && (r = read(fd, buf + len, cap - len)) > 0)
        len += (size_t)r;
    buf[len] = '\0';
    for (char *line = buf, *nl; rc == 0 && line < buf + len; line = nl + 1) {
        nl = strchr(line, '\n');
        if (!nl)
            nl = buf + len;
        *nl = '\0';
        rc = add_line(lv, line);
    }
out:
    free(buf);
    close(fd);
    return rc;
}

static void
level_free(struct gi_level *lv)
{
    for (size_t i = 0; i < lv->n; i++)
        free(lv->p[i].pat);
    free(lv->p);
    free(lv->dir);
    free(lv->prefix);
}

/* Push a level (dir and prefix are copied; either may be NULL) and load
 * `file` into it if not NULL.  0 or -ENOMEM. */
static int
push(sbx_gi *g, const char *dir, const char *prefix, size_t strip, const char *file)
{
    if (g->n == g->cap) {
        size_t cap = g->cap ? 2 * g->cap : 16;
        struct gi_level *nl = realloc(g->lv, cap * sizeof(*nl));
        if (!nl)
            return -ENOMEM;
        g->lv = nl;
        g->cap = cap;
    }
    struct gi_level *lv = &g->lv[g->n];
    *lv = (struct gi_level){.strip = strip};
    if ((dir && !(lv->dir = strdup(dir))) || (prefix && !(lv->prefix = strdup(prefix)))) {
        level_free(lv);
        return -ENOMEM;
    }
    g->n++;
    return file ? load_file(lv, file) : 0;
}

/* Does the last matching line of lv decide path (relative to lv's
 * directory; base its last component)?  If so, *ignored is the decision. */
static bool
level_decides(const struct gi_level *lv, const char *path, const char *base, bool is_dir,
              bool *ignored)
{
    for (size_t k = lv->n; k-- > 0;) {
        const struct gi_pat *pt = &lv->p[k];
        if (pt->dir_only && !is_dir)
            continue;
        if (sbx_gi_wildmatch(pt->pat, pt->anchored ? path : base)) {
            *ignored = !pt->neg;
            return true;
        }
    }
    return false;
}

/* Is a directory between <top> and the root, or the root, ignored?  `below`
 * is the root relative to <top>; the fixed levels are loaded: level 0 is
 * info/exclude and level j ≥ 1 the .gitignore of <top>'s (j-1)-th
 * descendant towards the root.  Git ignores everything under such a
 * directory. */
static bool
root_ignored(const sbx_gi *g, const char *below)
{
    char p[4096];
    size_t k = 0;
    for (const char *s = below; *s;) {
        const char *sl = strchr(s, '/');
        size_t cl = sl ? (size_t)(sl - s) : strlen(s);
        snprintf(p, sizeof(p), "%.*s", (int)(s + cl - below), below); /* P_k, k+1 components */
        const char *base = p + (s - below);
        k++;
        for (size_t j = k < g->nfixed - 1 ? k : g->nfixed - 1;; j--) {
            /* relative to level j's directory: P_k less its first j-1 components */
            const char *rel = p;
            for (size_t c = 1; c < j && rel; c++)
                if ((rel = strchr(rel, '/')))
                    rel++;
            bool ign;
            if (rel && level_decides(&g->lv[j], rel, base, true, &ign)) {
                if (ign)
                    return true;
                break;
            }
            if (j == 0)
                break;
        }
        s += cl;
        while (*s == '/')
            s++;
    }
    return false;
}

/* Does a path have a component ".git"? */
static bool
has_git(const char *p)
{
    for (const char *s = p; (s = strstr(s, ".git")); s += 4)
        if ((s == p || s[-1] == '/') && (s[4] == '\0' || s[4] == '/'))
            return true;
    return false;
}

int
sbx_gi_open(const char *root, sbx_gi **out)
{
    sbx_gi *g = calloc(1, sizeof(*g));
    if (!g)
        return -ENOMEM;
    /* <top>: the nearest directory at or above root with a .git directory. */
    char top[4096];
    snprintf(top, sizeof(top), "%s", root);
    size_t rl = strlen(top);
    while (rl > 1 && top[rl - 1] == '/')
        top[--rl] = '\0';
    bool found = false;
    for (;;) {
        char p[4200];
        struct stat st;
        snprintf(p, sizeof(p), "%s/.git", strcmp(top, "/") ? top : "");
        if (lstat(p, &st) == 0 && S_ISDIR(st.st_mode)) {
            found = true;
            break;
        }
        char *sl = strrchr(top, '/');
        if (!sl || sl == top)
            break;
        *sl = '\0';
    }
    if (!found || strcmp(top, "/") == 0)
        snprintf(top, sizeof(top), "%s", root);
    int rc = 0;
    /* root relative to top, and each ancestor's prefix: root = top/a/b →
     * top's prefix "a/b/", top/a's "b/". */
    size_t tl = strlen(top);
    const char *below = root + tl;
    while (*below == '/')
        below++;
    char p[4200];
    snprintf(p, sizeof(p), "%s/.git/info/exclude", tl > 1 ? top : "");
    char prefix[4200];
    snprintf(prefix, sizeof(prefix), "%s%s", below, *below ? "/" : "");
    rc = push(g, NULL, prefix, 0, p);
    /* The ancestors' .gitignore files (top included, root excluded: it is
     * the first inner level). */
    char anc[4096];
    snprintf(anc, sizeof(anc), "%s", top);
    for (const char *s = below; rc == 0 && *s;) {
        snprintf(p, sizeof(p), "%s/.gitignore", strcmp(anc, "/") ? anc : "");
        snprintf(prefix, sizeof(prefix), "%s/", s);
        rc = push(g, NULL, prefix, 0, p);
        const char *sl = strchr(s, '/');
        size_t cl = sl ? (size_t)(sl - s) : strlen(s);
        size_t al = strlen(anc);
        snprintf(anc + al, sizeof(anc) - al, "/%.*s", (int)cl, s);
        s += cl;
        while (*s == '/')
            s++;
    }
    g->nfixed = g->n;
    if (rc == 0)
        g->all = root_ignored(g, below);
    if (rc == 0)
        rc = push(g, "", NULL, 0, ".gitignore");
    if (rc != 0) {
        sbx_gi_free(g);
        return rc;
    }
    *out = g;
    return 0;
}

/* Make the inner levels those of rel's parent directory `par` (len bytes). */
static void
sync_levels(sbx_gi *g, const char *par, size_t len)
{
    /* Pop what is not par or one of its ancestors (the root "" always is). */
    while (g->n > g->nfixed + 1) {
        const char *d = g->lv[g->n - 1].dir;
        size_t dl = strlen(d);
        if (dl <= len && !memcmp(d, par, dl) && (dl == len || par[dl] == '/'))
            break;
        level_free(&g->lv[--g->n]);
    }
    /* Push the missing ones, one directory at a time. */
    for (;;) {
        const char *d = g->lv[g->n - 1].dir;
        size_t dl = strlen(d);
        if (dl == len)
            return;
        const char *next = par + dl + (dl ? 1 : 0);
        const char *sl = memchr(next, '/', len - (size_t)(next - par));
        size_t nl = sl ? (size_t)(sl - par) : len;
        char sub[4200], file[4300];
        snprintf(sub, sizeof(sub), "%.*s", (int)nl, par);
        snprintf(file, sizeof(file), "%s/.gitignore", sub);
        /* Out of memory: a level pushed stays without (some of) its
         * patterns; one not pushed ends the walk down. */
        size_t had = g->n;
        push(g, sub, NULL, nl + 1, has_git(sub) ? NULL : file);
        if (g->n == had)
            return;
    }
}

bool
sbx_gi_ignored(sbx_gi *g, const char *rel, bool is_dir)
{
    if (!*rel || has_git(rel))
        return false;
    if (g->all)
        return true;
    const char *sl = strrchr(rel, '/');
    const char *base = sl ? sl + 1 : rel;
    sync_levels(g, rel, sl ? (size_t)(sl - rel) : 0);
    for (size_t i = g->n; i-- > 0;) {
        const struct gi_level *lv = &g->lv[i];
        if (!lv->n)
            continue;
        char path[8400];
        snprintf(path, sizeof(path), "%s%s", lv->prefix ? lv->prefix : "", rel + lv->strip);
        bool ign;
        if (level_decides(lv, path, base, is_dir, &ign))
            return ign;
    }
    return false;
}

void
sbx_gi_free(sbx_gi *g)
{
    if (!g)
        return;
    for (size_t i = 0; i < g->n; i++)
        level_free(&g->lv[i]);
    free(g->lv);
    free(g);
}
