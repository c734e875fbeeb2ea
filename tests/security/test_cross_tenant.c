/*
 * test_cross_tenant.c — one tenant against another (issue 7, part 3).
 *
 * Tenant A attacks two peers: one on the same shard (same spawner, same uid
 * pool) and one on the other shard.  A must not see the peers' processes,
 * signal them, read their files, reach their listeners (TCP on lo,
 * abstract unix sockets, unix sockets under /tmp) or their IPC objects —
 * and every check carries a control run inside the peer itself, so a
 * failure to reach is the isolation and not a broken victim.  On the host
 * the three run as three different unprivileged uids.
 */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "../support/sdk.h"

static const char PRELUDE[] =
    "import ctypes, errno, json, os, socket, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "def en(e):\n"
    "    return errno.errorcode.get(e, str(e))\n"
    "def oserr(f, *a):\n"
    "    try:\n"
    "        f(*a)\n"
    "        return 'OK'\n"
    "    except OSError as e:\n"
    "        return en(e.errno) if e.errno else type(e).__name__\n"
    "def neg(v):\n"
    "    return 'OK' if v != -1 else en(ctypes.get_errno())\n"
    "def conn(fam, addr):\n"
    "    s = socket.socket(fam, socket.SOCK_STREAM)\n"
    "    s.settimeout(5)\n"
    "    try:\n"
    "        s.connect(addr)\n"
    "        return 'CONNECTED'\n"
    "    except socket.timeout:\n"
    "        return 'TIMEOUT'\n"
    "    except OSError as e:\n"
    "        return en(e.errno)\n"
    "    finally:\n"
    "        s.close()\n";

/* py — PRELUDE + body as a fresh python3 in `id`; one JSON object out. */
static json_t *
py(sbx_client *c, const char *id, const char *body)
{
    char *code = NULL;
    cr_assert(asprintf(&code, "%s%s", PRELUDE, body) > 0);
    const char *argv[] = {"python3", "-c", code, NULL};
    sbx_exec_opts o = {.argv = argv, .sessionless = true, .timeout_ms = 60000};
    sbx_exec_result r = tsh_opts(c, id, &o);
    free(code);
    cr_assert_eq(r.exit_code, 0, "probe in %s exited %d\nstdout: %s\nstderr: %s", id,
                 r.exit_code, r.stdout_data, r.stderr_data);
    json_error_t je;
    json_t *j = json_loads(r.stdout_data, 0, &je);
    cr_assert(j != NULL, "probe output is not JSON (%s): %s", je.text, r.stdout_data);
    sbx_exec_result_free(&r);
    return j;
}

static void
want(json_t *o, const char *key, const char *expect, const char *what)
{
    const char *got = jstr(o, key);
    cr_expect_str_eq(got, expect, "%s: %s gave '%s', expected %s", what, key, got, expect);
}

/* ---------------------------------------------------------------------------------- */
/* A and its two peers. */

struct tenants {
    sbx_client *c;
    char *a;
    char *peer[2];          /* [0] on A's shard, [1] on the other one */
    const char *where[2];
    char shard_a[64];
    unsigned tag;           /* random, for unique names */
};

static void
shard_of(sbx_client *c, const char *id, char out[64])
{
    sbx_error err;
    cr_assert_eq(sbx_ping(c, id, &err), 0, "ping %s: %s %s", id, err.code, err.message);
    json_t *sb = ts_status(c, id);
    snprintf(out, 64, "%s", jstr(sb, "shard"));
    json_decref(sb);
    cr_assert(out[0], "%s has no shard", id);
}

static void
tenants_new(struct tenants *t, const char *prefix)
{
    memset(t, 0, sizeof(*t));
    t->c = test_client();
    t->tag = (unsigned)getpid() * 2654435761u ^ (unsigned)time(NULL);
    char name[32];
    snprintf(name, sizeof(name), "%s-a", prefix);
    t->a = test_id(name);
    shard_of(t->c, t->a, t->shard_a);
    t->where[0] = "same shard";
    t->where[1] = "other shard";
    /* Sandboxes are placed by a hash of their ID: draw until both kinds. */
    snprintf(name, sizeof(name), "%s-b", prefix);
    for (int i = 0; i < 16 && (!t->peer[0] || !t->peer[1]); i++) {
        char *b = test_id(name), sh[64];
        shard_of(t->c, b, sh);
        int k = strcmp(sh, t->shard_a) ? 1 : 0;
        if (!t->peer[k])
            t->peer[k] = b;
        else
            tdone(t->c, b);
    }
    cr_assert(t->peer[0] && t->peer[1], "no peer found on %s",
              t->peer[0] ? "the other shard" : "A's shard");
}

