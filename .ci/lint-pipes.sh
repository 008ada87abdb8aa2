#!/usr/bin/env bash
# Fails when a script under .ci/ or tests/ pipes a command into a reader that stops early
# (`head`, `grep -q`, `grep -m`). Under `set -o pipefail` the writer then dies of SIGPIPE and the
# pipeline fails with 141 at random, depending on how much it wrote before the reader closed.
# Read the whole output into a variable instead, then take what is needed from it.
set -euo pipefail
cd "$(dirname "$0")/.."
pattern='\|[[:space:]]*(head([[:space:]]|$)|grep[[:space:]]+(-[[:alnum:]]*[qm]|--quiet|--max-count))'
hits="$(grep -rnE "$pattern" .ci tests --include='*.sh' --include='*.py' --include=run --include=test \
  | grep -v '^\.ci/lint-pipes\.sh:' || true)"
if [ -n "$hits" ]; then
  printf 'an early-closing reader after a pipe (SIGPIPE under pipefail):\n%s\n' "$hits" >&2
  exit 1
fi
echo "no early-closing pipe readers in .ci/ or tests/"
