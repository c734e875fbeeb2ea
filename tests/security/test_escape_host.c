/*
 * test_escape_host.c — escape attempts from inside real sandboxes, each
 * asserting that the attack fails, and where it fails (issue 7, parts 1–3).
 * This half: the network, abstract sockets, IPC and the host name, the
 * read-only system and setuid binaries, the file API (symlinks, magic
 * links, races) and file descriptors.  test_escape_kernel.c has the
 * privileges and the system-call filter (and says how probes work);
 * escape_util.h what both share.
 *
 * Host-side preconditions (a listener, an abstract socket, IPC objects,
 * setuid binaries, int 0x80 support) are set up or checked by this test
 * process, which runs on the host as root; everything it creates is removed
 * by the test that created it.
 */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <mqueue.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ipc.h>
#include <sys/msg.h>
#include <sys/sem.h>
#include <sys/shm.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "../../runtime/util.h"
#include "escape_util.h"

/* ---------------------------------------------------------------------------------- */
/* 5. Network, abstract sockets, IPC, host name. */

static int
host_tcp_listener(int *port)
{
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    cr_assert(s >= 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(bind(s, (struct sockaddr *)&a, sizeof(a)), 0);
    cr_assert_eq(listen(s, 16), 0);
    socklen_t l = sizeof(a);
    getsockname(s, (struct sockaddr *)&a, &l);
    *port = ntohs(a.sin_port);
    return s;
}

/* The port of the gateway the suite talks to (SBX_TEST_URL, tcp://HOST:PORT),
 * or 0. */
static int
gateway_port(void)
{
    const char *u = test_url(), *colon = strrchr(u, ':');
    return colon && strncmp(u, "tcp://", 6) == 0 ? atoi(colon + 1) : 0;
}

/* Once per network mode (none, egress under the widest policy): the host's
 * addresses on a port it serves, on 80, on the gateway's and etcd's ports,
 * the metadata address, another sandbox, the host's loopback. */
ESCAPE_NET_MODES(escape, only_loopback_and_host_ports_are_unreachable)
ParameterizedTest(struct escape_mode *mode, escape, only_loopback_and_host_ports_are_unreachable)
{
    SANDBOX("net");
    bool egress = !strcmp(mode->name, "egress");
    escape_create(c, id, mode->name);
    int port;
    int ls = host_tcp_listener(&port);
    /* Control: the host itself reaches the listener. */
    int probe = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert_eq(connect(probe, (struct sockaddr *)&a, sizeof(a)), 0, "host control connect");
    close(probe);
    int acc = accept(ls, NULL, NULL);
    cr_assert(acc >= 0);
    close(acc);
    /* Another sandbox of the same mode, serving on its address (egress:
     * one it has; none: it has none). */
    char *other = test_id("net-peer");
    escape_create(c, other, mode->name);
    char *oip = sh_out(c, other,
                       "python3 -c 'import socket,os\n"
                       "s=socket.socket(); s.bind((\"0.0.0.0\",8080)); s.listen()\n"
                       "if os.fork(): os._exit(0)\n"
                       "while True:\n c,_=s.accept(); c.close()' </dev/null >/dev/null 2>&1; "
                       "ip -o -4 addr show eth0 2>/dev/null | awk '{print $4}' | cut -d/ -f1");
    oip[strcspn(oip, "\n")] = '\0';
    cr_expect_eq(oip[0] != '\0', egress, "the other sandbox's address: '%s'", oip);
    /* The host's own addresses (every non-loopback IPv4 address), the cloud
     * metadata address and the other sandbox. */
    char *body = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&body, &len);
    fprintf(f, "ADDRS = [");
    struct ifaddrs *ifa = NULL, *p;
    int naddr = 0;
    if (getifaddrs(&ifa) == 0) {
        for (p = ifa; p; p = p->ifa_next) {
            if (!p->ifa_addr || p->ifa_addr->sa_family != AF_INET)
                continue;
            char buf[INET_ADDRSTRLEN];
            struct sockaddr_in *sin = (struct sockaddr_in *)p->ifa_addr;
            if ((ntohl(sin->sin_addr.s_addr) >> 24) == 127)
                continue;
            inet_ntop(AF_INET, &sin->sin_addr, buf, sizeof(buf));
            fprintf(f, "'%s', ", buf);
            naddr++;
        }
        freeifaddrs(ifa);
    }
    fprintf(f, "'169.254.169.254']\nPORTS = [%d, 80, %d, 2379, 2380]\nOTHER = '%s'\n", port,
            gateway_port(), oip);
    fprintf(f,
            "import concurrent.futures\n"
            "def conn(host, port):\n"
            "    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)\n"
            "    s.settimeout(3)\n"
            "    try:\n"
            "        s.connect((host, port))\n"
            "        return 'CONNECTED'\n"
            "    except socket.timeout:\n"
            "        return 'TIMEOUT'\n"
            "    except OSError as e:\n"
            "        return en(e.errno)\n"
            "    finally:\n"
            "        s.close()\n"
            "r = {'ifaces': [n for i, n in socket.if_nameindex()]}\n"
            "r['loopback_port'] = conn('127.0.0.1', PORTS[0])\n"
            "keys = [(a, p) for a in ADDRS for p in PORTS if p] + ([(OTHER, 8080)] if OTHER else [])\n"
            "with concurrent.futures.ThreadPoolExecutor(32) as ex:\n"
            "    r['addrs'] = {'%%s:%%d' %% k: v for k, v in zip(keys, ex.map(lambda k: conn(*k), keys))}\n"
            "r['routes'] = open('/proc/net/route').read().splitlines()[1:]\n"
            "print(json.dumps(r))\n");
    fclose(f);
    json_t *j = py(c, id, body);
    free(body);
    char *s = json_dumps(jget(j, "ifaces"), JSON_COMPACT);
    cr_expect_str_eq(s, egress ? "[\"lo\",\"eth0\"]" : "[\"lo\"]", "interfaces: %s", s);
    free(s);
    /* 127.0.0.1 inside is the sandbox's own loopback: nobody listens. */
    want(j, "loopback_port", "ECONNREFUSED", "the host's 127.0.0.1 port");
    /* none: no route at all.  egress: refused by the router (a reset), or,
     * for a host address that came after the router was made, dropped by
     * the host's table (a timeout); never connected. */
    const char *k;
    json_t *v;
    json_object_foreach(jget(j, "addrs"), k, v) {
        const char *got = json_string_value(v);
        if (egress)
            cr_expect(!strcmp(got, "ECONNREFUSED") || !strcmp(got, "TIMEOUT"),
                      "egress: connect %s: %s", k, got);
        else
            cr_expect_str_eq(got, "ENETUNREACH", "connect %s: %s", k, got);
    }
    if (egress) {
        const char *md = json_string_value(json_object_get(jget(j, "addrs"),
                                                           "169.254.169.254:80"));
        cr_expect(md && !strcmp(md, "ECONNREFUSED"), "the metadata address: %s", md ? md : "-");
        char ok[64];
        snprintf(ok, sizeof(ok), "%s:8080", oip);
        cr_expect(json_object_get(jget(j, "addrs"), ok) != NULL, "the other sandbox not tried");
    }
    /* none: no route; egress: one, the default route via its router. */
    size_t nroutes = json_array_size(jget(j, "routes"));
    cr_expect(egress ? nroutes >= 1 : nroutes == 0, "routes inside: %s",
              json_dumps(jget(j, "routes"), 0));
    if (naddr == 0)
        kernel_note("the host has no non-loopback IPv4 address; only the metadata address was tried");
    json_decref(j);
    /* Nothing arrived at the host listener. */
    errno = 0;
    acc = accept(ls, NULL, NULL);
    cr_expect(acc < 0 && (errno == EAGAIN || errno == EWOULDBLOCK),
              "the host listener accepted a connection");
    if (acc >= 0)
        close(acc);
    close(ls);
    free(oip);
    tdone(c, other);
    DONE();
}

