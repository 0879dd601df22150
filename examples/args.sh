# Sourced by the recipes: their usage (the comment block under a script's first line), and checks of
# their arguments that end a wrong one in one line naming it and what it takes, as argparse does.

# usage FILE: the comment block that opens FILE, without its "# "
usage() { sed -n '2,/^[^#]/{/^#/{s/^# \{0,1\}//;p}}' "$1"; }

# help_asked ARG...: whether -h or --help comes before a "--" (after it, the flags are fairseq-train's)
help_asked() {
  local arg
  for arg in "$@"; do
    case "$arg" in --) return 1 ;; -h|--help) return 0 ;; esac
  done
  return 1
}

die() { echo "error: $*" >&2; exit 2; }

# need_value NAME VALUE: the option NAME was given a value (not the end of the command line)
need_value() { [ -n "$2" ] || die "argument $1: expected a value"; }

# need_dir NAME VALUE: VALUE is an existing directory
need_dir() { [ -d "$2" ] || die "argument $1: takes an existing directory, got '$2'"; }

# need_whole NAME VALUE LOW: VALUE is a whole number >= LOW
need_whole() {
  [[ "$2" =~ ^[0-9]+$ ]] && [ "$2" -ge "$3" ] || die "argument $1: takes a whole number >= $3, got '$2'"
}

# need_positive NAME VALUE: VALUE is a number above 0 (e.g. 15 or 0.5)
need_positive() {
  [[ "$2" =~ ^([0-9]+[.]?[0-9]*|[.][0-9]+)$ ]] && ! [[ "$2" =~ ^[0.]+$ ]] \
    || die "argument $1: takes a number above 0 (e.g. 15 or 0.5), got '$2'"
}

# need_one_of NAME VALUE CHOICE...: VALUE is one of the choices
need_one_of() {
  local name=$1 value=$2 choice
  shift 2
  for choice in "$@"; do [ "$value" = "$choice" ] && return 0; done
  die "argument $name: takes one of $*, got '$value'"
}

# quickstart_as ARCH SCRIPT ARG...: examples/multi30k/quickstart.sh with ARG... and --arch fixed to
# ARCH (SCRIPT: the wrapper, whose usage --help gives before the quick start's)
quickstart_as() {
  local arch=$1 script=$2 arg
  shift 2
  if help_asked "$@"; then
    usage "$script"
    printf '\nOptions: those of examples/multi30k/quickstart.sh, but --arch, fixed here to %s:\n\n' "$arch"
    usage "$ROOT/examples/multi30k/quickstart.sh"
    exit 0
  fi
  for arg in "$@"; do
    [ "$arg" = -- ] && break
    [ "$arg" = --arch ] && die "argument --arch: fixed to $arch by this script (examples/multi30k/quickstart.sh takes any)"
  done
  exec bash "$ROOT/examples/multi30k/quickstart.sh" --arch "$arch" "$@"
}
