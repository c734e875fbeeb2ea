# sbx — build, run, test.
#
#   make          release build: bin/sbxd, bin/sbx, bin/sbx-agent, bin/sbx-bench,
#                 lib/libsbx.a, lib/libsbx.so + include/sbx/ (the C client library),
#                 lib/pkgconfig/sbx.pc
#   make install  PREFIX=/usr/local [DESTDIR=…]: sbx, sbxd, the agent, interpreter files,
#                 man pages, systemd units, include/sbx/, libsbx.{a,so}, sbx.pc
#                 (make install-lib: only the client library; docs/operations.md)
#   make run      install missing Debian packages, build, start `sbxd dev`, run the demo
#   make check    the fast tier (< 2 min): unit tests, fuzz corpus replay, one end-to-end
#                 smoke test, on the ASan build (README.md, "Tests")
#   make test     install missing packages, build with ASan+UBSan, run the whole suite
#                 (what CI runs: .ci/run), SBX_TEST_PARALLEL (2) binaries at a time
#   make bench    build and run the benchmarks (tools/bench), figures on stdout
#   make gen      regenerate what runtime/ops.yaml feeds (docs/schema.md); make gen-check
#                 fails with the diff when a committed generated file is stale
#   make clean    remove build outputs
#
# Warnings are errors everywhere (-Wall -Wextra -Werror, C17).  The test suite
# runs against the sanitizer build in build/asan/.

# The default goal: a bare `make` builds everything `make run` needs.  Its
# prerequisites are listed further down, once the variables naming them exist.
all:

CC      ?= cc
CSTD    := -std=c17 -D_GNU_SOURCE
WARN    := -Wall -Wextra -Werror -Wshadow -Wstrict-prototypes -Wno-unused-parameter \
           -Wno-format-truncation
# nng is Debian's 1.5.2 with the upstream fix of its listeners' stall (nng#1518; docs/cluster.md
# note 12), sbx's fix of a close that could hang (tools/nng/0002-*.patch) and its wake-up
# after unlock in the task dispatch (tools/nng/0003-*.patch), built by tools/nng-build.sh into build/nng as a static, PIC libnng.a with TLS
# (mbedTLS) and one task thread per process (docs/cluster.md, "The patched nng"):
# its headers come before the system's, the archive is linked into every
# program and into lib/libsbx.{a,so} (whose users need no nng).
NNG_DIR  := build/nng
NNG_LIB  := $(NNG_DIR)/lib/libnng.a
NNG_LIBS := $(NNG_LIB) -lmbedtls -lmbedx509 -lmbedcrypto
CFLAGS_COMMON := $(CSTD) $(WARN) -g -pthread -fno-strict-aliasing -I. -I$(NNG_DIR)/include
LDLIBS_DAEMON := $(NNG_LIBS) -lmsgpackc -llmdb -lseccomp -luuid -lxxhash -ljansson -lmicrohttpd \
                 -lcurl -lwslay -lnettle -larchive -lnftables -lldns -lexpat -lpthread -lm
LDLIBS_CLIENT := $(NNG_LIBS) -lmsgpackc -luuid -ljansson -lpthread -lm
LDLIBS_AGENT  := -lmsgpackc -luuid -ljansson -lm
# The release agent is linked statically: one per sandbox, and without the
# dynamic loader and the shared libraries' relocated pages it holds 96 KiB of
# PSS instead of 157 KiB (docs/benchmarks.md, "Density").  ASan needs the
# dynamic runtime, so the asan flavour stays dynamic.
AGENT_LDFLAGS_release := -static
AGENT_LDFLAGS_asan    :=
LDLIBS_TEST   := -lcriterion -lcurl -lnettle
# Criterion talks to its test workers through nanomsg (nn_socket, nn_recv, …
# over ipc:///tmp/criterion_<pid>.sock).  Debian's libnng.so also exports
# those names (its nanomsg compatibility layer), and a binary linked with
# -lnng before libcriterion's own libnanomsg got nng 1.5.2's unpatched ipc
# transport, whose listener stops accepting for good after a connection
# fails during its handshake (docs/cluster.md, "The patched nng"): a
# Criterion runner whose listener stops waits forever for its next worker,
# the suite's "HUNG" binaries.  The static patched nng exports nothing; naming
# libnanomsg first, before any library, keeps Criterion's nn_* calls bound
# to it whatever else a binary links.
CRITERION_IPC := -Wl,--push-state,--no-as-needed -lnanomsg -Wl,--pop-state

RELEASE_CFLAGS := $(CFLAGS_COMMON) -O2
ASAN_CFLAGS    := $(CFLAGS_COMMON) -O1 -fno-omit-frame-pointer -fsanitize=address,undefined \
                  -fno-sanitize-recover=undefined

RUNTIME := runtime/err.c runtime/log.c runtime/util.c runtime/wire.c runtime/id.c \
           runtime/loop.c runtime/place.c runtime/store.c runtime/store_log.c runtime/frame.c runtime/config.c \
           runtime/nngx.c runtime/json.c runtime/ops.c runtime/ops_gen.c runtime/relay.c \
           runtime/etcd.c runtime/cview.c runtime/error.c runtime/prom.c runtime/mcp.c
CLIENT  := runtime/client.c runtime/err.c runtime/error.c runtime/util.c runtime/wire.c runtime/id.c \
           runtime/json.c runtime/nngx.c runtime/log.c
CONTAINER := container/seccomp.c container/cgroup.c container/spawn.c container/spawn_child.c container/image_store.c \
             container/image_unpack.c container/image_layer.c container/image_user.c container/image_fetch.c \
             container/image_template.c \
             container/net.c container/net_dns.c container/net_link.c container/net_policy.c \
             container/net_proxy.c container/net_http.c \
             container/workspace.c container/backup.c container/backup_s3.c