/* Once per network mode: an egress sandbox's netns is its own too. */
ESCAPE_NET_MODES(escape, host_unix_sockets_are_unreachable)
ParameterizedTest(struct escape_mode *mode, escape, host_unix_sockets_are_unreachable)
{
    SANDBOX("unix");
    escape_create(c, id, mode->name);
    /* An abstract socket on the host: that namespace belongs to the network
     * namespace (unix(7)), so the sandbox's is another one (CVE-2020-15257). */
    char name[64];
    snprintf(name, sizeof(name), "sbx-escape-%d-%ld", (int)getpid(), (long)time(NULL));
    int ls = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    struct sockaddr_un un = {.sun_family = AF_UNIX};
    memcpy(un.sun_path + 1, name, strlen(name));
    socklen_t ul = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + 1 + strlen(name));
    cr_assert_eq(bind(ls, (struct sockaddr *)&un, ul), 0);
    cr_assert_eq(listen(ls, 4), 0);
    int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert_eq(connect(probe, (struct sockaddr *)&un, ul), 0, "host control connect");
    close(probe);
    int acc = accept(ls, NULL, NULL);
    cr_assert(acc >= 0);
    close(acc);
    /* The daemon's own sockets live under $SBX_TEST_DIR on the host. */
    const char *dir = getenv("SBX_TEST_DIR");
    cr_assert(dir != NULL);
    char *body = NULL;
    cr_assert(asprintf(&body,
                       "NAME = '%s'\nDIR = '%s'\n"
                       "def conn(addr):\n"
                       "    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
                       "    try:\n"
                       "        s.connect(addr)\n"
                       "        return 'CONNECTED'\n"
                       "    except OSError as e:\n"
                       "        return en(e.errno)\n"
                       "    finally:\n"
                       "        s.close()\n"
                       "r = {'abstract': conn('\\0' + NAME)}\n"
                       "r['listed'] = NAME in open('/proc/net/unix').read()\n"
                       "r['gateway'] = conn(DIR + '/gw.sock')\n"
                       "r['shard'] = conn(DIR + '/s0.sock')\n"
                       "r['dir'] = oserr(os.stat, DIR)\n"
                       "print(json.dumps(r))\n",
                       name, dir) > 0);
    json_t *j = py(c, id, body);
    free(body);
    want(j, "abstract", "ECONNREFUSED", "the host's abstract socket");
    cr_expect_eq(jbool(j, "listed"), 0, "the host's abstract socket is listed in /proc/net/unix");
    want(j, "gateway", "ENOENT", "the gateway's socket");
    want(j, "shard", "ENOENT", "a shard's socket");
    want(j, "dir", "ENOENT", "the daemon's directory");
    json_decref(j);
    errno = 0;
    acc = accept(ls, NULL, NULL);
    cr_expect(acc < 0 && errno == EAGAIN, "the host's abstract socket accepted a connection");
    if (acc >= 0)
        close(acc);
    close(ls);
    DONE();
}

/* The host IPC objects of the next test, removed by its .fini even when an
 * assertion ends it early. */
static int ipc_shm = -1, ipc_msq = -1, ipc_sem = -1;
static mqd_t ipc_mq = (mqd_t)-1;
static char ipc_mqname[64];

static void
ipc_cleanup(void)
{
    if (ipc_shm >= 0)
        shmctl(ipc_shm, IPC_RMID, NULL);
    if (ipc_msq >= 0)
        msgctl(ipc_msq, IPC_RMID, NULL);
    if (ipc_sem >= 0)
        semctl(ipc_sem, 0, IPC_RMID);
    if (ipc_mq != (mqd_t)-1) {
        mq_close(ipc_mq);
        mq_unlink(ipc_mqname);
    }
}

