#!/usr/bin/env bash
# The HTML report is tested in a real headless browser (Debian's chromium). Install it when missing
# and we are allowed to; otherwise the browser test skips with a message saying why.
set -u
if command -v chromium >/dev/null 2>&1 || command -v chromium-browser >/dev/null 2>&1; then
  exit 0
fi
if [ "$(id -u)" = "0" ] && command -v apt-get >/dev/null 2>&1; then
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
    || echo "ensure-chromium: could not install chromium; the browser test will skip" >&2
else
  echo "ensure-chromium: chromium missing and not root; the browser test will skip" >&2
fi
exit 0
