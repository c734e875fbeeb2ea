/*
 * files_git.c — git.checkout: git clone in a fresh process (exec.c's
 * internal jobs), its errors classified as the SDK's.  Called by main.c's
 * dispatch on the loop thread; the request is answered when the clone ends.
 */
#include "files_int.h"
/* ------------------------------------------------------------------------------ */
/* gitCheckout: git clone in a fresh process; errors classified as the SDK's. */

struct gitop {
    struct agent_req *req;
    char url[2100];
    char dir[PATH_MAX_BYTES];
    char branch[256];
    int phase; /* 0 clone, 1 rev-parse */
};

static int
classify(const char *err)
{
    if (strcasestr(err, "not found") || strcasestr(err, "does not appear to be a git repository") ||
        strcasestr(err, "does not exist"))
        return strcasestr(err, "branch") ? SBX_E_GIT_BRANCH_NOT_FOUND : SBX_E_GIT_REPO_NOT_FOUND;
    if (strcasestr(err, "Authentication failed") || strcasestr(err, "could not read Username") ||
        strcasestr(err, "Permission denied (publickey"))
        return SBX_E_GIT_AUTH;
    if (strcasestr(err, "Could not resolve host") || strcasestr(err, "unable to access") ||
        strcasestr(err, "Connection refused") || strcasestr(err, "timed out"))
        return SBX_E_GIT_NETWORK;
    return SBX_E_GIT_CLONE;
}

static void
git_done(struct agent *a, void *arg, int code, bool timed_out, struct outcap *out,
         struct outcap *err)
{
    struct gitop *g = arg;
    char errtxt[600];
    snprintf(errtxt, sizeof(errtxt), "%.*s", (int)SBX_MIN(err->data.len, sizeof(errtxt) - 1),
             err->data.p ? err->data.p : "");
    if (g->phase == 0) {
        if (code || timed_out) {
            int c = timed_out ? SBX_E_GIT_CLONE : classify(errtxt);
            sbx_werr w;
            sbx_werr_init(&w, c, "git clone of %s failed%s: %s", g->url,
                          timed_out ? " (timed out)" : "", errtxt);
            sbx_enc_kstr(sbx_werr_ctx(&w), "repoUrl", g->url);
            sbx_enc_kint(sbx_werr_ctx(&w), "exitCode", code);
            agent_reply_werr(a, g->req, &w);
            sbx_werr_free(&w);
            free(g);
            return;
        }
        g->phase = 1;
        const char *argv[] = {"git", "-C", g->dir, "rev-parse", "--abbrev-ref", "HEAD", NULL};
        if (agent_run_internal(a, argv, "/", 30000, git_done, g) == 0)
            return;
        code = 0;
    }
    /* phase 1: the branch actually checked out */
    char branch[256] = "";
    if (code == 0 && out->data.len) {
        snprintf(branch, sizeof(branch), "%.*s", (int)SBX_MIN(out->data.len, sizeof(branch) - 1),
                 out->data.p);
        char *nl = strchr(branch, '\n');
        if (nl)
            *nl = '\0';
    }
    char ts[40];
    sbx_iso8601(sbx_wall_ms(), ts, sizeof(ts));
    sbx_enc e;
    sbx_enc_init(&e);
    sbx_enc_map(&e);
    sbx_enc_kbool(&e, "success", true);
    sbx_enc_kstr(&e, "repoUrl", g->url);
    sbx_enc_kstr(&e, "branch", branch[0] ? branch : g->branch);
    sbx_enc_kstr(&e, "targetDir", g->dir);
    sbx_enc_kstr(&e, "timestamp", ts);
    agent_reply_ok(a, g->req, &e);
    free(g);
}