Test(escape, ipc_and_hostname_are_isolated_from_the_host, .fini = ipc_cleanup)
{
    SANDBOX("ipc");
    /* Host objects, world-accessible, so only the namespace can hide them. */
    key_t key = (key_t)(0x5b000000 | (getpid() & 0xffffff));
    int shm = ipc_shm = shmget(key, 4096, IPC_CREAT | IPC_EXCL | 0666);
    int msq = ipc_msq = msgget(key, IPC_CREAT | IPC_EXCL | 0666);
    int sem = ipc_sem = semget(key, 1, IPC_CREAT | IPC_EXCL | 0666);
    char *mqname = ipc_mqname;
    snprintf(ipc_mqname, sizeof(ipc_mqname), "/sbx-escape-%d", (int)getpid());
    mqd_t mq = ipc_mq = mq_open(mqname, O_CREAT | O_EXCL | O_RDWR, 0666, NULL);
    cr_assert(shm >= 0 && msq >= 0 && sem >= 0 && mq != (mqd_t)-1,
              "host IPC objects: shm %d msg %d sem %d mq %d (errno %d)", shm, msq, sem, (int)mq,
              errno);
    char host_before[256] = "", host_after[256] = "";
    gethostname(host_before, sizeof(host_before));
    char *body = NULL;
    cr_assert(asprintf(&body,
                       "KEY = %d\nMQ = b'%s'\n"
                       "libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int]\n"
                       "def neg(v):\n"
                       "    return 'OK' if v != -1 else en(ctypes.get_errno())\n"
                       "r = {}\n"
                       "r['shmget'] = neg(libc.shmget(KEY, 0, 0))\n"
                       "r['msgget'] = neg(libc.msgget(KEY, 0))\n"
                       "r['semget'] = neg(libc.semget(KEY, 0, 0))\n"
                       "r['mq_open'] = neg(libc.mq_open(MQ, os.O_RDONLY))\n"
                       "r['sysvipc'] = [len(open('/proc/sysvipc/' + t).read().splitlines())\n"
                       "                for t in ('shm', 'msg', 'sem')]\n"
                       "r['mqueue_fs'] = os.listdir('/dev/mqueue')\n"
                       /* control: the sandbox's own objects work (and stay in it) */
                       "r['own_shm'] = neg(libc.shmget(KEY + 1, 4096, 0o1000 | 0o666))\n"
                       "r['hostname'] = socket.gethostname()\n"
                       "r['sethostname'] = sc(170, b'pwned', 5)\n"
                       "r['setdomainname'] = sc(171, b'pwned', 5)\n"
                       "r['uts_write'] = oserr(lambda: open('/proc/sys/kernel/hostname', 'w').write('pwned'))\n"
                       "r['hostname_after'] = socket.gethostname()\n"
                       "print(json.dumps(r))\n",
                       (int)key, mqname) > 0);
    json_t *j = py(c, id, body);
    free(body);
    want(j, "shmget", "ENOENT", "host SysV shm");
    want(j, "msgget", "ENOENT", "host SysV message queue");
    want(j, "semget", "ENOENT", "host SysV semaphore");
    want(j, "mq_open", "ENOENT", "host POSIX message queue");
    char *s = json_dumps(jget(j, "sysvipc"), JSON_COMPACT);
    cr_expect_str_eq(s, "[1,1,1]", "/proc/sysvipc lists objects: %s", s);
    free(s);
    cr_expect_eq(json_array_size(jget(j, "mqueue_fs")), 0, "/dev/mqueue is not empty");
    want(j, "own_shm", "OK", "the sandbox's own SysV shm");
    want(j, "hostname", "sandbox", "host name");
    want(j, "sethostname", "EPERM", "sethostname");
    want(j, "setdomainname", "EPERM", "setdomainname");
    want(j, "uts_write", "EROFS", "/proc/sys/kernel/hostname");
    want(j, "hostname_after", "sandbox", "host name after the attempts");
    json_decref(j);
    /* The sandbox's shm did not appear on the host; the host's name is intact. */
    errno = 0;
    cr_expect(shmget(key + 1, 0, 0) < 0 && errno == ENOENT, "the sandbox's shm is on the host");
    gethostname(host_after, sizeof(host_after));
    cr_expect_str_eq(host_after, host_before);
    DONE(); /* the host objects: ipc_cleanup */
}

/* ---------------------------------------------------------------------------------- */
/* 6. Read-only system, setuid binaries. */

Test(escape, system_directories_are_read_only)
{
    SANDBOX("ro");
    struct stat env_before, bin_before, env_after, bin_after;
    cr_assert_eq(stat("/usr/bin/env", &env_before), 0);
    cr_assert_eq(stat("/usr/bin", &bin_before), 0);
    json_t *j = py(c, id,
                   "r = {}\n"
                   "def create(p):\n"
                   "    os.close(os.open(p, os.O_WRONLY | os.O_CREAT, 0o644))\n"
                   "for d in ['/', '/usr', '/usr/bin', '/usr/lib', '/etc', '/bin', '/sbin', '/lib', '/lib64',\n"
                   "          '/opt', '/opt/sbx', '/dev', '/var', '/sys', '/proc', '/etc/ssl']:\n"
                   "    if not os.path.isdir(d):\n"
                   "        continue\n"
                   "    r['create:' + d] = oserr(create, d.rstrip('/') + '/sbx-probe')\n"
                   "    r['mkdir:' + d] = oserr(os.mkdir, d.rstrip('/') + '/sbx-probe-dir')\n"
                   "r['write_env'] = oserr(os.open, '/usr/bin/env', os.O_WRONLY)\n"
                   "r['chmod_env'] = oserr(os.chmod, '/usr/bin/env', 0o4777)\n"
                   "r['utime_env'] = oserr(os.utime, '/usr/bin/env')\n"
                   "r['truncate_hosts'] = oserr(os.truncate, '/etc/hosts', 0)\n"
                   "r['unlink_passwd'] = oserr(os.unlink, '/etc/passwd')\n"
                   "r['rename_hosts'] = oserr(os.rename, '/etc/hosts', '/etc/hosts2')\n"
                   "r['symlink_lib'] = oserr(os.symlink, '/workspace/evil.so', '/usr/lib/evil.so')\n"
                   "r['replace_bin_link'] = oserr(os.unlink, '/bin')\n"
                   "r['write_resolv'] = oserr(os.open, '/etc/resolv.conf', os.O_WRONLY)\n"
                   "r['hardlink_out'] = oserr(os.link, '/usr/bin/env', '/workspace/env')\n"
                   "for d in ['/workspace', '/tmp', '/home', '/root']:\n"
                   "    r['create:' + d] = oserr(create, d + '/sbx-probe')\n"
                   "ro = {}\n"
                   "for l in open('/proc/self/mountinfo'):\n"
                   "    f = l.split()\n"
                   "    ro[f[4]] = 'ro' in f[5].split(',')\n"
                   "r['rw_mounts'] = sorted(m for m, v in ro.items() if not v)\n"
                   "print(json.dumps(r))\n");
    const char *k;
    json_t *v;
    int ro = 0;
    json_object_foreach(j, k, v) {
        const char *got = json_string_value(v);
        if (!strcmp(k, "create:/workspace") || !strcmp(k, "create:/tmp") ||
            !strcmp(k, "create:/home") || !strcmp(k, "create:/root")) {
            cr_expect_str_eq(got, "OK", "%s: %s (the writable directories must be writable)", k, got);
            continue;
        }
        if (!strcmp(k, "hardlink_out")) {
            cr_expect_str_eq(got, "EXDEV", "%s: %s", k, got);
            continue;
        }
        if (!strcmp(k, "rw_mounts"))
            continue;
        /* Files of the host's /usr belong to an unmapped uid (nobody): the
         * permission check refuses first, the read-only mount is below it. */
        if (!strcmp(k, "write_env") || !strcmp(k, "chmod_env") || !strcmp(k, "utime_env")) {
            cr_expect(!strcmp(got, "EACCES") || !strcmp(got, "EROFS") || !strcmp(got, "EPERM"),
                      "%s: %s", k, got);
            ro++;
            continue;
        }
        /* /proc refuses creation with ENOENT/EACCES rather than EROFS. */
        bool ok = !strcmp(got, "EROFS") ||
                  (strstr(k, ":/proc") && (!strcmp(got, "ENOENT") || !strcmp(got, "EACCES")));
        cr_expect(ok, "%s: %s, expected EROFS", k, got);
        ro++;
    }
    cr_expect(ro >= 35, "only %d read-only checks ran", ro);
    /* The only writable mounts: the sandbox's own tmpfs and the pseudo
     * file systems it needs. */
    char *rw = json_dumps(jget(j, "rw_mounts"), JSON_COMPACT);
    cr_expect_str_eq(rw,
                     "[\"/dev/full\",\"/dev/mqueue\",\"/dev/null\",\"/dev/pts\",\"/dev/random\","
                     "\"/dev/shm\",\"/dev/tty\",\"/dev/urandom\",\"/dev/zero\",\"/home\",\"/proc\","
                     "\"/run\",\"/tmp\",\"/workspace\"]",
                     "read-write mounts: %s", rw);
    free(rw);
    json_decref(j);
    /* The host's files were not touched. */
    cr_assert_eq(stat("/usr/bin/env", &env_after), 0);
    cr_assert_eq(stat("/usr/bin", &bin_after), 0);
    cr_expect(env_after.st_mtim.tv_sec == env_before.st_mtim.tv_sec &&
                  env_after.st_mtim.tv_nsec == env_before.st_mtim.tv_nsec &&
                  env_after.st_ctim.tv_nsec == env_before.st_ctim.tv_nsec &&
                  env_after.st_mode == env_before.st_mode,
              "/usr/bin/env changed on the host");
    cr_expect(bin_after.st_mtim.tv_nsec == bin_before.st_mtim.tv_nsec &&
                  bin_after.st_nlink == bin_before.st_nlink,
              "/usr/bin changed on the host");
    cr_expect(access("/usr/sbx-probe", F_OK) != 0 && access("/usr/bin/sbx-probe", F_OK) != 0,
              "a probe file appeared on the host");
    DONE();
}