static void
tenants_done(struct tenants *t)
{
    tdone(t->c, t->a);
    tdone(t->c, t->peer[0]);
    tdone(t->c, t->peer[1]);
    sbx_client_close(t->c);
}

static long long
agent_pid(sbx_client *c, const char *id)
{
    json_t *sb = ts_status(c, id);
    long long p = jint(sb, "container.pid");
    json_decref(sb);
    return p;
}

/* host_pid_of — on the host, the pid whose command line is exactly `cmd`
 * (arguments separated by spaces), or -1. */
static pid_t
host_pid_of(const char *cmd)
{
    DIR *d = opendir("/proc");
    struct dirent *de;
    pid_t found = -1;
    while (d && (de = readdir(d)) != NULL) {
        if (de->d_name[0] < '1' || de->d_name[0] > '9')
            continue;
        char p[64], buf[512];
        snprintf(p, sizeof(p), "/proc/%s/cmdline", de->d_name);
        FILE *f = fopen(p, "r");
        if (!f)
            continue;
        size_t n = fread(buf, 1, sizeof(buf) - 1, f);
        fclose(f);
        if (n == 0)
            continue;
        for (size_t i = 0; i + 1 < n; i++)
            if (buf[i] == '\0')
                buf[i] = ' ';
        buf[n] = '\0';
        if (n > 0 && buf[n - 1] == '\0')
            n--;
        if (!strcmp(buf, cmd)) {
            found = (pid_t)atoi(de->d_name);
            break;
        }
    }
    if (d)
        closedir(d);
    return found;
}

/* host_uid_of — the real uid of a host pid (from /proc/PID/status), or -1. */
static long long
host_uid_of(long long pid)
{
    char p[64], line[256];
    snprintf(p, sizeof(p), "/proc/%lld/status", pid);
    FILE *f = fopen(p, "r");
    long long uid = -1;
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, "Uid: %lld", &uid) == 1)
            break;
    if (f)
        fclose(f);
    return uid;
}

/* ---------------------------------------------------------------------------------- */

Test(cross_tenant, uids_differ_on_the_host)
{
    struct tenants t;
    tenants_new(&t, "uid");
    const char *ids[3] = {t.a, t.peer[0], t.peer[1]};
    long long uid[3];
    for (int i = 0; i < 3; i++) {
        json_t *sb = ts_status(t.c, ids[i]);
        uid[i] = jint(sb, "container.uid");
        long long pid = jint(sb, "container.pid");
        json_decref(sb);
        cr_expect(uid[i] > 0, "%s: host uid %lld", ids[i], uid[i]);
        /* The host agrees: the agent runs as that uid, and so does tenant code. */
        cr_expect_eq(host_uid_of(pid), uid[i], "%s: agent %lld runs as %lld on the host", ids[i],
                     pid, host_uid_of(pid));
        char marker[64], cmd[128];
        snprintf(marker, sizeof(marker), "sleep 77%u.%d", t.tag % 1000, i);
        snprintf(cmd, sizeof(cmd), "%s", marker);
        sbx_exec_opts o = {.command = cmd};
        char pid_s[128], pname[16];
        sbx_error err;
        snprintf(pname, sizeof(pname), "uid%d", i);
        cr_assert_eq(sbx_process_start(t.c, ids[i], &o, pname, pid_s, &err), 0, "%s", err.message);
        pid_t hp = -1;
        for (int k = 0; k < 100 && hp < 0; k++) {
            hp = host_pid_of(marker);
            if (hp < 0)
                tsleep_ms(20);
        }
        cr_expect(hp > 0, "%s: '%s' not found on the host", ids[i], marker);
        cr_expect_eq(host_uid_of(hp), uid[i], "%s: tenant process %d runs as %lld", ids[i],
                     (int)hp, host_uid_of(hp));
    }
    cr_expect(uid[0] != uid[1] && uid[0] != uid[2] && uid[1] != uid[2],
              "host uids %lld %lld %lld are not distinct", uid[0], uid[1], uid[2]);
    tenants_done(&t);
}

