#!/usr/bin/env bash
# Provide a CPython newer than the system's 3.11 (for integrations that declare Requires-Python >= 3.12:
# SkyRL, NeMo Gym), without touching the system Python. Prints the interpreter's path on stdout, and
# nothing else; progress goes to stderr. Idempotent: once installed, a run only checks (well under 1 s).
#
# Where it comes from: these machines reach only PyPI, Debian's archive and the npm registry. No prebuilt
# CPython >= 3.12 that runs on Debian 12 is to be had there (npm's portable-python packages and
# `uv python install` download from GitHub; Debian 13's python3.13 binaries need glibc 2.38, Debian 12 has
# 2.36; no Debian suite carries python3.12 any more). So this script takes the upstream CPython 3.13 source
# that Debian 13 (trixie) ships (its source package's .orig tarball, through apt-get with a private,
# temporary sources list: the system's apt configuration is left alone) and builds it with the machine's gcc
# without PGO and without its test suite into $NEWER_PYTHON_PREFIX (about 7 min of CPU, measured; so an
# estimated 4-5 min on an idle 2-core machine, 26 min seen on a heavily loaded one; 250 MB installed).
#
# Needs: root (or sudo) only for the Debian -dev packages it installs when missing (headers for ssl, sqlite3,
# ctypes/ffi, lzma, bz2, zlib, readline, curses, uuid, dbm).
#
# Env: NEWER_PYTHON_PREFIX    install prefix (default: ${XDG_CACHE_HOME:-$HOME/.cache}/rollouts/python3.13)
#      NEWER_PYTHON_SUITE     Debian suite to take the source from (default: trixie)
#      NEWER_PYTHON_OPTIMIZE  1: build with --enable-optimizations (PGO; several times slower to build)
set -euo pipefail
exec </dev/null

SERIES=3.13
CACHE=${XDG_CACHE_HOME:-$HOME/.cache}/rollouts
PREFIX=${NEWER_PYTHON_PREFIX:-$CACHE/python$SERIES}
SUITE=${NEWER_PYTHON_SUITE:-trixie}
PYBIN=$PREFIX/bin/python$SERIES
STAMP=$PREFIX/.newer-python-complete
# The stdlib modules that a working interpreter must have (each needs a -dev package at build time).
MODULES="ssl,sqlite3,ctypes,lzma,bz2,zlib,readline,curses,uuid,dbm.gnu,decimal,hashlib,venv,ensurepip"

say() { echo "newer_python: $*" >&2; }
die() { echo "newer_python: error: $*" >&2; exit 1; }

# Installed: the stamp (written only after the full module check below passed) and an interpreter that starts
# and still finds the system's libssl (the one shared library most likely to change under it).
works() {
  [ -f "$STAMP" ] && [ -x "$PYBIN" ] && "$PYBIN" -c "import ssl" >/dev/null 2>&1
}

# Fast path: already installed and working.
if works; then
  echo "$PYBIN"
  exit 0
fi

mkdir -p "$CACHE"
# One build at a time (a second caller waits, then finds it installed).
exec 9>"$CACHE/.newer-python.lock"
command -v flock >/dev/null 2>&1 && flock 9
if works; then
  echo "$PYBIN"
  exit 0
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then
  command -v sudo >/dev/null 2>&1 || die "not root and no sudo: cannot install the build packages"
  SUDO="sudo -n"
fi

# --- build dependencies (Debian packages of the running release) --------------------------------------
command -v apt-get >/dev/null 2>&1 || die "apt-get not found: this script supports Debian-based machines only"
DEPS="gcc make xz-utils libc6-dev pkg-config libssl-dev libffi-dev libsqlite3-dev liblzma-dev libbz2-dev
      zlib1g-dev libreadline-dev libncurses-dev uuid-dev libgdbm-dev libgdbm-compat-dev libexpat1-dev"
missing=()
for pkg in $DEPS; do dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg"); done
if [ ${#missing[@]} -gt 0 ]; then
  say "installing build packages: ${missing[*]}"
  $SUDO apt-get update -qq >&2 || die "apt-get update failed"
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 \
    || die "apt-get install ${missing[*]} failed"
fi

# --- the source: Debian $SUITE's python$SERIES source package, .orig tarball only ------------------------
SRC_DIR=$CACHE/src
mkdir -p "$SRC_DIR"
tarball=$(ls -1 "$SRC_DIR"/python${SERIES}_${SERIES}.*.orig.tar.xz 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$tarball" ]; then
  say "fetching the python$SERIES source from Debian $SUITE"
  APT_TMP=$(mktemp -d)
  trap 'rm -rf "$APT_TMP"' EXIT
  mkdir -p "$APT_TMP/lists/partial" "$APT_TMP/cache/archives/partial" "$APT_TMP/dl"
  echo "deb-src http://deb.debian.org/debian $SUITE main" >"$APT_TMP/sources.list"
  APT_OPTS=(-o "Dir::Etc::SourceList=$APT_TMP/sources.list" -o "Dir::Etc::SourceParts=/dev/null"
            -o "Dir::State::Lists=$APT_TMP/lists" -o "Dir::Cache=$APT_TMP/cache"
            -o "APT::Sandbox::User=root" -o "Acquire::Languages=none")
  apt-get "${APT_OPTS[@]}" update -qq >&2 || die "apt-get update of Debian $SUITE's source index failed"
  (cd "$APT_TMP/dl" && apt-get "${APT_OPTS[@]}" source --download-only -qq "python$SERIES/$SUITE" >&2) \
    || die "apt-get source python$SERIES/$SUITE failed (is it still in Debian $SUITE?)"
  got=$(ls -1 "$APT_TMP"/dl/python${SERIES}_*.orig.tar.xz 2>/dev/null | head -n 1 || true)
  [ -n "$got" ] || die "no python$SERIES .orig.tar.xz in what apt-get source fetched"
  # apt-get checked it against the signed Sources index; keep it so that a rebuild needs no download.
  mv "$got" "$SRC_DIR/"
  tarball=$SRC_DIR/$(basename "$got")
fi
version=$(basename "$tarball" | sed -E "s/^python${SERIES}_([0-9.]+)\.orig\.tar\.xz$/\1/")

# --- build and install ----------------------------------------------------------------------------------
BUILD=$(mktemp -d "${TMPDIR:-/tmp}/newer-python-build.XXXXXX")
LOG=$CACHE/newer-python-build.log
say "building CPython $version into $PREFIX (log: $LOG)"
start=$(date +%s)
rm -rf "$PREFIX"
configure_args=(--prefix="$PREFIX" --with-ensurepip=install --disable-test-modules)
[ "${NEWER_PYTHON_OPTIMIZE:-0}" = 1 ] && configure_args+=(--enable-optimizations)
if ! (
  set -e
  tar -xf "$tarball" -C "$BUILD"
  cd "$BUILD"/Python-*
  ./configure "${configure_args[@]}"
  make -j"$(nproc)"
  make install
) >"$LOG" 2>&1; then
  tail -n 30 "$LOG" >&2
  rm -rf "$BUILD"
  die "building CPython $version failed (full log: $LOG)"
fi
rm -rf "$BUILD"

if ! "$PYBIN" -c "import $MODULES" >&2; then
  die "the built interpreter lacks a stdlib module (one of: $MODULES); see $LOG"
fi
"$PYBIN" -m pip --version >/dev/null 2>&1 || die "the built interpreter has no working pip"
touch "$STAMP"
say "CPython $version ready in $(( $(date +%s) - start )) s"
echo "$PYBIN"