Test(escape, setuid_binaries_grant_nothing)
{
    /* Precondition on the host: real setuid-root binaries exist (the
     * sandbox sees the host's /usr).  Without them this test proves
     * nothing, so it fails rather than skips. */
    static const char *const bins[] = {"/usr/bin/passwd", "/usr/bin/su", "/usr/bin/mount"};
    for (size_t i = 0; i < SBX_ARRAY_LEN(bins); i++) {
        struct stat st;
        cr_assert(stat(bins[i], &st) == 0 && (st.st_mode & S_ISUID) && st.st_uid == 0,
                  "precondition: %s must exist on the host as a setuid-root binary", bins[i]);
    }
    SANDBOX("suid");
    for (size_t i = 0; i < SBX_ARRAY_LEN(bins); i++) {
        /* glibc honours LD_SHOW_AUXV only when AT_SECURE is 0: a setuid
         * exec that took effect would print nothing (ld.so unsecure
         * variables).  So the auxv printed proves the exec gained nothing. */
        char cmd[256];
        snprintf(cmd, sizeof(cmd),
                 "stat -c '%%u %%A' %s; LD_SHOW_AUXV=1 %s --help 2>/dev/null | "
                 "grep -E '^AT_(SECURE|UID|EUID|GID|EGID):' | tr -s ' '",
                 bins[i], bins[i]);
        sbx_exec_result r = tsh(c, id, cmd, 20000);
        cr_expect_str_eq(r.stdout_data,
                         "65534 -rwsr-xr-x\nAT_UID: 0\nAT_EUID: 0\nAT_GID: 0\nAT_EGID: 0\n"
                         "AT_SECURE: 0\n",
                         "%s inside the sandbox (owner unmapped, setuid bit ignored): %s", bins[i],
                         r.stdout_data);
        sbx_exec_result_free(&r);
    }
    /* The same from a binary the tenant marks setuid itself. */
    sbx_exec_result r = tsh(c, id,
                            "cp /usr/bin/id /tmp/id && chmod 4755 /tmp/id && "
                            "LD_SHOW_AUXV=1 /tmp/id -u | grep -E '^AT_SECURE:|^[0-9]' | tr -s ' '",
                            20000);
    cr_expect_str_eq(r.stdout_data, "AT_SECURE: 0\n0\n", "%s %s", r.stdout_data, r.stderr_data);
    sbx_exec_result_free(&r);
    DONE();
}

/* ---------------------------------------------------------------------------------- */
/* 7. The file API: symlinks, magic links, races (container/agent/files.c). */

static tcall
fcall(sbx_client *c, const char *id, const char *op, json_t *args)
{
    return tc_call(c, op, id, args, 20000);
}

/* read_fails — file.read of path fails with `code`. */
static void
read_fails(sbx_client *c, const char *id, const char *path, const char *code)
{
    tcall t = fcall(c, id, "file.read", json_pack("{s:s}", "path", path));
    if (t.rc == 0) {
        sbx_str got = tc_bin(&t, "content");
        cr_expect_fail("file.read %s succeeded (%zu bytes: %.*s), expected %s", path, got.n,
                       (int)SBX_MIN(got.n, (size_t)200), got.p, code);
    } else {
        cr_expect_str_eq(t.err.code, code, "file.read %s: %s (%s)", path, t.err.code,
                         t.err.message);
    }
    tc_free(&t);
}

/* write_fails — file.write of path fails with `code`. */
static void
write_fails(sbx_client *c, const char *id, const char *path, const char *code)
{
    tcall t = fcall(c, id, "file.write", json_pack("{s:s, s:s}", "path", path, "content", "pwned"));
    cr_expect_neq(t.rc, 0, "file.write %s succeeded, expected %s", path, code);
    if (t.rc)
        cr_expect_str_eq(t.err.code, code, "file.write %s: %s (%s)", path, t.err.code,
                         t.err.message);
    tc_free(&t);
}

static char *
slurp(const char *path, size_t *n)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    char *buf = NULL;
    size_t len = 0;
    FILE *m = open_memstream(&buf, &len);
    char chunk[4096];
    size_t k;
    while ((k = fread(chunk, 1, sizeof(chunk), f)) > 0)
        fwrite(chunk, 1, k, m);
    fclose(f);
    fclose(m);
    if (n)
        *n = len;
    return buf;
}

/* The host canary directory of the next test, removed by its .fini. */
static char canary_dir[64];

static void
canary_cleanup(void)
{
    if (canary_dir[0])
        sbx_rm_rf(canary_dir);
}

