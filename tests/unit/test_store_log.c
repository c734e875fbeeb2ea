/*
 * test_store_log.c — the store's redo log (runtime/store_log.h,
 * runtime/store.h sbx_store_put_logged): writes committed through it
 * survive a crash before they reach LMDB, and nothing it holds ever comes
 * back over a newer value.
 *
 * A crash is a child process that opens the store, writes, waits for its
 * writes to be decided (acknowledged) and _exit()s without closing it.  The
 * log delay is set to a minute, so the writes are in the log and not in
 * LMDB when the child dies: the test reads LMDB directly (liblmdb, before
 * the store opens it again) to check that, then opens the store — which
 * replays the log — and reads the values back.
 *
 * Covers: acknowledged logged writes (and lazy writes in their batches)
 * replayed after a crash; a torn last group dropped, the groups before it
 * replayed; a log cut short or full of garbage; groups of an earlier pass
 * (still whole on disk after the log started again at offset 0) never
 * applied over a newer value, from an earlier open or the same one; a
 * group forged inside a logged value never replayed; a logged write LMDB
 * cannot take failing a read of its table and kept for the next open; a read seeing a logged write at once; a batch with a plain write
 * going to LMDB, and a key LMDB refuses kept out of the log; a failed
 * append going through LMDB, its group never replayed; a failed append
 * whose LMDB transaction fails too answered as failed only after a new
 * pass, or the process stopped unanswered when no pass can commit, and
 * no stop for a group never written; no room for the log at open; a clean close leaving everything in LMDB.
 *
 * Every test works in its own mkdtemp directory under /tmp, removed by the
 * fixture's fini even when an assertion fails; each child is reaped.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <xxhash.h>

#include "runtime/err.h"
#include "runtime/store.h"
#include "runtime/util.h"

#define MAPSIZE (64ull << 20)

static char tmpdir[64];
static char datadir[96];
static sbx_store *st;
/* The next fail_syncs fdatasync(2) calls of the redo log fail with EIO
 * (linked with --wrap=fdatasync: LMDB's calls are inside liblmdb.so). */
static atomic_int fail_syncs;

int __real_fdatasync(int fd);
int __wrap_fdatasync(int fd);

int
__wrap_fdatasync(int fd)
{
    if (atomic_load(&fail_syncs) > 0) {
        atomic_fetch_sub(&fail_syncs, 1);
        errno = EIO;
        return -1;
    }
    return __real_fdatasync(fd);
}

/* The next fail_commits mdb_txn_commit calls of the store fail with EIO
 * (the transaction aborted, as a failed commit leaves it); the store's own
 * pwrite(2) calls (the redo log's: LMDB's are inside liblmdb.so) fail with
 * ENOSPC while pwrite_mode is PW_NOSPC, and those of 4 bytes (the zeroing
 * of a failed group's magic) with EIO while it is PW_KEEP_GROUP — the
 * group stays whole, as it may be on disk after a power loss: --wrap too. */
enum { PW_OK, PW_NOSPC, PW_KEEP_GROUP };
static atomic_int fail_commits;
static atomic_int pwrite_mode;

int __real_mdb_txn_commit(MDB_txn *txn);
int __wrap_mdb_txn_commit(MDB_txn *txn);
ssize_t __real_pwrite(int fd, const void *buf, size_t n, off_t off);
ssize_t __wrap_pwrite(int fd, const void *buf, size_t n, off_t off);

int
__wrap_mdb_txn_commit(MDB_txn *txn)
{
    if (atomic_load(&fail_commits) > 0) {
        atomic_fetch_sub(&fail_commits, 1);
        mdb_txn_abort(txn);
        return EIO;
    }
    return __real_mdb_txn_commit(txn);
}

ssize_t
__wrap_pwrite(int fd, const void *buf, size_t n, off_t off)
{
    int mode = atomic_load(&pwrite_mode);
    if (mode == PW_NOSPC || (mode == PW_KEEP_GROUP && n == 4)) {
        errno = mode == PW_NOSPC ? ENOSPC : EIO;
        return -1;
    }
    return __real_pwrite(fd, buf, n, off);
}

