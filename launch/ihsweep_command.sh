# Sourced by the launchers (not run itself): which `ihsweep` they start, and what a dry run
# checks before it prints a command.
#
# find_ihsweep ROOT: sets the array `ihsweep` (the command's words) and `ihsweep_from` (where it
# came from, in words): IHSWEEP if set (e.g. ".venv/bin/ihsweep", or "python -m ihsweep.cli");
# else `ihsweep` on PATH (an activated venv); else ROOT/.venv/bin/ihsweep, what `make install`
# makes, as an absolute path (so that a printed line runs from a fresh clone without an
# activated venv; bash would otherwise find the ihsweep/ package folder: "Is a directory").
# ROOT: the checkout, absolute.
find_ihsweep() {
  local root=$1 found
  if [[ -n "${IHSWEEP:-}" ]]; then
    read -ra ihsweep <<< "$IHSWEEP"
    ihsweep_from="from IHSWEEP"
  elif found=$(type -P ihsweep); then
    ihsweep=(ihsweep)
    ihsweep_from="on PATH: $found"
  else
    ihsweep=("$root/.venv/bin/ihsweep")
    ihsweep_from="this checkout's venv: no ihsweep on PATH"
  fi
}

# ihsweep_problem: why "${ihsweep[@]}" cannot be started here (one phrase), or nothing.
ihsweep_problem() {
  local exe=${ihsweep[0]}
  if [[ "$exe" == */* ]]; then
    if [[ -d "$exe" || ! -x "$exe" ]]; then
      echo "$exe (${ihsweep_from}) is not an executable file (\`make install\` makes .venv/bin/ihsweep; or set IHSWEEP)"
    fi
  elif ! type -P "$exe" > /dev/null; then
    echo "$exe (${ihsweep_from}) is not on PATH (\`make install\` makes .venv/bin/ihsweep; or set IHSWEEP)"
  fi
}

# config_problem ARGS...: why the run flags' --config=FILE[:VARIANT] cannot be read here (one
# phrase; relative to this directory, as `ihsweep run` reads it), or nothing. Sets `config_file`.
config_problem() {
  local a prev="" given=""
  config_file=""
  for a in "$@"; do
    if [[ "$a" == --config=* ]]; then given=${a#--config=}
    elif [[ "$prev" == --config ]]; then given=$a; fi
    prev=$a
  done
  if [[ -z "$given" ]]; then
    echo "no --config=FILE (ihsweep run needs one)"
    return
  fi
  config_file=${given%%:*}
  if [[ ! -f "$config_file" ]]; then
    echo "--config=$given: no file $config_file (from $PWD)"
  fi
}

# check_run WHO ARGS...: a dry run's check of the executable and the config file; one line on
# stderr: "# checked: …" (status 0), or "WHO: the run would fail: …" (status 1).
check_run() {
  local who=$1 problems=() p
  shift
  p=$(ihsweep_problem); if [[ -n "$p" ]]; then problems+=("$p"); fi
  p=$(config_problem "$@"); if [[ -n "$p" ]]; then problems+=("$p"); fi
  if (( ${#problems[@]} )); then
    p=$(printf '%s; ' "${problems[@]}")
    echo "$who: the run would fail: ${p%; }" >&2
    return 1
  fi
  config_problem "$@" > /dev/null
  echo "# checked: the run starts ${ihsweep[*]} (${ihsweep_from}) with $config_file (found)" >&2
}

# require_ihsweep WHO: before a real run, one line and status 127 where "${ihsweep[@]}" cannot
# be started (rather than bash's "exec: ihsweep: cannot execute: Is a directory").
require_ihsweep() {
  local p
  p=$(ihsweep_problem)
  if [[ -n "$p" ]]; then
    echo "$1: cannot start ihsweep: $p" >&2
    exit 127
  fi
}
