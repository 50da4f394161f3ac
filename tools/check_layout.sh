#!/usr/bin/env bash
# The tree's structural rules (issue 12), checked on the sources, not the build:
#   sizes    no source file over 800 lines, no function (lambdas included) over 150 lines;
#   layering the runtime includes no header of the compiler, the passes, the cost models or
#            the tools (it reads only the plan format). That the runtime library links none of
#            their libraries is checked when CMake configures (runtime/CMakeLists.txt).
#            Within the runtime (issue 30), each op's backend-neutral rules live in runtime/ops,
#            which includes nothing of either backend (runtime/cpu, runtime/cuda); the backends
#            include nothing of each other (runtime/cuda reaches the CPU backend object, for
#            `same_as_cpu`, through runtime/core/backend.h); and the compiler and the passes
#            include nothing of runtime/cpu (they read op rules from runtime/ops). The core
#            (runtime/core: tensors, kernels, programs, backends) includes nothing of the
#            executor (runtime/exec), the MPI layer or either backend.
#   enums    no two `enum class` of compiler, runtime, passes, cost_models and tools list the
#            same enumerators (one enum per concept: issue 30).
#   families the CPU and CUDA backends file each op under the same family (issue 30): each
#            family of runtime/ops/families.def has its table `<family>_kernels()` defined in
#            runtime/cpu/<family>.cpp and runtime/cuda/<family>.cpp, the two tables naming the
#            same ops, and no other file of either backend defines a family table.
# Usage: tools/check_layout.sh [sizes|layering|enums|families|all] [ROOT]. Prints one line per offence and
# exits 1 when there is any; exits 2 when a tool it needs is missing.
set -euo pipefail

