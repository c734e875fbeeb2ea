/*
 * backup_s3.c — the backup store in an S3-compatible object store, through
 * libcurl's SigV4 signing; ListObjectsV2's XML read with expat.  See
 * backup_s3.h and docs/persistence.md, "The S3 store".
 */
#include <curl/curl.h>
#include <errno.h>
#include <expat.h>
#include <fcntl.h>
#include <nettle/sha2.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "../runtime/cleanup.h"
#include "../runtime/err.h"
#include "../runtime/log.h"
#include "../runtime/util.h"
#include "backup_s3.h"

struct sbx_s3 {
    char endpoint[512];
    char bucket[64];
    char prefix[512]; /* "" or ending in '/' */
    char sigv4[128];  /* aws:amz:<region>:s3 */
    char userpwd[512];/* key:secret */
    char desc[1200];
    int64_t timeout_ms;
};

/* ------------------------------------------------------------------------------ */
/* Configuration. */

static bool
key_chars_ok(const char *s)
{
    for (; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
              *s == '.' || *s == '_' || *s == '-' || *s == '/'))
            return false;
    return true;
}

/* Credentials from a file of KEY=VALUE lines, refused if group or others
 * may read it (it holds a secret). */
static int
read_creds(const char *path, char *key, size_t keylen, char *secret, size_t seclen,
           sbx_err_t *err)
{
    _cleanup_fclose_ FILE *f = fopen(path, "re");
    if (!f)
        return sbx_err_make(err, SBX_E_VALIDATION, "--s3-credentials %s: %s", path,
                            strerror(errno));
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || (st.st_mode & 077) != 0 || st.st_uid != geteuid())
        return sbx_err_make(err, SBX_E_VALIDATION,
                            "--s3-credentials %s: must be owned by the daemon's user and not "
                            "readable by group or others (chmod 600)", path);
    char line[1024];
    while (fgets(line, sizeof(line), f)) {
        line[strcspn(line, "\r\n")] = '\0';
        const char *v;
        if (!strncmp(line, "AWS_ACCESS_KEY_ID=", 18) && (v = line + 18))
            snprintf(key, keylen, "%s", v);
        else if (!strncmp(line, "AWS_SECRET_ACCESS_KEY=", 22) && (v = line + 22))
            snprintf(secret, seclen, "%s", v);
    }
    return 0;
}

int
sbx_s3_new(const struct sbx_s3_conf *conf, struct sbx_s3 **out, sbx_err_t *err)
{
    *out = NULL;
    const char *u = conf->url;
    if (!u || strncmp(u, "s3://", 5) != 0)
        return sbx_err_make(err, SBX_E_VALIDATION, "--backup-store must be s3://bucket[/prefix]");
    u += 5;
    size_t bl = strcspn(u, "/");
    if (bl < 3 || bl > 63)
        return sbx_err_make(err, SBX_E_VALIDATION, "--backup-store: a bucket's name has 3-63 "
                                                   "characters");
    _cleanup_free_ struct sbx_s3 *s = sbx_xcalloc(1, sizeof(*s));
    memcpy(s->bucket, u, bl);
    const char *p = u[bl] ? u + bl + 1 : "";
    if (!key_chars_ok(s->bucket) || strchr(s->bucket, '/') || !key_chars_ok(p) ||
        strlen(p) > 400 || strstr(p, "//") || strstr(p, "..") || p[0] == '/')
        return sbx_err_make(err, SBX_E_VALIDATION,
                            "--backup-store: bucket and prefix may have only A-Z a-z 0-9 . _ - / "
                            "(no empty or '..' component)");
    snprintf(s->prefix, sizeof(s->prefix), "%s%s", p, p[0] && p[strlen(p) - 1] != '/' ? "/" : "");
    const char *region = conf->region && *conf->region ? conf->region : "us-east-1";
    if (strlen(region) > 60 || !key_chars_ok(region) || strchr(region, '/'))
        return sbx_err_make(err, SBX_E_VALIDATION, "--s3-region '%s'", region);
    snprintf(s->sigv4, sizeof(s->sigv4), "aws:amz:%s:s3", region);
    if (conf->endpoint && *conf->endpoint) {
        size_t n = strlen(conf->endpoint);
        if ((strncmp(conf->endpoint, "http://", 7) && strncmp(conf->endpoint, "https://", 8)) ||
            n >= sizeof(s->endpoint) || strchr(conf->endpoint + 8, '/'))
            return sbx_err_make(err, SBX_E_VALIDATION,
                                "--s3-endpoint must be http(s)://host[:port], without a path");
        memcpy(s->endpoint, conf->endpoint, n + 1);
    } else {
        snprintf(s->endpoint, sizeof(s->endpoint), "https://s3.%s.amazonaws.com", region);
    }
    char key[200] = "", secret[200] = "";
    if (conf->cred_file && *conf->cred_file) {
        int rc = read_creds(conf->cred_file, key, sizeof(key), secret, sizeof(secret), err);
        if (rc)
            return rc;
    } else {
        const char *k = getenv("AWS_ACCESS_KEY_ID"), *v = getenv("AWS_SECRET_ACCESS_KEY");
        snprintf(key, sizeof(key), "%s", k ? k : "");
        snprintf(secret, sizeof(secret), "%s", v ? v : "");
    }
    if (!key[0] || !secret[0] || strchr(key, ':'))
        return sbx_err_make(err, SBX_E_VALIDATION,
                            "the S3 backup store needs credentials: AWS_ACCESS_KEY_ID and "
                            "AWS_SECRET_ACCESS_KEY in the environment or in --s3-credentials");
    snprintf(s->userpwd, sizeof(s->userpwd), "%s:%s", key, secret);
    explicit_bzero(secret, sizeof(secret));
    s->timeout_ms = conf->timeout_ms > 0 ? conf->timeout_ms : 30000;
    snprintf(s->desc, sizeof(s->desc), "s3://%s/%s at %s", s->bucket, s->prefix, s->endpoint);
    *out = s;
    s = NULL;
    return 0;
}