static void
setup(void)
{
    snprintf(tmpdir, sizeof(tmpdir), "/tmp/sbx-test-slog-XXXXXX");
    cr_assert_not_null(mkdtemp(tmpdir), "mkdtemp: %s", strerror(errno));
    snprintf(datadir, sizeof(datadir), "%s/data", tmpdir);
    st = NULL;
}

static void
teardown(void)
{
    if (st)
        sbx_store_close(st);
    st = NULL;
    if (tmpdir[0]) {
        int rc = sbx_rm_rf(tmpdir);
        cr_expect_eq(rc, 0, "removing %s: %s", tmpdir, strerror(-rc));
    }
}

TestSuite(store_log, .init = setup, .fini = teardown, .timeout = 120);

/* In a child: open the store; abort the child on failure. */
static sbx_store *
child_open(void)
{
    sbx_store *s = NULL;
    if (sbx_store_open(&s, datadir, MAPSIZE, 0, NULL, NULL) != 0)
        _exit(10);
    sbx_store_set_log_delay(s, 60000);
    return s;
}

/* In a child: a logged write of key=val, waited for (one batch each). */
static void
child_logged(sbx_store *s, const char *key, const char *val)
{
    uint64_t q = sbx_store_put_logged(s, SBX_DB_IDEM, key, strlen(key), val, strlen(val));
    if (sbx_store_wait(s, q) != 0)
        _exit(11);
}

/* In a child: a plain (LMDB) write of key=val, waited for. */
static void
child_plain(sbx_store *s, const char *key, const char *val)
{
    uint64_t q = sbx_store_put(s, SBX_DB_IDEM, key, strlen(key), val, strlen(val));
    if (sbx_store_wait(s, q) != 0)
        _exit(12);
}

/* In a child: the crash, after checking that the log took `groups` batches. */
static void
child_crash(sbx_store *s, uint64_t groups)
{
    _exit(sbx_store_logged(s) == groups ? 0 : 13);
}

static void
reap(pid_t pid)
{
    int ws = 0;
    cr_assert_eq(waitpid(pid, &ws, 0), pid, "waitpid: %s", strerror(errno));
    cr_assert(WIFEXITED(ws) && WEXITSTATUS(ws) == 0,
              "the writing child failed (status %d; 10 open, 11 logged write, 12 plain write, "
              "13 batches through the log not as expected)",
              WIFEXITED(ws) ? WEXITSTATUS(ws) : -WTERMSIG(ws));
}

/* A child that writes each pair of kv (key, value, …, NULL) as a logged
 * write, one batch each, and crashes; reaped. */
static void
crash_after_logged(const char *const *kv)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        sbx_store *s = child_open();
        uint64_t n = 0;
        for (; kv[0]; kv += 2, n++)
            child_logged(s, kv[0], kv[1]);
        child_crash(s, n);
    }
    reap(pid);
}

/* The value of key in the idem database as LMDB alone holds it (read with
 * liblmdb, the store closed), or NULL; heap, caller frees. */
static char *
lmdb_value(const char *key)
{
    MDB_env *env = NULL;
    MDB_txn *txn = NULL;
    MDB_dbi dbi;
    char *out = NULL;
    cr_assert_eq(mdb_env_create(&env), 0);
    mdb_env_set_maxdbs(env, 8);
    int rc = mdb_env_open(env, datadir, MDB_RDONLY, 0600);
    cr_assert_eq(rc, 0, "mdb_env_open: %s", mdb_strerror(rc));
    cr_assert_eq(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), 0);
    if (mdb_dbi_open(txn, "idem", 0, &dbi) == 0) {
        MDB_val k = {strlen(key), (void *)key}, v;
        if (mdb_get(txn, dbi, &k, &v) == 0)
            out = sbx_xstrndup(v.mv_data, v.mv_size);
    }
    mdb_txn_abort(txn);
    mdb_env_close(env);
    return out;
}

static void
open_store(void)
{
    int rc = sbx_store_open(&st, datadir, MAPSIZE, 0, NULL, NULL);
    cr_assert_eq(rc, 0, "sbx_store_open: %d %s", rc, sbx_err_message(rc));
}

