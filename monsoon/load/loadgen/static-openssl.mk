# OpenSSL (the engine's DTLS for CoAP) linked statically from libssl-dev's archives, so that monsoon-loadgen needs
# no libssl where it runs (a pod's image, a wheel; auditwheel then grafts nothing). openssl-sys reads these
# target-prefixed variables (pkg-config never links a library of /usr statically). They apply only where
# <LIB_DIR>/libssl.a and <LIB_DIR>/libcrypto.a exist (Debian/Ubuntu x86_64); elsewhere OpenSSL links dynamically.
# The one place they are written: the Makefile includes this file, and setup.py and
# monsoon.load.loadgen_build.static_openssl_env read its `KEY = VALUE` lines.
X86_64_UNKNOWN_LINUX_GNU_OPENSSL_STATIC = 1
X86_64_UNKNOWN_LINUX_GNU_OPENSSL_LIB_DIR = /usr/lib/x86_64-linux-gnu
X86_64_UNKNOWN_LINUX_GNU_OPENSSL_INCLUDE_DIR = /usr/include
