/*
 * test_watch_git_env.c — file.watch, git.checkout, env.set and
 * sandbox.configure (docs/protocol.md §3.4 file.watch, §3.5, §3.6) through
 * the C client against a private sbxd:
 *  - watch: create/modify/delete/move events for changes made by commands,
 *    include/exclude globs, new subdirectories picked up when recursive,
 *    stream.cancel ending the watch with a `stopped` event;
 *  - git.checkout from a bare repository inside the sandbox over file://
 *    (default target dir, a branch, depth 1) and its error codes;
 *  - env.set: set and unset, visible in the default session at once and in
 *    sessions/processes started later, kept across a container restart
 *    caused by sleepAfter; sandbox.configure validation and keepAlive.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/sdk.h"

/* ------------------------------------------------------------------------------ */
/* watch */

struct watch {
    char sid[80];
    long long after;
    json_t *events; /* every event read so far */
    bool done;
};

/* watch_start — file.watch with extra arguments (stolen); asserts. */
static void
watch_start(sbx_client *c, const char *id, const char *path, json_t *extra, struct watch *w)
{
    json_t *a = extra ? extra : json_object();
    json_object_set_new(a, "path", json_string(path));
    tcall t = tc_call(c, "file.watch", id, a, 0);
    tc_ok(t, "file.watch");
    memset(w, 0, sizeof(*w));
    snprintf(w->sid, sizeof(w->sid), "%s", jstr(t.res, "streamId"));
    cr_assert(w->sid[0], "file.watch returned no streamId");
    cr_expect(jstr(t.res, "watchId")[0], "file.watch returned no watchId");
    cr_expect_str_eq(jstr(t.res, "path"), path);
    tc_free(&t);
    w->events = json_array();
}

static void
watch_free(struct watch *w)
{
    json_decref(w->events);
}

/* count_events — events of eventType `type` whose path ends with `suffix`. */
static int
count_events(const struct watch *w, const char *type, const char *suffix)
{
    int n = 0;
    for (size_t i = 0; i < json_array_size(w->events); i++) {
        json_t *e = json_array_get(w->events, i);
        const char *p = jstr(e, "path");
        size_t pl = strlen(p), sl = strlen(suffix);
        if (!strcmp(jstr(e, "type"), "event") && !strcmp(jstr(e, "eventType"), type) &&
            pl >= sl && !strcmp(p + pl - sl, suffix))
            n++;
    }
    return n;
}

/* Names of the events read, for failure messages (heap). */
static char *
event_summary(const struct watch *w)
{
    char *s = json_dumps(w->events, JSON_COMPACT);
    return s ? s : strdup("?");
}

/* watch_read — read events for up to ms or until `want` (eventType, path
 * suffix) has been seen (want NULL: read for the whole time). */
static void
watch_read(sbx_client *c, const char *id, struct watch *w, int ms, const char *want_type,
           const char *want_suffix)
{
    double until = test_now_ms() + ms;
    while (!w->done && test_now_ms() < until) {
        if (want_type && count_events(w, want_type, want_suffix) > 0)
            return;
        int wait = (int)(until - test_now_ms());
        tcall t = tc_call(c, "stream.read", id,
                          json_pack("{s:s, s:I, s:i}", "streamId", w->sid, "after", w->after,
                                    "waitMs", wait > 50 ? (wait < 1000 ? wait : 1000) : 50),
                          0);
        tc_ok(t, "stream.read of the watch");
        json_t *evs = jget(t.res, "events");
        for (size_t i = 0; i < json_array_size(evs); i++) {
            json_t *e = json_array_get(evs, i);
            json_array_append(w->events, e);
            w->after = jint(e, "seq");
        }
        if (jbool(t.res, "done") == 1)
            w->done = true;
        tc_free(&t);
    }
}

/* run — a sessionless shell command; asserts exit 0. */
static void
run(sbx_client *c, const char *id, const char *cmd)
{
    sbx_exec_opts o = {.command = cmd, .sessionless = true};
    sbx_exec_result r = tsh_opts(c, id, &o);
    cr_expect_eq(r.exit_code, 0, "'%s' exited %d: %s", cmd, r.exit_code, r.stderr_data);
    sbx_exec_result_free(&r);
}