void
agent_op_git_checkout(struct agent *a, struct agent_req *r)
{
    sbx_str url, br = {0};
    int64_t depth = 0, tmo = 600000;
    if (sbx_wire_get_str(r->args, "repoUrl", &url) != 0 || url.n == 0 || url.n > 2048 ||
        memchr(url.p, '\0', url.n) || url.p[0] == '-') {
        agent_reply_err(a, r, SBX_E_INVALID_GIT_URL, "'repoUrl' must be a URL of 1-2048 bytes");
        return;
    }
    static const char *const schemes[] = {"https://", "http://", "git://", "ssh://", "file://"};
    bool ok = false;
    for (size_t i = 0; i < SBX_ARRAY_LEN(schemes); i++)
        if (url.n > strlen(schemes[i]) && !strncmp(url.p, schemes[i], strlen(schemes[i])))
            ok = true;
    if (!ok && memchr(url.p, '@', url.n) && memchr(url.p, ':', url.n))
        ok = true; /* scp-like user@host:path */
    if (!ok || memchr(url.p, ' ', url.n) || memchr(url.p, '\n', url.n)) {
        agent_reply_err(a, r, SBX_E_INVALID_GIT_URL, "'%.*s' is not a git URL (https, http, git, "
                        "ssh, file or user@host:path)", (int)SBX_MIN(url.n, (size_t)200), url.p);
        return;
    }
    if (sbx_wire_get_str(r->args, "branch", &br) == 0 &&
        (br.n == 0 || br.n > 250 || br.p[0] == '-' || memchr(br.p, ' ', br.n))) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "'branch' is not a valid branch name");
        return;
    }
    if (sbx_wire_get_i64(r->args, "depth", &depth) == SBX_E_VALIDATION || depth < 0 ||
        depth > 1000000) {
        agent_reply_err(a, r, SBX_E_VALIDATION, "'depth' must be a positive number");
        return;
    }
    sbx_wire_get_i64(r->args, "cloneTimeoutMs", &tmo);
    struct gitop *g = sbx_xcalloc(1, sizeof(*g));
    g->req = r;
    sbx_str_copy(url, g->url, sizeof(g->url));
    if (br.n)
        sbx_str_copy(br, g->branch, sizeof(g->branch));
    if (sbx_wire_get(r->args, "targetDir")) {
        if (files_path_arg(a, r, "targetDir", g->dir) != 0) {
            free(g);
            return;
        }
    } else {
        /* /workspace/<repository name>, as the SDK does. */
        char name[256];
        const char *slash = strrchr(g->url, '/');
        const char *colon = strrchr(g->url, ':');
        const char *start = slash ? slash + 1 : colon ? colon + 1 : g->url;
        snprintf(name, sizeof(name), "%s", start);
        size_t nl = strlen(name);
        if (nl > 4 && !strcmp(name + nl - 4, ".git"))
            name[nl - 4] = '\0';
        if (!name[0] || !strcmp(name, ".") || !strcmp(name, ".."))
            snprintf(name, sizeof(name), "repo");
        snprintf(g->dir, sizeof(g->dir), "/workspace/%s", name);
    }
    char dstr[32];
    snprintf(dstr, sizeof(dstr), "--depth=%lld", (long long)depth);
    const char *argv[12];
    int n = 0;
    argv[n++] = "git";
    argv[n++] = "-c";
    argv[n++] = "credential.interactive=never";
    argv[n++] = "clone";
    argv[n++] = "--quiet";
    if (depth > 0)
        argv[n++] = dstr;
    if (g->branch[0]) {
        argv[n++] = "--branch";
        argv[n++] = g->branch;
    }
    argv[n++] = "--";
    argv[n++] = g->url;
    argv[n++] = g->dir;
    argv[n] = NULL;
    files_make_parents(g->dir);
    if (agent_run_internal(a, argv, "/workspace", tmo > 0 ? tmo : 600000, git_done, g) != 0) {
        agent_reply_err(a, r, SBX_E_GIT_CLONE, "could not start git: %s", strerror(errno));
        free(g);
    }
}
