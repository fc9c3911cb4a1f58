#!/usr/bin/env bash
# The HTML report is tested in a real headless browser (Debian's chromium): it is a requirement of the
# test suite, like pytest. Install it when missing (as root, with apt-get); when that cannot be done,
# stop `make test` here with one line saying why. Leave the browser tests out on purpose instead with
#   python -m pytest -m "not browser"
set -u
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  if (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null); then
    exit 0
  fi
  echo "ensure-chromium: chromium is missing and apt-get could not install it; the browser tests need it (or run pytest -m 'not browser')" >&2
else
  echo "ensure-chromium: chromium is missing and only root can install it here (apt-get install chromium); the browser tests need it (or run pytest -m 'not browser')" >&2
fi
exit 1
