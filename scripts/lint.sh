#!/usr/bin/env bash
# clang-format and clang-tidy over the first-party C++ files (the config: .clang-format,
# .clang-tidy). README.md, "Formatting and lint", says what runs where and why.
#
#   scripts/lint.sh format        rewrite the files in place (make format)
#   scripts/lint.sh format-check  fail on any file clang-format would change (make test)
#   scripts/lint.sh tidy          fail on any clang-tidy warning in TIDY_SCOPE (make test)
#
# Environment:
#   BUILD         the build folder with compile_commands.json (default build)
#   JOBS          clang-tidy processes at once (default: nproc)
#   LINT_EXCLUDE  a file of paths to skip, one a line, a trailing / for a folder (default
#                 scripts/lint-exclude.txt: files being rewritten elsewhere); empty: none
#   TIDY_SCOPE    what clang-tidy reads: "modules" (default: the .cc files of src/ but the
#                 *_test.cc, i.e. the module libraries), "all" (src with its tests, apps,
#                 tools, tests, bench), or folders and files
# Files are given relative to the repository root; any arguments after the mode replace
# the file list (still filtered by LINT_EXCLUDE).
set -euo pipefail
cd "$(dirname "$0")/.."
mode=${1:-}
shift || true
build=${BUILD:-build}
jobs=${JOBS:-$(nproc)}
exclude=${LINT_EXCLUDE-scripts/lint-exclude.txt}
scope=${TIDY_SCOPE:-modules}
tests_too=1
[[ $scope == modules ]] && { scope=src; tests_too=0; }
[[ $scope == all ]] && scope="src apps tools tests bench"
clang_format=${CLANG_FORMAT:-clang-format}
clang_tidy=${CLANG_TIDY:-clang-tidy}

# The exclusion patterns (LINT_EXCLUDE), read once.
patterns=()
if [[ -n $exclude && -f $exclude ]]; then
  mapfile -t patterns < <(grep -v '^#' "$exclude" | sed '/^[[:space:]]*$/d')
fi

excluded() {  # true when the exclusions name the file (or a folder above it)
  local p
  for p in "${patterns[@]}"; do
    if [[ $1 == "$p" || ($p == */ && $1 == "$p"*) ]]; then return 0; fi
  done
  return 1
}

# The first-party C++ files under the given folders, minus the exclusions.
list_files() {
  find "$@" -type d -name node_modules -prune -o -type f \( -name '*.cc' -o -name '*.h' \) -print | sort |
    while IFS= read -r f; do
      f=${f#./}
      excluded "$f" || echo "$f"
    done
}

files_for() {  # the arguments if given, else every file under the folders in $1
  local dirs=$1; shift
  if (($#)); then
    printf '%s\n' "$@" | while IFS= read -r f; do list_files "$f"; done
  else
    # shellcheck disable=SC2086  # word splitting intended: a folder list
    list_files $(for d in $dirs; do [[ -e $d ]] && echo "$d"; done)
  fi
}

case $mode in
  format)
    files_for "src apps tools tests bench fuzz include" "$@" | xargs -r "$clang_format" -i
    ;;
  format-check)
    mapfile -t files < <(files_for "src apps tools tests bench fuzz include" "$@")
    if ! "$clang_format" --dry-run -Werror "${files[@]}"; then
      echo "lint: clang-format would change the files above; run 'make format' (scripts/lint.sh format)" >&2
      exit 1
    fi
    echo "lint: ${#files[@]} files formatted as .clang-format says"
    ;;
  tidy)
    [[ -f $build/compile_commands.json ]] || { echo "lint: $build/compile_commands.json is missing (configure first)" >&2; exit 1; }
    # Only the translation units this build compiles (not another ISA's kernels): the headers
    # of include/daisy are read through them (HeaderFilterRegex in .clang-tidy).
    mapfile -t files < <(files_for "$scope" "$@" | grep '\.cc$' | { ((tests_too)) && cat || grep -v '_test\.cc$'; } |
      grep -Fxf <(python3 -c '
import json, os, sys
for e in json.load(open(sys.argv[1])):
    print(os.path.relpath(os.path.join(e["directory"], e["file"]), sys.argv[2]))' "$build/compile_commands.json" "$(pwd)"))
    log=$(mktemp -d)
    trap 'rm -rf "$log"' EXIT
    start=$(date +%s)
    printf '%s\n' "${files[@]}" | xargs -r -P "$jobs" -I{} sh -c \
      '"$0" -p "$1" --quiet "$2" > "$3/$(echo "$2" | tr / _).log" 2>&1 || true' "$clang_tidy" "$build" {} "$log"
    # Every diagnostic, once (a header's is seen through each file that includes it), but
    # those in excluded files: a file in scope may include an excluded header.
    root=$(pwd)
    cat "$log"/*.log 2>/dev/null | grep -E '^[^ ]+:[0-9]+:[0-9]+: (warning|error):' | sed "s|^$root/||" | sort -u |
      while IFS= read -r line; do
        f=${line%%:*}
        excluded "$f" || echo "$line"
      done > "$log/found" || true
    took=$(($(date +%s) - start))
    if [[ -s $log/found ]]; then
      cat "$log/found"
      echo "lint: clang-tidy found $(wc -l < "$log/found") problems in ${#files[@]} files (${TIDY_SCOPE:-modules}, ${took} s)" >&2
      exit 1
    fi
    echo "lint: clang-tidy read ${#files[@]} files (${TIDY_SCOPE:-modules}) in ${took} s with $jobs jobs: no problem"
    ;;
  *)
    sed -n '2,18p' "$0" >&2
    exit 2
    ;;
esac