Test(watch, create_modify_move_and_delete_are_reported, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("watch-ev");
    run(c, id, "mkdir -p /workspace/w");
    struct watch w;
    watch_start(c, id, "/workspace/w", NULL, &w);
    run(c, id, "echo a > /workspace/w/f1; sleep 0.1; echo b >> /workspace/w/f1; sleep 0.1; "
               "mv /workspace/w/f1 /workspace/w/f2; sleep 0.1; rm /workspace/w/f2");
    watch_read(c, id, &w, 8000, "delete", "/f2");
    char *sum = event_summary(&w);
    cr_expect_str_eq(jstr(w.events, "0.type"), "watching", "the first event: %s", sum);
    cr_expect_gt(count_events(&w, "create", "/w/f1"), 0, "no create of f1: %s", sum);
    cr_expect_gt(count_events(&w, "modify", "/w/f1"), 0, "no modify of f1: %s", sum);
    cr_expect_gt(count_events(&w, "move_from", "/w/f1"), 0, "no move_from of f1: %s", sum);
    cr_expect_gt(count_events(&w, "move_to", "/w/f2"), 0, "no move_to of f2: %s", sum);
    cr_expect_gt(count_events(&w, "delete", "/w/f2"), 0, "no delete of f2: %s", sum);
    /* Paths are absolute and isDirectory is there. */
    for (size_t i = 0; i < json_array_size(w.events); i++) {
        json_t *e = json_array_get(w.events, i);
        if (strcmp(jstr(e, "type"), "event"))
            continue;
        cr_expect(!strncmp(jstr(e, "path"), "/workspace/w/", 13), "event path %s",
                  jstr(e, "path"));
        cr_expect_eq(jbool(e, "isDirectory"), 0, "isDirectory of %s", jstr(e, "path"));
    }
    free(sum);
    /* A directory is reported as one. */
    run(c, id, "mkdir /workspace/w/newdir");
    watch_read(c, id, &w, 5000, "create", "/newdir");
    bool isdir = false;
    for (size_t i = 0; i < json_array_size(w.events); i++) {
        json_t *e = json_array_get(w.events, i);
        const char *p = jstr(e, "path");
        if (strlen(p) >= 7 && !strcmp(p + strlen(p) - 7, "/newdir"))
            isdir |= jbool(e, "isDirectory") == 1;
    }
    cr_expect(isdir, "mkdir was not reported with isDirectory true");
    tcall t = tc_call(c, "stream.cancel", id, json_pack("{s:s}", "streamId", w.sid), 0);
    tc_ok(t, "stream.cancel");
    tc_free(&t);
    watch_free(&w);
    tdone(c, id);
    sbx_client_close(c);
}

Test(watch, include_and_exclude_patterns_filter, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("watch-pat");
    run(c, id, "mkdir -p /workspace/inc /workspace/exc");
    struct watch wi, we;
    watch_start(c, id, "/workspace/inc", json_pack("{s:[s]}", "include", "*.txt"), &wi);
    watch_start(c, id, "/workspace/exc", json_pack("{s:[s, s]}", "exclude", "*.log", "tmpdir"),
                &we);
    run(c, id, "for d in inc exc; do echo x > /workspace/$d/keep.txt; echo y > /workspace/$d/"
               "drop.log; mkdir /workspace/$d/tmpdir; echo z > /workspace/$d/tmpdir/in.txt; "
               "done; sleep 0.3; echo end > /workspace/inc/zz-end.txt; "
               "echo end > /workspace/exc/zz-end.txt");
    watch_read(c, id, &wi, 6000, "create", "/zz-end.txt");
    watch_read(c, id, &we, 6000, "create", "/zz-end.txt");
    char *si = event_summary(&wi), *se = event_summary(&we);
    cr_expect_gt(count_events(&wi, "create", "/keep.txt"), 0, "include: keep.txt missing: %s", si);
    cr_expect_eq(count_events(&wi, "create", "/drop.log"), 0, "include *.txt let drop.log in: %s",
                 si);
    cr_expect_gt(count_events(&we, "create", "/keep.txt"), 0, "exclude: keep.txt missing: %s", se);
    cr_expect_eq(count_events(&we, "create", "/drop.log"), 0, "exclude *.log let drop.log in: %s",
                 se);
    cr_expect_eq(count_events(&we, "create", "/tmpdir/in.txt") + count_events(&we, "create",
                                                                              "/tmpdir"),
                 0, "exclude tmpdir let its contents in: %s", se);
    free(si);
    free(se);
    watch_free(&wi);
    watch_free(&we);
    tdone(c, id);
    sbx_client_close(c);
}