void
sbx_s3_free(struct sbx_s3 *s)
{
    if (s)
        explicit_bzero(s->userpwd, sizeof(s->userpwd));
    free(s);
}

const char *
sbx_s3_describe(const struct sbx_s3 *s)
{
    return s->desc;
}

/* ------------------------------------------------------------------------------ */
/* One request, retried. */

/* A request and where its answer goes. */
struct s3_call {
    const char *method;  /* GET, PUT, HEAD, DELETE */
    char url[2048];
    /* PUT's body: from in_fd (in_size bytes from offset 0), else in_buf. */
    int in_fd;
    const char *in_buf;
    int64_t in_size;
    int64_t in_off;
    /* GET's body of a 2xx: into out_fd (hashed into h), else into buf. */
    int out_fd;
    struct sha256_ctx h;
    int64_t out_max;     /* bytes beyond which a body is cut (the call fails): of a 2xx
                          * into out_fd, else of buf */
    int64_t got;         /* bytes of a 2xx body written to out_fd */
    bool too_big, write_failed;
    char *buf;           /* heap, NUL-terminated; also a non-2xx answer's body */
    size_t len, cap;
    long status;
    CURL *curl;
};

static size_t
on_read(char *dst, size_t size, size_t nmemb, void *arg)
{
    struct s3_call *c = arg;
    size_t want = size * nmemb;
    int64_t left = c->in_size - c->in_off;
    if ((int64_t)want > left)
        want = (size_t)left;
    if (want == 0)
        return 0;
    if (c->in_buf) {
        memcpy(dst, c->in_buf + c->in_off, want);
    } else {
        ssize_t n = pread(c->in_fd, dst, want, c->in_off);
        if (n <= 0)
            return CURL_READFUNC_ABORT;
        want = (size_t)n;
    }
    c->in_off += (int64_t)want;
    return want;
}

static size_t
on_write(char *src, size_t size, size_t nmemb, void *arg)
{
    struct s3_call *c = arg;
    size_t n = size * nmemb;
    if (!c->status)
        curl_easy_getinfo(c->curl, CURLINFO_RESPONSE_CODE, &c->status);
    if (c->out_fd >= 0 && c->status / 100 == 2) {
        c->got += (int64_t)n;
        if (c->got > c->out_max) {
            c->too_big = true;
            return 0;
        }
        sha256_update(&c->h, n, (const uint8_t *)src);
        for (size_t off = 0; off < n;) {
            ssize_t w = write(c->out_fd, src + off, n - off);
            if (w < 0) {
                if (errno == EINTR)
                    continue;
                c->write_failed = true;
                return 0;
            }
            off += (size_t)w;
        }
        return n;
    }
    /* Into buf: an answer read whole, or an error's body (1 MiB at most). */
    if ((int64_t)(c->len + n) > (c->out_fd >= 0 ? (1 << 20) : c->out_max)) {
        c->too_big = true;
        return 0;
    }
    if (c->len + n + 1 > c->cap) {
        c->cap = (c->len + n + 1) * 2;
        c->buf = sbx_xrealloc(c->buf, c->cap);
    }
    memcpy(c->buf + c->len, src, n);
    c->len += n;
    c->buf[c->len] = '\0';
    return n;
}

