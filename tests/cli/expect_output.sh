#!/usr/bin/env bash
# expect_output.sh REGEX COMMAND...: runs COMMAND and passes when it exits 0, prints nothing on
# stderr, and its stdout matches REGEX (grep -Ez: the whole output as one text, '.' spanning lines).
set -u
regex=$1
shift
errfile=$(mktemp)
out=$("$@" 2>"$errfile")
code=$?
err=$(cat "$errfile")
rm -f "$errfile"
if [ "$code" -ne 0 ]; then echo "FAIL: exit $code: $err"; exit 1; fi
if [ -n "$err" ]; then echo "FAIL: stderr: $err"; exit 1; fi
if ! printf '%s\n' "$out" | grep -Ezq -- "$regex"; then
  echo "FAIL: output does not match '$regex':"
  printf '%s\n' "$out" | head -40
  exit 1
fi
echo "ok"