Test(escape, file_api_symlinks_cannot_leave_the_sandbox, .fini = canary_cleanup)
{
    SANDBOX("fapi");
    /* Host canaries: a directory with one file, and the host's shadow file. */
    char hdir[] = "/tmp/sbx-escape-XXXXXX";
    cr_assert(mkdtemp(hdir) != NULL);
    snprintf(canary_dir, sizeof(canary_dir), "%s", hdir);
    char canary[128], ctext[96];
    snprintf(canary, sizeof(canary), "%s/canary", hdir);
    snprintf(ctext, sizeof(ctext), "host-canary-%d-%ld\n", (int)getpid(), (long)time(NULL));
    FILE *cf = fopen(canary, "w");
    cr_assert(cf != NULL);
    fputs(ctext, cf);
    fclose(cf);
    struct stat cst, sst, dst;
    cr_assert_eq(stat(canary, &cst), 0);
    cr_assert_eq(stat(hdir, &dst), 0);
    size_t shadow_len = 0;
    char *shadow = slurp("/etc/shadow", &shadow_len);
    cr_assert(shadow != NULL && stat("/etc/shadow", &sst) == 0, "precondition: /etc/shadow on the host");
    size_t hpasswd_len = 0;
    char *hpasswd = slurp("/etc/passwd", &hpasswd_len);

    /* Tenant code plants links to host paths, to /, and to the agent's /proc. */
    char *cmd = NULL;
    cr_assert(asprintf(&cmd,
                       "cd /workspace && ln -s %s l_canary && ln -s /etc/shadow l_shadow && "
                       "ln -s %s l_hostdir && ln -s / l_root && ln -s /proc/1/root l_agent_root && "
                       "ln -s /proc/self/root l_self_root && ln -s /proc/1/fd l_fds && "
                       "ln -s /proc/1 l_agent && ln -s /proc/self/cwd l_cwd && echo planted",
                       canary, hdir) > 0);
    char *s = sh_out(c, id, cmd);
    free(cmd);
    cr_assert_str_eq(s, "planted\n");
    free(s);
    char *passwd_inside = sh_out(c, id, "cat /etc/passwd");

    char p[512];
    /* Host paths do not exist in the sandbox, by name or through links. */
    read_fails(c, id, canary, "FILE_NOT_FOUND");
    read_fails(c, id, "/workspace/l_canary", "FILE_NOT_FOUND");
    snprintf(p, sizeof(p), "/workspace/../../../../../..%s", canary);
    read_fails(c, id, p, "FILE_NOT_FOUND");
    snprintf(p, sizeof(p), "../../../../..%s", canary);
    read_fails(c, id, p, "FILE_NOT_FOUND");
    read_fails(c, id, "/etc/shadow", "FILE_NOT_FOUND");
    read_fails(c, id, "/workspace/l_shadow", "FILE_NOT_FOUND");
    read_fails(c, id, "/workspace/../../../etc/shadow", "FILE_NOT_FOUND");
    /* …and where a path resolves, it is the sandbox's file, not the host's. */
    static const char *const passwds[] = {"/workspace/l_root/etc/passwd",
                                          "/workspace/../../../../etc/passwd",
                                          "../../../../../etc/passwd"};
    for (size_t i = 0; i < SBX_ARRAY_LEN(passwds); i++) {
        tcall t = fcall(c, id, "file.read", json_pack("{s:s}", "path", passwds[i]));
        tc_ok(t, "file.read");
        sbx_str got = tc_bin(&t, "content");
        cr_expect(got.n == strlen(passwd_inside) && !memcmp(got.p, passwd_inside, got.n),
                  "%s: %.*s", passwds[i], (int)got.n, got.p);
        cr_expect(!(got.n == hpasswd_len && hpasswd && !memcmp(got.p, hpasswd, got.n)),
                  "%s returned the host's /etc/passwd", passwds[i]);
        tc_free(&t);
    }
    /* Magic links and procfs (the agent's root, cwd, fds, memory) are refused. */
    static const char *const magic[] = {
        "/proc/self/root/etc/passwd", "/proc/1/root/etc/passwd", "/proc/1/cwd/x",
        "/proc/self/cwd/x",           "/proc/1/fd/3",            "/proc/self/fd/0",
        "/dev/fd/3",                  "/dev/stdin",              "/workspace/l_agent_root/etc/passwd",
        "/workspace/l_self_root/etc/passwd", "/workspace/l_fds/3", "/workspace/l_cwd/l_root",
        "/proc/1/environ",            "/proc/1/mem",             "/workspace/l_agent/mem",
        "/workspace/l_agent/environ", "/proc/self/environ",      "/proc/self/mem",
        "/proc/sys/kernel/core_pattern", "/proc/keys",           "/dev/null",
        "/dev/zero",                  "/dev/tty",
    };
    for (size_t i = 0; i < SBX_ARRAY_LEN(magic); i++)
        read_fails(c, id, magic[i], "PERMISSION_DENIED");
    static const char *const wmagic[] = {
        "/proc/self/root/tmp/pwned", "/proc/1/root/tmp/pwned", "/proc/1/cwd/pwned",
        "/proc/1/fd/3",              "/workspace/l_fds/1",     "/workspace/l_agent/mem",
        "/proc/1/mem",               "/proc/self/mem",         "/proc/sys/kernel/core_pattern",
        "/proc/1/oom_score_adj",     "/dev/null",              "/workspace/l_agent_root/tmp/pwned",
    };
    for (size_t i = 0; i < SBX_ARRAY_LEN(wmagic); i++)
        write_fails(c, id, wmagic[i], "PERMISSION_DENIED");
    /* rename/move: a procfs source, or a destination through a magic link,
     * is refused before mv(1) could copy anything. */
    static const char *const rfrom[] = {"/proc/self/environ", "/proc/1/environ",
                                        "/proc/self/status", "/workspace/l_agent/environ",
                                        "/proc/1/fd/3"};
    for (size_t i = 0; i < SBX_ARRAY_LEN(rfrom); i++) {
        tcall m = fcall(c, id, "file.rename",
                        json_pack("{s:s, s:s}", "oldPath", rfrom[i], "newPath", "/workspace/stolen"));
        cr_expect_neq(m.rc, 0, "file.rename %s succeeded", rfrom[i]);
        if (m.rc)
            cr_expect_str_eq(m.err.code, "PERMISSION_DENIED", "file.rename %s: %s (%s)", rfrom[i],
                             m.err.code, m.err.message);
        tc_free(&m);
    }
    tcall m = fcall(c, id, "file.move",
                    json_pack("{s:s, s:s}", "sourcePath", "/workspace/l_root",
                              "destinationPath", "/proc/self/root/workspace/moved"));
    cr_expect_neq(m.rc, 0, "file.move through a magic link succeeded");
    if (m.rc)
        cr_expect_str_eq(m.err.code, "PERMISSION_DENIED", "%s (%s)", m.err.code, m.err.message);
    tc_free(&m);
    s = sh_out(c, id, "ls /workspace/stolen /workspace/moved 2>&1 | grep -c 'No such file'");
    cr_expect_str_eq(s, "2\n", "something was moved: %s", s);
    free(s);
    /* Through a dangling link to a host file: refused (never created). */
    tcall t = fcall(c, id, "file.write",
                    json_pack("{s:s, s:s}", "path", "/workspace/l_shadow", "content", "pwned"));
    cr_expect_neq(t.rc, 0, "file.write through a link to /etc/shadow succeeded");
    tc_free(&t);
    static const char *const lmagic[] = {"/workspace/l_agent_root", "/workspace/l_fds",
                                         "/workspace/l_agent", "/proc", "/proc/1/fd",
                                         "/proc/self/root"};
    for (size_t i = 0; i < SBX_ARRAY_LEN(lmagic); i++) {
        t = fcall(c, id, "file.list", json_pack("{s:s}", "path", lmagic[i]));
        cr_expect_neq(t.rc, 0, "file.list %s succeeded", lmagic[i]);
        if (t.rc)
            cr_expect_str_eq(t.err.code, "PERMISSION_DENIED", "file.list %s: %s", lmagic[i],
                             t.err.code);
        tc_free(&t);
    }

    /* Writes, mkdir, rename and delete on the host paths act on the
     * sandbox's own files of the same name. */
    t = fcall(c, id, "file.write", json_pack("{s:s, s:s}", "path", canary, "content", "pwned"));
    tc_ok(t, "file.write <host canary path>");
    tc_free(&t);
    t = fcall(c, id, "file.write",
              json_pack("{s:s, s:s}", "path", "/workspace/l_canary", "content", "pwned-link"));
    tc_ok(t, "file.write through the link");
    tc_free(&t);
    snprintf(p, sizeof(p), "/workspace/l_hostdir/new");
    t = fcall(c, id, "file.mkdir", json_pack("{s:s, s:b}", "path", p, "recursive", 1));
    tc_ok(t, "file.mkdir");
    tc_free(&t);
    cmd = NULL;
    cr_assert(asprintf(&cmd, "cat %s; ls %s", canary, hdir) > 0);
    s = sh_out(c, id, cmd);
    free(cmd);
    cr_expect_str_eq(s, "pwned-linkcanary\nnew\n", "inside: %s", s);
    free(s);
    t = fcall(c, id, "file.rename",
              json_pack("{s:s, s:s}", "oldPath", canary, "newPath", "/workspace/stolen"));
    tc_ok(t, "file.rename");
    tc_free(&t);
    t = fcall(c, id, "file.delete", json_pack("{s:s}", "path", "/workspace/l_shadow"));
    tc_ok(t, "file.delete of a link");
    tc_free(&t);

    /* The host: canary intact, no new file, shadow untouched. */
    struct stat cst2, sst2, dst2;
    cr_assert_eq(stat(canary, &cst2), 0, "the host canary is gone");
    size_t cl = 0;
    char *now = slurp(canary, &cl);
    cr_expect(now && !strcmp(now, ctext), "the host canary changed: %s", now ? now : "(null)");
    free(now);
    cr_expect(cst2.st_mtim.tv_nsec == cst.st_mtim.tv_nsec && cst2.st_ino == cst.st_ino &&
                  cst2.st_ctim.tv_nsec == cst.st_ctim.tv_nsec,
              "the host canary was modified");
    cr_assert_eq(stat(hdir, &dst2), 0);
    DIR *d = opendir(hdir);
    int entries = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL)
        if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
            entries++;
    closedir(d);
    cr_expect_eq(entries, 1, "the host directory has %d entries", entries);
    cr_expect_eq(dst2.st_mtim.tv_nsec, dst.st_mtim.tv_nsec, "the host directory changed");
    size_t sl2 = 0;
    char *shadow2 = slurp("/etc/shadow", &sl2);
    cr_expect(shadow2 && sl2 == shadow_len && !memcmp(shadow, shadow2, sl2),
              "/etc/shadow changed on the host");
    cr_expect(stat("/etc/shadow", &sst2) == 0 && sst2.st_mtim.tv_nsec == sst.st_mtim.tv_nsec);
    free(shadow);
    free(shadow2);
    free(hpasswd);
    free(passwd_inside);
    /* The agent survived all of it (the canary directory: canary_cleanup). */
    json_t *sb = ts_status(c, id);
    cr_expect_eq(jint(sb, "restarts"), 0);
    json_decref(sb);
    DONE();
}

