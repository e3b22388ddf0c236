#!/usr/bin/env bash
# Lists the functions outside tests that run over MAX_FN_LINES lines (default 150), counted from
# the line of `fn` to the line of its closing brace, in the operator, the simulator and the
# planner core (and the simulator's engine); fails when one is outside ALLOWED. Run by `make lint`.
#
# Braces are matched after taking out comments, strings (raw strings too) and character
# literals. `#[cfg(test)]` items are skipped, and so are the files of `#[cfg(test)] mod x;`.
# Plain awk (POSIX; mawk and gawk), as CI lints before any other package is installed.
set -euo pipefail
cd "$(dirname "$0")/.."

MAX_FN_LINES="${MAX_FN_LINES:-150}"
ROOTS=(operator/src crates/planner-sim/src crates/planner-sim-engine/src crates/planner-core/src)

# Files whose long functions are being split: listed, not failed. An entry that no longer has
# a long function fails the check, so that the list only shrinks.
ALLOWED=()

mapfile -t files < <(find "${ROOTS[@]}" -name '*.rs' | LC_ALL=C sort)

# The files that `#[cfg(test)] mod name;` brings in (name.rs or name/mod.rs beside the parent's
# module directory).
mapfile -t test_files < <(LC_ALL=C awk '
  FNR == 1 { test_attr = 0 }
  /^[ \t]*#\[cfg\(test\)\][ \t]*$/ { test_attr = 1; next }
  test_attr && match($0, /^[ \t]*(pub(\([a-z]+\))? )?mod [A-Za-z0-9_]+;/) {
    name = $0
    sub(/^[ \t]*(pub(\([a-z]+\))? )?mod /, "", name)
    sub(/;.*/, "", name)
    dir = FILENAME
    if (dir ~ /\/(mod|lib|main)\.rs$/) sub(/\/[^\/]+$/, "", dir); else sub(/\.rs$/, "", dir)
    print dir "/" name ".rs"
    print dir "/" name "/mod.rs"
  }
  /[^ \t]/ { test_attr = 0 }
' "${files[@]}")

report="$(
  printf '%s\n' "${test_files[@]}" | LC_ALL=C awk -v max="$MAX_FN_LINES" '
  # First input: the test files to leave out.
  FILENAME == "-" { skip_file[$0] = 1; next }

  FNR == 1 {
    depth = 0; block = 0; in_str = 0; raw_hashes = -1; pending = ""; open = 0
    test_next = 0; test_depth = -1; skip_this = (FILENAME in skip_file)
  }
  skip_this { next }

  {
    line = $0
    if (!in_str && !block && line ~ /^[ \t]*#\[cfg\(test\)\]/) test_next = 1
    n = length(line)
    i = 1
    while (i <= n) {
      c = substr(line, i, 1)
      if (block) {
        if (c == "*" && substr(line, i + 1, 1) == "/") { block--; i += 2; continue }
        if (c == "/" && substr(line, i + 1, 1) == "*") { block++; i += 2; continue }
        i++; continue
      }
      if (in_str) {
        if (raw_hashes < 0) {
          if (c == "\\") { i += 2; continue }
          if (c == "\"") in_str = 0
          i++; continue
        }
        if (c == "\"" && substr(line, i + 1, raw_hashes) == hashes(raw_hashes)) {
          in_str = 0; i += 1 + raw_hashes; continue
        }
        i++; continue
      }
      if (c == "/" && substr(line, i + 1, 1) == "/") break
      if (c == "/" && substr(line, i + 1, 1) == "*") { block = 1; i += 2; continue }
      if (c == "\"") { in_str = 1; raw_hashes = -1; i++; continue }
      if (c == "'\''") {
        # A character literal (x, an escape) or a lifetime / label.
        if (substr(line, i + 1, 1) == "\\") {
          j = index(substr(line, i + 2), "'\''")
          i += (j ? j + 2 : n); continue
        }
        if (substr(line, i + 2, 1) == "'\''") { i += 3; continue }
        i++; continue
      }
      if (c ~ /[A-Za-z_]/) {
        word = c; j = i + 1
        while (j <= n && substr(line, j, 1) ~ /[A-Za-z0-9_]/) { word = word substr(line, j, 1); j++ }
        # Raw strings: r"..", r#".."#, br"..".
        if ((word == "r" || word == "br") && substr(line, j) ~ /^#*"/) {
          h = 0
          while (substr(line, j + h, 1) == "#") h++
          in_str = 1; raw_hashes = h; i = j + h + 1; continue
        }
        if (want_name) { pending = word; pending_line = fn_line; pending_depth = depth; want_name = 0 }
        else if (word == "fn") { want_name = 1; fn_line = FNR }
        i = j; continue
      }
      if (c !~ /[ \t]/) want_name = 0
      if (c == "{") {
        if (test_next) { test_next = 0; if (test_depth < 0) test_depth = depth }
        if (pending != "" && depth == pending_depth) {
          open++; fn_name[open] = pending; fn_start[open] = pending_line; fn_depth[open] = depth
          fn_test[open] = (test_depth >= 0)
          pending = ""
        }
        depth++
      } else if (c == "}") {
        depth--
        if (open && depth == fn_depth[open]) {
          len = FNR - fn_start[open] + 1
          if (len > max && !fn_test[open]) printf "%s:%d %s %d\n", FILENAME, fn_start[open], fn_name[open], len
          open--
        }
        if (depth == test_depth) test_depth = -1
      } else if (c == ";") {
        if (pending != "" && depth == pending_depth) pending = ""
        if (test_next) test_next = 0
      }
      i++
    }
  }

  function hashes(k,   s) { s = ""; while (k-- > 0) s = s "#"; return s }
  ' - "${files[@]}"
)"

status=0
for entry in "${ALLOWED[@]}"; do
  if ! grep -q "^$entry:" <<<"$report"; then
    echo "tools/fn-length.sh: $entry is listed in ALLOWED but has no function over $MAX_FN_LINES lines: take it off the list" >&2
    status=1
  fi
done
while read -r place name lines; do
  [ -n "$place" ] || continue
  file="${place%%:*}"
  if printf '%s\n' "${ALLOWED[@]}" | grep -qx "$file"; then
    echo "allowed for now: $place $name is $lines lines"
  else
    echo "$place: $name is $lines lines; the most is $MAX_FN_LINES outside tests (split it into named stages)" >&2
    status=1
  fi
done <<<"$report"
exit "$status"
