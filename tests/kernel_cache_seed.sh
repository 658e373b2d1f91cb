#!/usr/bin/env bash
# tests/kernel_cache_seed.sh LOOM SEED [DONOR] — fills SEED, the kernel caches every test
# process starts from (tests/test_util.cpp links its files into a folder of the test's own;
# tests/with_kernel_cache.sh does the same for the script tests).
#   1. DONOR, when given and present, is another build's test-cache folder (the release
#      build's, for the sanitizer build: the OpenCL kernels are the same programs for the
#      same device whichever build compiles them). Every entry of every folder there is
#      copied in, never over one SEED has: PoCL's kernel cache and Loom's OpenCL binaries are
#      keyed by a hash of what was compiled, so an entry is the same whoever wrote it.
#   2. LOOM opens every backend of the build once (Loom's OpenCL program: about 4 s of
#      PoCL's compiler).
#   3. Every file of SEED is made read-only: tests link to them, so a writer that changed a
#      file in place instead of replacing it (both caches write a new file and rename it)
#      would fail loudly rather than change every test's cache.
set -euo pipefail
loom=$1 seed=$2 donor=${3:-}
mkdir -p "$seed"
if [[ -n "$donor" && -d "$donor" && "$(cd "$donor" && pwd)" != "$(cd "$seed/.." && pwd)" ]]; then
  merged=0
  for folder in "$donor"/*/; do
    [[ "$folder" == *.copying.* ]] && continue
    cp -r --no-clobber "$folder." "$seed/" 2>/dev/null || true
    merged=$((merged + 1))
  done
  echo "kernel cache seed: merged the entries of $merged folders of $donor"
fi
XDG_CACHE_HOME="$seed" "$loom" ops --backend all --layers 1 --width 16 --heads 2 --context 8 \
  --batch 2 --vocab 16 --steps 1
find "$seed" -type f -perm /222 -exec chmod a-w {} +
echo "kernel cache seed: $(find "$seed" -type f | wc -l) files, $(du -sh "$seed" | cut -f1)"
