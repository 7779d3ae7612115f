#!/usr/bin/env bash
# The unit tier, ROUNDS times in a row (default 3), each beside a core kept
# busy by a spinning process, so a test that passes only when its sleeps win
# a race against the machine's scheduler fails here instead of at random in
# CI. Every round must pass. Usage: tests/unit_stress.sh [ROUNDS]
set -uo pipefail
cd "$(dirname "$0")/.."
rounds=${1:-3}
py=${PY:-.venv/bin/python}
"$py" -c 'while True: pass' &
spinner=$!
trap 'kill $spinner 2>/dev/null' EXIT
failed=0
for i in $(seq "$rounds"); do
  if "$py" -m pytest -q -p no:cacheprovider -m "unit and not slow" tests/unit >/tmp/unit-stress-$$.log 2>&1; then
    echo "unit tier beside a busy core, round $i/$rounds: $(tail -n 1 /tmp/unit-stress-$$.log)"
  else
    echo "unit tier beside a busy core, round $i/$rounds FAILED:"; tail -n 40 /tmp/unit-stress-$$.log
    failed=1
  fi
done
rm -f /tmp/unit-stress-$$.log
exit $failed