# git's ignore rules for backup.create's gitignore (issue 15).
CONTAINER += container/backup_ignore.c
# Moving a persistent workspace between nodes (issue 15, docs/persistence.md).
CONTAINER += container/ws_xfer.c
# The XFS workspace pool where the data directory has no reflinks (issue 15).
CONTAINER += container/ws_pool.c
# The disk guard: workspaces share out the host's free disk (issue 15).
CONTAINER += container/ws_guard.c
AGENT   := container/agent/main.c container/agent/setup.c container/agent/mount_attr.c \
           container/agent/exec.c container/agent/exec_args.c container/agent/proctree.c \
           container/agent/session.c container/agent/session_shell.c container/agent/session_cmd.c \
           container/agent/stream.c container/agent/proc.c container/agent/proc_wait.c \
           container/agent/files.c container/agent/files_mime.c container/agent/files_rw.c \
           container/agent/files_watch.c container/agent/files_git.c \
           container/agent/interp.c container/agent/interp_driver.c container/agent/interp_result.c \
           container/agent/interp_pool.c \
           container/agent/term.c container/agent/ops_gen.c \
           runtime/err.c runtime/error.c runtime/log.c \
           runtime/util.c runtime/wire.c runtime/loop.c runtime/frame.c runtime/id.c \
           runtime/json.c