/* Reset what an attempt wrote, for the next one. */
static int
call_reset(struct s3_call *c)
{
    c->in_off = 0;
    c->got = 0;
    c->len = 0;
    if (c->buf)
        c->buf[0] = '\0';
    c->status = 0;
    c->too_big = c->write_failed = false;
    if (c->out_fd >= 0) {
        sha256_init(&c->h);
        if (ftruncate(c->out_fd, 0) != 0 || lseek(c->out_fd, 0, SEEK_SET) != 0)
            return -errno;
    }
    return 0;
}

/* S3's <Code> of an error body, into out ("" if none). */
static void
s3_code(const char *body, char *out, size_t outlen)
{
    out[0] = '\0';
    const char *p = body ? strstr(body, "<Code>") : NULL;
    if (!p)
        return;
    p += 6;
    size_t n = strcspn(p, "<");
    snprintf(out, outlen, "%.*s", (int)(n < outlen ? n : outlen - 1), p);
}

/*
 * Run c until an answer that is not a 5xx, or the deadline.  Returns 0 with
 * c->status set (any status below 500), or BACKUP_STORE_UNAVAILABLE.
 */
static int
s3_perform(const struct sbx_s3 *s, struct s3_call *c, const char *what, sbx_err_t *err)
{
    int64_t deadline = sbx_mono_ms() + s->timeout_ms;
    int64_t backoff = 100;
    int attempts = 0;
    char why[CURL_ERROR_SIZE + 64] = "";
    CURL *h = curl_easy_init();
    if (!h)
        return sbx_err_make(err, SBX_E_INTERNAL, "curl_easy_init");
    c->curl = h;
    struct curl_slist *hdr = curl_slist_append(NULL, "x-amz-content-sha256: UNSIGNED-PAYLOAD");
    int rc = SBX_E_BACKUP_STORE_UNAVAILABLE;
    for (;;) {
        int64_t left = deadline - sbx_mono_ms();
        if (left <= 0)
            break;
        if (call_reset(c) != 0) {
            rc = sbx_err_make(err, SBX_E_STORAGE, "%s: a temporary file: %s", what,
                              strerror(errno));
            goto out;
        }
        attempts++;
        char ebuf[CURL_ERROR_SIZE] = "";
        curl_easy_reset(h);
        curl_easy_setopt(h, CURLOPT_URL, c->url);
        curl_easy_setopt(h, CURLOPT_AWS_SIGV4, s->sigv4);
        curl_easy_setopt(h, CURLOPT_USERPWD, s->userpwd);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)left);
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)(left < 5000 ? left : 5000));
        curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
        curl_easy_setopt(h, CURLOPT_ERRORBUFFER, ebuf);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_write);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, c);
        curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
        if (!strcmp(c->method, "PUT")) {
            curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
            curl_easy_setopt(h, CURLOPT_READFUNCTION, on_read);
            curl_easy_setopt(h, CURLOPT_READDATA, c);
            curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)c->in_size);
        } else if (!strcmp(c->method, "HEAD")) {
            curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
        } else if (strcmp(c->method, "GET") != 0) {
            curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, c->method);
        }
        CURLcode cc = curl_easy_perform(h);
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &c->status);
        if (c->too_big || c->write_failed) {
            rc = sbx_err_make(err, SBX_E_STORAGE, "%s: %s", what,
                              c->too_big ? "the answer is larger than the entry says"
                                         : "cannot write the download here");
            goto out;
        }
        if (cc == CURLE_OK && c->status < 500) {
            rc = 0;
            goto out;
        }
        if (cc != CURLE_OK)
            snprintf(why, sizeof(why), "%s", ebuf[0] ? ebuf : curl_easy_strerror(cc));
        else {
            char code[64];
            s3_code(c->buf, code, sizeof(code));
            snprintf(why, sizeof(why), "HTTP %ld %s", c->status, code);
        }
        /* Back off, not past the deadline. */
        int64_t now = sbx_mono_ms();
        if (now + backoff >= deadline)
            break;
        struct timespec ts = {backoff / 1000, (backoff % 1000) * 1000000};
        nanosleep(&ts, NULL);
        backoff = backoff * 2 > 2000 ? 2000 : backoff * 2;
    }
    rc = sbx_err_make(err, SBX_E_BACKUP_STORE_UNAVAILABLE,
                      "backup store %s: %s: %s (%d attempt%s in %lld ms)", s->desc, what,
                      why[0] ? why : "no time left", attempts, attempts == 1 ? "" : "s",
                      (long long)s->timeout_ms);
