#!/usr/bin/env bash
# Build the documentation site into docs/_build/html (index.html at its root).
#
# 1. docs/gen.py copies the hand-written pages (docs/src) to docs/_build/src,
#    runs every tutorial script in docs/tutorials and writes its page (source,
#    printed output, figures), draws the concept figures and writes the
#    benchmarks page from benchmarks/results/*.png.
# 2. mkdocs builds the site with --strict: any warning (a broken link, an API
#    reference that does not resolve) fails the build.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON="${PYTHON:-python}"
export MPLBACKEND=Agg NO_MKDOCS_2_WARNING=1
"$PYTHON" docs/gen.py
PYTHONPATH="$PWD/docs${PYTHONPATH:+:$PYTHONPATH}" "$PYTHON" -m mkdocs build --strict --config-file mkdocs.yml
test -f docs/_build/html/index.html
echo "docs: built docs/_build/html/index.html"