/* The store's value of key (open), or NULL; heap, caller frees. */
static char *
store_value(const char *key)
{
    char *v = NULL;
    size_t vn = 0;
    int rc = sbx_store_get(st, SBX_DB_IDEM, key, strlen(key), &v, &vn);
    if (rc == -ENOENT)
        return NULL;
    cr_assert_eq(rc, 0, "get %s: %d %s", key, rc, sbx_err_message(rc));
    return v;
}

static void
expect_store(const char *key, const char *want)
{
    char *v = store_value(key);
    if (!want)
        cr_expect_null(v, "%s: '%s', want none", key, v);
    else if (!v)
        cr_expect_fail("%s: none, want '%s'", key, want);
    else
        cr_expect_str_eq(v, want, "%s", key);
    free(v);
}

static char *
log_path(void)
{
    static char p[128];
    snprintf(p, sizeof(p), "%s/redo.log", datadir);
    return p;
}

/* The offset of group i (0-based) of the log, read from the headers. */
static size_t
group_offset(int fd, int i)
{
    size_t off = 0;
    for (int g = 0; g < i; g++) {
        unsigned char h[8];
        cr_assert_eq(pread(fd, h, 8, (off_t)off), 8);
        cr_assert_eq(h[0] | h[1] << 8 | h[2] << 16 | (unsigned)h[3] << 24, 0x4c584253u,
                     "group %d has no magic", g);
        off += h[4] | h[5] << 8 | h[6] << 16 | (size_t)h[7] << 24;
    }
    return off;
}

Test(store_log, acknowledged_logged_writes_survive_a_crash_before_their_lmdb_transaction)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        sbx_store *s = child_open();
        char k[32], v[32];
        for (int i = 0; i < 20; i++) {
            snprintf(k, sizeof(k), "intent-%02d", i);
            snprintf(v, sizeof(v), "value-%02d", i);
            child_logged(s, k, v);
        }
        /* A lazy write rides with the next logged one, in the same group
         * (the hold keeps both queued until both are there). */
        sbx_store_hold(s);
        sbx_store_put_lazy_after(s, SBX_DB_IDEM, "reply-00", 8, "lazy", 4, 0);
        uint64_t q = sbx_store_put_logged(s, SBX_DB_IDEM, "intent-20", 9, "value-20", 8);
        sbx_store_release(s);
        if (sbx_store_wait(s, q) != 0)
            _exit(11);
        child_crash(s, 21);
    }
    reap(pid);
    char *raw = lmdb_value("intent-00");
    cr_expect_null(raw, "the write reached LMDB before the crash: the log was not what kept it");
    free(raw);
    open_store();
    char k[32], v[32];
    for (int i = 0; i <= 20; i++) {
        snprintf(k, sizeof(k), "intent-%02d", i);
        snprintf(v, sizeof(v), "value-%02d", i);
        expect_store(k, v);
    }
    expect_store("reply-00", "lazy");
    sbx_store_close(st);
    st = NULL;
    /* Replayed into LMDB itself, not only read back. */
    raw = lmdb_value("intent-20");
    cr_expect(raw && !strcmp(raw, "value-20"), "after the replay LMDB holds '%s'", raw);
    free(raw);
}

Test(store_log, a_torn_last_group_is_dropped_and_the_groups_before_it_replayed)
{
    crash_after_logged((const char *[]){"a", "1", "b", "2", "c", "3", NULL});
    /* A write of the last group that reached the disk only in part: one
     * byte of its entry's value differs. */
    int fd = open(log_path(), O_RDWR | O_CLOEXEC);
    cr_assert_geq(fd, 0, "%s: %s", log_path(), strerror(errno));
    size_t off = group_offset(fd, 2) + 32 + 16 + 1; /* header, entry's fixed part, key "c" */
    char c = '9';
    cr_assert_eq(pwrite(fd, &c, 1, (off_t)off), 1);
    close(fd);
    open_store();
    expect_store("a", "1");
    expect_store("b", "2");
    expect_store("c", NULL);
}

