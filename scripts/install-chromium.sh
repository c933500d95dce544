#!/usr/bin/env bash
# Idempotent: install Debian's chromium when it is missing. tests/test_docs_browser.py drives it
# headless through Playwright (the `test` extra) to look at the built docs site as a reader would.
set -euo pipefail
if [ -x /usr/bin/chromium ] || command -v chromium >/dev/null; then
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y -q chromium; then
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q chromium
fi
command -v chromium >/dev/null || { echo "install-chromium.sh: chromium still missing" >&2; exit 1; }
