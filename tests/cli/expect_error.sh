#!/usr/bin/env bash
# expect_error.sh REGEX COMMAND...: runs COMMAND and passes when it exits non-zero (and not by
# a signal), prints exactly one line on stderr, that line matches REGEX (grep -E), and the exit
# code is the one of the line's error kind ("TOOL: usage error: ..." 2, "internal error" 70,
# every other kind 1; runtime/format/error.h).
set -u
regex=$1
shift
err=$("$@" 2>&1 >/dev/null)
code=$?
if [ "$code" -eq 0 ]; then echo "FAIL: exit 0, expected an error"; exit 1; fi
if [ "$code" -ge 128 ]; then echo "FAIL: killed by signal $((code - 128)): $err"; exit 1; fi
lines=$(printf '%s\n' "$err" | wc -l)
if [ "$lines" -ne 1 ]; then echo "FAIL: $lines lines on stderr:"; echo "$err"; exit 1; fi
if ! printf '%s\n' "$err" | grep -Eq -- "$regex"; then echo "FAIL: '$err' does not match '$regex'"; exit 1; fi
case "$err" in
  *": usage error: "*) want=2 ;;
  *": internal error: "*) want=70 ;;
  *) want=1 ;;
esac
if [ "$code" -ne "$want" ]; then echo "FAIL: exit $code, expected $want for: $err"; exit 1; fi
echo "ok (exit $code): $err"
