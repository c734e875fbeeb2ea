/*
 * sbxd_dev.c — `sbxd dev`, the embedded single-node default: the gateway
 * (nng and HTTP fronts) in this process, N shard processes as its children,
 * each restarted with back-off when it dies, one image store, backup store
 * and workspace pool for the node.  Its options are the shard's and the
 * gateway's (tools/sbxd_cmd.h) plus --data, --listen, --name, --shards;
 * the exit status is that of tools/sbxd.c's header.
 */
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>

#include "../actors/shard.h"
#include "../container/backup.h"
#include "../container/cgroup.h"
#include "../container/ws_pool.h"
#include "../gateway/gateway.h"
#include "../runtime/config.h"
#include "../runtime/log.h"
#include "../runtime/nngx.h"
#include "../runtime/util.h"
#include "hostlock.h"
#include "sbxd_cmd.h"

struct child {
    pid_t pid;              /* 0 while not running */
    char **argv;
    int64_t started_ms;
    int64_t restart_at_ms;  /* when pid is 0: the monotonic time of the next start, 0 none */
    int restarts;           /* consecutive restarts that were up < 10 s */
    bool ever_restarted;
};

/* How long, in ms, a stopping deployment waits for its shards by default
 * (--stop-timeout). */
#define DEV_STOP_WAIT_MS 60000

/* How long, in ms, a stopping deployment waits for the shards it SIGKILLed
 * to die, and for their sweeps (each bounds its own work at 65 s:
 * container/cgroup.c) to end: one deadline for all shards, one for all
 * sweeps.  A process in uninterruptible sleep (a hung disk, a frozen v1
 * freezer cgroup) ignores SIGKILL until it wakes: the stop gives up on it
 * rather than hang (see reap_within). */
#define DEV_KILL_REAP_MS 10000
#define DEV_SWEEP_REAP_MS 70000

/* reap_within — wait at most ms for the child pid to end.  true with its
 * wait status in *st (0 if it was reaped elsewhere: ECHILD), false if it is
 * still running then (not reaped; the caller decides). */
static bool
reap_within(pid_t pid, int64_t ms, int *st)
{
    int64_t until = sbx_mono_ms() + ms;
    *st = 0;
    for (;;) {
        pid_t r = waitpid(pid, st, WNOHANG);
        if (r == pid || (r < 0 && errno == ECHILD))
            return true;
        if (sbx_mono_ms() > until)
            return false;
        struct timespec ts = {0, 10000000L};
        nanosleep(&ts, NULL);
    }
}

/* dev_restart_delay_ms — the back-off before the n-th consecutive restart
 * (n ≥ 1) of a shard: 100 ms, doubling, at most 5000 ms. */
static int
dev_restart_delay_ms(int n)
{
    int d = 100;
    for (int k = 1; k < n && d < 5000; k++)
        d *= 2;
    return d < 5000 ? d : 5000;
}

static pid_t
spawn_child(char **argv)
{
    pid_t pid = fork();
    if (pid == 0) {
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        prctl(PR_SET_PDEATHSIG, SIGTERM);
        execv("/proc/self/exe", argv);
        perror("sbxd dev: exec");
        _exit(127);
    }
    return pid;
}

static void
argv_add(char ***v, size_t *n, const char *s)
{
    *v = sbx_xrealloc(*v, (*n + 2) * sizeof(char *));
    (*v)[(*n)++] = sbx_xstrdup(s);
    (*v)[*n] = NULL;
}

/* Start `argv --sweep` (sbxd shard --sweep: kill and remove what an
 * earlier incarnation of that shard left; tools/sbxd.c): its pid, or -1.
 * argv is the shard's, borrowed. */
static pid_t
spawn_sweep(char **argv)
{
    size_t n = 0;
    char **av = NULL;
    for (char **a = argv; *a; a++)
        argv_add(&av, &n, *a);
    argv_add(&av, &n, "--sweep");
    pid_t pid = spawn_child(av);
    sbx_strv_free(av);
    return pid;
}

