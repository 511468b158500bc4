#!/usr/bin/env bash
# Set up a fresh machine: system packages, then a virtualenv with the project.
# Idempotent: a second run only checks. Used by both README commands and CI.
set -euo pipefail
cd "$(dirname "$0")/.."

APT_PACKAGES=(redis-server bubblewrap git slurm-wlm munge chromium)

missing=()
for pkg in "${APT_PACKAGES[@]}"; do
  dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
stamp=.venv/.installed-$(sha1sum pyproject.toml | cut -c1-12)
if [ ! -f "$stamp" ]; then
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e ".[dev,cpu,data,train]"
  rm -f .venv/.installed-*
  touch "$stamp"
fi