Test(store_log, a_log_cut_short_or_full_of_garbage_opens_without_replaying_it)
{
    crash_after_logged((const char *[]){"a", "1", "b", "2", NULL});
    /* Cut in the middle of the second group. */
    int fd = open(log_path(), O_RDWR | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    cr_assert_eq(ftruncate(fd, (off_t)group_offset(fd, 1) + 20), 0);
    close(fd);
    open_store();
    expect_store("a", "1");
    expect_store("b", NULL);
    struct stat sb;
    cr_assert_eq(stat(log_path(), &sb), 0);
    cr_expect_eq(sb.st_size, 1 << 20, "the log was not extended back to its size");
    sbx_store_close(st);
    st = NULL;

    /* Garbage where the log was: nothing to replay, and the store works. */
    fd = open(log_path(), O_WRONLY | O_TRUNC | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    char junk[8192];
    for (size_t i = 0; i < sizeof(junk); i++)
        junk[i] = (char)(i * 7 + 3);
    cr_assert_eq(write(fd, junk, sizeof(junk)), (ssize_t)sizeof(junk));
    close(fd);
    open_store();
    expect_store("a", "1");
    uint64_t q = sbx_store_put_logged(st, SBX_DB_IDEM, "c", 1, "3", 1);
    cr_assert_eq(sbx_store_wait(st, q), 0);
    expect_store("c", "3");
    cr_expect_eq(sbx_store_logged(st), 1, "the log took no batch after the garbage");
}

/* Every open starts a new pass.  Groups of an earlier open are still whole
 * on disk behind the new ones, with higher sequence numbers than the new
 * groups (sequence numbers start again at each open): one of them must
 * not be replayed over the value a later open logged. */
Test(store_log, a_group_of_an_earlier_open_never_comes_back_over_a_newer_value)
{
    /* open 1: k (seq 1, offset 0) and x (seq 2, offset 56) in the log */
    crash_after_logged((const char *[]){"k", "1", "x", "old", NULL});
    /* open 2: replays both, then x = new (seq 1, a group the size of open
     * 1's first, at offset 0); open 1's group of x is whole at 56 */
    crash_after_logged((const char *[]){"x", "new", NULL});
    open_store();
    expect_store("k", "1");
    expect_store("x", "new");
}

/* A group stays whole on disk after LMDB took its write and a later one
 * changed the value: neither a read nor a replay after a crash brings the
 * logged value back. */
Test(store_log, a_logged_write_applied_and_then_overwritten_never_comes_back)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        sbx_store *s = child_open();
        child_logged(s, "k", "1");
        child_plain(s, "k", "2"); /* one transaction: k = 1, then k = 2 */
        char *v = NULL;
        size_t vn = 0;
        if (sbx_store_get(s, SBX_DB_IDEM, "k", 1, &v, &vn) != 0 || vn != 1 || v[0] != '2')
            _exit(14);
        free(v);
        child_crash(s, 1);
    }
    reap(pid);
    open_store();
    expect_store("k", "2");
}

/* A recorded reply holds what a sandbox printed.  Bytes in it that look
 * like a group — checksummed the way anyone can (the pass unknown to them:
 * 0 here) — stand where the next pass's last group ends: the scan must not
 * take them (before the pass, one could write any record into any table of
 * the store this way). */