int
sbxd_cmd_dev(int argc, char **argv)
{
    struct sbx_shard_conf c;
    char *data = sbx_xstrdup("/var/lib/sbx/dev");
    char *listen = sbx_xstrdup(DEFAULT_LISTEN);
    char *name = sbx_xstrdup("dev");
    int64_t nshards = 2;
    int64_t stop_ms = DEV_STOP_WAIT_MS;
    struct sbx_gateway_conf gc = {.contexts = 1024, .timeout = 600000};
    struct tls_opts tls = {0};
    sbx_nng_sec sec = {0};
    gc.http = sbx_xstrdup(DEFAULT_HTTP);
    bool help = false;
    char **rest = NULL, why[256];
    char *relay_secret_file = NULL;
    char *log_format = NULL;
    sbx_shard_conf_defaults(&c);
    sbx_strv_free(c.etc);
    sbx_strv_free(c.env);
    c.etc = c.env = NULL;
    free(c.agent);
    c.agent = NULL;
    /* Only options given explicitly are passed on to the shards. */
    struct sbx_opt opts[] = {
        {"data", SBX_OPT_STR, &data, "data directory (one sub-directory per shard)"},
        {"listen", SBX_OPT_STR, &listen, "nng URL of the gateway"},
        {"name", SBX_OPT_STR, &name,
         "deployment name: prefix of shard names, cgroups and host uids; one live "
         "deployment per name on a host"},
        {"shards", SBX_OPT_INT, &nshards, "number of shard processes"},
        {"stop-timeout", SBX_OPT_MS, &stop_ms,
         "how long a stop waits for each shard to stop its sandboxes and commit before it kills "
         "the shard and removes what it left (60s; ~2.5 ms per running sandbox on 2 cores)"},
        GATEWAY_HTTP_OPTS(&gc),
        SHARD_OPTS(&c),
        TLS_OPTS(&tls),
        {"help", SBX_OPT_BOOL, &help, "show this help"},
        {NULL, 0, NULL, NULL},
    };
    int rc = 0;
    struct child *kids = NULL;
    sbx_wspool *node_pool = NULL; /* the shards' shared workspace pool (ws_pool.h), if made */
    sbx_gateway *gw = NULL;
    struct hostlock dlock = {.n = 0};
    char **shard_specs = NULL;
    size_t nspecs = 0;

    if (sbx_config_parse(opts, argc, argv, 2, &rest, why, sizeof(why)) != 0) {
        fprintf(stderr, "sbxd dev: %s\n", why);
        rc = 2;
        goto out;
    }
    if (sbxd_load_secret(relay_secret_file, &c.relay_secret, "sbxd dev")) {
        rc = 2;
        goto out;
    }
    if (help) {
        sbx_config_usage(opts, "sbxd dev",
                         "Run the embedded single-node default: a gateway and N shards.");
        goto out;
    }
    if (nshards < 1 || nshards > 64) {
        fprintf(stderr, "sbxd dev: --shards must be 1..64\n");
        rc = 2;
        goto out;
    }
    sbx_log_init("sbxd dev", -1);
    sbxd_raise_nofile();
    if ((rc = sbxd_set_log_format(log_format, "sbxd dev")) != 0)
        goto out;
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGCHLD);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* The gateway's listen is checked here; the shards (on ipc://) get the
     * TLS options with the other shard options. */
    if ((rc = sbxd_tls_open(&tls, &sec, listen)) != 0)
        goto out;
    gc.sec = &sec;
    if (geteuid() != 0) {
        sbx_log_error("sbxd must run as root (it creates namespaces, cgroups and mounts)");
        rc = 1;
        goto out;
    }
    /* One live deployment per name on the host, before anything is touched
     * (host locks, above); each shard then locks its own cgroup subtree. */
    char lwhy[1024];
    int lrc = hostlock_take(&dlock, "deploy", name, false, "the name of a live deployment on "
                            "this host", lwhy, sizeof(lwhy));
    if (lrc == -EBUSY) {
        sbx_log_error("%s. A second deployment of one name would share its cgroups (and kill its "
                  "sandboxes) and its host uids: stop that one, or give this one another --name",
                  lwhy);
        rc = 2;
        goto out;
    }
    if (lrc) {
        sbx_log_error("cannot lock deployment '%s': %s", name, lwhy);
        rc = 1;
        goto out;
    }
    if (sbx_mkdir_p(data, 0700) != 0) {
        sbx_log_error("cannot create the data directory %s", data);
        rc = 1;
        goto out;
    }
    char absdata[PATH_MAX];
    if (!realpath(data, absdata)) {
        sbx_log_error("cannot resolve %s", data);
        rc = 1;
        goto out;
    }

    /* The gateway first: it dials the shards in the background, and its HTTP
     * port (maybe picked by the kernel) names the preview domain. */
    for (int i = 0; i < nshards; i++) {
        char buf[PATH_MAX + 64];
        snprintf(buf, sizeof(buf), "%s-s%d=ipc://%s/s%d.sock", name, i, absdata, i);
        argv_add(&shard_specs, &nspecs, buf);
    }
    gc.name = name;
    gc.listen = listen;
    gc.shards = shard_specs;
    gc.await_shards = true; /* started below, after the gateway answers */
    gc.preview_domain = c.preview_domain;
    gc.preview_scheme = c.preview_scheme;
    gc.relay_secret = c.relay_secret;
    bool domain_given = false;
    for (int k = 2; k < argc; k++)
        if (!strncmp(argv[k], "--preview-domain", 16))
            domain_given = true;
    if (!domain_given)
        gc.preview_domain = NULL; /* set below from the bound port */
    if (sbx_gateway_start(&gw, &gc) != 0) {
        rc = 1;
        goto stop;
    }
    char preview_domain[300];
    int http_port = sbx_gateway_http_port(gw);
    if (domain_given)
        snprintf(preview_domain, sizeof(preview_domain), "%s", c.preview_domain);
    else
        snprintf(preview_domain, sizeof(preview_domain), "localhost:%d", http_port ? http_port : 7780);
    if (http_port) {
        /* Where clients (and the tests) find the HTTP front. */
        char path[PATH_MAX + 16], addr[300];
        snprintf(path, sizeof(path), "%s/http.addr", absdata);
        const char *colon = strrchr(gc.http, ':');
        snprintf(addr, sizeof(addr), "%.*s:%d\n", colon ? (int)(colon - gc.http) : 0, gc.http,
                 http_port);
        FILE *f = fopen(path, "we");
        if (f) {
            fputs(addr, f);
            fclose(f);
        }
        sbx_log_info("HTTP API on http://%.*s:%d, preview URLs http://{port}-{id}-{token}.%s/",
                 colon ? (int)(colon - gc.http) : 0, gc.http, http_port, preview_domain);
    }
    /* Host uids: an explicit --uid-base, split among the shards; else each
     * shard locks a free range of its own (uid_range_lock), so deployments
     * side by side on one host never hand out the same host uids. */
    int64_t uid_base = c.uid_base;
    bool uid_given = false;
    for (int k = 2; k < argc; k++)
        if (!strncmp(argv[k], "--uid-base", 10))
            uid_given = true;
    /* One workspace pool for the node (container/ws_pool.h), made and held
     * here, each shard a directory of it (sbx_wspool_attach): a fork into
     * another shard's sandbox is then a reflink and a rename, not a copy
     * (docs/persistence.md, "The workspace pool").  A shard that has a pool
     * of its own (a deployment made before) moves its workspaces into it
     * (sbx_wspool_absorb).  The shards' own rules apply when the node pool
     * is not made (reflinks on the host file system, --ws-pool off, no XFS
     * here). */
    char node_arg[PATH_MAX + 32] = "";
    if (!(c.ws_pool && !strcmp(c.ws_pool, "off"))) {
        char pwhy[512];
        int prc = sbx_wspool_open(absdata, c.ws_pool, c.ws_pool_size, &node_pool, pwhy,
                                  sizeof(pwhy));
        if (prc) {
            sbx_log_warn("the node's workspace pool: %s; each shard decides for itself", pwhy);
        } else if (node_pool) {
            sbx_wspool_describe(node_pool, pwhy, sizeof(pwhy));
            sbx_log_info("the node's %s", pwhy);
            snprintf(node_arg, sizeof(node_arg), "--ws-pool-node=%s/workspaces", absdata);
        }
    }
    kids = sbx_xcalloc((size_t)nshards, sizeof(*kids));
    for (int i = 0; i < nshards; i++) {
        char buf[PATH_MAX + 64];
        size_t n = 0;
        char **av = NULL;
        argv_add(&av, &n, "sbxd");
        argv_add(&av, &n, "shard");
        snprintf(buf, sizeof(buf), "--name=%s-s%d", name, i);
        argv_add(&av, &n, buf);
        snprintf(buf, sizeof(buf), "--listen=ipc://%s/s%d.sock", absdata, i);
        argv_add(&av, &n, buf);
        snprintf(buf, sizeof(buf), "--data=%s/s%d", absdata, i);
        argv_add(&av, &n, buf);
        /* One image store for the node, shared by its shards (docs/images.md);
         * an --images given below replaces it. */
        snprintf(buf, sizeof(buf), "--images=%s/images", absdata);
        argv_add(&av, &n, buf);
        snprintf(buf, sizeof(buf), "--backups=%s/backups", absdata);
        argv_add(&av, &n, buf);
        /* Distinct host uid ranges per shard: from --uid-base when given,
         * else each shard takes a free range itself (uid_range_lock). */
        snprintf(buf, sizeof(buf), "--uid-base=%lld", (long long)(uid_base + i * c.uid_count));
        if (uid_given)
            argv_add(&av, &n, buf);
        snprintf(buf, sizeof(buf), "--relay=unix:%s/s%d.relay", absdata, i);
        argv_add(&av, &n, buf);
        snprintf(buf, sizeof(buf), "--preview-domain=%s", preview_domain);
        argv_add(&av, &n, buf);
        if (node_arg[0])
            argv_add(&av, &n, node_arg);
        /* The shards draw on one disk: each one's disk guard shares out its
         * part of the room (container/ws_guard.h). */
        snprintf(buf, sizeof(buf), "--node-shards=%lld", (long long)nshards);
        argv_add(&av, &n, buf);
        /* Pass on every shard option the user gave. */
        for (int k = 2; k < argc; k++) {
            const char *a = argv[k];
            if (strncmp(a, "--", 2) != 0)
                continue;
            static const char *const mine[] = {"--data",     "--listen",   "--name",
                                               "--shards",   "--help",     "--config",
                                               "--uid-base", "--http",     "--api-keys",
                                               "--preview-domain", "--console", "--node-shards",
                                               "--stop-timeout"};
            bool skip = false;
            for (size_t j = 0; j < SBX_ARRAY_LEN(mine); j++)
                if (!strncmp(a, mine[j], strlen(mine[j])))
                    skip = true;
            if (skip) {
                if (!strchr(a, '=') && k + 1 < argc && strncmp(argv[k + 1], "--", 2) != 0)
                    k++;
                continue;
            }
            argv_add(&av, &n, a);
            if (!strchr(a, '=') && k + 1 < argc && strncmp(argv[k + 1], "--", 2) != 0)
                argv_add(&av, &n, argv[++k]);
        }
        kids[i].argv = av;
        kids[i].pid = spawn_child(av);
        kids[i].started_ms = sbx_mono_ms();
    }
    sbx_log_info("ready: gateway on %s, %lld shard(s), data in %s", listen, (long long)nshards,
             absdata);
    for (;;) {
        /* Restarts are scheduled, not slept through: the supervisor keeps
         * answering SIGTERM and reaping other shards meanwhile. */
        int64_t now = sbx_mono_ms(), next = INT64_MAX;
        for (int i = 0; i < nshards; i++) {
            if (kids[i].pid == 0 && kids[i].restart_at_ms > 0 && kids[i].restart_at_ms <= now) {
                kids[i].pid = spawn_child(kids[i].argv);
                kids[i].started_ms = sbx_mono_ms();
                kids[i].restart_at_ms = 0;
            }
            if (kids[i].pid == 0 && kids[i].restart_at_ms > 0 && kids[i].restart_at_ms < next)
                next = kids[i].restart_at_ms;
        }
        int64_t wait_ms = next == INT64_MAX ? -1 : next - sbx_mono_ms();
        int sig = sbxd_wait_signal_until(&set, wait_ms < 0 && next != INT64_MAX ? 0 : wait_ms);
        if (sig == 0)
            continue; /* a restart is due */
        if (sig == SIGCHLD) {
            int st;
            pid_t pid;
            while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
                for (int i = 0; i < nshards; i++) {
                    if (kids[i].pid != pid)
                        continue;
                    kids[i].pid = 0;
                    int64_t up = sbx_mono_ms() - kids[i].started_ms;
                    /* Status 2 from a shard's first start: it refused its
                     * options or its cgroup subtree (held by a live shard of
                     * another deployment); starting it again would only be
                     * refused again, so the deployment stops.  Status 2 on a
                     * restart is different: the previous incarnation's
                     * processes may still be on their way out (a SIGKILLed
                     * shard's children die with it, asynchronously) and hold
                     * its locks for a moment.  One slow shard never stops a
                     * healthy deployment: it is retried with back-off. */
                    if (WIFEXITED(st) && WEXITSTATUS(st) == 2 && !kids[i].ever_restarted) {
                        sbx_log_error("shard %d refused to start (status 2, its reason is above); "
                                  "stopping", i);
                        rc = 2;
                        continue;
                    }
                    /* Supervise: restart a shard that died, with back-off
                     * (100 ms doubling to 5 s; reset after 10 s up). */
                    kids[i].restarts = up > 10000 ? 0 : kids[i].restarts + 1;
                    int delay = dev_restart_delay_ms(kids[i].restarts);
                    sbx_log_warn("shard %d (pid %d) exited (%s %d); restarting in %d ms", i, (int)pid,
                             WIFEXITED(st) ? "status" : "signal",
                             WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), delay);
                    kids[i].restart_at_ms = sbx_mono_ms() + delay;
                    kids[i].ever_restarted = true;
                }
            }
            if (rc == 2)
                break;
            continue;
        }
        sbx_log_info("stopping (signal %d)", sig);
        break;
    }