/*
 * A racer inside the sandbox swaps /workspace/rc/x between a directory
 * (decoy files `environ`, `mem`, `status`, `fd/3`) and a symlink to
 * /proc/self — which, resolved by the agent, is the agent's own /proc/1 —
 * with renameat2(RENAME_EXCHANGE), as fast as it can, while the test reads,
 * writes and lists through x.  Whatever the interleaving, the API may only
 * ever touch the decoys: never the agent's environment, memory or fds, and
 * never list procfs (isolation.md §3 rows 3–4; CVE-2018-15664 is this race
 * against `docker cp`).
 */
static const char RACER[] =
    "import ctypes, os, time\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "os.makedirs('/workspace/rc/x/fd')\n"
    "for n in ('environ', 'mem', 'status'):\n"
    "    open('/workspace/rc/x/' + n, 'w').write('decoy\\n')\n"
    "open('/workspace/rc/x/fd/3', 'w').write('decoy\\n')\n"
    "os.symlink('/proc/self', '/workspace/rc/s')\n"
    "open('/workspace/rc/ready', 'w').write('1')\n"
    "end = time.time() + 60\n"
    "n = 0\n"
    "while time.time() < end and not os.path.exists('/workspace/rc/stop'):\n"
    "    for _ in range(200):\n"
    "        libc.renameat2(-100, b'/workspace/rc/x', -100, b'/workspace/rc/s', 2)\n"
    "    n += 200\n"
    "print('swaps', n)\n";

