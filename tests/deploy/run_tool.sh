#!/usr/bin/env bash
# run_tool.sh TOOL ARGS... : runs TOOL (an absolute path), failing with a
# clear message when it is not installed.
tool=${1:?usage: run_tool.sh /abs/path/to/tool args...}
shift
if [[ ! -x $tool ]]; then
  case $tool in
    */promtool) pkg=prometheus ;;
    */systemd-analyze) pkg=systemd ;;
    */yamllint) pkg=yamllint ;;
    */python3) pkg=python3 ;;
    *) pkg="the package providing $(basename "$tool")" ;;
  esac
  echo "FAIL: $tool not found; install $pkg (scripts/install-deps.sh does)" >&2
  exit 1
fi
exec "$tool" "$@"