Test(store_log, a_group_forged_inside_a_logged_value_is_never_replayed)
{
    /* The forged group: one entry putting "forged" into the sandboxes
     * table, sequence numbers far above the real ones. */
    char forged[128] = {0};
    size_t fn = 32 + ((16 + 6 + 3 + 7) & ~(size_t)7);
    forged[0] = 0x53, forged[1] = 0x42, forged[2] = 0x58, forged[3] = 0x4c; /* magic */
    forged[4] = (char)fn;
    forged[8 + 1] = 0x10;  /* first = 4096 */
    forged[16 + 1] = 0x10; /* last = 4096 */
    char *e = forged + 32;
    e[0] = SBX_DB_SANDBOXES;
    e[2] = 6;              /* key bytes */
    e[4] = 3;              /* value bytes */
    e[8 + 1] = 0x10;       /* seq = 4096 */
    memcpy(e + 16, "forged", 6);
    memcpy(e + 22, "bad", 3);
    uint64_t sum = XXH3_64bits_withSeed(forged + 32, fn - 32, XXH3_64bits_withSeed(forged, 24, 0));
    for (int i = 0; i < 8; i++)
        forged[24 + i] = (char)(sum >> (8 * i));

    /* The second pass's group: key "b" (1 byte) and a 200-byte value:
     * 32 + 16 + 1 + 200 → 256 bytes after padding.  The first pass's group
     * (key "a") holds the forged bytes at its value's offset 256 - 49. */
    static char big[1000], small[201];
    memset(big, 'v', sizeof(big) - 1);
    memcpy(big + 256 - 49, forged, fn);
    big[sizeof(big) - 1] = '\0';
    memset(small, 's', sizeof(small) - 1);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        sbx_store *s = child_open();
        uint64_t q = sbx_store_put_logged(s, SBX_DB_IDEM, "a", 1, big, sizeof(big) - 1);
        if (sbx_store_wait(s, q) != 0)
            _exit(11);
        child_plain(s, "p", "1"); /* LMDB takes "a"; the log starts again at 0 */
        child_logged(s, "b", small);
        child_crash(s, 2);
    }
    reap(pid);
    /* The forged bytes are where the scan goes after the second pass. */
    int fd = open(log_path(), O_RDONLY | O_CLOEXEC);
    cr_assert_geq(fd, 0);
    char got[4];
    cr_assert_eq(pread(fd, got, 4, (off_t)group_offset(fd, 1)), 4);
    close(fd);
    cr_assert_arr_eq(got, forged, 4, "the test's layout is off: no forged magic at the chain's end");
    open_store();
    expect_store("b", small);
    char *v = NULL;
    size_t vn = 0;
    cr_expect_eq(sbx_store_get(st, SBX_DB_SANDBOXES, "forged", 6, &v, &vn), -ENOENT,
                 "a record forged inside a logged value was replayed: '%s'", v ? v : "");
    free(v);
}

/* An append whose flush fails: the batch goes through LMDB instead, the
 * log takes nothing more, and the group — whole in the page cache, as it
 * may be on disk — is never replayed over a later value. */
Test(store_log, a_failed_append_goes_through_lmdb_and_its_group_never_comes_back)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        sbx_store *s = child_open();
        atomic_store(&fail_syncs, 1);
        child_logged(s, "k", "1"); /* the append fails; LMDB commits it */
        child_plain(s, "k", "2");
        child_logged(s, "j", "3"); /* the log is broken: LMDB again */
        child_crash(s, 0);
    }
    reap(pid);
    open_store();
    expect_store("k", "2");
    expect_store("j", "3");
}

/* An append whose flush fails (its group left whole, as it may be on disk
 * after a power loss), then the LMDB transaction that commits its batch
 * instead fails too: before the write is answered as failed, the pass is
 * replaced in a transaction of its own, so the group never checks out
 * again — the write is not there after a crash that follows at once. */
Test(store_log, a_failed_append_and_a_failed_transaction_answer_failed_only_after_a_new_pass)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        sbx_store *s = child_open();
        child_plain(s, "j", "2");
        atomic_store(&pwrite_mode, PW_KEEP_GROUP);
        atomic_store(&fail_syncs, 1);
        atomic_store(&fail_commits, 1);
        uint64_t q = sbx_store_put_logged(s, SBX_DB_IDEM, "k", 1, "1", 1);
        if (sbx_store_wait(s, q) == 0)
            _exit(20); /* it could not have been committed */
        child_crash(s, 0); /* no commit after the answer */
    }
    reap(pid);
    open_store();
    expect_store("k", NULL);
    expect_store("j", "2");
}

/* The same, with LMDB unable to commit anything after the failed append:
 * the pass cannot be replaced, so the process stops (abort) rather than
 * answer the write as failed — it is never answered. */