out:
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    c->curl = NULL;
    return rc;
}

/* A 4xx that the caller does not expect: BACKUP_STORE_UNAVAILABLE. */
static int
s3_refused(const struct sbx_s3 *s, const struct s3_call *c, const char *what, sbx_err_t *err)
{
    char code[64];
    s3_code(c->buf, code, sizeof(code));
    return sbx_err_make(err, SBX_E_BACKUP_STORE_UNAVAILABLE,
                        "backup store %s: %s: refused with HTTP %ld %s", s->desc, what, c->status,
                        code[0] ? code : "");
}

static void
call_init(const struct sbx_s3 *s, struct s3_call *c, const char *method, const char *key)
{
    memset(c, 0, sizeof(*c));
    c->method = method;
    c->in_fd = -1;
    c->out_fd = -1;
    c->out_max = 1 << 20;
    snprintf(c->url, sizeof(c->url), "%s/%s/%s%s", s->endpoint, s->bucket, s->prefix, key);
}

/* ------------------------------------------------------------------------------ */
/* Objects. */

/* PUT key from fd (size bytes) or buf. */
static int
obj_put(const struct sbx_s3 *s, const char *key, int fd, const char *buf, int64_t size,
        sbx_err_t *err)
{
    struct s3_call c;
    call_init(s, &c, "PUT", key);
    c.in_fd = fd;
    c.in_buf = buf;
    c.in_size = size;
    char what[600];
    snprintf(what, sizeof(what), "PUT %s%s", s->prefix, key);
    int rc = s3_perform(s, &c, what, err);
    if (rc == 0 && c.status / 100 != 2)
        rc = s3_refused(s, &c, what, err);
    free(c.buf);
    return rc;
}

/* HEAD or DELETE key: 0 (2xx), 1 (404), or an error. */
static int
obj_simple(const struct sbx_s3 *s, const char *method, const char *key, sbx_err_t *err)
{
    struct s3_call c;
    call_init(s, &c, method, key);
    char what[600];
    snprintf(what, sizeof(what), "%s %s%s", method, s->prefix, key);
    int rc = s3_perform(s, &c, what, err);
    if (rc == 0)
        rc = c.status / 100 == 2 ? 0 : c.status == 404 ? 1 : s3_refused(s, &c, what, err);
    free(c.buf);
    return rc;
}

/* GET key into *body (heap, NUL-terminated; at most 1 MiB): 0, 1 (404) or
 * an error. */
static int
obj_get_small(const struct sbx_s3 *s, const char *key, char **body, size_t *len, sbx_err_t *err)
{
    struct s3_call c;
    call_init(s, &c, "GET", key);
    char what[600];
    snprintf(what, sizeof(what), "GET %s%s", s->prefix, key);
    int rc = s3_perform(s, &c, what, err);
    /* A 404 of the bucket is the store's problem, not a missing object. */
    bool gone = c.status == 404 && !(c.buf && strstr(c.buf, "<Code>NoSuchBucket<"));
    if (rc == 0)
        rc = c.status / 100 == 2 ? 0 : gone ? 1 : s3_refused(s, &c, what, err);
    if (rc == 0) {
        *body = c.buf ? c.buf : sbx_xstrdup("");
        *len = c.len;
        c.buf = NULL;
    }
    free(c.buf);
    return rc;
}

/* ListObjectsV2's answer, read by expat: the keys of <Contents>, and where
 * to go on. */
