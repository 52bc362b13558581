#!/bin/sh
# Run an install step with its output in a log file, printing nothing when it works.
#
#   scripts/quiet_install.sh LOG required|optional WHAT -- COMMAND [ARGS...]
#
# required: on failure print the log's last 25 lines and exit with the command's status.
# optional: on failure print ONE line (what, the first compiler/pip error, where the log
#           is) and exit 0 — e.g. the chaos extra's native NetfilterQueue build without
#           Debian's libnetfilter-queue-dev.
set -u
log=$1 kind=$2 what=$3
shift 3
[ "${1:-}" = "--" ] && shift
mkdir -p "$(dirname "$log")"
"$@" >"$log" 2>&1
status=$?
[ "$status" -eq 0 ] && exit 0
if [ "$kind" = required ]; then
    echo "make: installing $what failed (exit $status); last lines of $log:" >&2
    tail -n 25 "$log" >&2
    exit "$status"
fi
reason=$(grep -m1 -o 'fatal error: .*' "$log" | sed 's/^fatal error: //')
[ -n "$reason" ] || reason=$(grep -m1 -E '^(ERROR|error): ' "$log" | sed -E 's/^(ERROR|error): //')
[ -n "$reason" ] || reason="exit $status"
echo "make: $what not installed ($(printf '%s' "$reason" | cut -c1-160)); its tests will skip; details in $log"
exit 0