Test(escape, file_api_survives_a_symlink_swap_race, .timeout = 120)
{
    SANDBOX("race");
    free(sh_out(c, id, "true"));
    json_t *sb = ts_status(c, id);
    long long agent = jint(sb, "container.pid");
    json_decref(sb);
    const char *argv[] = {"python3", "-c", RACER, NULL};
    sbx_exec_opts o = {.argv = argv};
    char pid[128];
    sbx_error err;
    cr_assert_eq(sbx_process_start(c, id, &o, "racer", pid, &err), 0, "%s", err.message);
    for (int i = 0; i < 200; i++) {
        tcall t = fcall(c, id, "file.exists", json_pack("{s:s}", "path", "/workspace/rc/ready"));
        bool ready = t.rc == 0 && jbool(t.res, "exists") == 1;
        tc_free(&t);
        if (ready)
            break;
        tsleep_ms(50);
    }
    static const char *const reads[] = {"/workspace/rc/x/environ", "/workspace/rc/x/mem",
                                        "/workspace/rc/x/status", "/workspace/rc/x/fd/3"};
    int decoy = 0, refused = 0, other_err = 0, listed = 0, list_refused = 0, writes = 0;
    int watched = 0, watch_refused = 0;
    double until = test_now_ms() + 6000;
    for (int i = 0; test_now_ms() < until; i++) {
        const char *path = reads[i % SBX_ARRAY_LEN(reads)];
        tcall t = fcall(c, id, "file.read", json_pack("{s:s}", "path", path));
        if (t.rc == 0) {
            sbx_str got = tc_bin(&t, "content");
            cr_expect(got.n == 6 && !memcmp(got.p, "decoy\n", 6),
                      "file.read %s returned something else than the decoy: %.*s", path,
                      (int)SBX_MIN(got.n, (size_t)300), got.p);
            decoy++;
        } else if (!strcmp(t.err.code, "PERMISSION_DENIED")) {
            refused++;
        } else {
            other_err++;
        }
        tc_free(&t);
        /* A write aimed at the agent's memory or status through the link. */
        t = fcall(c, id, "file.write",
                  json_pack("{s:s, s:s}", "path", i % 2 ? "/workspace/rc/x/mem" : "/workspace/rc/x/status",
                            "content", "decoy\n"));
        writes += t.rc == 0;
        tc_free(&t);
        t = fcall(c, id, "file.list", json_pack("{s:s}", "path", "/workspace/rc/x"));
        if (t.rc == 0) {
            size_t k;
            json_t *e;
            json_array_foreach(jget(t.res, "files"), k, e) {
                const char *name = jstr(e, "name");
                cr_expect(!strcmp(name, "environ") || !strcmp(name, "mem") ||
                              !strcmp(name, "status") || !strcmp(name, "fd"),
                          "file.list listed '%s': the race reached procfs", name);
            }
            listed++;
        } else {
            list_refused++;
        }
        tc_free(&t);
        /* A recursive watch: the decoy tree has two directories (x, x/fd);
         * the agent's /proc/1 has dozens. */
        if (i % 4 == 0) {
            t = fcall(c, id, "file.watch", json_pack("{s:s}", "path", "/workspace/rc/x"));
            if (t.rc == 0) {
                cr_expect(jint(t.res, "directories") <= 2,
                          "file.watch put %lld watches: the race reached procfs",
                          jint(t.res, "directories"));
                tcall sc = fcall(c, id, "stream.cancel",
                                 json_pack("{s:s}", "streamId", jstr(t.res, "streamId")));
                tc_free(&sc);
                watched++;
            } else {
                watch_refused++;
            }
            tc_free(&t);
        }
    }
    tcall t = fcall(c, id, "file.write", json_pack("{s:s, s:s}", "path", "/workspace/rc/stop",
                                                    "content", "1"));
    tc_ok(t, "file.write stop");
    tc_free(&t);
    t = tc_call(c, "process.waitForExit", id,
                json_pack("{s:s, s:i}", "processId", "racer", "timeout", 30000), 0);
    tc_ok(t, "process.waitForExit");
    tc_free(&t);
    cr_log_info("race: %d decoy reads, %d refused, %d other errors, %d writes, %d listings, "
                "%d refused listings, %d watches, %d refused watches",
                decoy, refused, other_err, writes, listed, list_refused, watched, watch_refused);
    /* The race was live: both states were seen. */
    cr_expect(decoy > 0 && refused > 0, "the race never flipped (decoy %d, refused %d)", decoy,
              refused);
    /* The agent is the same process and healthy. */
    char *s = sh_out(c, id, "echo alive");
    cr_expect_str_eq(s, "alive\n");
    free(s);
    sb = ts_status(c, id);
    cr_expect_eq(jint(sb, "container.pid"), agent, "the agent was replaced");
    cr_expect_eq(jint(sb, "restarts"), 0);
    json_decref(sb);
    DONE();
}

/* ---------------------------------------------------------------------------------- */
/* 8. File descriptors. */

/* The fds of a fresh python: listing /proc/self/fd opens one more fd, gone
 * by the time it is resolved ("closed"). */
#define FDS_PY                                                                               \
    "import json, os\n"                                                                       \
    "def rl(f):\n"                                                                            \
    "    try:\n"                                                                              \
    "        return os.readlink('/proc/self/fd/' + f)\n"                                      \
    "    except OSError:\n"                                                                   \
    "        return 'closed'\n"                                                               \
    "print(json.dumps({f: rl(f) for f in os.listdir('/proc/self/fd')}))"
static const char FDS[] = "python3 -c \"" FDS_PY "\"";

static void
check_fds(const char *where, const char *json)
{
    json_error_t je;
    json_t *j = json_loads(json, 0, &je);
    cr_assert(j != NULL, "%s: %s", where, json);
    /* 0, 1, 2 and the directory python itself opened for the listing. */
    cr_expect_eq(json_object_size(j), 4, "%s: fds %s", where, json);
    cr_expect(!strcmp(jstr(j, "0"), "/dev/null") || !strncmp(jstr(j, "0"), "pipe:", 5),
              "%s: stdin is %s", where, jstr(j, "0"));
    cr_expect(!strncmp(jstr(j, "1"), "pipe:", 5), "%s: stdout is %s", where, jstr(j, "1"));
    cr_expect(!strncmp(jstr(j, "2"), "pipe:", 5), "%s: stderr is %s", where, jstr(j, "2"));
    cr_expect_str_eq(jstr(j, "3"), "closed", "%s: fd 3 is %s", where, jstr(j, "3"));
    json_decref(j);
}

/* (dev, ino) of what /proc/<pid>/fd/<fd> names; false if it is gone. */
static bool
fd_identity(pid_t pid, const char *fd, dev_t *dev, ino_t *ino, char *link, size_t linklen)
{
    char path[96];
    struct stat st;
    snprintf(path, sizeof(path), "/proc/%d/fd/%s", (int)pid, fd);
    if (stat(path, &st) != 0)
        return false;
    ssize_t k = readlink(path, link, linklen - 1);
    link[k > 0 ? k : 0] = '\0';
    *dev = st.st_dev;
    *ino = st.st_ino;
    return true;
}

