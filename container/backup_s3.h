/*
 * backup_s3.h — the backup store in an S3-compatible object store
 * (docs/persistence.md, "The S3 store"; sbxd --backup-store s3://…).
 *
 * The same content as the local store (backup.h), as objects of one bucket
 * under a prefix:
 *     <prefix>blobs/<hex>.tar.zst   archives, named by their sha256
 *     <prefix>index/<id>.json       one per backup (sbx_backup_info_json)
 * Requests are path-style (<endpoint>/<bucket>/<key>), signed by libcurl
 * (CURLOPT_AWS_SIGV4, "aws:amz:<region>:s3", payload UNSIGNED-PAYLOAD).
 * Every call has a deadline (sbx_s3_conf.timeout_ms, retries included): a
 * connection error or a 5xx is retried with back-off (100 ms doubling,
 * at most 2 s apart) while the deadline allows; what is still failing at
 * the deadline, any 4xx but a 404 where a 404 means "no such backup", and
 * an unparsable answer are BACKUP_STORE_UNAVAILABLE with S3's error code or
 * libcurl's reason in the message.
 *
 * No lock spans the nodes sharing a bucket: a delete racing a create of
 * the same content may remove the archive the create just shared (its
 * restore is then STORAGE_ERROR); creates and restores of different
 * content do not interfere.  An archive is one PUT: --backup-max is at most
 * SBX_S3_MAX_PUT (5 GiB, S3's limit of one PUT).
 *
 * The functions block (network): call them off the loop thread.  A struct
 * sbx_s3 is read-only once made, so threads may share it; each call uses
 * its own curl handle.  curl_global_init must have been called (sbxd's
 * main does, before any thread).
 */
#ifndef SBX_CONTAINER_BACKUP_S3_H
#define SBX_CONTAINER_BACKUP_S3_H

#include <stddef.h>
#include <stdint.h>

#include "../runtime/error.h"
#include "backup.h"

/* The largest archive one PUT stores (S3's limit), bytes. */
#define SBX_S3_MAX_PUT (5LL << 30)

/* What the deployment says (strings borrowed for sbx_s3_new's call only). */
struct sbx_s3_conf {
    const char *url;        /* s3://bucket[/prefix]; the prefix's characters A-Z a-z 0-9 . _ - / */
    const char *endpoint;   /* http(s)://host[:port] (no path); NULL: https://s3.<region>.amazonaws.com */
    const char *region;     /* NULL or "": us-east-1 */
    const char *cred_file;  /* NULL: $AWS_ACCESS_KEY_ID / $AWS_SECRET_ACCESS_KEY; else a file of
                             * lines AWS_ACCESS_KEY_ID=… and AWS_SECRET_ACCESS_KEY=…, owned by
                             * the daemon's user and not readable by group or others */
    int64_t timeout_ms;     /* each call's deadline, retries included; ≤ 0: 30000 */
};

struct sbx_s3;

/*
 * sbx_s3_new — check conf and make the store's handle (*out, the caller's,
 * freed by sbx_s3_free).  VALIDATION_FAILED with the reason for a bad URL,
 * endpoint, missing credentials or a credentials file others can read.
 * Makes no request.
 */
int sbx_s3_new(const struct sbx_s3_conf *conf, struct sbx_s3 **out, sbx_err_t *err);
void sbx_s3_free(struct sbx_s3 *s);
/* sbx_s3_describe — "s3://bucket/prefix at <endpoint>" (static per handle). */
const char *sbx_s3_describe(const struct sbx_s3 *s);

/*
 * sbx_s3_store_add — store the archive in fd (read with pread from 0,
 * info->size bytes, named by info->digest: uploaded unless an object of
 * that name exists) and info's index entry; info->id is filled in
 * (sbx_backup_new_id).  BACKUP_STORE_UNAVAILABLE.
 */
int sbx_s3_store_add(const struct sbx_s3 *s, int fd, struct sbx_backup_info *info,
                     sbx_err_t *err);

/*
 * sbx_s3_store_lookup — backup id's entry into *info (id may be info->id).
 * BACKUP_NOT_FOUND, BACKUP_EXPIRED, STORAGE_ERROR (unreadable entry),
 * BACKUP_STORE_UNAVAILABLE.
 */
int sbx_s3_store_lookup(const struct sbx_s3 *s, const char *id, struct sbx_backup_info *info,
                        sbx_err_t *err);

/*
 * sbx_s3_store_fetch — download the archive of the backup whose entry is
 * *info (from sbx_s3_store_lookup) into out_fd (the caller's, written from
 * offset 0, truncated first), hashing it as it arrives: STORAGE_ERROR
 * "corrupt" when the digest or size differs from the entry's (out_fd's
 * content is then not to be used), or "missing"; BACKUP_STORE_UNAVAILABLE.
 */
int sbx_s3_store_fetch(const struct sbx_s3 *s, const struct sbx_backup_info *info, int out_fd,
                       sbx_err_t *err);

/*
 * sbx_s3_store_list — every backup's entry (ListObjectsV2 of index/, then
 * each entry), expired ones deleted (with their archive when no other
 * entry has it) and left out: *out a heap array of *n (the caller frees it).
 */
int sbx_s3_store_list(const struct sbx_s3 *s, struct sbx_backup_info **out, size_t *n,
                      sbx_err_t *err);

/* sbx_s3_store_delete — remove backup id's entry, and its archive when no
 * other entry has it.  BACKUP_NOT_FOUND, BACKUP_STORE_UNAVAILABLE. */
int sbx_s3_store_delete(const struct sbx_s3 *s, const char *id, sbx_err_t *err);

#endif