# Every file of actors/ is the shard's: a new op's handler file needs no line here.
ACTORS  := $(sort $(wildcard actors/*.c))
GATEWAY := gateway/gateway.c gateway/http.c gateway/http_route.c gateway/openapi_gen.c \
           gateway/http_auth.c gateway/http_sse.c gateway/http_call.c gateway/preview.c \
           gateway/terminal.c gateway/gw_metrics.c gateway/console.c build/console/console_assets.c \
           gateway/http_token.c gateway/gw_fork.c \
           gateway/tenant.c gateway/tenant_admin.c gateway/gw_merge.c gateway/keyfile.c \
           gateway/gw_tenant.c gateway/mcp_http.c
# The web console (gateway/console/, docs/console.md): TypeScript + xterm.js bundled by esbuild
# (npm packages pinned in gateway/console/package-lock.json) into files embedded in sbxd as
# C arrays (tools/build-console.sh; build output only, not in git).  A console that
# cannot be built fails the build: sbxd is never built without it.
CONSOLE_SRC := $(wildcard gateway/console/src/*.ts) gateway/console/index.html \
               gateway/console/style.css gateway/console/tsconfig.json \
               gateway/console/package.json gateway/console/package-lock.json
build/console/console_assets.c: $(CONSOLE_SRC) tools/build-console.sh
	@tools/build-console.sh build/console
DAEMON  := tools/sbxd.c tools/sbxd_dev.c tools/sbxd_common.c tools/hostlock.c $(RUNTIME) $(CONTAINER) $(ACTORS) $(GATEWAY)
CLI     := tools/sbx.c tools/cli_sdk.c tools/cli_util.c tools/cli_schema.c tools/cli_ops_gen.c \
           tools/cli_mcp.c runtime/mcp.c
# The library the CLI links: the release one exports only the public API
# (see the client library block below), so the CLI cannot use anything else.
CLI_LIBSBX_release := lib/libsbx.a
CLI_LIBSBX_asan    := build/asan/lib/libsbx.a
BENCH   := tools/bench.c tools/bench_burst.c tools/bench_image.c tools/bench_workspace.c tools/stats.c

UNIT_TESTS  := $(wildcard tests/unit/test_*.c)
INTEG_TESTS := $(wildcard tests/integration/test_*.c tests/security/test_*.c)
TEST_SUPPORT := tests/support/harness.c tests/support/httpc.c tests/support/httpapi.c \
                tests/support/wsclient.c tests/support/hostlocks.c tests/support/shell.c

# Header dependencies are real: every object is compiled with -MMD -MP and its
# .d file (next to the .o) is included below, so touching one header rebuilds
# only the objects that include it.  An object built without a .d (before these rules)
# is rebuilt once (the end of this file).
DEPFLAGS := -MMD -MP

# $(call objs,FLAVOR,SOURCES)
objs = $(patsubst %.c,build/$(1)/obj/%.o,$(2))

define build_flavor
build/$(1)/obj/%.o: %.c | $(NNG_LIB)
	@mkdir -p $$(dir $$@)
	$$(CC) $$($(2)) $(DEPFLAGS) -c $$< -o $$@

$(3)/sbxd: $$(call objs,$(1),$(DAEMON)) $(NNG_LIB)
	@mkdir -p $$(dir $$@)
	$$(CC) $$($(2)) -o $$@ $$^ $(LDLIBS_DAEMON)

$(3)/sbx-agent: $$(call objs,$(1),$(AGENT))
	@mkdir -p $$(dir $$@)
	$$(CC) $$($(2)) $$(AGENT_LDFLAGS_$(1)) -o $$@ $$^ $(LDLIBS_AGENT)

build/$(1)/lib/libsbx.a: $$(call objs,$(1),$(sort $(CLIENT)))
	@mkdir -p $$(dir $$@)
	rm -f $$@ && ar rcs $$@ $$^

$(3)/sbx: $$(call objs,$(1),$(CLI)) $$(CLI_LIBSBX_$(1))
	@mkdir -p $$(dir $$@)
	$$(CC) $$($(2)) -o $$@ $$^ $(LDLIBS_CLIENT)

$(3)/sbx-bench: $$(call objs,$(1),$(BENCH)) build/$(1)/lib/libsbx.a
	@mkdir -p $$(dir $$@)
	$$(CC) $$($(2)) -o $$@ $$^ $(LDLIBS_CLIENT) -lm
endef

$(eval $(call build_flavor,release,RELEASE_CFLAGS,bin))
$(eval $(call build_flavor,asan,ASAN_CFLAGS,build/asan/bin))

RELEASE_BINS := bin/sbxd bin/sbx bin/sbx-agent bin/sbx-bench bin/sbx-bench-interp bin/sbx-bench-http \
                share/sbx/interp/.installed
ASAN_BINS    := build/asan/bin/sbxd build/asan/bin/sbx build/asan/bin/sbx-agent \
                build/asan/share/sbx/interp/.installed

# The interpreter benchmark (sbx against Jupyter; tools/jupyter_bench.py).
bin/sbx-bench-interp: $(call objs,release,tools/bench_interp.c tools/stats.c tests/support/harness.c tests/support/hostlocks.c) \
                      build/release/lib/libsbx.a
	@mkdir -p $(dir $@)
	$(CC) $(RELEASE_CFLAGS) -o $@ $^ $(LDLIBS_CLIENT)

# The HTTP benchmark (the HTTP front against the nng path).
bin/sbx-bench-http: $(call objs,release,tools/bench_http.c tools/stats.c tests/support/harness.c tests/support/hostlocks.c) \
                    build/release/lib/libsbx.a
	@mkdir -p $(dir $@)
	$(CC) $(RELEASE_CFLAGS) -o $@ $^ $(LDLIBS_CLIENT) -lcurl

# The observability benchmark (exec throughput with metrics scraped and JSON logs on vs off).
bin/sbx-bench-obs: $(call objs,release,tools/bench_obs.c tools/stats.c tests/support/harness.c tests/support/hostlocks.c \
                   runtime/prom.c) build/release/lib/libsbx.a
	@mkdir -p $(dir $@)
	$(CC) $(RELEASE_CFLAGS) -o $@ $^ $(LDLIBS_CLIENT) -lcurl
RELEASE_BINS += bin/sbx-bench-obs

# The density benchmark (many idle sandboxes: memory, creation rate, stop time).
bin/sbx-bench-density: $(call objs,release,tools/bench_density.c tools/stats.c tests/support/harness.c tests/support/hostlocks.c) \
                       build/release/lib/libsbx.a
	@mkdir -p $(dir $@)
	$(CC) $(RELEASE_CFLAGS) -o $@ $^ $(LDLIBS_CLIENT)
RELEASE_BINS += bin/sbx-bench-density

# The bystander benchmark (a sandbox's API latency while another runs
# exhaustion attacks: issue 16's floor).
bin/sbx-bench-bystander: $(call objs,release,tools/bench_bystander.c tools/stats.c tests/support/harness.c tests/support/hostlocks.c) \
                         build/release/lib/libsbx.a
	@mkdir -p $(dir $@)
	$(CC) $(RELEASE_CFLAGS) -o $@ $^ $(LDLIBS_CLIENT)
RELEASE_BINS += bin/sbx-bench-bystander

# The code-interpreter drivers and their npm packages (bound at /opt/sbx in sandboxes).
INTERP_SRC := container/interp/driver.py $(wildcard container/interp/_sbx_driver/*.py) \
              container/interp/driver.js \
              container/interp/package.json container/interp/package-lock.json
%/share/sbx/interp/.installed: $(INTERP_SRC) tools/install-interp.sh
	@tools/install-interp.sh $*/share/sbx/interp
share/sbx/interp/.installed: $(INTERP_SRC) tools/install-interp.sh
	@tools/install-interp.sh share/sbx/interp

# Keep the objects of pattern chains (test support, harness): they are not
# throwaway intermediates, and rebuilding them made every test link slower.
.SECONDARY:

.PHONY: all deps run check test unit integration bench clean install install-lib man gen gen-check
all: $(RELEASE_BINS) lib/libsbx.a lib/libsbx.so lib/pkgconfig/sbx.pc

# ---- the client library: libsbx.a, libsbx.so, sbx.pc, install --------------------------
# include/sbx/sbx.h (with result.h) is the whole API.  Both libraries are
# built from position-independent objects with -fvisibility=hidden, so they
# export only what those headers mark SBX_API: the shared one by
# construction, the static one because its single object is the client
# objects linked together (ld -r) with every hidden symbol made local
# (tests/integration/test_libsbx.c checks both with nm).  The release `sbx`
# CLI links that archive, so it cannot use anything else of the tree; the
# in-tree programs that may (benchmarks, tests) link build/*/lib/libsbx.a,
# the plain archive of the client objects.
SBX_VERSION := 0.1.0
SBX_SOMAJOR := 0
PREFIX      ?= /usr/local
LIBSBX_PIC  := $(patsubst %.c,build/pic/obj/%.o,$(sort $(CLIENT)))
build/pic/obj/%.o: %.c | $(NNG_LIB)
	@mkdir -p $(dir $@)
	$(CC) $(RELEASE_CFLAGS) -fPIC -fvisibility=hidden $(DEPFLAGS) -c $< -o $@

build/pic/libsbx.o: $(LIBSBX_PIC) $(NNG_LIB)
	$(LD) -r -o $@.tmp $^
	objcopy --localize-hidden $@.tmp $@
	rm -f $@.tmp

lib/libsbx.a: build/pic/libsbx.o
	@mkdir -p lib
	rm -f $@ && ar rcs $@ $<

lib/libsbx.so.$(SBX_SOMAJOR): $(LIBSBX_PIC) $(NNG_LIB)
	@mkdir -p lib
	$(CC) $(RELEASE_CFLAGS) -shared -Wl,-soname,libsbx.so.$(SBX_SOMAJOR) -Wl,--no-undefined \
	    -o $@ $^ $(LDLIBS_CLIENT)

lib/libsbx.so: lib/libsbx.so.$(SBX_SOMAJOR)
	ln -sf libsbx.so.$(SBX_SOMAJOR) $@

# The tree's own sbx.pc points into the tree (PKG_CONFIG_PATH=$(CURDIR)/lib/pkgconfig).
lib/pkgconfig/sbx.pc: Makefile tools/sbx-pc.sh
	@mkdir -p $(dir $@)
	tools/sbx-pc.sh $(CURDIR) $(SBX_VERSION) > $@

install-lib: lib/libsbx.a lib/libsbx.so.$(SBX_SOMAJOR)
	install -d $(DESTDIR)$(PREFIX)/include/sbx $(DESTDIR)$(PREFIX)/lib/pkgconfig
	install -m 644 include/sbx/sbx.h include/sbx/result.h $(DESTDIR)$(PREFIX)/include/sbx/
	install -m 644 lib/libsbx.a $(DESTDIR)$(PREFIX)/lib/
	install -m 755 lib/libsbx.so.$(SBX_SOMAJOR) $(DESTDIR)$(PREFIX)/lib/
	ln -sf libsbx.so.$(SBX_SOMAJOR) $(DESTDIR)$(PREFIX)/lib/libsbx.so
	tools/sbx-pc.sh $(PREFIX) $(SBX_VERSION) > $(DESTDIR)$(PREFIX)/lib/pkgconfig/sbx.pc
# ---- end of the client library block ---------------------------------------------------

# ---- install the daemon like a service (issue 17; docs/operations.md "Install") -----------
#   make install  PREFIX=/usr/local [DESTDIR=…]: the client library (install-lib, above),
#                 PREFIX/bin/{sbx,sbxd}, PREFIX/libexec/sbx/sbx-agent (sbxd finds it there),
#                 PREFIX/share/sbx/interp (the interpreter drivers), man pages sbx(1) and
#                 sbxd(8), systemd units sbxd-dev, sbxd-gateway, sbxd-shard in
#                 SYSTEMD_UNIT_DIR (PREFIX/lib/systemd/system) with PREFIX/bin written in
#   make man      build/man/sbx.1 and sbxd.8 (INSTALL_BUILD/man/ for another build) from
#                 the programs' --help (tools/gen-man.sh, help2man)
# INSTALL_BUILD picks the build installed: bin (release, default) or build/asan
# (tests/install/run-tests.sh installs the build under test).
INSTALL_BUILD    ?= .
SYSTEMD_UNIT_DIR ?= $(PREFIX)/lib/systemd/system
IB := $(if $(filter .,$(INSTALL_BUILD)),,$(INSTALL_BUILD)/)
MANOUT := $(if $(IB),$(IB)man,build/man)
UNITS := sbxd-dev sbxd-gateway sbxd-shard
$(MANOUT)/sbx.1 $(MANOUT)/sbxd.8: $(IB)bin/sbx $(IB)bin/sbxd tools/gen-man.sh
	@tools/gen-man.sh $(IB)bin $(MANOUT) $(SBX_VERSION)
man: $(MANOUT)/sbx.1
install: install-lib $(IB)bin/sbx $(IB)bin/sbxd $(IB)bin/sbx-agent $(IB)share/sbx/interp/.installed \
         $(MANOUT)/sbx.1 $(MANOUT)/sbxd.8
	install -d $(DESTDIR)$(PREFIX)/bin $(DESTDIR)$(PREFIX)/libexec/sbx \
	    $(DESTDIR)$(PREFIX)/share/sbx $(DESTDIR)$(PREFIX)/share/man/man1 \
	    $(DESTDIR)$(PREFIX)/share/man/man8 $(DESTDIR)$(SYSTEMD_UNIT_DIR)
	install -m 755 $(IB)bin/sbx $(IB)bin/sbxd $(DESTDIR)$(PREFIX)/bin/
	install -m 755 tools/sbx-cert $(DESTDIR)$(PREFIX)/bin/
	install -m 755 $(IB)bin/sbx-agent $(DESTDIR)$(PREFIX)/libexec/sbx/
	rm -rf $(DESTDIR)$(PREFIX)/share/sbx/interp
	cp -a $(IB)share/sbx/interp $(DESTDIR)$(PREFIX)/share/sbx/interp
	install -m 644 $(MANOUT)/sbx.1 $(DESTDIR)$(PREFIX)/share/man/man1/
	install -m 644 $(MANOUT)/sbxd.8 $(DESTDIR)$(PREFIX)/share/man/man8/
	for u in $(UNITS); do \
	  sed -e 's|@BINDIR@|$(PREFIX)/bin|g' -e '/^\.include-hardening$$/{r dist/systemd/hardening.conf' \
	      -e 'd;}' dist/systemd/$$u.service.in > $(DESTDIR)$(SYSTEMD_UNIT_DIR)/$$u.service; \
	done
# The Debian package (debian/): `make deb` builds build/deb/sbx_*.deb from HEAD in a temp
# copy (tools/deb.sh; minutes: a full release build); `make deb-check` checks its files and
# units and runs its sbxd dev + sbx exec from an extracted copy (tools/deb-check.sh).
# `make deb-systemd-check` installs it under a real systemd booted in a throwaway container
# (systemd-nspawn over an overlay of this host's root; tools/deb-systemd-check.sh): the unit
# starts, `sbx exec` works through it, the package purges cleanly.
.PHONY: deb deb-check deb-systemd-check
deb:
	@tools/deb.sh build/deb
deb-check:
	@tools/deb-check.sh $$(ls -t build/deb/sbx_*.deb | head -1)
deb-systemd-check:
	@tools/deb-systemd-check.sh $$(ls -t build/deb/sbx_*.deb | head -1)
# ---- end of the install block -------------------------------------------------------------

# Tests: one Criterion binary per file.  Unit tests link the daemon's objects;
# integration and security tests link the client library and the harness,
# whose main() starts a private sbxd (tests/support/itest_main.c).
UNIT_LINK  := $(filter-out build/asan/obj/tools/sbxd%.o,$(call objs,asan,$(DAEMON))) \
              build/asan/obj/runtime/client.o $(NNG_LIB)
INTEG_LINK := $(call objs,asan,$(sort $(CLIENT)) $(TEST_SUPPORT) tests/support/itest_main.c) \
              $(NNG_LIB)
# The TLS test helpers (a test PKI, captured ClientHellos, reset-handshake storms;
# tests/support/tlstest.h).
TLSTEST_BINS := build/asan/tests/unit/test_nngx build/asan/tests/security/test_transport
$(TLSTEST_BINS): build/asan/obj/tests/support/tlstest.o
$(call objs,asan,tests/unit/test_nngx.c tests/security/test_transport.c tests/support/tlstest.c): \
    tests/support/tlstest.h
build/asan/tests/unit/%: build/asan/obj/tests/unit/%.o $(UNIT_LINK)
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) $(CRITERION_IPC) -o $@ $^ $(LDLIBS_DAEMON) $(LDLIBS_TEST)
build/asan/tests/integration/%: build/asan/obj/tests/integration/%.o $(INTEG_LINK)
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) $(CRITERION_IPC) -o $@ $^ $(LDLIBS_CLIENT) $(LDLIBS_TEST)
# test_shard runs a real shard on scripted agents: tests/unit/fake_spawn.c stands in
# for container/spawn.c (no root, no containers); --wrap=mdb_put lets it fail one
# record's writes as a full disk would.
build/asan/tests/unit/test_shard: build/asan/obj/tests/unit/test_shard.o \
    build/asan/obj/tests/unit/fake_spawn.o $(filter-out build/asan/obj/container/spawn.o,$(UNIT_LINK))
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) $(CRITERION_IPC) -Wl,--wrap=mdb_put -o $@ $^ $(LDLIBS_DAEMON) $(LDLIBS_TEST)
# test_store_log fails the redo log's fdatasync and pwrite, and the store's
# mdb_txn_commit, through --wrap (LMDB's own calls, inside liblmdb.so, are not wrapped).
build/asan/tests/unit/test_store_log: build/asan/obj/tests/unit/test_store_log.o $(UNIT_LINK)
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) $(CRITERION_IPC) -Wl,--wrap=fdatasync,--wrap=pwrite,--wrap=mdb_txn_commit -o $@ $^ $(LDLIBS_DAEMON) $(LDLIBS_TEST)
# test_mount_attr checks the agent's mount attributes (container/agent/mount_attr.c).
build/asan/tests/unit/test_mount_attr: build/asan/obj/container/agent/mount_attr.o
# The image tests build OCI layouts with libarchive (tests/support/imgbuild.h).
build/asan/tests/unit/test_images: build/asan/obj/tests/support/imgbuild.o
build/asan/tests/integration/test_images: build/asan/obj/tests/support/imgbuild.o
build/asan/tests/integration/test_images: LDLIBS_TEST += -larchive
build/asan/tests/integration/test_image_pull: build/asan/obj/tests/support/imgbuild.o
build/asan/tests/integration/test_image_pull: LDLIBS_TEST += -larchive
build/asan/tests/integration/test_egress: build/asan/obj/tests/support/imgbuild.o
build/asan/tests/integration/test_egress: LDLIBS_TEST += -larchive
build/asan/tests/integration/test_workspace: build/asan/obj/tests/support/imgbuild.o
build/asan/tests/integration/test_workspace: LDLIBS_TEST += -larchive
build/asan/tests/cluster/test_cluster_images: build/asan/obj/tests/support/imgbuild.o
build/asan/tests/cluster/test_cluster_images: LDLIBS_TEST += -larchive
# test_fork and test_wspool compute which shard of `sbxd dev` owns an ID
# (tests/support/shard_of.c, runtime/place.c).
build/asan/tests/integration/test_fork build/asan/tests/integration/test_wspool: \
    $(call objs,asan,runtime/place.c tests/support/shard_of.c)
