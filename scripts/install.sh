#!/usr/bin/env bash
# Install litforge from its lock into the active Python environment (a venv of yours is respected):
#   bash scripts/install.sh          # dev: the tests, linters and every extra
#   bash scripts/install.sh runtime  # what `python train.py` needs
# The same two commands as the README's; CI and the Dockerfile run this script. Every package
# comes pinned with its hashes (requirements/<profile>.txt, made by scripts/lock.py) from the
# index pip is configured for: a file whose hash changed stops the install.
set -euo pipefail
cd "$(dirname "$0")/.."
profile="${1:-dev}"
python="${PYTHON:-python3}"
if [ ! -f "requirements/$profile.txt" ]; then
  echo "error: no install profile '$profile': use one of: $(ls requirements | sed 's/\.txt$//' | xargs)" >&2
  exit 2
fi
"$python" -m pip install --require-hashes -r "requirements/$profile.txt"
"$python" -m pip install --no-deps -e .
# What was installed from, for a run's record of its environment
"$python" -c "import hashlib, sys; print(sys.argv[1], hashlib.sha256(open(sys.argv[1], 'rb').read()).hexdigest())" \
  "requirements/$profile.txt" > .installed-from