Test(store_log, a_failed_append_the_store_cannot_fence_stops_the_process_unanswered)
{
    int fds[2];
    cr_assert_eq(pipe(fds), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(fds[0]);
        sbx_store *s = child_open();
        atomic_store(&pwrite_mode, PW_KEEP_GROUP);
        atomic_store(&fail_syncs, 1);
        atomic_store(&fail_commits, 1000);
        uint64_t q = sbx_store_put_logged(s, SBX_DB_IDEM, "k", 1, "1", 1);
        int rc = sbx_store_wait(s, q);
        char c = rc == 0 ? 'y' : 'n';
        (void)!write(fds[1], &c, 1); /* answered: the test fails */
        _exit(0);
    }
    close(fds[1]);
    char c = 0;
    ssize_t r = read(fds[0], &c, 1);
    close(fds[0]);
    int ws = 0;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    cr_expect_eq(r, 0, "the write was answered (%c) with its group maybe whole under the pass", c);
    cr_expect(WIFSIGNALED(ws) && WTERMSIG(ws) == SIGABRT, "the child was not stopped (status %d)",
              WIFEXITED(ws) ? WEXITSTATUS(ws) : -WTERMSIG(ws));
    open_store(); /* the store opens after the stop */
    char *v = store_value("k"); /* unanswered: there or not, never a torn value */
    if (v)
        cr_expect_str_eq(v, "1");
    free(v);
}

/* A group the log could not even write (pwrite fails: ENOSPC) cannot be
 * whole on disk: with LMDB failing too, its write is answered as failed
 * and the process goes on (no stop), and the write is not there later. */
Test(store_log, a_group_never_written_is_answered_failed_without_a_stop)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        sbx_store *s = child_open();
        atomic_store(&pwrite_mode, PW_NOSPC);
        atomic_store(&fail_commits, 1000);
        uint64_t q = sbx_store_put_logged(s, SBX_DB_IDEM, "k", 1, "1", 1);
        int rc = sbx_store_wait(s, q);
        atomic_store(&pwrite_mode, PW_OK);
        atomic_store(&fail_commits, 0);
        if (rc == 0)
            _exit(20); /* it could not have been committed */
        child_plain(s, "j", "2");
        child_crash(s, 0);
    }
    reap(pid);
    open_store();
    expect_store("k", NULL);
    expect_store("j", "2");
}

/* No room to create the log (its zero fill fails with ENOSPC): the store
 * opens without it, and a logged write goes through LMDB — it is in LMDB
 * when the process crashes, and no batch went to the log. */
Test(store_log, no_room_for_the_log_at_open_sends_logged_writes_through_lmdb)
{
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        atomic_store(&pwrite_mode, PW_NOSPC);
        sbx_store *s = child_open();
        atomic_store(&pwrite_mode, PW_OK);
        child_logged(s, "k", "1");
        child_crash(s, 0);
    }
    reap(pid);
    char *v = lmdb_value("k");
    cr_expect(v && strcmp(v, "1") == 0, "LMDB holds '%s', want '1'", v ? v : "(none)");
    free(v);
    open_store(); /* the log is created now that there is room */
    sbx_store_set_log_delay(st, 60000);
    uint64_t q = sbx_store_put_logged(st, SBX_DB_IDEM, "j", 1, "2", 1);
    cr_assert_eq(sbx_store_wait(st, q), 0);
    cr_expect_eq(sbx_store_logged(st), 1, "the log was not created at the next open");
    expect_store("k", "1");
}

/* LMDB full: a logged write is still acknowledged (the log has room), a
 * read of its table fails with STORAGE_FULL (it cannot see the write), a
 * clean close cannot apply it, and the write is kept — replayed, after the
 * map grows, by the next open.  (That no LMDB write goes ahead of it is
 * a_logged_write_applied_and_then_overwritten_never_comes_back's.) */
