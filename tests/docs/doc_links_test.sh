#!/usr/bin/env bash
# Every link of the user documentation stays inside the repository and resolves: for README.md,
# docs/*.md and samples/README.md, each Markdown link [text](target) must be a relative path
# (no http:, https:, mailto: or absolute path) to a file or folder that exists, and an anchor
# (#section) must be a heading of the target file (GitHub's rule: lower case, punctuation but
# '-' and '_' dropped, spaces to '-'). One line per bad link, exit 1.
#
#   bash tests/docs/doc_links_test.sh ROOT
set -euo pipefail
root=$(cd "${1:?usage: doc_links_test.sh ROOT}" && pwd)
bad=0
checked=0

# The anchors of a Markdown file's headings, one a line (code blocks left out).
anchors() {
  awk '/^```/{code=!code} !code && /^#+ /{sub(/^#+ +/, ""); print}' "$1" |
    tr 'A-Z' 'a-z' | sed -e 's/[^a-z0-9 _-]//g' -e 's/ /-/g'
}

check_file() {
  local file=$1 dir rel target path anchor
  dir=$(dirname "$file")
  rel=${file#"$root"/}
  # Links outside code spans and indented code: [text](target), one per match.
  while IFS= read -r target; do
    checked=$((checked + 1))
    case $target in
      http:* | https:* | mailto:* | /*)
        echo "$rel: link '$target' leaves the repository (only relative links)"
        bad=$((bad + 1))
        continue
        ;;
    esac
    path=${target%%#*}
    anchor=
    [[ $target == *"#"* ]] && anchor=${target#*#}
    if [ -z "$path" ]; then
      path=$file
    else
      path=$dir/$path
      if [ ! -e "$path" ]; then
        echo "$rel: link '$target': ${path#"$root"/} does not exist"
        bad=$((bad + 1))
        continue
      fi
    fi
    if [ -n "$anchor" ] && [[ $path == *.md ]] && ! anchors "$path" | grep -qxF -- "$anchor"; then
      echo "$rel: link '$target': no heading '#$anchor' in ${path#"$root"/}"
      bad=$((bad + 1))
    fi
  done < <(awk '/^```/{code=!code} !code && !/^    /' "$file" | sed -e 's/`[^`]*`//g' |
    grep -o '\[[^]]*\]([^) ]*)' | sed -e 's/^\[[^]]*\](//' -e 's/)$//' || true)
}

files=("$root/README.md" "$root/samples/README.md")
for f in "$root"/docs/*.md; do files+=("$f"); done
for f in "${files[@]}"; do
  [ -f "$f" ] || { echo "${f#"$root"/} is missing"; bad=$((bad + 1)); continue; }
  check_file "$f"
done
if [ "$bad" -ne 0 ]; then
  echo "FAIL: $bad bad link(s) of $checked"
  exit 1
fi
echo "$checked links in ${#files[@]} files resolve inside the repository"
