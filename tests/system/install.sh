#!/usr/bin/env bash
# The system packages in tests/system/packages.txt that are missing (each line's
# check fails), installed with apt-get (as root, or through sudo). Where they
# cannot be installed (no apt-get, not root and no sudo), it names them and
# stops at once, before anything else is installed or run. Run by `make test`
# (and so CI) before the venv is made.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
missing=()
while read -r pkg check; do
  [ -z "$pkg" ] && continue
  bash -c "$check" >/dev/null 2>&1 || missing+=("$pkg")
done < <(sed -e 's/#.*//' "$here/packages.txt" | sed '/^[[:space:]]*$/d')
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
if [ "$(id -u)" -ne 0 ]; then
  if command -v sudo >/dev/null && sudo -n true 2>/dev/null; then sudo="sudo"; else sudo="none"; fi
fi
if ! command -v apt-get >/dev/null || [ "$sudo" = none ]; then
  echo "make test needs these system packages (Debian names; tests/system/packages.txt says which test needs each):" >&2
  echo "  ${missing[*]}" >&2
  if command -v apt-get >/dev/null; then
    echo "install them as root: apt-get install ${missing[*]}" >&2
  else
    echo "no apt-get here: install them with this system's package manager" >&2
  fi
  exit 1
fi
echo "installing system packages for the tests: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q >/dev/null
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
still=()
while read -r pkg check; do
  [ -z "$pkg" ] && continue
  bash -c "$check" >/dev/null 2>&1 || still+=("$pkg")
done < <(sed -e 's/#.*//' "$here/packages.txt" | sed '/^[[:space:]]*$/d')
if [ ${#still[@]} -ne 0 ]; then
  echo "installed, yet their checks still fail: ${still[*]} (tests/system/packages.txt)" >&2
  exit 1
fi