Test(cross_tenant, processes_are_invisible_and_unsignalable)
{
    struct tenants t;
    tenants_new(&t, "ps");
    for (int k = 0; k < 2; k++) {
        const char *b = t.peer[k];
        char marker[64], pname[16], pid_s[128];
        snprintf(marker, sizeof(marker), "sleep 88%u.%d", t.tag % 1000, k);
        snprintf(pname, sizeof(pname), "victim%d", k);
        sbx_exec_opts o = {.command = marker};
        sbx_error err;
        cr_assert_eq(sbx_process_start(t.c, b, &o, pname, pid_s, &err), 0, "%s", err.message);
        pid_t hp = -1;
        for (int i = 0; i < 100 && hp < 0; i++) {
            hp = host_pid_of(marker);
            if (hp < 0)
                tsleep_ms(20);
        }
        cr_assert(hp > 0, "'%s' not found on the host", marker);
        long long bagent = agent_pid(t.c, b);
        /* Control: B itself sees its process. */
        char cmd[160];
        snprintf(cmd, sizeof(cmd), "ps -eo args | grep -c '^%s$'", marker);
        char *s = tsh_out(t.c, b, cmd);
        cr_expect_str_eq(s, "1\n", "B does not see its own process: %s", s);
        free(s);
        /* A: not in ps, not in /proc; the host pids (of B's process and of
         * B's agent) name nothing A can signal or open. */
        s = tsh_out(t.c, t.a, cmd);
        cr_expect_str_eq(s, "0\n", "%s: A sees B's process", t.where[k]);
        free(s);
        char *body = NULL;
        cr_assert(asprintf(&body,
                           "MARK = '%s'\nHP = %d\nBAGENT = %lld\n"
                           "r = {}\n"
                           "seen = []\n"
                           "for p in os.listdir('/proc'):\n"
                           "    if p.isdigit():\n"
                           "        try:\n"
                           "            if open('/proc/%%s/cmdline' %% p).read().replace('\\0', ' ').strip() == MARK:\n"
                           "                seen.append(p)\n"
                           "        except OSError:\n"
                           "            pass\n"
                           "r['seen'] = seen\n"
                           "r['npids'] = len([p for p in os.listdir('/proc') if p.isdigit()])\n"
                           "for name, pid in (('proc', HP), ('agent', BAGENT)):\n"
                           "    r['kill0_' + name] = oserr(os.kill, pid, 0)\n"
                           "    r['kill9_' + name] = oserr(os.kill, pid, 9)\n"
                           "    r['pidfd_' + name] = oserr(os.pidfd_open, pid)\n"
                           "    r['root_' + name] = oserr(os.listdir, '/proc/%%d/root/' %% pid)\n"
                           "    r['pgrp_' + name] = oserr(os.killpg, pid, 9)\n"
                           "print(json.dumps(r))\n",
                           marker, (int)hp, bagent) > 0);
        json_t *j = py(t.c, t.a, body);
        free(body);
        cr_expect_eq(json_array_size(jget(j, "seen")), 0, "%s: A sees B's process in /proc",
                     t.where[k]);
        cr_expect(jint(j, "npids") < 10, "A sees %lld processes", jint(j, "npids"));
        static const char *const keys[] = {"kill0_proc",  "kill9_proc",  "pidfd_proc",
                                           "pgrp_proc",   "kill0_agent", "kill9_agent",
                                           "pidfd_agent", "pgrp_agent"};
        for (size_t i = 0; i < SBX_ARRAY_LEN(keys); i++)
            want(j, keys[i], "ESRCH", t.where[k]);
        want(j, "root_proc", "ENOENT", t.where[k]);
        want(j, "root_agent", "ENOENT", t.where[k]);
        json_decref(j);
        /* A kills everything it can: B's process lives on. */
        sbx_exec_opts ko = {.command = "kill -9 -1; echo done", .sessionless = true};
        sbx_exec_result r = tsh_opts(t.c, t.a, &ko);
        sbx_exec_result_free(&r);
        cr_expect_eq(kill(hp, 0), 0, "%s: B's process %d died", t.where[k], (int)hp);
        tcall g = tc_call(t.c, "process.get", b, json_pack("{s:s}", "processId", pname), 0);
        tc_ok(g, "process.get");
        cr_expect_str_eq(jstr(g.res, "process.status"), "running", "%s", t.where[k]);
        tc_free(&g);
    }
    tenants_done(&t);
}

