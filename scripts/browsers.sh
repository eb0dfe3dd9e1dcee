#!/usr/bin/env bash
# Make sure Debian's Chromium is installed for the browser tests (Playwright cannot download its own here).
set -euo pipefail
[ -x /usr/bin/chromium ] && exit 0
echo "browsers: installing chromium from the system packages" >&2
if [ "$(id -u)" = 0 ]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
elif command -v sudo >/dev/null 2>&1 && sudo -n true 2>/dev/null; then
    sudo apt-get update -qq && sudo DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
else
    echo "browsers: error: chromium is missing and this user cannot install it: sudo apt-get install -y chromium" >&2
    exit 1
fi