Test(watch, recursive_watch_picks_up_new_subdirectories, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("watch-rec");
    run(c, id, "mkdir -p /workspace/r/existing");
    struct watch w;
    watch_start(c, id, "/workspace/r", NULL, &w);
    run(c, id, "echo 1 > /workspace/r/existing/old.txt; mkdir -p /workspace/r/new/deeper; "
               "sleep 0.5; echo 2 > /workspace/r/new/deeper/f.txt");
    watch_read(c, id, &w, 8000, "create", "/new/deeper/f.txt");
    char *sum = event_summary(&w);
    cr_expect_gt(count_events(&w, "create", "/existing/old.txt"), 0,
                 "no event from an existing subdirectory: %s", sum);
    cr_expect_gt(count_events(&w, "create", "/r/new"), 0, "no create of new/: %s", sum);
    cr_expect_gt(count_events(&w, "create", "/new/deeper/f.txt"), 0,
                 "no event from a new subdirectory: %s", sum);
    free(sum);
    watch_free(&w);
    /* recursive false: only the directory itself. */
    run(c, id, "mkdir -p /workspace/flat/sub");
    watch_start(c, id, "/workspace/flat", json_pack("{s:b}", "recursive", 0), &w);
    run(c, id, "echo 1 > /workspace/flat/sub/nested.txt; sleep 0.2; echo 2 > /workspace/flat/top.txt");
    watch_read(c, id, &w, 6000, "create", "/flat/top.txt");
    sum = event_summary(&w);
    cr_expect_gt(count_events(&w, "create", "/flat/top.txt"), 0, "no top-level event: %s", sum);
    cr_expect_eq(count_events(&w, "create", "/sub/nested.txt"), 0,
                 "a non-recursive watch reported a subdirectory: %s", sum);
    free(sum);
    watch_free(&w);
    tdone(c, id);
    sbx_client_close(c);
}

