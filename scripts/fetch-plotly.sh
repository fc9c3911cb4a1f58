#!/usr/bin/env bash
# Vendor the partial plotly.js bundle the HTML report embeds (reports/assets/), from the npm registry.
#
# Why partial: the charts use only bar, scatter and heatmap traces; the full plotly.js is 4.6 MB
# and made the report page that heavy. plotly.js-cartesian-dist-min has exactly the cartesian
# trace types (heatmap needs it; plotly.js-basic-dist-min lacks heatmap) at ~1.3 MB.
# The page stays fully offline: the bundle is inlined into the HTML, never loaded from a CDN.
#
# Usage: scripts/fetch-plotly.sh [VERSION]   (default: the version pinned below; keep it equal to
# the plotly.js that the installed plotly.py ships, so figures behave as in plotly.py)
set -euo pipefail
VERSION="${1:-4.1.1}"
PKG="plotly.js-cartesian-dist-min"
HERE="$(cd "$(dirname "$0")/.." && pwd)"
DEST="$HERE/reports/assets"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT
cd "$TMP"
npm pack --silent "$PKG@$VERSION" >/dev/null
tar -xzf ./*.tgz
mkdir -p "$DEST"
cp package/plotly-cartesian.min.js "$DEST/plotly-cartesian.min.js"
cp package/LICENSE "$DEST/plotly-cartesian.LICENSE.txt"
printf '%s@%s\n' "$PKG" "$VERSION" > "$DEST/plotly-cartesian.VERSION"
echo "fetched $PKG@$VERSION -> $DEST ($(wc -c < "$DEST/plotly-cartesian.min.js") bytes)"
