#!/usr/bin/env bash
# Makes the fleetfs(1) man page from the binary's help: help2man on
# `fleetfs --help` and `--version`, plus a COMMANDS section with the help of
# every subcommand (and of theirs: `fleetfs lease claim`), found by reading
# the SUBCOMMANDS list of each help, so a new command needs no change here.
# Usage: packaging/make-man.sh BINARY OUTPUT.1.gz
set -euo pipefail
binary="$1"
output="$2"
command -v help2man >/dev/null || { echo "make-man: help2man is missing (packaging/install-deps.sh installs it)" >&2; exit 1; }

work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

# The names listed under SUBCOMMANDS: in a CLI11 help text.
subcommands() {
  awk 'tolower($0) ~ /^subcommands:$/ {in_list = 1; next}
       in_list && /^[^ ]/ {in_list = 0}
       in_list && /^  [a-z]/ {print $1}' 
}

# roff text as it is: no line may start a request, backslashes stay.
escape() {
  sed -e 's/\\/\\e/g' -e "s/^\\([.']\\)/\\\\\\&\\1/"
}

# help2man reflows the text after the options, which would run the
# examples together: it reads the help up to the subcommand list (through a
# wrapper named fleetfs, as the page is), and the rest goes in verbatim.
top_help="$("$binary" --help)"
cat > "$work/fleetfs" <<WRAPPER
#!/bin/sh
if [ "\$1" = --help ]; then
  "$binary" --help | awk 'tolower(\$0) ~ /^subcommands:\$/ {s = 1} s && /^\$/ {exit} {print}'
else
  exec "$binary" "\$@"
fi
WRAPPER
chmod +x "$work/fleetfs"

include="$work/commands.h2m"
{
  echo "[DESCRIPTION]"
  echo ".nf"
  printf '%s\n' "$top_help" | awk 'tolower($0) ~ /^subcommands:$/ {s = 1} s == 1 && /^$/ {s = 2; next} s == 2 {print}' |
    sed -e '/./,$!d' | escape
  echo ".fi"
  echo "[COMMANDS]"
  echo "Each command's own help (\\fBfleetfs COMMAND --help\\fR)."
  for cmd in $("$binary" --help | subcommands); do
    subs="$("$binary" "$cmd" --help | subcommands)"
    for path in "$cmd" $(for s in $subs; do echo "$cmd:$s"; done); do
      args=(${path//:/ })
      echo ".SS \"fleetfs ${args[*]}\""
      echo ".nf"
      "$binary" "${args[@]}" --help | escape
      echo ".fi"
    done
  done
  cat <<'ROFF'
[FILES]
.TP
.I /etc/fleetfs/agent.toml
The configuration of \fBfleetfs mount\fR in the package's unit (a conffile).
.TP
.I /lib/systemd/system/fleetfs.service
The systemd unit: \fBType=notify\fR, READY once the mount is up and the first
claims answered, a watchdog pinged while the loop is healthy.
[ENVIRONMENT]
.TP
.B NOTIFY_SOCKET, WATCHDOG_USEC
Set by systemd: \fBfleetfs mount\fR sends READY=1, STATUS=, STOPPING=1 and
WATCHDOG=1 (sd_notify(3)).
.TP
.B JOURNAL_STREAM
Set by systemd when stderr is the journal: log lines then carry their level
as the journal's priority and no time stamp of their own.
[SEE ALSO]
.BR systemd.service (5),
.BR sd_notify (3),
.BR fusermount3 (1)
ROFF
} > "$include"

help2man --no-info --section 1 --source "fleetfs" --manual "fleetfs manual" \
  --name "volume agent for fleets of SQLite databases" \
  --include "$include" --output "$work/fleetfs.1" "$work/fleetfs"
gzip -9n < "$work/fleetfs.1" > "$output.tmp"
mv "$output.tmp" "$output"