/*
 * Seen from the host: the agent (PID 1 of the sandbox, tenant-level by the
 * threat model) holds nothing the shard that started it holds, but for its
 * stderr (the shard's log stream, by design) and /dev/null: not the shard's
 * LMDB files, its etcd or client sockets, nor pipes the daemon inherited.
 * Compared by (st_dev, st_ino) of every fd of both processes (files, pipes,
 * sockets); the shard is the agent's parent on the host.
 */
Test(escape, the_agent_holds_none_of_the_shards_files)
{
    SANDBOX("agentfds");
    char *s = sh_out(c, id, "true");
    free(s);
    json_t *sb = ts_status(c, id);
    pid_t agent = (pid_t)jint(sb, "container.pid");
    json_decref(sb);
    cr_assert(agent > 1, "no container pid in status");
    char path[64], *buf = NULL;
    size_t n;
    snprintf(path, sizeof(path), "/proc/%d/status", (int)agent);
    cr_assert_eq(sbx_fs_read(path, 1 << 16, &buf, &n), 0);
    const char *pp = strstr(buf, "\nPPid:");
    pid_t shard = pp ? (pid_t)atoi(pp + 6) : -1;
    free(buf);
    cr_assert(shard > 1, "no parent of the agent");
    /* Every identity the shard holds open. */
    struct held { dev_t dev; ino_t ino; } *held = NULL;
    size_t nheld = 0, cap = 0;
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)shard);
    DIR *d = opendir(path);
    cr_assert(d, "cannot list the shard's fds (%s)", path);
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        char link[256];
        dev_t dev;
        ino_t ino;
        if (de->d_name[0] == '.' || !fd_identity(shard, de->d_name, &dev, &ino, link, sizeof(link)))
            continue;
        if (nheld == cap)
            held = realloc(held, (cap = cap ? 2 * cap : 64) * sizeof(*held));
        held[nheld++] = (struct held){dev, ino};
    }
    closedir(d);
    cr_assert_gt(nheld, 3, "the shard (pid %d) holds almost nothing: not the shard?", (int)shard);
    snprintf(path, sizeof(path), "/proc/%d/fd", (int)agent);
    d = opendir(path);
    cr_assert(d, "cannot list the agent's fds");
    int checked = 0;
    while ((de = readdir(d)) != NULL) {
        char link[256];
        dev_t dev;
        ino_t ino;
        if (de->d_name[0] == '.' || !fd_identity(agent, de->d_name, &dev, &ino, link, sizeof(link)))
            continue;
        checked++;
        cr_expect(!strstr(link, ".mdb"), "agent fd %s is the shard's store: %s", de->d_name, link);
        /* anon_inode files (eventfd, epoll, signalfd, …) all share one
         * inode: their identity cannot be compared this way. */
        if (!strcmp(de->d_name, "2") || !strcmp(link, "/dev/null") ||
            !strncmp(link, "anon_inode:", 11))
            continue;
        for (size_t i = 0; i < nheld; i++)
            cr_expect(!(held[i].dev == dev && held[i].ino == ino),
                      "agent fd %s (%s) is also open in the shard (pid %d)", de->d_name, link,
                      (int)shard);
    }
    closedir(d);
    free(held);
    cr_assert_gt(checked, 2, "the agent has almost no fds: not the agent?");
    DONE();
}

Test(escape, no_file_descriptors_leak_into_the_sandbox)
{
    SANDBOX("fds");
    char *s = sh_out(c, id, FDS);
    check_fds("session command", s);
    free(s);
    sbx_exec_opts o = {.command = FDS, .sessionless = true};
    sbx_exec_result r = tsh_opts(c, id, &o);
    check_fds("sessionless command", r.stdout_data);
    sbx_exec_result_free(&r);
    const char *argv[] = {"python3", "-c", FDS_PY, NULL};
    sbx_exec_opts oa = {.argv = argv, .sessionless = true, .stdin_data = "x", .stdin_len = 1,
                        .has_stdin = true};
    r = tsh_opts(c, id, &oa);
    check_fds("argv command with stdin", r.stdout_data);
    sbx_exec_result_free(&r);
    char pid[128];
    sbx_error err;
    sbx_exec_opts op = {.command = FDS};
    cr_assert_eq(sbx_process_start(c, id, &op, "fds", pid, &err), 0, "%s", err.message);
    tcall w = tc_call(c, "process.waitForExit", id,
                      json_pack("{s:s, s:i}", "processId", "fds", "timeout", 20000), 0);
    tc_ok(w, "process.waitForExit");
    tc_free(&w);
    tcall lg = tc_call(c, "process.logs", id, json_pack("{s:s}", "processId", "fds"), 0);
    tc_ok(lg, "process.logs");
    sbx_str out = tc_bin(&lg, "stdout");
    char *copy = strndup(out.p, out.n);
    check_fds("background process", copy);
    free(copy);
    tc_free(&lg);
    /* No process of the sandbox but PID 1 holds a socket (the channel to the
     * shard is the agent's alone), and every fd that names a file names one
     * that exists inside: nothing opened on the host side was inherited. */
    json_t *j = py(c, id,
                   "bad = []\n"
                   "for p in os.listdir('/proc'):\n"
                   "    if not p.isdigit() or p == '1':\n"
                   "        continue\n"
                   "    try:\n"
                   "        fds = os.listdir('/proc/%s/fd' % p)\n"
                   "    except OSError:\n"
                   "        continue\n"
                   "    for f in fds:\n"
                   "        try:\n"
                   "            t = os.readlink('/proc/%s/fd/%s' % (p, f))\n"
                   "            st = os.stat('/proc/%s/fd/%s' % (p, f))\n"
                   "        except OSError:\n"
                   "            continue\n"
                   "        if t.startswith('socket:'):\n"
                   "            bad.append([p, f, t])\n"
                   "        elif t.startswith('/'):\n"
                   "            try:\n"
                   "                st2 = os.stat(t.replace(' (deleted)', ''))\n"
                   "                same = (st2.st_dev, st2.st_ino) == (st.st_dev, st.st_ino)\n"
                   "            except OSError:\n"
                   "                same = False\n"
                   "            if not same and not t.endswith(' (deleted)'):\n"
                   "                bad.append([p, f, t])\n"
                   "print(json.dumps({'bad': bad}))\n");
    char *bad = json_dumps(jget(j, "bad"), JSON_COMPACT);
    cr_expect_str_eq(bad, "[]", "fds from outside the sandbox: %s", bad);
    free(bad);
    json_decref(j);
    DONE();
}