stop:
    sbx_gateway_stop(gw);
    for (int i = 0; kids && i < nshards; i++) {
        if (kids[i].pid > 0) {
            kill(kids[i].pid, SIGTERM);
        } else if (kids[i].restart_at_ms > 0) {
            /* Down, waiting for its restart: nobody would remove what its
             * last incarnation left (cgroups, its lock file), so a sweep
             * with its own options does, under its locks. */
            kids[i].pid = spawn_sweep(kids[i].argv);
        }
    }
    /* Give shards time (--stop-timeout, 60 s) to stop their containers and
     * commit: a shard's stop costs the kernel ~2.5 ms per sandbox on
     * 2 cores (10,000 took 25 s: docs/benchmarks.md, "Density").  Those
     * still running then are all killed, and a sweep with each one's
     * options removes what it left — its containers' processes and cgroups
     * — before the deployment exits; the sweeps run side by side and wait
     * at most 65 s (container/cgroup.c), so a stop takes at most
     * --stop-timeout + DEV_KILL_REAP_MS + DEV_SWEEP_REAP_MS (+ 10 s for a
     * sweep killed then), within the units'
     * TimeoutStopSec (dist/systemd/hardening.conf). */
    int64_t until = sbx_mono_ms() + stop_ms;
    bool *killed = kids ? sbx_xcalloc((size_t)nshards, sizeof(bool)) : NULL;
    for (int i = 0; kids && i < nshards; i++) {
        while (kids[i].pid > 0) {
            int st;
            pid_t r = waitpid(kids[i].pid, &st, WNOHANG);
            if (r == kids[i].pid || (r < 0 && errno == ECHILD))
                break;
            if (sbx_mono_ms() > until) {
                sbx_log_error("shard %d (pid %d) did not stop within %lld ms: killed; sweeping "
                              "what it left", i, (int)kids[i].pid, (long long)stop_ms);
                kill(kids[i].pid, SIGKILL);
                killed[i] = true;
                break;
            }
            struct timespec ts = {0, 10000000L};
            nanosleep(&ts, NULL);
        }
    }
    /* The sweep needs the killed shard's locks, so it waits for the shard
     * to die.  One that does not within DEV_KILL_REAP_MS is left (logged,
     * not swept: its locks are still held) and the stop goes on: its cgroups
     * and locks stay until it dies, and a start of the deployment refuses
     * that shard meanwhile (status 2). */
    int64_t reap_until = sbx_mono_ms() + DEV_KILL_REAP_MS;
    for (int i = 0; kids && i < nshards; i++) {
        int st;
        if (!killed[i])
            continue;
        if (!reap_within(kids[i].pid, SBX_MAX(reap_until - sbx_mono_ms(), (int64_t)0), &st)) {
            sbx_log_error("shard %d (pid %d) did not die within %d ms of SIGKILL (uninterruptible "
                          "sleep?): not swept; its cgroups and locks stay until it dies",
                          i, (int)kids[i].pid, DEV_KILL_REAP_MS);
            kids[i].pid = 0;
            killed[i] = false;
            rc = 1;
            continue;
        }
        kids[i].pid = spawn_sweep(kids[i].argv);
    }
    /* A sweep refused (status 2: the killed shard's locks are held a moment
     * longer by its children on their way out) is tried again, for 5 s.  A
     * sweep that does not end within DEV_SWEEP_REAP_MS is killed. */
    int64_t sweep_until = sbx_mono_ms() + DEV_SWEEP_REAP_MS;
    for (int i = 0, tries = 0; kids && i < nshards; i++) {
        int st = 0;
        if (!killed[i])
            continue;
        while (kids[i].pid > 0) {
            if (!reap_within(kids[i].pid, SBX_MAX(sweep_until - sbx_mono_ms(), (int64_t)0),
                             &st)) {
                sbx_log_error("the sweep of shard %d (pid %d) did not end within %d ms: killed",
                              i, (int)kids[i].pid, DEV_SWEEP_REAP_MS);
                kill(kids[i].pid, SIGKILL);
                reap_within(kids[i].pid, DEV_KILL_REAP_MS, &st);
                st = SIGKILL; /* reported as killed, whatever came back */
            }
            kids[i].pid = 0;
            if (WIFEXITED(st) && WEXITSTATUS(st) == 2 && tries++ < 25) {
                struct timespec ts = {0, 200000000L};
                nanosleep(&ts, NULL);
                kids[i].pid = spawn_sweep(kids[i].argv);
            }
        }
        if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            sbx_log_error("the sweep of shard %d failed (%s %d): its cgroups may be left", i,
                          WIFEXITED(st) ? "status" : "signal",
                          WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st));
            rc = 1;
        }
    }
    free(killed);
out:
    /* After the shards: their containers' images held the pool's mount too. */
    sbx_wspool_close(node_pool);
    /* Released only now: every shard has stopped (or was killed) by here. */
    hostlock_release(&dlock);
    for (int i = 0; kids && i < nshards; i++)
        sbx_strv_free(kids[i].argv);
    free(kids);
    sbx_strv_free(shard_specs);
    free(rest);
    free(data);
    free(listen);
    free(name);
    free(gc.http);
    free(gc.api_keys);
    free(relay_secret_file);
    free(log_format);
    sbx_shard_conf_free(&c);
    sbxd_tls_opts_free(&tls);
    sbx_nng_sec_close(&sec);
    return rc;
}
