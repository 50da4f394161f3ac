#!/usr/bin/env bash
# Proves doc_links_test.sh can fail: a small tree with one link of each bad kind (a missing file,
# a missing anchor, a link out of the repository) is refused with one line each; mended, passes.
set -euo pipefail
checker=$1
tree=$(mktemp -d)
trap 'rm -rf "$tree"' EXIT
mkdir -p "$tree/docs" "$tree/samples"
printf '# Samples\n\nBack to the [README](../README.md#quick-start).\n' >"$tree/samples/README.md"
printf '# Notes\n\n## How it works\n\nSee [the start](../README.md#quick-start).\n' >"$tree/docs/notes.md"
cat >"$tree/README.md" <<'MD'
# Title

## Quick start

[notes](docs/notes.md#how-it-works), [gone](docs/gone.md), [no such part](docs/notes.md#nowhere),
[outside](https://example.org/), `[in code](docs/gone.md)`.

    [indented code](docs/gone.md)
MD
set +e
out=$(bash "$checker" "$tree" 2>&1)
rc=$?
set -e
echo "$out"
[ "$rc" -eq 1 ] || { echo "FAIL: expected exit 1, got $rc"; exit 1; }
grep -q "README.md: link 'docs/gone.md': docs/gone.md does not exist" <<<"$out" ||
  { echo "FAIL: missing file not reported"; exit 1; }
grep -q "README.md: link 'docs/notes.md#nowhere': no heading '#nowhere' in docs/notes.md" <<<"$out" ||
  { echo "FAIL: missing anchor not reported"; exit 1; }
grep -q "README.md: link 'https://example.org/' leaves the repository" <<<"$out" ||
  { echo "FAIL: outside link not reported"; exit 1; }
[ "$(grep -c '^README.md: ' <<<"$out")" -eq 3 ] || { echo "FAIL: expected 3 bad links"; exit 1; }

sed -i -e 's|, \[gone\](docs/gone.md), \[no such part\](docs/notes.md#nowhere),|,|' \
  -e 's|^\[outside\](https://example.org/), ||' "$tree/README.md"
bash "$checker" "$tree"
echo "doc_links self-test passed"