what=${1:-all}
root=${2:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root"

max_file_lines=800
max_function_lines=150
dirs=(compiler runtime passes cost_models tools tests samples bench)
bad=0

check_sizes() {
  if ! command -v ctags >/dev/null || ! ctags --version 2>/dev/null | grep -q 'Universal Ctags'; then
    echo "check_layout: Universal Ctags is needed for the function-length rule (Debian package universal-ctags; tools/setup.sh installs it)" >&2
    exit 2
  fi
  local files
  mapfile -t files < <(find "${dirs[@]}" -type f \( -name '*.cpp' -o -name '*.h' -o -name '*.cu' \
    -o -name '*.cuh' -o -name '*.def' \) 2>/dev/null | sort)
  local f n
  for f in "${files[@]}"; do
    n=$(wc -l <"$f")
    if [ "$n" -gt "$max_file_lines" ]; then
      echo "sizes: $f has $n lines (at most $max_file_lines)"
      bad=1
    fi
  done
  # One line per function: start, end, file, scope, name. ctags reports lambdas as functions
  # named __anon...; their scope names the function that holds them.
  local report
  report=$(ctags -x --_xformat='%{line} %{end} %F %{scope} %N' --fields=+ne --c++-kinds=f \
    --languages=C++ --langmap=C++:+.cu.cuh -o - "${files[@]}" 2>/dev/null |
    awk -v max="$max_function_lines" '$2 ~ /^[0-9]+$/ && $2 - $1 + 1 > max {
      if (NF < 5) name = $4
      else name = ($5 ~ /^__anon/) ? "a lambda in " $4 : $4 "::" $5
      gsub(/__anon[0-9a-f]+/, "(anonymous)", name)
      printf "sizes: %s:%d: %s has %d lines (at most %d)\n", $3, $1, name, $2 - $1 + 1, max
    }')
  if [ -n "$report" ]; then
    echo "$report"
    bad=1
  fi
}

# Prints "layering: WHY, but FILE:LINE: #include ..." for each include in the dirs after the
# reason that names a header under PATTERN (an extended regex of include paths).
forbid_includes() {
  local why=$1 pattern=$2 hits dir dirs=()
  shift 2
  for dir in "$@"; do [ -d "$dir" ] && dirs+=("$dir"); done
  [ "${#dirs[@]}" -gt 0 ] || return 0
  hits=$(grep -rnE "^\s*#\s*include\s*\"($pattern)/" "${dirs[@]}" \
    --include='*.h' --include='*.cpp' --include='*.cu' --include='*.cuh' || true)
  if [ -n "$hits" ]; then
    echo "$hits" | sed "s|^|layering: $why, but |"
    bad=1
  fi
}

check_layering() {
  forbid_includes "the runtime reads only the plan format" \
    'compiler|passes|cost_models|tools|samples' runtime
  forbid_includes "runtime/ops holds rules both backends share" 'runtime/cpu|runtime/cuda' \
    runtime/ops
  forbid_includes "the CUDA backend shares op rules through runtime/ops" 'runtime/cpu' runtime/cuda
  forbid_includes "the CPU backend shares op rules through runtime/ops" 'runtime/cuda' runtime/cpu
  forbid_includes "the compiler reads op rules from runtime/ops" 'runtime/cpu' compiler passes
  forbid_includes "the core is below the executor and the backends" \
    'runtime/exec|runtime/mpi|runtime/cpu|runtime/cuda' runtime/core
}

# Prints "enums: A and B list the same enumerators (...)" for each enumerator list that two
# `enum class` declarations share (comments stripped; `= value` ignored).
check_enums() {
  local dirs=() dir report
  for dir in compiler runtime passes cost_models tools; do [ -d "$dir" ] && dirs+=("$dir"); done
  [ "${#dirs[@]}" -gt 0 ] || return 0
  local files
  mapfile -t files < <(find "${dirs[@]}" -type f \( -name '*.h' -o -name '*.cpp' -o -name '*.cu' \
    -o -name '*.cuh' \) | sort)
  [ "${#files[@]}" -gt 0 ] || return 0
  # perl is Debian's essential perl-base: on every machine this runs on.
  report=$(perl -0777 -ne '
    s{//[^\n]*}{}g;
    s{/\*.*?\*/}{}gs;
    while (/enum\s+class\s+(\w+)\s*(?::\s*[\w:]+\s*)?\{([^}]*)\}/g) {
      my ($name, $body) = ($1, $2);
      my @list = map { my $e = (split /=/)[0]; $e =~ s/^\s+|\s+$//g; $e } grep { /\S/ } split /,/, $body;
      push @{$lists{join(", ", @list)}}, "$ARGV: $name" if @list >= 2;
    }
    END {
      for my $list (sort keys %lists) {
        my @where = @{$lists{$list}};
        print "enums: " . join(" and ", @where) . " list the same enumerators ($list): keep one\n"
          if @where > 1;
      }
    }' "${files[@]}")
  if [ -n "$report" ]; then
    echo "$report"
    bad=1
  fi
}

# Prints "families: ..." for each family of runtime/ops/families.def whose table is not in
# `<family>.cpp` of each backend, each op one backend files under a family and the other does
# not, and each family table defined outside the list.
check_families() {
  local list=runtime/ops/families.def
  if [ ! -f "$list" ]; then
    echo "families: $list is missing"
    bad=1
    return
  fi
  local report
  report=$(perl -e '
    my ($list, @dirs) = @ARGV;
    sub slurp { local $/; open(my $f, "<", $_[0]) or return undef; my $s = <$f>; $s =~ s{//[^\n]*}{}g; $s }
    my %family; my @names;
    my $def = slurp($list);
    while ($def =~ /^\s*STAGECRAFT_FAMILY\((\w+)\)/mg) { push @names, $1; $family{$1} = 1 }
    # The ops a family file enters in its tables: {"Op", run, check...}.
    sub ops_of {
      my %o; $o{$1} = 1 while $_[0] =~ /\{"([A-Z][A-Za-z0-9]*)",\s*[\w:<>]+/g;
      return \%o;
    }
    for my $dir (@dirs) {
      for my $file (sort glob("$dir/*.cpp")) {
        my $src = slurp($file);
        while ($src =~ /std::span<const KernelEntry>\s+(\w+)_kernels\(\)\s*\{/g) {
          my $name = $1;
          my ($stem) = $file =~ m{([^/]+)\.cpp$};
          print "families: $file defines ${name}_kernels(), which $list does not list\n" unless $family{$name};
          print "families: $file defines ${name}_kernels(); a family is <family>.cpp\n" if $family{$name} && $name ne $stem;
        }
      }
    }
    for my $name (@names) {
      my %ops; my $ok = 1;
      for my $dir (@dirs) {
        my $file = "$dir/$name.cpp";
        my $src = slurp($file);
        if (!defined $src || $src !~ /std::span<const KernelEntry>\s+${name}_kernels\(\)\s*\{/) {
          print "families: ${name}_kernels() is not defined in $file (a family is <family>.cpp)\n";
          $ok = 0;
          next;
        }
        $ops{$dir} = ops_of($src);
      }
      next unless $ok;
      my ($a, $b) = @dirs;
      for my $op (sort keys %{$ops{$a}}) {
        print "families: $op is in $a/$name.cpp and not in $b/$name.cpp\n" unless $ops{$b}{$op};
      }
      for my $op (sort keys %{$ops{$b}}) {
        print "families: $op is in $b/$name.cpp and not in $a/$name.cpp\n" unless $ops{$a}{$op};
      }
    }' "$list" runtime/cpu runtime/cuda)
  if [ -n "$report" ]; then
    echo "$report"
    bad=1
  fi
}

case "$what" in
  sizes) check_sizes ;;
  layering) check_layering ;;
  enums) check_enums ;;
  families) check_families ;;
  all)
    check_sizes
    check_layering
    check_enums
    check_families
    ;;
  *)
    echo "check_layout: unknown check '$what' (sizes, layering, enums, families or all)" >&2
    exit 2
    ;;
esac

if [ "$bad" -ne 0 ]; then exit 1; fi
echo "check_layout: $what ok"
