#!/bin/sh
# setup.sh — installs what fsdpc needs to build and test, if it is missing.
# As root it uses apt-get; otherwise it prints the command to run.
set -e

need=""
command -v flex  >/dev/null 2>&1 || need="$need flex"
command -v bison >/dev/null 2>&1 || need="$need bison"
command -v cc    >/dev/null 2>&1 || need="$need gcc"
command -v make  >/dev/null 2>&1 || need="$need make"
command -v python3 >/dev/null 2>&1 || need="$need python3"

[ -z "$need" ] && exit 0

if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing$need"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    apt-get install -y -qq $need >/dev/null
else
    echo "setup: missing$need; install with:" >&2
    echo "  sudo apt-get install -y$need" >&2
    exit 1
fi