Test(cross_tenant, files_are_private)
{
    struct tenants t;
    tenants_new(&t, "files");
    for (int k = 0; k < 2; k++) {
        const char *b = t.peer[k];
        char secret[64], path[96], cmd[512];
        snprintf(secret, sizeof(secret), "secret-%u-%d-%ld", t.tag, k, (long)time(NULL));
        snprintf(path, sizeof(path), "/workspace/%s", secret);
        /* B's files: in /workspace, /tmp, /home, /dev/shm, /run. */
        snprintf(cmd, sizeof(cmd),
                 "for d in /workspace /tmp /home /dev/shm /run; do echo %s > $d/%s; done; "
                 "cat %s",
                 secret, secret, path);
        char *s = tsh_out(t.c, b, cmd);
        char want_s[80];
        snprintf(want_s, sizeof(want_s), "%s\n", secret);
        cr_assert_str_eq(s, want_s, "control: B reads its own file");
        free(s);
        /* A, by the file API and from inside, by name and by content. */
        tcall f = tc_call(t.c, "file.read", t.a, json_pack("{s:s}", "path", path), 0);
        cr_expect_neq(f.rc, 0, "%s: A read B's %s", t.where[k], path);
        if (f.rc)
            cr_expect_str_eq(f.err.code, "FILE_NOT_FOUND");
        tc_free(&f);
        long long bagent = agent_pid(t.c, b);
        snprintf(cmd, sizeof(cmd),
                 "find / -path /proc -prune -o -path /usr -prune -o -name '%s' -print 2>/dev/null; "
                 "grep -rls '%s' /workspace /tmp /home /dev/shm /run /etc /opt 2>/dev/null; "
                 "cat /proc/%lld/root%s 2>&1 | grep -c 'No such file'",
                 secret, secret, bagent, path);
        s = tsh_out(t.c, t.a, cmd);
        cr_expect_str_eq(s, "1\n", "%s: A finds B's file: %s", t.where[k], s);
        free(s);
        /* A writes the same names: B's files are unchanged. */
        tcall w = tc_call(t.c, "file.write", t.a,
                          json_pack("{s:s, s:s}", "path", path, "content", "overwritten by A"), 0);
        tc_ok(w, "file.write");
        tc_free(&w);
        snprintf(cmd, sizeof(cmd), "cat /workspace/%s /tmp/%s /dev/shm/%s | sort -u", secret,
                 secret, secret);
        s = tsh_out(t.c, b, cmd);
        cr_expect_str_eq(s, want_s, "%s: B's files changed: %s", t.where[k], s);
        free(s);
    }
    tenants_done(&t);
}

/* The listener B runs: TCP on 127.0.0.1, an abstract and a path unix
 * socket; it accepts forever and counts nothing (the test checks from the
 * client side). */
static const char LISTENER[] =
    "import socket, sys, threading\n"
    "port, name = int(sys.argv[1]), sys.argv[2]\n"
    "t = socket.socket(); t.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "t.bind(('127.0.0.1', port)); t.listen(16)\n"
    "a = socket.socket(socket.AF_UNIX); a.bind('\\0' + name); a.listen(16)\n"
    "u = socket.socket(socket.AF_UNIX); u.bind('/tmp/' + name + '.sock'); u.listen(16)\n"
    "def serve(s):\n"
    "    while True:\n"
    "        c, _ = s.accept(); c.close()\n"
    "for s in (t, a):\n"
    "    threading.Thread(target=serve, args=(s,), daemon=True).start()\n"
    "print('ready', flush=True)\n"
    "serve(u)\n";