build/asan/tests/integration/test_fork build/asan/tests/integration/test_wspool: \
    LDLIBS_TEST += -lxxhash
# test_backup writes hostile archives into the backup store with libarchive.
build/asan/tests/integration/test_backup: LDLIBS_TEST += -larchive
# test_http_sse reads the table of operations (runtime/ops.h) to check that every one is served.
build/asan/tests/integration/test_http_sse: $(call objs,asan,runtime/ops.c runtime/ops_gen.c)
# test_destroy_queued holds the write lock of a shard's LMDB environment.
build/asan/tests/integration/test_destroy_queued: LDLIBS_TEST += -llmdb
build/asan/tests/security/%: build/asan/obj/tests/security/%.o $(INTEG_LINK)
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) $(CRITERION_IPC) -o $@ $^ $(LDLIBS_CLIENT) $(LDLIBS_TEST)
# test_tenants' randomized client draws operations from the table (runtime/ops.h).
build/asan/tests/security/test_tenants: $(call objs,asan,runtime/ops.c runtime/ops_gen.c)
# The escape tests' two binaries share their probe helpers (tests/security/escape_util.h).
ESCAPE_TESTS := $(wildcard tests/security/test_escape_*.c)
$(patsubst %.c,build/asan/%,$(ESCAPE_TESTS)): build/asan/obj/tests/security/escape_util.o
$(call objs,asan,$(ESCAPE_TESTS) tests/security/escape_util.c): tests/security/escape_util.h
# So do the HTTP front's two (tests/integration/http_util.h).
HTTP_TESTS := tests/integration/test_http.c tests/integration/test_http_sse.c
$(patsubst %.c,build/asan/%,$(HTTP_TESTS)): build/asan/obj/tests/integration/http_util.o
$(call objs,asan,$(HTTP_TESTS) tests/integration/http_util.c): tests/integration/http_util.h
# And the code-context tests' two (tests/integration/interp_util.h).
INTERP_TESTS := tests/integration/test_interp.c tests/integration/test_interp_edges.c
$(patsubst %.c,build/asan/%,$(INTERP_TESTS)): build/asan/obj/tests/integration/interp_util.o
$(call objs,asan,$(INTERP_TESTS) tests/integration/interp_util.c): tests/integration/interp_util.h
# And the fault-injection tests' two (tests/integration/faults_util.h).
FAULT_TESTS := tests/integration/test_faults.c tests/integration/test_faults_outages.c
$(patsubst %.c,build/asan/%,$(FAULT_TESTS)): build/asan/obj/tests/integration/faults_util.o
$(call objs,asan,$(FAULT_TESTS) tests/integration/faults_util.c): tests/integration/faults_util.h
# And the egress tests' two on one test host (tests/integration/egress_util.h).
EGRESS_HOST_TESTS := tests/integration/test_egress_dns.c tests/integration/test_egress_traffic.c
$(patsubst %.c,build/asan/%,$(EGRESS_HOST_TESTS)): build/asan/obj/tests/integration/egress_util.o
$(call objs,asan,$(EGRESS_HOST_TESTS) tests/integration/egress_util.c): tests/integration/egress_util.h

