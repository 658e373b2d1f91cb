#!/usr/bin/env bash
# The sanitizer build's compiled-in ASan default intercept_tls_get_addr=0 keeps
# LeakSanitizer's exit-time check from crashing on dynamic TLS (the "Tracer caught signal
# 11" that failed OpenCL tests after they had passed; src/core/sanitizer_defaults.cpp.in):
#  - with the build's defaults, the probe's leak check runs to the end and finds nothing;
#  - the control: with the interceptor turned back on, the same probe's check crashes. If
#    it no longer does, this toolchain's runtime has dropped the misreading (LLVM 17 did)
#    and the default can go: the test says so and passes.
# Usage: test_dynamic_tls.sh PROBE LIBRARY
set -u
probe=$1 library=$2
failures=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }
out=$(ASAN_OPTIONS=detect_leaks=1 "$probe" "$library" 2>&1)
rc=$?
echo "$out" | head -n 5
[[ $rc -eq 0 ]] || fail "with the build's defaults the probe exited $rc, expected 0"
[[ $out == *"16 bytes past a 4 KiB boundary"* ]] || fail "the probe did not place a block at the misread offset"
[[ $out != *"Tracer caught"* && $out != *"LeakSanitizer has encountered a fatal error"* ]] ||
  fail "LeakSanitizer's check crashed with the build's defaults"
[[ $out != *"detected memory leaks"* ]] || fail "LeakSanitizer found a leak in the probe"
control=$(ASAN_OPTIONS=detect_leaks=1:intercept_tls_get_addr=1 "$probe" "$library" 2>&1)
if [[ $control == *"Tracer caught signal"* ]]; then
  echo "control: with intercept_tls_get_addr=1 the same check crashes: $(echo "$control" | grep -m1 'Tracer caught')"
else
  echo "note: with intercept_tls_get_addr=1 the check no longer crashes: this runtime has dropped the misreading, and the default in src/core/sanitizer_defaults.cpp.in can go"
fi
(( failures == 0 )) || exit 1
echo "dynamic TLS under LeakSanitizer: all checks passed"
