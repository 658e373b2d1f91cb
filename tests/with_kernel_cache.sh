#!/usr/bin/env bash
# tests/with_kernel_cache.sh COMMAND... — runs COMMAND with the kernel caches named by
# $XDG_CACHE_HOME (PoCL's kernel cache and Loom's OpenCL binaries: tests/CMakeLists.txt
# gives each script test a folder of its own), started the first time as hard links to the
# files of $LOOM_KERNEL_CACHE_SEED (filled by tests/kernel_cache_seed.sh), as a GoogleTest
# process's caches are (tests/test_util.cpp): the test's loom processes find the kernels
# the seed compiled instead of compiling them again.
set -euo pipefail
cache=${XDG_CACHE_HOME:?with_kernel_cache.sh: XDG_CACHE_HOME names the test\'s cache folder}
seed=${LOOM_KERNEL_CACHE_SEED:-}
if [[ ! -d "$cache" ]]; then
  partial="$cache.copying.$$"  # linked into a temporary folder, then renamed: all or nothing
  mkdir -p "$partial"
  if [[ -n "$seed" && -d "$seed" ]]; then
    cp -r --link "$seed/." "$partial/" 2>/dev/null || cp -r "$seed/." "$partial/"
  fi
  mv -T "$partial" "$cache" 2>/dev/null || rm -rf "$partial"
fi
exec "$@"