struct list_parse {
    char **keys;       /* heap, heap strings */
    size_t n, cap;
    char text[1100];   /* the current element's text */
    size_t tlen;
    bool truncated;
    char next[1100];   /* NextContinuationToken */
};

static void XMLCALL
lp_start(void *arg, const XML_Char *name, const XML_Char **attrs)
{
    (void)name;
    (void)attrs;
    struct list_parse *lp = arg;
    lp->tlen = 0;
}

static void XMLCALL
lp_text(void *arg, const XML_Char *t, int n)
{
    struct list_parse *lp = arg;
    if (n > 0 && lp->tlen + (size_t)n < sizeof(lp->text)) {
        memcpy(lp->text + lp->tlen, t, (size_t)n);
        lp->tlen += (size_t)n;
    }
}

static void XMLCALL
lp_end(void *arg, const XML_Char *name)
{
    struct list_parse *lp = arg;
    lp->text[lp->tlen] = '\0';
    if (!strcmp(name, "Key")) {
        if (lp->n == lp->cap) {
            lp->cap = lp->cap ? lp->cap * 2 : 64;
            lp->keys = sbx_xrealloc(lp->keys, lp->cap * sizeof(char *));
        }
        lp->keys[lp->n++] = sbx_xstrdup(lp->text);
    } else if (!strcmp(name, "IsTruncated")) {
        lp->truncated = !strcmp(lp->text, "true");
    } else if (!strcmp(name, "NextContinuationToken")) {
        snprintf(lp->next, sizeof(lp->next), "%s", lp->text);
    }
    lp->tlen = 0;
}