Test(watch, cancel_stops_the_watch, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("watch-stop");
    run(c, id, "mkdir -p /workspace/s");
    struct watch w;
    watch_start(c, id, "/workspace/s", NULL, &w);
    run(c, id, "touch /workspace/s/one");
    watch_read(c, id, &w, 5000, "create", "/s/one");
    tcall t = tc_call(c, "stream.cancel", id, json_pack("{s:s}", "streamId", w.sid), 0);
    tc_ok(t, "stream.cancel");
    tc_free(&t);
    watch_read(c, id, &w, 5000, NULL, NULL);
    char *sum = event_summary(&w);
    cr_expect(w.done, "the watch stream did not end after cancel: %s", sum);
    json_t *last = json_array_get(w.events, json_array_size(w.events) - 1);
    cr_expect_str_eq(jstr(last, "type"), "stopped", "the last event: %s", sum);
    free(sum);
    /* Changes after the cancel are not reported, and the stream is gone. */
    run(c, id, "touch /workspace/s/two");
    cr_expect_eq(count_events(&w, "create", "/s/two"), 0);
    watch_free(&w);
    /* A watch of a path that does not exist. */
    t = tc_call(c, "file.watch", id, json_pack("{s:s}", "path", "/workspace/no-such-dir"), 0);
    tc_fails_with(t, "file.watch of a missing dir", "FILE_NOT_FOUND");
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

/* file.checkChanges (docs/protocol.md §3.4): one call, its version. */
static tcall
changes(sbx_client *c, const char *id, const char *path, const char *since)
{
    json_t *a = json_pack("{s:s}", "path", path);
    if (since)
        json_object_set_new(a, "since", json_string(since));
    return tc_call(c, "file.checkChanges", id, a, 0);
}

/* The status of one checkChanges call that must succeed; *ver gets its version. */
static void
expect_changes(sbx_client *c, const char *id, const char *path, const char *since,
               const char *status, const char *reason, char *ver, size_t verlen)
{
    tcall t = changes(c, id, path, since);
    tc_ok(t, "file.checkChanges");
    cr_expect_str_eq(jstr(t.res, "status"), status, "since %s", since ? since : "(none)");
    const char *why = jstr(t.res, "reason");
    cr_expect_str_eq(why ? why : "", reason ? reason : "", "reason after since %s",
                     since ? since : "(none)");
    const char *v = jstr(t.res, "version");
    cr_assert(v, "no version");
    /* The SDK's look: watch-<n>-<n>:<n>. */
    unsigned long long n1, n2, n3;
    char end;
    cr_expect_eq(sscanf(v, "watch-%llu-%llu:%llu%c", &n1, &n2, &n3, &end), 3, "version '%s'", v);
    snprintf(ver, verlen, "%s", v);
    tc_free(&t);
}

Test(watch, check_changes_reports_unchanged_changed_and_resync, .timeout = 90)
{
    sbx_client *c = test_client();
    char *id = test_id("changes");
    run(c, id, "mkdir -p /workspace/cc");
    char v0[128], v1[128], v2[128], v3[128];
    expect_changes(c, id, "/workspace/cc", NULL, "unchanged", NULL, v0, sizeof(v0));
    expect_changes(c, id, "/workspace/cc", v0, "unchanged", NULL, v1, sizeof(v1));
    cr_expect_str_eq(v1, v0, "nothing happened, yet the version moved");
    run(c, id, "echo x > /workspace/cc/f");
    expect_changes(c, id, "/workspace/cc", v0, "changed", NULL, v1, sizeof(v1));
    cr_expect_str_neq(v1, v0);
    expect_changes(c, id, "/workspace/cc", v1, "unchanged", NULL, v2, sizeof(v2));
    /* Malformed, or ahead of the state: VALIDATION_FAILED (the SDK's). */
    static const char *const bad[] = {"bogus", "watch-1-2:", ":3", "watch-1-2:x1"};
    for (size_t i = 0; i < SBX_ARRAY_LEN(bad); i++) {
        tcall t = changes(c, id, "/workspace/cc", bad[i]);
        tc_fails_with(t, bad[i], "VALIDATION_FAILED");
        tc_free(&t);
    }
    char ahead[160];
    snprintf(ahead, sizeof(ahead), "%.*s:999999", (int)strcspn(v2, ":"), v2);
    tcall t = changes(c, id, "/workspace/cc", ahead);
    tc_fails_with(t, "a version ahead", "VALIDATION_FAILED");
    tc_free(&t);
    /* A missing directory is FILE_NOT_FOUND. */
    t = changes(c, id, "/workspace/no-such-dir", NULL);
    tc_fails_with(t, "checkChanges of a missing dir", "FILE_NOT_FOUND");
    tc_free(&t);
    /* The state ends with its directory: made again, resync (expired). */
    run(c, id, "rm -r /workspace/cc && mkdir /workspace/cc");
    expect_changes(c, id, "/workspace/cc", v2, "resync", "expired", v3, sizeof(v3));
    expect_changes(c, id, "/workspace/cc", v3, "unchanged", NULL, v2, sizeof(v2));
    /* Another container (destroyed and made again): resync (restarted). */
    cr_assert_eq(sbx_destroy(c, id, NULL, NULL), 0);
    run(c, id, "mkdir -p /workspace/cc");
    expect_changes(c, id, "/workspace/cc", v2, "resync", "restarted", v3, sizeof(v3));
    /* Options are part of the state: another include is another state. */
    t = tc_call(c, "file.checkChanges", id,
                json_pack("{s:s, s:s, s:[s]}", "path", "/workspace/cc", "since", v3, "include",
                          "*.py"),
                0);
    tc_ok(t, "checkChanges with include");
    cr_expect_str_eq(jstr(t.res, "status"), "resync", "another state: %s", jstr(t.res, "version"));
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

/* ------------------------------------------------------------------------------ */
/* git */

static const char *const make_repo =
    "(set -e; G='git -c user.name=t -c user.email=t@example.com -c init.defaultBranch=main'; "
    "$G init -q --bare /tmp/r.git; "
    "$G init -q /tmp/src; cd /tmp/src; "
    "echo hello > README; $G add README; $G commit -q -m one; "
    "echo two > second; $G add second; $G commit -q -m two; "
    "$G push -q /tmp/r.git main; "
    "$G checkout -q -b dev; echo dev > devfile; $G add devfile; $G commit -q -m dev; "
    "$G push -q /tmp/r.git dev; "
    "git --git-dir=/tmp/r.git symbolic-ref HEAD refs/heads/main)";

static tcall
checkout(sbx_client *c, const char *id, json_t *args)
{
    return tc_call(c, "git.checkout", id, args, 120000);
}

Test(git, checkout_from_a_local_bare_repository, .timeout = 120)
{
    sbx_client *c = test_client();
    char *id = test_id("git-ok");
    sbx_exec_result r = tsh(c, id, make_repo, 60000);
    cr_assert_eq(r.exit_code, 0, "making the repository: %s", r.stderr_data);
    sbx_exec_result_free(&r);
    /* Default target dir and branch. */
    tcall t = checkout(c, id, json_pack("{s:s}", "repoUrl", "file:///tmp/r.git"));
    tc_ok(t, "git.checkout");
    cr_expect_eq(jbool(t.res, "success"), 1);
    cr_expect_str_eq(jstr(t.res, "repoUrl"), "file:///tmp/r.git");
    cr_expect_str_eq(jstr(t.res, "targetDir"), "/workspace/r");
    cr_expect_str_eq(jstr(t.res, "branch"), "main");
    tc_free(&t);
    char *out = tsh_out(c, id, "cat /workspace/r/README; git -C /workspace/r rev-parse "
                               "--abbrev-ref HEAD; git -C /workspace/r rev-list --count HEAD");
    cr_expect_str_eq(out, "hello\nmain\n2\n", "the clone: %s", out);
    free(out);
    /* A branch. */
    t = checkout(c, id, json_pack("{s:s, s:s, s:s}", "repoUrl", "file:///tmp/r.git", "branch",
                                  "dev", "targetDir", "/workspace/rdev"));
    tc_ok(t, "git.checkout dev");
    cr_expect_str_eq(jstr(t.res, "branch"), "dev");
    cr_expect_str_eq(jstr(t.res, "targetDir"), "/workspace/rdev");
    tc_free(&t);
    out = tsh_out(c, id, "cat /workspace/rdev/devfile; git -C /workspace/rdev rev-parse "
                         "--abbrev-ref HEAD");
    cr_expect_str_eq(out, "dev\ndev\n", "the dev clone: %s", out);
    free(out);
    /* Shallow. */
    t = checkout(c, id, json_pack("{s:s, s:s, s:i}", "repoUrl", "file:///tmp/r.git", "targetDir",
                                  "/workspace/shallow", "depth", 1));
    tc_ok(t, "git.checkout depth 1");
    tc_free(&t);
    out = tsh_out(c, id, "git -C /workspace/shallow rev-list --count HEAD; "
                         "cat /workspace/shallow/second");
    cr_expect_str_eq(out, "1\ntwo\n", "the shallow clone: %s", out);
    free(out);
    /* A relative targetDir resolves against the session's cwd. */
    t = checkout(c, id, json_pack("{s:s, s:s}", "repoUrl", "file:///tmp/r.git", "targetDir",
                                  "relclone"));
    tc_ok(t, "git.checkout relative targetDir");
    cr_expect_str_eq(jstr(t.res, "targetDir"), "/workspace/relclone");
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

Test(git, checkout_errors_are_classified, .timeout = 120)
{
    sbx_client *c = test_client();
    char *id = test_id("git-err");
    sbx_exec_result r = tsh(c, id, make_repo, 60000);
    cr_assert_eq(r.exit_code, 0, "making the repository: %s", r.stderr_data);
    sbx_exec_result_free(&r);
    tcall t = checkout(c, id, json_pack("{s:s}", "repoUrl", "file:///tmp/no-such-repo.git"));
    tc_fails_with(t, "git.checkout of a missing repository", "GIT_REPOSITORY_NOT_FOUND");
    cr_expect_str_eq(jstr(t.ctx, "repoUrl"), "file:///tmp/no-such-repo.git");
    tc_free(&t);
    t = checkout(c, id, json_pack("{s:s, s:s, s:s}", "repoUrl", "file:///tmp/r.git", "branch",
                                  "no-such-branch", "targetDir", "/workspace/nb"));
    tc_fails_with(t, "git.checkout of a missing branch", "GIT_BRANCH_NOT_FOUND");
    tc_free(&t);
    const char *bad[] = {"not a url", "ftp://example.com/r.git", "--upload-pack=touch /tmp/x",
                         "-c core.sshCommand=x", ""};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        t = checkout(c, id, json_pack("{s:s}", "repoUrl", bad[i]));
        cr_expect_neq(t.rc, 0, "git.checkout of '%s' succeeded", bad[i]);
        cr_expect(!strcmp(t.err.code, "INVALID_GIT_URL") ||
                      (!bad[i][0] && !strcmp(t.err.code, "VALIDATION_FAILED")),
                  "git.checkout of '%s': %s (%s), expected INVALID_GIT_URL", bad[i], t.err.code,
                  t.err.message);
        tc_free(&t);
    }
    char *out = tsh_out(c, id, "test -e /tmp/x && echo injected || echo clean");
    cr_expect_str_eq(out, "clean\n");
    free(out);
    /* An existing non-empty target directory. */
    t = checkout(c, id, json_pack("{s:s, s:s}", "repoUrl", "file:///tmp/r.git", "targetDir",
                                  "/tmp/src"));
    cr_expect_neq(t.rc, 0, "cloning into a non-empty directory succeeded");
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

/* ------------------------------------------------------------------------------ */
/* env and lifecycle */

static void
set_env(sbx_client *c, const char *id, const char *const *vars)
{
    sbx_error err;
    int rc = sbx_set_env(c, id, vars, &err);
    char msg[600];
    snprintf(msg, sizeof(msg), "%s %s", err.code, err.message);
    if (rc)
        sbx_error_free(&err);
    cr_assert_eq(rc, 0, "env.set: %s", msg);
}

Test(env, set_and_unset_reach_default_session_new_sessions_and_processes, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("env-set");
    /* The default session's shell exists before the env.set. */
    sbx_exec_result r = tsh(c, id, "echo \"${ALPHA:-none}\"", 0);
    cr_expect_str_eq(r.stdout_data, "none\n");
    sbx_exec_result_free(&r);
    const char *vars[] = {"ALPHA=1", "BETA=two words", "GAMMA=$HOME 'quoted' \"x\"", NULL};
    set_env(c, id, vars);
    r = tsh(c, id, "echo \"$ALPHA|$BETA|$GAMMA\"", 0);
    cr_expect_str_eq(r.stdout_data, "1|two words|$HOME 'quoted' \"x\"\n",
                     "default session after env.set: %s", r.stdout_data);
    sbx_exec_result_free(&r);
    r = tsh_in(c, id, "later", "echo \"$ALPHA|$BETA\"", 0);
    cr_expect_str_eq(r.stdout_data, "1|two words\n", "new session: %s", r.stdout_data);
    sbx_exec_result_free(&r);
    sbx_exec_opts so = {.command = "echo \"$ALPHA|$BETA\"", .sessionless = true};
    r = tsh_opts(c, id, &so);
    cr_expect_str_eq(r.stdout_data, "1|two words\n", "sessionless: %s", r.stdout_data);
    sbx_exec_result_free(&r);
    char pid[128];
    sbx_exec_opts po = {.command = "echo \"$ALPHA|$BETA\""};
    cr_assert_eq(sbx_process_start(c, id, &po, NULL, pid, NULL), 0);
    tcall t = tc_call(c, "process.waitForExit", id,
                      json_pack("{s:s, s:i}", "processId", pid, "timeout", 10000), 0);
    tc_free(&t);
    t = tc_call(c, "process.logs", id, json_pack("{s:s}", "processId", pid), 0);
    tc_ok(t, "process.logs");
    cr_expect_str_eq(jstr(t.res, "stdout"), "1|two words\n", "process: %s", jstr(t.res, "stdout"));
    tc_free(&t);
    /* Unset (nil) one, change another. */
    const char *vars2[] = {"ALPHA", "BETA=changed", NULL};
    set_env(c, id, vars2);
    r = tsh(c, id, "echo \"${ALPHA-unset}|$BETA\"", 0);
    cr_expect_str_eq(r.stdout_data, "unset|changed\n", "default session after unset: %s",
                     r.stdout_data);
    sbx_exec_result_free(&r);
    r = tsh_in(c, id, "later2", "echo \"${ALPHA-unset}|$BETA\"", 0);
    cr_expect_str_eq(r.stdout_data, "unset|changed\n", "new session after unset: %s",
                     r.stdout_data);
    sbx_exec_result_free(&r);
    /* Invalid names. */
    t = tc_call(c, "env.set", id, json_pack("{s:{s:s}}", "vars", "A=B", "x"), 0);
    tc_fails_with(t, "env.set of a name with '='", "VALIDATION_FAILED");
    tc_free(&t);
    t = tc_call(c, "env.set", id, json_pack("{s:{s:s}}", "vars", "", "x"), 0);
    tc_fails_with(t, "env.set of an empty name", "VALIDATION_FAILED");
    tc_free(&t);
    tdone(c, id);
    sbx_client_close(c);
}

static json_t *
configure(sbx_client *c, const char *id, json_t *args)
{
    tcall t = tc_call(c, "sandbox.configure", id, args, 0);
    tc_ok(t, "sandbox.configure");
    json_t *res = json_incref(t.res);
    tc_free(&t);
    return res;
}

Test(env, variables_survive_a_container_restart_by_sleep_after, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("env-sleep");
    const char *vars[] = {"PERSIST=across-restarts", NULL};
    set_env(c, id, vars);
    json_t *res = configure(c, id, json_pack("{s:s}", "sleepAfter", "2s"));
    cr_expect_eq(jint(res, "sleepAfter"), 2000);
    cr_expect_eq(jbool(res, "keepAlive"), 0);
    json_decref(res);
    sbx_exec_result r = tsh(c, id, "echo \"$PERSIST\"", 0);
    cr_expect_str_eq(r.stdout_data, "across-restarts\n", "before the restart: '%s'",
                     r.stdout_data);
    sbx_exec_result_free(&r);
    json_t *sb = ts_status(c, id);
    long long gen = jint(sb, "generation");
    cr_expect_str_eq(jstr(sb, "state"), "running");
    cr_expect_geq(gen, 1);
    json_decref(sb);
    /* No operation for a while (status counts as one). */
    tsleep_ms(4500);
    sb = ts_status(c, id);
    if (strcmp(jstr(sb, "state"), "stopped")) {
        json_decref(sb);
        tsleep_ms(3500);
        sb = ts_status(c, id);
    }
    cr_expect_str_eq(jstr(sb, "state"), "stopped", "the idle container is %s", jstr(sb, "state"));
    cr_expect(jget(sb, "container") == NULL, "a stopped sandbox reports a container");
    cr_expect_eq(jint(sb, "restarts"), 0, "an idle stop counted as a crash");
    json_decref(sb);
    r = tsh(c, id, "echo \"$PERSIST\"", 0);
    cr_expect_str_eq(r.stdout_data, "across-restarts\n", "after the restart: '%s'", r.stdout_data);
    sbx_exec_result_free(&r);
    sb = ts_status(c, id);
    cr_expect_gt(jint(sb, "generation"), gen, "generation %lld, was %lld", jint(sb, "generation"),
                 gen);
    cr_expect_str_eq(jstr(sb, "state"), "running");
    json_decref(sb);
    tdone(c, id);
    sbx_client_close(c);
}

Test(env, keep_alive_prevents_the_idle_stop, .timeout = 60)
{
    sbx_client *c = test_client();
    char *id = test_id("env-keep");
    cr_assert_eq(sbx_ping(c, id, NULL), 0);
    json_t *res = configure(c, id, json_pack("{s:s, s:b}", "sleepAfter", "2s", "keepAlive", 1));
    cr_expect_eq(jbool(res, "keepAlive"), 1);
    json_decref(res);
    json_t *sb = ts_status(c, id);
    long long gen = jint(sb, "generation");
    json_decref(sb);
    tsleep_ms(4500);
    sb = ts_status(c, id);
    cr_expect_str_eq(jstr(sb, "state"), "running", "keepAlive: the container is %s",
                     jstr(sb, "state"));
    cr_expect_eq(jint(sb, "generation"), gen);
    cr_expect_eq(jbool(sb, "keepAlive"), 1);
    json_decref(sb);
    /* Switching it off lets the container sleep. */
    res = configure(c, id, json_pack("{s:b}", "keepAlive", 0));
    cr_expect_eq(jbool(res, "keepAlive"), 0);
    cr_expect_eq(jint(res, "sleepAfter"), 2000, "sleepAfter was lost: %lld",
                 jint(res, "sleepAfter"));
    json_decref(res);
    tsleep_ms(4500);
    sb = ts_status(c, id);
    cr_expect_str_eq(jstr(sb, "state"), "stopped", "after keepAlive off: %s", jstr(sb, "state"));
    json_decref(sb);
    tdone(c, id);
    sbx_client_close(c);
}

Test(env, configure_validates_its_arguments)
{
    sbx_client *c = test_client();
    char *id = test_id("env-conf");
    struct {
        json_t *args;
        const char *what;
    } bad[] = {
        {json_pack("{s:s}", "sleepAfter", "abc"), "sleepAfter \"abc\""},
        {json_pack("{s:i}", "sleepAfter", 0), "sleepAfter 0"},
        {json_pack("{s:s}", "sleepAfter", "-5s"), "sleepAfter \"-5s\""},
        {json_pack("{s:I}", "sleepAfter", (json_int_t)366 * 86400), "sleepAfter 366 days"},
        {json_pack("{s:s}", "keepAlive", "yes"), "keepAlive \"yes\""},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        tcall t = tc_call(c, "sandbox.configure", id, bad[i].args, 0);
        tc_fails_with(t, bad[i].what, "VALIDATION_FAILED");
        tc_free(&t);
    }
    struct {
        json_t *args;
        long long ms;
    } good[] = {
        {json_pack("{s:s}", "sleepAfter", "10m"), 600000},
        {json_pack("{s:s}", "sleepAfter", "1h"), 3600000},
        {json_pack("{s:i}", "sleepAfter", 90), 90000},
        {json_pack("{s:s}", "sleepAfter", "30s"), 30000},
    };
    for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
        tcall t = tc_call(c, "sandbox.configure", id, good[i].args, 0);
        tc_ok(t, "sandbox.configure");
        cr_expect_eq(jint(t.res, "sleepAfter"), good[i].ms, "case %zu: sleepAfter %lld", i,
                     jint(t.res, "sleepAfter"));
        cr_expect_eq(jbool(t.res, "success"), 1);
        tc_free(&t);
    }
    tdone(c, id);
    sbx_client_close(c);
}
