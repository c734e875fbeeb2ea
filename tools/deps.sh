#!/usr/bin/env bash
# tools/deps.sh — install the Debian packages sbx needs, only those missing.
#
# Idempotent: a second run installs nothing.  Needs root (apt-get) when
# something is missing; prints what it would install otherwise.  Run by
# `make run` and `make test`.  SBX_DEPS_SKIP=1 skips the check entirely.
set -euo pipefail

[ "${SBX_DEPS_SKIP:-0}" = 1 ] && exit 0

pkgs=(
  # build
  build-essential pkg-config
  # libraries named by the project, and the ones it chose (see README)
  libmsgpack-dev liblmdb-dev lmdb-utils libseccomp-dev uuid-dev
  libxxhash-dev libjansson-dev
  # nng: Debian's 1.5.2 source with the upstream fix of its listener stall, built into
  # build/nng by tools/nng-build.sh (the Makefile runs it): cmake, patch, curl to fetch
  # it from the Debian archive, mbedTLS for its TLS transport
  cmake patch curl libmbedtls-dev
  # the HTTP front: server, upstream client for preview URLs, WebSocket framing, SHA-1
  libmicrohttpd-dev libcurl4-openssl-dev libwslay-dev nettle-dev
  # tests: the framework; libFuzzer targets (clang with its fuzzer runtime) and the
  # valgrind job, both run by `make test`
  libcriterion-dev clang libclang-rt-dev valgrind
  # tests: a hung test binary is reported with the stacks of its threads (tools/watchdog.sh)
  gdb
  # inside sandboxes: the host's /usr is what sandboxes run
  bash coreutils procps python3 nodejs git
  # the code interpreter: IPython, matplotlib, pandas, numpy; npm for the JS/TS driver
  python3-ipython python3-matplotlib python3-matplotlib-inline python3-pandas python3-numpy
  npm
  # tests: a real Jupyter kernel for the differential test; pytest for the Python client
  python3-ipykernel python3-jupyter-client python3-pytest
  # build: tools/gen_ops.py reads runtime/ops.yaml (make gen, make gen-check)
  python3-yaml
  # benchmark baseline
  bubblewrap
  # clusters: etcd holds membership and partition ownership (tests start their own)
  etcd-server etcd-client iproute2
  # tests: a real browser loads a page through a preview URL (tests/integration/test_preview.c)
  chromium
  # images (docs/images.md): layer tars read with libarchive; skopeo converts docker-archive
  # tarballs and pulls from registries; busybox-static builds the tests' images
  libarchive-dev skopeo busybox-static
  # tests: a real registry (the CNCF distribution registry) on loopback for pulls
  # (tests/integration/test_image_pull.c starts its own; the package's service is not used)
  docker-registry
  # operations (issue 17): a real Prometheus scrapes /metrics in tests; man pages from --help
  prometheus help2man
  # egress networking: the shards run ip and nft for each egress sandbox (docs/network.md)
  nftables libnftables-dev
  # the sandboxes' resolver parses and writes DNS with libldns; the DNS tests' server is dnsmasq
  libldns-dev dnsmasq-base
  # persistent workspaces: the XFS workspace pool (reflinks for forks) where the data
  # directory's file system has none (container/ws_pool.c runs mkfs.xfs)
  xfsprogs
  # the S3 backup store: ListObjectsV2's XML read with expat (signing and transfers: libcurl above)
  libexpat1-dev
)

missing=()
for p in "${pkgs[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "ok installed"; then
    missing+=("$p")
  fi
done
# Node may come from elsewhere (NodeSource, which bundles npm); a working
# `node` / `npm` is enough.
if [[ " ${missing[*]} " == *" nodejs "* ]] && command -v node >/dev/null 2>&1; then
  missing=("${missing[@]/nodejs}")
fi
if [[ " ${missing[*]} " == *" npm "* ]] && command -v npm >/dev/null 2>&1; then
  missing=("${missing[@]/npm}")
fi
missing=($(printf '%s\n' "${missing[@]}" | grep -v '^$' || true))

if [ ${#missing[@]} -eq 0 ]; then
  exit 0
fi
if [ "$(id -u)" != 0 ]; then
  echo "deps: missing Debian packages: ${missing[*]}" >&2
  echo "deps: run as root (sbx needs root anyway: namespaces, cgroups, mounts)" >&2
  exit 1
fi
echo "deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "deps: done"