Test(cross_tenant, listeners_are_unreachable)
{
    struct tenants t;
    tenants_new(&t, "net");
    for (int k = 0; k < 2; k++) {
        const char *b = t.peer[k];
        int port = 20000 + (int)(t.tag % 20000) + k;
        char name[64], ports[16], pname[16];
        snprintf(name, sizeof(name), "xt-%u-%d", t.tag, k);
        snprintf(ports, sizeof(ports), "%d", port);
        snprintf(pname, sizeof(pname), "listener%d", k);
        const char *argv[] = {"python3", "-c", LISTENER, ports, name, NULL};
        sbx_exec_opts o = {.argv = argv};
        char pid_s[128];
        sbx_error err;
        cr_assert_eq(sbx_process_start(t.c, b, &o, pname, pid_s, &err), 0, "%s", err.message);
        tcall wl = tc_call(t.c, "process.waitForLog", b,
                           json_pack("{s:s, s:s, s:i}", "processId", pname, "pattern", "ready",
                                     "timeout", 20000),
                           0);
        tc_ok(wl, "process.waitForLog");
        tc_free(&wl);
        char *body = NULL;
        cr_assert(asprintf(&body,
                           "PORT = %d\nNAME = '%s'\n"
                           "r = {'tcp': conn(socket.AF_INET, ('127.0.0.1', PORT)),\n"
                           "     'tcp6': conn(socket.AF_INET6, ('::1', PORT)),\n"
                           "     'abstract': conn(socket.AF_UNIX, '\\0' + NAME),\n"
                           "     'path': conn(socket.AF_UNIX, '/tmp/' + NAME + '.sock')}\n"
                           "r['listed_unix'] = NAME in open('/proc/net/unix').read()\n"
                           "r['listed_tcp'] = (':%%04X' %% PORT) in open('/proc/net/tcp').read()\n"
                           "print(json.dumps(r))\n",
                           port, name) > 0);
        /* Control: B reaches its own listeners. */
        json_t *j = py(t.c, b, body);
        want(j, "tcp", "CONNECTED", "control (B to itself)");
        want(j, "abstract", "CONNECTED", "control (B to itself)");
        want(j, "path", "CONNECTED", "control (B to itself)");
        cr_expect_eq(jbool(j, "listed_unix"), 1, "control: B's /proc/net/unix");
        cr_expect_eq(jbool(j, "listed_tcp"), 1, "control: B's /proc/net/tcp");
        json_decref(j);
        /* A: its own loopback, its own abstract namespace, its own /tmp. */
        j = py(t.c, t.a, body);
        free(body);
        want(j, "tcp", "ECONNREFUSED", t.where[k]);
        const char *v6 = jstr(j, "tcp6");
        cr_expect(!strcmp(v6, "ECONNREFUSED") || !strcmp(v6, "EADDRNOTAVAIL") ||
                      !strcmp(v6, "ENETUNREACH") || !strcmp(v6, "EAFNOSUPPORT"),
                  "%s: tcp6 %s", t.where[k], v6);
        want(j, "abstract", "ECONNREFUSED", t.where[k]);
        want(j, "path", "ENOENT", t.where[k]);
        cr_expect_eq(jbool(j, "listed_unix"), 0, "%s: B's abstract socket in A's /proc/net/unix",
                     t.where[k]);
        cr_expect_eq(jbool(j, "listed_tcp"), 0, "%s: B's port in A's /proc/net/tcp", t.where[k]);
        json_decref(j);
    }
    tenants_done(&t);
}

Test(cross_tenant, ipc_objects_are_private)
{
    struct tenants t;
    tenants_new(&t, "ipc");
    for (int k = 0; k < 2; k++) {
        const char *b = t.peer[k];
        int key = (int)(0x5c000000u | ((t.tag + (unsigned)k) & 0xffffff));
        char *body = NULL;
        /* B creates world-accessible objects; create=1 in B, 0 in A. */
        static const char tmpl[] =
            "KEY = %d\nMQ = b'/xt-%u-%d'\nCREATE = %d\n"
            "libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]\n"
            "fl = 0o1000 | 0o666 if CREATE else 0\n"
            "r = {'shm': neg(libc.shmget(KEY, 4096 if CREATE else 0, fl)),\n"
            "     'msg': neg(libc.msgget(KEY, fl)),\n"
            "     'sem': neg(libc.semget(KEY, 1 if CREATE else 0, fl)),\n"
            "     'mq': neg(libc.mq_open(MQ, (os.O_CREAT | os.O_RDWR) if CREATE else os.O_RDONLY,\n"
            "                            0o666, None))}\n"
            "r['listed'] = sum(len(open('/proc/sysvipc/' + t).read().splitlines()) - 1\n"
            "                  for t in ('shm', 'msg', 'sem'))\n"
            "print(json.dumps(r))\n";
        cr_assert(asprintf(&body, tmpl, key, t.tag, k, 1) > 0);
        json_t *j = py(t.c, b, body);
        free(body);
        want(j, "shm", "OK", "control: B creates shm");
        want(j, "msg", "OK", "control: B creates a message queue");
        want(j, "sem", "OK", "control: B creates a semaphore");
        want(j, "mq", "OK", "control: B creates a POSIX queue");
        cr_expect_eq(jint(j, "listed"), 3, "control: B lists its objects");
        json_decref(j);
        cr_assert(asprintf(&body, tmpl, key, t.tag, k, 0) > 0);
        j = py(t.c, t.a, body);
        free(body);
        want(j, "shm", "ENOENT", t.where[k]);
        want(j, "msg", "ENOENT", t.where[k]);
        want(j, "sem", "ENOENT", t.where[k]);
        want(j, "mq", "ENOENT", t.where[k]);
        cr_expect_eq(jint(j, "listed"), 0, "%s: A lists IPC objects", t.where[k]);
        json_decref(j);
    }
    tenants_done(&t);
}