TEST_BINS := $(patsubst %.c,build/asan/%,$(UNIT_TESTS) $(INTEG_TESTS))

deps:
	@tools/deps.sh

# The patched nng (above): fetched, checked, patched and built once; the script is a
# no-op when build/nng is current.  Every object waits for it (its headers).
$(NNG_LIB): tools/nng-build.sh $(wildcard tools/nng/*.patch)
	@tools/nng-build.sh $(NNG_DIR)
	@touch $@

run: deps
	@$(MAKE) --no-print-directory all
	@tools/demo.sh

# The files generated from runtime/ops.yaml (docs/schema.md) are committed:
# `make gen` rewrites them, `make gen-check` fails with the diff when one is
# stale (run first by `make test`).
gen:
	@python3 tools/gen_ops.py
gen-check:
	@python3 tools/gen_ops.py --check

# The build is one job per core unless make was given -j (a fresh clone's asan
# build, one job at a time, was about 4 of make test's minutes on 2 cores), the
# fuzz targets included (built one at a time inside `make fuzz-smoke`, they took
# ~1.5 of its 2 minutes beside the other tests).
test: deps gen-check
	@case " $(MAKEFLAGS) " in *" -j"*) j= ;; *) j=-j$$(nproc) ;; esac; \
	  $(MAKE) --no-print-directory $$j $(ASAN_BINS) $(TEST_BINS) $(FUZZ_BINS) bin/sbx-bench
	@tools/run-tests.sh build/asan

unit: $(patsubst %.c,build/asan/%,$(UNIT_TESTS))
	@tools/run-tests.sh build/asan unit

# Opt-in, never in `make test` or CI: tests that reach the public npm registry
# (tests/online/run-tests.sh: `npm install` in an egress sandbox allowed the
# registry by name, refused without the rule).  Release build.
.PHONY: test-online
test-online: deps all
	@tests/online/run-tests.sh

# The inner loop: what a change should pass before `make test`.  gen-check (half a
# second: the generated files are current), then the unit tests (no root,
# no containers), every fuzz target over its committed corpus once (fuzz-replay, below) and
# tests/integration/test_smoke (one sandbox's life on a private sbxd dev, root).  No
# `deps`: run `make deps` (or `make test`) once first on a new machine.  What it needs is
# built with one job per core unless make was given -j.
CHECK_BINS  = $(ASAN_BINS) $(patsubst %.c,build/asan/%,$(UNIT_TESTS)) \
              build/asan/tests/integration/test_smoke $(FUZZ_BINS)
check: gen-check
	@case " $(MAKEFLAGS) " in *" -j"*) j= ;; *) j=-j$$(nproc) ;; esac; \
	  $(MAKE) --no-print-directory $$j $(CHECK_BINS)
	@tools/run-tests.sh build/asan check

# ---- reliability (issue 7 parts 4-7): fuzzing, valgrind, soak --------------------------
# One block; `make test` reaches it through tools/run-tests.sh, which runs
# `make fuzz-smoke` and `make valgrind` after the test binaries.
#
#   make fuzz          every libFuzzer target in tests/fuzz/ for FUZZ_SECONDS (300) each,
#                      FUZZ_JOBS (2) at a time
#   make fuzz-smoke    the same for FUZZ_SMOKE_SECONDS (5) each, two at a time (make test)
#   make fuzz-replay   each target over its committed corpus once, no mutation (make check)
#   make valgrind      a short scenario with the release shard, gateway and client under
#                      valgrind --leak-check=full --error-exitcode=1 (tools/valgrind.sh)
#   make soak          200 sandboxes doing mixed operations for SOAK_SECONDS (300) against
#                      the release build, p50/p99 per operation (tools/soak.c)
#
# Fuzz targets are built with clang (-fsanitize=fuzzer,address,undefined) into
# build/fuzz/; new corpus entries go to build/fuzz/work/<target>, crashes to
# build/fuzz/artifacts/; the committed seeds (and every input that once failed)
# are tests/fuzz/corpus/<target>/.
FUZZ_CC            ?= clang
FUZZ_SECONDS       ?= 300
FUZZ_SMOKE_SECONDS ?= 5
SOAK_SECONDS       ?= 300
SOAK_SANDBOXES     ?= 200
FUZZ_JOBS          ?= 2
# clang has no -Wformat-truncation to switch off
FUZZ_CFLAGS := $(CSTD) $(filter-out -Wno-format-truncation,$(WARN)) -g -O1 -pthread \
               -fno-strict-aliasing -I. -I$(NNG_DIR)/include -fno-omit-frame-pointer \
               -fsanitize=fuzzer-no-link,address,undefined -fno-sanitize-recover=undefined
FUZZ_LDFLAGS :=
FUZZ_LIBS   := -lmsgpackc -ljansson -luuid -lpthread -lm
FUZZ_RT     := runtime/err.c runtime/log.c runtime/util.c runtime/wire.c runtime/id.c \
               runtime/json.c runtime/frame.c runtime/config.c runtime/ops.c runtime/ops_gen.c \
               runtime/loop.c runtime/error.c
FUZZ_AGENT  := $(filter-out runtime/%,$(AGENT))
FUZZ_TARGETS := $(patsubst tests/fuzz/%.c,%,$(wildcard tests/fuzz/fuzz_*.c))
FUZZ_BINS   := $(addprefix build/fuzz/,$(FUZZ_TARGETS))
fuzz_objs    = $(patsubst %.c,build/fuzz/obj/%.o,$(1))

.PRECIOUS: build/fuzz/obj/%.o
build/fuzz/obj/%.o: %.c | $(NNG_LIB)
	@mkdir -p $(dir $@)
	$(FUZZ_CC) $(FUZZ_CFLAGS) $(DEPFLAGS) -c $< -o $@
# fuzz_path and fuzz_agent link the agent and reach its internals through its
# internal headers (container/agent/*_int.h); the agent's main() is renamed
# in their copy of main.o so that libFuzzer's is the program's (rebuilt when the
# Makefile changes: a copy compiled before the rename would clash with libFuzzer's main).
build/fuzz/obj/container/agent/main.o: FUZZ_CFLAGS += -Dmain=sbx_agent_main
build/fuzz/obj/container/agent/main.o: Makefile
build/fuzz/fuzz_record: $(call fuzz_objs,actors/record.c)
build/fuzz/fuzz_path: $(call fuzz_objs,$(FUZZ_AGENT))
build/fuzz/fuzz_agent: $(call fuzz_objs,$(FUZZ_AGENT))
# fuzz_http, fuzz_preview and fuzz_terminal link the HTTP front, with the libraries
# it calls, and reach it through its internal headers (gateway/*_int.h);
# fuzz_terminal catches the front's calls to the sandbox at link time.
FUZZ_GW     := gateway/http.c gateway/http_route.c gateway/openapi_gen.c gateway/http_auth.c \
               gateway/keyfile.c \
               gateway/http_token.c \
               gateway/http_sse.c gateway/http_call.c gateway/preview.c gateway/terminal.c \
               gateway/console.c build/console/console_assets.c runtime/relay.c runtime/nngx.c \
               gateway/mcp_http.c runtime/mcp.c
build/fuzz/fuzz_http build/fuzz/fuzz_preview build/fuzz/fuzz_terminal: \
    FUZZ_LIBS += -lmicrohttpd $(NNG_LIBS) -lcurl -lwslay -lnettle
build/fuzz/fuzz_http: $(call fuzz_objs,$(FUZZ_GW))
build/fuzz/fuzz_preview: $(call fuzz_objs,$(FUZZ_GW))
build/fuzz/fuzz_terminal: $(call fuzz_objs,$(FUZZ_GW))
build/fuzz/fuzz_terminal: FUZZ_LDFLAGS += -Wl,--wrap=http_call_sync
# fuzz_relay links actors/relay.c (the shard's relay; actors/relay_int.h), replaces the
# actor table with a scripted one and catches its posts to the loop thread.
build/fuzz/fuzz_relay: $(call fuzz_objs,actors/relay.c runtime/relay.c)
build/fuzz/fuzz_relay: FUZZ_LDFLAGS += -Wl,--wrap=sbx_loop_post
# fuzz_etcd links runtime/etcd.c and runtime/cview.c (runtime/etcd_int.h, cview_int.h)
# with libcurl's easy API scripted and jansson's parser counted.
build/fuzz/fuzz_etcd: $(call fuzz_objs,runtime/etcd.c runtime/cview.c)
build/fuzz/fuzz_etcd: FUZZ_LIBS += -lcurl
build/fuzz/fuzz_etcd: FUZZ_LDFLAGS += -Wl,--wrap=curl_easy_init,--wrap=curl_easy_setopt \
    -Wl,--wrap=curl_easy_perform,--wrap=curl_easy_getinfo,--wrap=curl_easy_cleanup \
    -Wl,--wrap=json_loadb
# fuzz_egress_head links the egress point's request-head parser and injection rules
# (container/net_http.c, net_proxy.c; container/net_int.h).
build/fuzz/fuzz_egress_head: $(call fuzz_objs,container/net_http.c container/net_proxy.c \
    container/net_policy.c)
build/fuzz/fuzz_%: build/fuzz/obj/tests/fuzz/fuzz_%.o $(call fuzz_objs,$(FUZZ_RT))
	$(FUZZ_CC) -fsanitize=fuzzer,address,undefined $(FUZZ_LDFLAGS) -o $@ $^ $(FUZZ_LIBS)

bin/sbx-soak: $(call objs,release,tools/soak.c tools/stats.c tests/support/harness.c tests/support/hostlocks.c) build/release/lib/libsbx.a
	@mkdir -p $(dir $@)
	$(CC) $(RELEASE_CFLAGS) -o $@ $^ $(LDLIBS_CLIENT)

.PHONY: fuzz fuzz-smoke fuzz-replay fuzz-bins valgrind soak
fuzz-bins: $(FUZZ_BINS)
fuzz: fuzz-bins
	@tools/fuzz.sh $(FUZZ_SECONDS) $(FUZZ_JOBS) $(FUZZ_TARGETS)
fuzz-smoke: fuzz-bins
	@rm -rf build/fuzz/smoke
	@FUZZ_WORK=build/fuzz/smoke tools/fuzz.sh $(FUZZ_SMOKE_SECONDS) 2 $(FUZZ_TARGETS)
# -runs=0: libFuzzer runs the inputs of the corpus directory and stops; a crash, a
# property failure or a 10 s input fails the target (log in build/fuzz/logs/<t>.replay.log).
fuzz-replay: fuzz-bins
	@mkdir -p build/fuzz/logs build/fuzz/artifacts; rc=0; for t in $(FUZZ_TARGETS); do \
	  if build/fuzz/$$t -runs=0 -timeout=10 -rss_limit_mb=2560 \
	       -artifact_prefix=build/fuzz/artifacts/$$t-replay- tests/fuzz/corpus/$$t \
	       >build/fuzz/logs/$$t.replay.log 2>&1; then \
	    echo "fuzz-replay: $$t ok ($$(ls tests/fuzz/corpus/$$t | wc -l) inputs)"; \
	  else \
	    echo "fuzz-replay: $$t FAILED — see build/fuzz/logs/$$t.replay.log"; \
	    grep -m1 -A12 -E 'ERROR: |property failed|==ERROR|runtime error' \
	      build/fuzz/logs/$$t.replay.log | sed 's/^/    /'; rc=1; \
	  fi; done; exit $$rc
SOAK_BINS := bin/sbxd bin/sbx bin/sbx-agent bin/sbx-soak share/sbx/interp/.installed
valgrind: $(SOAK_BINS)
	@tools/valgrind.sh
soak: $(SOAK_BINS)
	@SBX_BIN=bin bin/sbx-soak --seconds $(SOAK_SECONDS) --sandboxes $(SOAK_SANDBOXES)
# ---- end of the reliability block -------------------------------------------------------

# ---- fault-injection history test (issue 11) ----------------------------------------------
# tests/faults/: client threads record every operation (invoke -> ok/fail/unknown) while
# faults are injected; checker.py (Wing & Gong linearizability with Lowe's memoization)
# decides.  docs/cluster.md, "Fault-injection history test".  Binaries: $SBX_BIN if set
# (tools/run-tests.sh sets the ASan build's), else the release build in bin/.
#   make faults        FAULTS_EVENTS (300) events on `sbxd dev` (shard kill -9, SIGSTOP, a
#                      data tmpfs that fills up), then as many on a 3-node cluster with a
#                      3-member etcd (tests/faults/cluster.py)
#                      and FAULTS_SHARD_KILLS (200) random shard kills during container
#                      creation that must leave nothing behind (test_shard_kill; make test: 25)
#   make faults-smoke  the checker's unit tests, then FAULTS_SMOKE_EVENTS (25) shard kill -9 /
#                      SIGSTOP / full data tmpfs events on `sbxd dev`, then 12 kills under a create/destroy-heavy
#                      workload (--mix lifecycle: the answers a retry must not change) (make test)
FAULTS_EVENTS       ?= 300
FAULTS_SMOKE_EVENTS ?= 25
FAULTS_SHARD_KILLS  ?= 200
FAULTS_BINS := $(if $(SBX_BIN),,bin/sbxd bin/sbx bin/sbx-agent)
FAULTS_ENV  := SBX_BIN=$(or $(SBX_BIN),$(CURDIR)/bin) PYTHONDONTWRITEBYTECODE=1
.PHONY: faults faults-smoke
faults-smoke: $(FAULTS_BINS)
	@$(FAULTS_ENV) python3 -m unittest tests/faults/test_checker.py
	@$(FAULTS_ENV) python3 tests/faults/faults.py --events $(FAULTS_SMOKE_EVENTS) --faults kill,stop,fill
	@$(FAULTS_ENV) python3 tests/faults/faults.py --events 12 --faults kill --mix lifecycle \
	    --clients 12 --keys 12
faults: $(FAULTS_BINS) $(ASAN_BINS) build/asan/tests/integration/test_shard_kill
	@$(FAULTS_ENV) python3 -m unittest tests/faults/test_checker.py
	@rc=0; $(FAULTS_ENV) python3 tests/faults/faults.py --events $(FAULTS_EVENTS) \
	    --faults kill,stop,fill || rc=1; \
	  $(FAULTS_ENV) python3 tests/faults/faults.py --cluster --events $(FAULTS_EVENTS) || rc=1; \
	  SBX_SHARD_KILLS=$(FAULTS_SHARD_KILLS) SBX_BIN=$(CURDIR)/build/asan/bin \
	    build/asan/tests/integration/test_shard_kill --jobs 1 --timeout 1800 || rc=1; \
	  exit $$rc
# ---- end of the fault-injection block -------------------------------------------------------

# ---- cluster tests and benchmark (issue 6 parts 6-7) -------------------------------------
# tests/cluster/test_*.c are Criterion binaries with their own main()
# (tests/cluster/cluster_main.c) that build a multi-host cluster on this machine
# (tests/cluster/cluster.c: shard nodes in network namespaces on a bridge, etcd, two
# gateways; root, iproute2 and etcd-server needed).  `make test` builds and runs them
# (tools/run-tests.sh); `make cluster-test` runs only them.  `make bench-cluster` runs the
# horizontal-scaling benchmark (tools/bench-cluster.c) on the same setup with the release
# binaries (docs/benchmarks.md, "Cluster scaling").
CLUSTER_TESTS   := $(wildcard tests/cluster/test_*.c)
CLUSTER_SUPPORT := tests/cluster/cluster.c tests/cluster/cluster_sup.c tests/cluster/cluster_state.c \
                   tests/cluster/cluster_client.c runtime/etcd.c runtime/place.c \
                   tests/support/hostlocks.c tests/support/shell.c
CLUSTER_LINK    := $(call objs,asan,$(sort $(CLIENT)) $(CLUSTER_SUPPORT) tests/cluster/cluster_main.c \
                                    tests/cluster/eproxy.c tests/cluster/cluster_util.c)
CLUSTER_BINS    := $(patsubst %.c,build/asan/%,$(CLUSTER_TESTS))
build/asan/tests/cluster/%: build/asan/obj/tests/cluster/%.o $(CLUSTER_LINK)
	@mkdir -p $(dir $@)
	$(CC) $(ASAN_CFLAGS) $(CRITERION_IPC) -o $@ $^ $(LDLIBS_CLIENT) -lxxhash -lcurl $(LDLIBS_TEST)
TEST_BINS += $(CLUSTER_BINS)
bin/sbx-bench-cluster: $(call objs,release,tools/bench-cluster.c tools/stats.c $(CLUSTER_SUPPORT)) \
                       build/release/lib/libsbx.a
	@mkdir -p $(dir $@)
	$(CC) $(RELEASE_CFLAGS) -o $@ $^ $(LDLIBS_CLIENT) -lxxhash -lcurl
.PHONY: cluster-test bench-cluster
cluster-test: $(ASAN_BINS) $(CLUSTER_BINS)
	@set -e; export SBX_BIN=$(CURDIR)/build/asan/bin \
	  ASAN_OPTIONS=detect_leaks=1:halt_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  LSAN_OPTIONS=suppressions=$(CURDIR)/tests/lsan.supp:print_suppressions=0; \
	  for t in $(CLUSTER_BINS); do $$t --verbose; done
bench-cluster: all bin/sbx-bench-cluster
	@SBX_BIN=bin bin/sbx-bench-cluster $(BENCH_CLUSTER_ARGS)
# ---- end of the cluster block -----------------------------------------------------------

bench: all
	@bin/sbx-bench
	@bin/sbx-bench-interp
	@bin/sbx-bench-http

clean:
	rm -rf build bin lib share

# Every object's header dependencies (-MMD -MP above; release, asan, pic and fuzz).  A
# compiled object (build/*/obj/) without its .d was built before these rules: without
# knowing its headers, rebuild it.
DEPFILES := $(shell find build -name '*.d' 2>/dev/null)
-include $(DEPFILES)
$(filter-out $(DEPFILES:.d=.o),$(shell find build -path '*/obj/*' -name '*.o' 2>/dev/null)): FORCE
.PHONY: FORCE
FORCE:
