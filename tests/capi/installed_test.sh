#!/usr/bin/env bash
# The C ABI as a user gets it: `cmake --install` into a scratch prefix, the C test compiled as C11
# (not C++) against the installed header and library through pkg-config, run; and the library's
# exported symbols checked: exactly the functions include/selfserve.h declares, all ss_*.
#   tests/capi/installed_test.sh BUILD_DIR
set -euo pipefail
src=$(cd "$(dirname "$0")/../.." && pwd)
build=$(cd "${1:?usage: installed_test.sh BUILD_DIR}" && pwd)
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install "$build" --prefix "$prefix" >/dev/null
libdir=$(dirname "$(find "$prefix" -name selfserve.pc)")/..
export PKG_CONFIG_PATH="$libdir/pkgconfig"
lib="$libdir/libselfserve.so"

# Symbols: every dynamic symbol the library defines is an ss_* function of the header, and every
# function of the header is there.
exported=$(nm -D --defined-only "$lib" | awk '$2 != "A" {print $3}' | sed 's/@.*//' | sort -u)
declared=$(grep -oE '\bss_[a-z0-9_]+\(' "$prefix/include/selfserve.h" | tr -d '(' | sort -u)
if [ "$exported" != "$declared" ]; then
  echo "exported symbols differ from the header's functions:" >&2
  diff <(echo "$declared") <(echo "$exported") >&2 || true
  exit 1
fi
echo "symbols: $(echo "$exported" | wc -l) exported, all ss_* and all declared"

# The header alone compiles as strict C11 and as C++ (extern "C").
cc -std=c11 -pedantic-errors -Wall -Wextra -Werror -fsyntax-only -x c "$prefix/include/selfserve.h"
c++ -std=c++17 -Wall -Wextra -Werror -fsyntax-only -x c++ "$prefix/include/selfserve.h"

cc -std=c11 -pedantic-errors -Wall -Wextra -Werror "$src/tests/capi/capi_test.c" -o "$prefix/capi_test" \
  $(pkg-config --cflags --libs selfserve)
if ldd "$prefix/capi_test" | grep -q "$build/libselfserve"; then
  echo "capi_test links the build tree's library, not the installed one" >&2
  exit 1
fi
exec "$prefix/capi_test"
