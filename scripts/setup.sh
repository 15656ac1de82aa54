# Sourced by demo.sh and test.sh: a virtualenv in .venv with ringml and every extra installed,
# and Java 17 for the Spark parts when `java` is missing.  Safe to run again.
set -euo pipefail
PYTHON=${PYTHON:-python3}
as_root() { if [ "$(id -u)" = 0 ]; then "$@"; else sudo "$@"; fi; }
if [ ! -x .venv/bin/python ]; then
  if ! "$PYTHON" -m venv .venv 2>/dev/null; then
    echo "setup: installing python3-venv" >&2
    as_root apt-get update -qq && as_root apt-get install -y -qq python3-venv >/dev/null
    rm -rf .venv && "$PYTHON" -m venv .venv
  fi
fi
# shellcheck disable=SC1091
. .venv/bin/activate
if [ ! -f .venv/.ringml-installed ] || [ pyproject.toml -nt .venv/.ringml-installed ]; then
  python -m pip install -q --upgrade pip
  python -m pip install -q -e ".[all,dev]"
  touch .venv/.ringml-installed
fi
if ! command -v java >/dev/null 2>&1; then
  echo "setup: installing Java 17 (needed by Spark)" >&2
  as_root apt-get update -qq && as_root apt-get install -y -qq openjdk-17-jre-headless >/dev/null
fi
export PYSPARK_PYTHON="$PWD/.venv/bin/python" PYSPARK_DRIVER_PYTHON="$PWD/.venv/bin/python"
