#!/bin/sh
# sbx-pc.sh PREFIX VERSION — print the pkg-config file of libsbx installed
# under PREFIX (the Makefile writes lib/pkgconfig/sbx.pc and the installed
# one with it).  msgpack is required, not private: include/sbx/sbx.h
# includes <msgpack.h> (results are msgpack_object views).  nng is inside
# libsbx (the patched static nng of tools/nng-build.sh, its symbols local):
# only its TLS library, mbedTLS, is left to link.
set -eu
cat <<PC
prefix=$1
exec_prefix=\${prefix}
libdir=\${exec_prefix}/lib
includedir=\${prefix}/include

Name: sbx
Description: C client library of sbx, the code-execution sandbox runtime
Version: $2
Requires: msgpack
Cflags: -I\${includedir}
Libs: -L\${libdir} -lsbx
Libs.private: -lmbedtls -lmbedx509 -lmbedcrypto -lmsgpackc -luuid -ljansson -lpthread -lm
PC
