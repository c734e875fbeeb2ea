/*
 * record.h — the durable metadata of one sandbox, as kept in LMDB
 * (SBX_DB_SANDBOXES, key = sandbox ID, value = a msgpack map).
 *
 *   { "id": "user-42", "createdAt": <ms since epoch>, "updatedAt": <ms>,
 *     "state": "created" | "running" | "stopped",
 *     "generation": <containers started so far>,
 *     "restarts": <containers that ended unexpectedly>,
 *     "limits": { "memory": <bytes>, "pids": <n>, "cpu": <millicpus> },
 *     "env": { "K": "v", … },         sandbox environment (setEnvVars)
 *     "config": { … },                lifecycle settings (sleepAfter, keepAlive, …)
 *     "ports": { "8080": { "token": "…", "name": "…", "generation": <n> }, … },
 *                                     exposed ports: preview URL tokens, and the
 *                                     container generation each was exposed for
 *     "workspace": "persistent",      absent: ephemeral (docs/persistence.md)
 *     "disk": <bytes>,                its disk size from create (absent: the shard's --disk)
 *     "image": "sha256:<hex>",        the image it runs, by manifest digest (absent:
 *                                     the host's /usr; docs/images.md), so every
 *                                     container it gets runs the same image
 *     "imageConfig": { "ports": ["8080/tcp", …], "start": ["argv", …] } }
 *                                     what of the image's config the sandbox keeps
 *                                     from its create: ExposedPorts (hints shown by
 *                                     status) and, with create {start: true}, its
 *                                     Entrypoint + Cmd, started at every container start
 *
 * The state a record shows is the last one committed; a shard that restarts
 * has no live container for any of its sandboxes, whatever the record says,
 * and treats "running" as "stopped".  Unknown keys are preserved (`extra`)
 * so an older shard never drops what a newer one wrote.
 */
#ifndef SBX_RECORD_H
#define SBX_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "../container/cgroup.h"
#include "../runtime/wire.h"

struct sbx_record {
    char id[64];
    int64_t created_ms, updated_ms;
    char state[16];
    uint64_t generation;
    uint64_t restarts;
    struct sbx_limits limits;
    char *env;          /* msgpack map bytes (heap) or NULL */
    size_t env_len;
    char *config;       /* msgpack map bytes (heap) or NULL */
    size_t config_len;
    char *ports;        /* msgpack map bytes (heap) or NULL */
    size_t ports_len;
    char image[72];     /* image manifest digest "sha256:<hex>", or "" */
    bool persistent;    /* workspace kept on disk (container/workspace.h) */
    bool ws_made;       /* "wsMade": its workspace image was made (a container started with
                           it): a start that finds none must not make an empty one
                           (docs/persistence.md, "Across the cluster") */
    uint64_t disk;      /* "disk": bytes of its writable file system, 0 = the shard's --disk */
    char *imgcfg;       /* "imageConfig": msgpack map bytes (heap) or NULL */
    size_t imgcfg_len;
};

/* sbx_record_encode — msgpack bytes of r into *out (caller frees). */
int sbx_record_encode(const struct sbx_record *r, char **out, size_t *len);
/* sbx_record_decode — parse bytes (untrusted: from disk) into *r; heap
 * fields are owned by r afterwards (sbx_record_free).  0 or SBX_E_STORAGE. */
int sbx_record_decode(const void *buf, size_t len, struct sbx_record *r);
void sbx_record_free(struct sbx_record *r);
/* sbx_record_copy_blob — replace a heap blob field with a copy of bytes. */
void sbx_record_set_blob(char **field, size_t *flen, const void *p, size_t n);

#endif
