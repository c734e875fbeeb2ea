/*
 * escape_util.c — the escape tests' shared probe prelude and probe calls
 * (escape_util.h).
 */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "escape_util.h"

/* ---------------------------------------------------------------------------------- */
/* The probe prelude (Python).  sc(nr, *args) makes a raw system call and
 * returns 'OK' or the errno name; in_child(fn) runs fn in a forked child and
 * returns its JSON result, or {'!signal': N} if the child was killed;
 * oracle(calls) runs each (label, nr, *args) under the TRACE filter above. */

const char PRELUDE[] =
    "import ctypes, errno, json, os, socket, struct, sys\n"
    "libc = ctypes.CDLL(None, use_errno=True)\n"
    "libc.syscall.restype = ctypes.c_long\n"
    "def en(e):\n"
    "    return errno.errorcode.get(e, str(e))\n"
    "def arg(x):\n"
    "    return ctypes.c_ulong(x & (2**64 - 1)) if isinstance(x, int) else x\n"
    "def sc(nr, *a):\n"
    "    ctypes.set_errno(0)\n"
    "    r = libc.syscall(ctypes.c_long(nr), *[arg(x) for x in a])\n"
    "    return 'OK' if r != -1 else en(ctypes.get_errno())\n"
    "def oserr(f, *a):\n"
    "    try:\n"
    "        f(*a)\n"
    "        return 'OK'\n"
    "    except OSError as e:\n"
    "        return en(e.errno) if e.errno else type(e).__name__\n"
    "def in_child(fn):\n"
    "    r, w = os.pipe()\n"
    "    pid = os.fork()\n"
    "    if pid == 0:\n"
    "        os.close(r)\n"
    "        try:\n"
    "            out = fn()\n"
    "        except BaseException as e:\n"
    "            out = {'!error': repr(e)}\n"
    "        os.write(w, json.dumps(out).encode())\n"
    "        os._exit(0)\n"
    "    os.close(w)\n"
    "    data = b''\n"
    "    while True:\n"
    "        b = os.read(r, 65536)\n"
    "        if not b:\n"
    "            break\n"
    "        data += b\n"
    "    os.close(r)\n"
    "    st = os.waitpid(pid, 0)[1]\n"
    "    if os.WIFSIGNALED(st):\n"
    "        return {'!signal': os.WTERMSIG(st)}\n"
    "    return json.loads(data) if data else {'!error': 'no output'}\n"
    /* BPF: A = seccomp_data.nr; for each n: if A == n return TRACE; return ALLOW. */
    "def trace_filter(nrs):\n"
    "    ins = [(0x20, 0, 0, 0)]\n"
    "    for n in nrs:\n"
    "        ins += [(0x15, 0, 1, n), (0x06, 0, 0, 0x7ff00000)]\n"
    "    ins.append((0x06, 0, 0, 0x7fff0000))\n"
    "    f = ctypes.create_string_buffer(b''.join(struct.pack('=HBBI', *i) for i in ins))\n"
    "    p = ctypes.create_string_buffer(struct.pack('=HxxxxxxQ', len(ins), ctypes.addressof(f)))\n"
    "    if libc.prctl(22, 2, p, 0, 0) != 0:\n"
    "        raise OSError(ctypes.get_errno(), 'prctl(PR_SET_SECCOMP)')\n"
    "    return (f, p)\n"
    "def oracle(calls):\n"
    "    def run():\n"
    "        keep = trace_filter(sorted({c[1] for c in calls}))\n"
    "        return {c[0]: sc(c[1], *c[2:]) for c in calls}\n"
    "    return in_child(run)\n";

/* py — run PRELUDE + body as a fresh python3 in sandbox `id`; it must exit 0
 * and print one JSON object, which is returned (caller json_decref's). */
json_t *
py(sbx_client *c, const char *id, const char *body)
{
    char *code = NULL;
    cr_assert(asprintf(&code, "%s%s", PRELUDE, body) > 0);
    const char *argv[] = {"python3", "-c", code, NULL};
    sbx_exec_opts o = {.argv = argv, .sessionless = true, .timeout_ms = 60000};
    sbx_exec_result r = tsh_opts(c, id, &o);
    free(code);
    cr_assert_eq(r.exit_code, 0, "probe exited %d\nstdout: %s\nstderr: %s", r.exit_code,
                 r.stdout_data, r.stderr_data);
    json_error_t je;
    json_t *j = json_loads(r.stdout_data, 0, &je);
    cr_assert(j != NULL, "probe output is not JSON (%s): %s\nstderr: %s", je.text, r.stdout_data,
              r.stderr_data);
    sbx_exec_result_free(&r);
    return j;
}

/* escape_create — see escape_util.h. */
void
escape_create(sbx_client *c, const char *id, const char *mode)
{
    char args[512];
    if (!strcmp(mode, "egress"))
        snprintf(args, sizeof(args),
                 "{\"network\":{\"mode\":\"egress\",\"allow\":[\"0.0.0.0/0\",\"10.0.0.0/8\","
                 "\"172.16.0.0/12\",\"192.168.0.0/16\",\"100.64.0.0/10\"]}}");
    else
        snprintf(args, sizeof(args), "{\"network\":{\"mode\":\"%s\"}}", mode);
    sbx_reply *r = NULL;
    sbx_error err = {0};
    cr_assert_eq(sbx_call_json(c, "create", id, args, 30000, &r, &err), 0, "create %s (%s): %s",
                 id, mode, err.message);
    sbx_reply_free(r);
    sbx_error_free(&err);
}

/* want — the string at `key` is `expect` (one of several: "EACCES|EROFS"). */
void
want(json_t *o, const char *key, const char *expect, const char *what)
{
    const char *got = jstr(o, key);
    char alts[128];
    snprintf(alts, sizeof(alts), "%s", expect);
    bool ok = false;
    char *save = NULL;
    for (char *a = strtok_r(alts, "|", &save); a; a = strtok_r(NULL, "|", &save))
        if (!strcmp(a, got))
            ok = true;
    cr_expect(ok, "%s: %s gave '%s', expected %s", what, key, got, expect);
}

/* sh_ok — run a shell string in the default session; return its stdout (heap). */
char *
sh_out(sbx_client *c, const char *id, const char *cmd)
{
    sbx_exec_result r = tsh(c, id, cmd, 60000);
    cr_expect_eq(r.exit_code, 0, "'%s' exited %d: %s", cmd, r.exit_code, r.stderr_data);
    char *s = r.stdout_data;
    r.stdout_data = NULL;
    sbx_exec_result_free(&r);
    return s ? s : strdup("");
}
