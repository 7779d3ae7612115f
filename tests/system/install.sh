#!/usr/bin/env bash
# Installs the Debian packages in tests/system/packages.txt that are missing.
# Run by `make test` (and so CI); needs root (or sudo) and Debian's apt.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
wanted=$(sed -e 's/#.*//' "$here/packages.txt" | tr -s ' \t' '\n' | sed '/^$/d')
[ -z "$wanted" ] && exit 0
missing=()
for p in $wanted; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "installing Debian packages for the tests: ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$sudo apt-get update -q >/dev/null
$sudo apt-get install -y -q --no-install-recommends "${missing[@]}" >/dev/null