/* The URL-encoded form of a continuation token. */
static void
url_escape(const char *in, char *out, size_t outlen)
{
    static const char hex[] = "0123456789ABCDEF";
    size_t o = 0;
    for (; *in && o + 4 < outlen; in++) {
        unsigned char ch = (unsigned char)*in;
        if ((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
            ch == '-' || ch == '_' || ch == '.' || ch == '~') {
            out[o++] = (char)ch;
        } else {
            out[o++] = '%';
            out[o++] = hex[ch >> 4];
            out[o++] = hex[ch & 15];
        }
    }
    out[o] = '\0';
}

/* Every key under <prefix><sub> (full keys, prefix included): lp->keys. */
static int
obj_list(const struct sbx_s3 *s, const char *sub, struct list_parse *lp, sbx_err_t *err)
{
    memset(lp, 0, sizeof(*lp));
    char token[3400] = "";
    for (int page = 0; page < 10000; page++) {
        struct s3_call c;
        call_init(s, &c, "GET", "");
        c.out_max = 16 << 20;
        char pfx[1600];
        url_escape(s->prefix, pfx, sizeof(pfx));
        char esub[200];
        url_escape(sub, esub, sizeof(esub));
        snprintf(c.url, sizeof(c.url), "%s/%s?list-type=2&prefix=%s%s%s%s", s->endpoint,
                 s->bucket, pfx, esub, token[0] ? "&continuation-token=" : "", token);
        char what[700];
        snprintf(what, sizeof(what), "list %s%s", s->prefix, sub);
        int rc = s3_perform(s, &c, what, err);
        if (rc == 0 && c.status / 100 != 2)
            rc = s3_refused(s, &c, what, err);
        if (rc == 0) {
            XML_Parser p = XML_ParserCreate(NULL);
            if (!p) {
                free(c.buf);
                return sbx_err_make(err, SBX_E_INTERNAL, "XML_ParserCreate");
            }
            XML_SetUserData(p, lp);
            XML_SetElementHandler(p, lp_start, lp_end);
            XML_SetCharacterDataHandler(p, lp_text);
            lp->truncated = false;
            lp->next[0] = '\0';
            if (XML_Parse(p, c.buf ? c.buf : "", (int)c.len, 1) == XML_STATUS_ERROR)
                rc = sbx_err_make(err, SBX_E_BACKUP_STORE_UNAVAILABLE,
                                  "backup store %s: %s: unreadable answer: %s", s->desc, what,
                                  XML_ErrorString(XML_GetErrorCode(p)));
            XML_ParserFree(p);
        }
        free(c.buf);
        if (rc)
            return rc;
        if (!lp->truncated || !lp->next[0])
            return 0;
        url_escape(lp->next, token, sizeof(token));
    }
    return 0;
}

static void
list_free(struct list_parse *lp)
{
    for (size_t i = 0; i < lp->n; i++)
        free(lp->keys[i]);
    free(lp->keys);
}

/* ------------------------------------------------------------------------------ */
/* The store. */

static void
blob_key(const char *digest, char *out, size_t outlen)
{
    snprintf(out, outlen, "blobs/%s.tar.zst", digest + 7);
}

int
sbx_s3_store_add(const struct sbx_s3 *s, int fd, struct sbx_backup_info *info, sbx_err_t *err)
{
    if (sbx_backup_new_id(info->id) != 0)
        return sbx_err_make(err, SBX_E_INTERNAL, "getrandom");
    if (info->size > SBX_S3_MAX_PUT)
        return sbx_err_make(err, SBX_E_BACKUP_TOO_LARGE,
                            "the archive has %lld bytes: more than one PUT of S3 takes",
                            (long long)info->size);
    char bk[200], ik[200];
    blob_key(info->digest, bk, sizeof(bk));
    int rc = obj_simple(s, "HEAD", bk, err);
    if (rc == 1)
        rc = obj_put(s, bk, fd, NULL, info->size, err);
    if (rc)
        return rc;
    _cleanup_free_ char *j = sbx_backup_info_json(info);
    if (!j)
        return sbx_err_make(err, SBX_E_INTERNAL, "out of memory");
    snprintf(ik, sizeof(ik), "index/%s.json", info->id);
    return obj_put(s, ik, -1, j, (int64_t)strlen(j), err);
}

/* The entry of id: 0, BACKUP_NOT_FOUND, STORAGE_ERROR or unavailable. */
static int
get_entry(const struct sbx_s3 *s, const char *id, struct sbx_backup_info *info, sbx_err_t *err)
{
    if (!sbx_backup_id_valid(id))
        return sbx_err_make(err, SBX_E_BACKUP_NOT_FOUND, "no backup '%s'", id);
    char ik[200];
    snprintf(ik, sizeof(ik), "index/%s.json", id);
    _cleanup_free_ char *body = NULL;
    size_t len = 0;
    int rc = obj_get_small(s, ik, &body, &len, err);
    if (rc == 1)
        return sbx_err_make(err, SBX_E_BACKUP_NOT_FOUND, "no backup '%s'", id);
    if (rc)
        return rc;
    if (sbx_backup_info_parse(id, body, len, info) != 0)
        return sbx_err_make(err, SBX_E_STORAGE, "backup '%s': unreadable index entry", id);
    return 0;
}

int
sbx_s3_store_lookup(const struct sbx_s3 *s, const char *id, struct sbx_backup_info *info,
                    sbx_err_t *err)
{
    int rc = get_entry(s, id, info, err);
    if (rc)
        return rc;
    if (info->expires_ms <= sbx_wall_ms())
        return sbx_err_make(err, SBX_E_BACKUP_EXPIRED, "backup '%s' expired", info->id);
    return 0;
}

int
sbx_s3_store_fetch(const struct sbx_s3 *s, const struct sbx_backup_info *info, int out_fd,
                   sbx_err_t *err)
{
    const char *id = info->id;
    int rc;
    char bk[200];
    blob_key(info->digest, bk, sizeof(bk));
    struct s3_call c;
    call_init(s, &c, "GET", bk);
    c.out_fd = out_fd;
    c.out_max = info->size; /* more is not the archive the entry names */
    char what[600];
    snprintf(what, sizeof(what), "GET %s%s", s->prefix, bk);
    rc = s3_perform(s, &c, what, err);
    if (rc == 0 && c.status == 404)
        rc = sbx_err_make(err, SBX_E_STORAGE, "backup '%s': its archive is missing from the store",
                          id);
    else if (rc == 0 && c.status / 100 != 2)
        rc = s3_refused(s, &c, what, err);
    if (rc == 0) {
        uint8_t d[SHA256_DIGEST_SIZE];
        sha256_digest(&c.h, sizeof(d), d);
        char hex[80] = "sha256:";
        for (int i = 0; i < SHA256_DIGEST_SIZE; i++)
            snprintf(hex + 7 + 2 * i, 3, "%02x", d[i]);
        if (c.got != info->size || strcmp(hex, info->digest) != 0) {
            sbx_log_error("backup %s: archive from %s: %lld bytes, digest %s; expected %lld, "
                          "%s: refused", id, s->desc, (long long)c.got, hex,
                          (long long)info->size, info->digest);
            rc = sbx_err_make(err, SBX_E_STORAGE,
                              "backup '%s' is corrupt: its archive's digest is %s, not %s; "
                              "nothing was restored", id, hex, info->digest);
        }
    } else if (c.too_big) {
        rc = sbx_err_make(err, SBX_E_STORAGE,
                          "backup '%s' is corrupt: its archive is larger than %lld bytes; "
                          "nothing was restored", id, (long long)info->size);
    }
    free(c.buf);
    return rc;
}

/* Every entry (expired ones too): *out, *n. */
static int
all_entries(const struct sbx_s3 *s, struct sbx_backup_info **out, size_t *n, sbx_err_t *err)
{
    struct list_parse lp;
    int rc = obj_list(s, "index/", &lp, err);
    *out = NULL;
    *n = 0;
    if (rc) {
        list_free(&lp);
        return rc;
    }
    *out = sbx_xcalloc(lp.n ? lp.n : 1, sizeof(**out));
    size_t plen = strlen(s->prefix) + 6;
    for (size_t i = 0; i < lp.n && rc == 0; i++) {
        const char *k = lp.keys[i];
        char id[32];
        if (strlen(k) != plen + 32 || strcmp(k + plen + 27, ".json") != 0)
            continue;
        memcpy(id, k + plen, 27);
        id[27] = '\0';
        sbx_err_t e2 = NULL;
        int r = get_entry(s, id, &(*out)[*n], &e2);
        if (r == 0)
            (*n)++;
        else if (r == SBX_E_BACKUP_STORE_UNAVAILABLE)
            rc = sbx_err_make(err, r, "%s", sbx_err_msg(e2));
        /* gone meanwhile, or unreadable: not listed */
        sbx_err_release(&e2);
    }
    list_free(&lp);
    if (rc) {
        free(*out);
        *out = NULL;
        *n = 0;
    }
    return rc;
}

/* Remove entry i of v (n entries): its index object, and its archive when
 * no other entry of v has the same digest. */
static int
remove_entry(const struct sbx_s3 *s, const struct sbx_backup_info *v, size_t n, size_t i,
             sbx_err_t *err)
{
    char k[200];
    snprintf(k, sizeof(k), "index/%s.json", v[i].id);
    int rc = obj_simple(s, "DELETE", k, err);
    if (rc < 0)
        return rc;
    for (size_t o = 0; o < n; o++)
        if (o != i && !strcmp(v[o].digest, v[i].digest))
            return 0;
    blob_key(v[i].digest, k, sizeof(k));
    rc = obj_simple(s, "DELETE", k, err);
    return rc < 0 ? rc : 0;
}

int
sbx_s3_store_list(const struct sbx_s3 *s, struct sbx_backup_info **out, size_t *n,
                  sbx_err_t *err)
{
    struct sbx_backup_info *v = NULL;
    size_t nv = 0;
    int rc = all_entries(s, &v, &nv, err);
    if (rc)
        return rc;
    int64_t now = sbx_wall_ms();
    /* Expired ones out of v, one by one (remove_entry sees the rest). */
    for (size_t i = 0; i < nv && rc == 0;) {
        if (v[i].expires_ms > now) {
            i++;
            continue;
        }
        rc = remove_entry(s, v, nv, i, err);
        v[i] = v[--nv];
    }
    if (rc) {
        free(v);
        return rc;
    }
    *out = v;
    *n = nv;
    return 0;
}

int
sbx_s3_store_delete(const struct sbx_s3 *s, const char *id, sbx_err_t *err)
{
    struct sbx_backup_info one;
    int rc = get_entry(s, id, &one, err);
    if (rc)
        return rc;
    struct sbx_backup_info *v = NULL;
    size_t nv = 0;
    if ((rc = all_entries(s, &v, &nv, err)) != 0)
        return rc;
    size_t i = 0;
    while (i < nv && strcmp(v[i].id, id) != 0)
        i++;
    if (i == nv) { /* deleted meanwhile */
        free(v);
        return sbx_err_make(err, SBX_E_BACKUP_NOT_FOUND, "no backup '%s'", id);
    }
    rc = remove_entry(s, v, nv, i, err);
    free(v);
    return rc;
}