Test(store_log, a_logged_write_that_lmdb_cannot_take_is_kept_for_the_next_open)
{
    int rc = sbx_store_open(&st, datadir, 4ull << 20, 0, NULL, NULL);
    cr_assert_eq(rc, 0);
    sbx_store_set_log_delay(st, 60000);
    /* Filled with 64 KiB values, then 3,000-byte ones, until neither fits:
     * no transaction commits after that, so LMDB frees no page, and a
     * 4,000-byte value cannot fit either. */
    static char chunk[64 << 10];
    memset(chunk, 'f', sizeof(chunk));
    const size_t sizes[] = {sizeof(chunk), 3000};
    int n = 0;
    for (int z = 0; z < 2; z++) {
        int fails = 0;
        while (fails < 3 && n < 5000) {
            char k[16];
            snprintf(k, sizeof(k), "fill-%04d", n++);
            fails = sbx_store_wait(st, sbx_store_put(st, SBX_DB_SANDBOXES, k, strlen(k), chunk,
                                                     sizes[z])) != 0
                        ? fails + 1
                        : 0;
        }
        cr_assert_lt(n, 5000, "a 4 MiB map never filled");
    }
    static char val[4000];
    memset(val, 'y', sizeof(val) - 1);
    uint64_t q = sbx_store_put_logged(st, SBX_DB_IDEM, "kept", 4, val, sizeof(val) - 1);
    cr_assert_eq(sbx_store_wait(st, q), 0, "the log did not take the write");
    char *v = NULL;
    size_t vn = 0;
    cr_expect_eq(sbx_store_get(st, SBX_DB_IDEM, "kept", 4, &v, &vn), SBX_E_STORAGE_FULL,
                 "a read of the table with a write LMDB cannot take");
    free(v);
    sbx_store_close(st); /* its apply fails too: the write stays in the log */
    st = NULL;
    rc = sbx_store_open(&st, datadir, 4ull << 20, 64ull << 20, NULL, NULL);
    cr_assert_eq(rc, 0, "reopen with room to grow: %d %s", rc, sbx_err_message(rc));
    expect_store("kept", val);
}

Test(store_log, a_read_sees_a_logged_write_at_once_and_a_batch_with_a_plain_write_goes_to_lmdb)
{
    open_store();
    sbx_store_set_log_delay(st, 60000);
    uint64_t q = sbx_store_put_logged(st, SBX_DB_IDEM, "k", 1, "v", 1);
    cr_assert_eq(sbx_store_wait(st, q), 0);
    cr_expect_eq(sbx_store_logged(st), 1);
    expect_store("k", "v"); /* waits for its LMDB transaction */
    /* A logged write and a plain one in one batch: LMDB takes it. */
    sbx_store_hold(st);
    sbx_store_put_logged(st, SBX_DB_IDEM, "l", 1, "1", 1);
    q = sbx_store_put(st, SBX_DB_IDEM, "p", 1, "2", 1);
    sbx_store_release(st);
    cr_assert_eq(sbx_store_wait(st, q), 0);
    cr_expect_eq(sbx_store_logged(st), 1, "a batch with a plain write went to the log");
    /* A logged write too large for the log. */
    static char big[SBX_STORE_LOG_MAX_WRITE];
    memset(big, 'b', sizeof(big));
    q = sbx_store_put_logged(st, SBX_DB_IDEM, "big", 3, big, sizeof(big));
    cr_assert_eq(sbx_store_wait(st, q), 0);
    cr_expect_eq(sbx_store_logged(st), 1, "a write over SBX_STORE_LOG_MAX_WRITE went to the log");
    /* A key LMDB refuses (over 511 bytes): not taken by the log, failed
     * by LMDB as before. */
    static char longkey[600];
    memset(longkey, 'k', sizeof(longkey));
    q = sbx_store_put_logged(st, SBX_DB_IDEM, longkey, sizeof(longkey), "v", 1);
    cr_expect_neq(sbx_store_wait(st, q), 0, "a 600-byte key was acknowledged");
    cr_expect_eq(sbx_store_logged(st), 1, "a 600-byte key went to the log");
    expect_store("l", "1");
    expect_store("p", "2");
    /* A clean close leaves everything in LMDB. */
    q = sbx_store_put_logged(st, SBX_DB_IDEM, "m", 1, "3", 1);
    cr_assert_eq(sbx_store_wait(st, q), 0);
    cr_expect_eq(sbx_store_logged(st), 2);
    sbx_store_close(st);
    st = NULL;
    char *raw = lmdb_value("m");
    cr_expect(raw && !strcmp(raw, "3"), "after a clean close LMDB holds '%s'", raw);
    free(raw);
}
