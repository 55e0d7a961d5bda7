#!/usr/bin/env bash
# Creates everything the project needs on a fresh Debian machine: system packages (Redis, a user-space
# NFS server and client library, iproute2 for network namespaces, Chromium for the report's screenshot
# test) and a virtual environment in .venv with the project installed in editable mode.
# Idempotent: a second run only checks. Set COORDL_SKIP_APT=1 to skip the system packages.
set -euo pipefail
cd "$(dirname "$0")/.."

# gcc, python3-dev and libjpeg62-turbo-dev build coordl's crop decoder and native read-ahead (setup.py; optional:
# without them coordl decodes whole images and reads ahead in Python threads).
# plasma-workspace-wallpapers and mate-backgrounds ship the free-licensed photographs `coordl synth --photos` cuts
# into an ImageNet-like dataset (coordl/datasets/photos.py lists them; ~140 MB download).
APT_PACKAGES=(redis-server nfs-ganesha nfs-ganesha-vfs libnfs-dev libnfs-utils rpcbind iproute2 chromium
              gcc python3-dev libjpeg62-turbo-dev plasma-workspace-wallpapers mate-backgrounds)
EXTRAS="${COORDL_EXTRAS:-dev,nfs}"
TORCH_VERSION=2.13.0

missing=()
if [ "${COORDL_SKIP_APT:-0}" != "1" ] && command -v dpkg-query >/dev/null; then
  for p in "${APT_PACKAGES[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
  done
fi
if [ ${#missing[@]} -gt 0 ]; then
  if [ "$(id -u)" != "0" ] && ! command -v sudo >/dev/null; then
    echo "setup: need root (or sudo) to install: ${missing[*]}" >&2; exit 1
  fi
  SUDO=""; [ "$(id -u)" = "0" ] || SUDO="sudo"
  echo "setup: installing system packages: ${missing[*]}"
  $SUDO apt-get update -qq
  # Debian's policy-rc.d keeps the services from starting: the project starts its own on demand.
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

PY="${PYTHON:-python3}"
if [ ! -x .venv/bin/python ]; then
  echo "setup: creating .venv"
  "$PY" -m venv .venv
fi
stamp=.venv/.coordl-installed
# Installed already when the stamp is newer than pyproject.toml, setup.py and the C extensions' sources and lists
# every extra asked for now (the editable install compiles the extensions in place).
have_extras() {
  [ -f "$stamp" ] && [ ! pyproject.toml -nt "$stamp" ] && [ ! setup.py -nt "$stamp" ] \
    && [ -z "$(find coordl/prep/_jpeg coordl/fileread -name "*.[ch]" -newer "$stamp" -print -quit)" ] || return 1
  local e
  for e in ${EXTRAS//,/ }; do
    grep -qx "$e" <(tr ',' '\n' < "$stamp") || return 1
  done
}
if ! have_extras; then
  echo "setup: installing coordl[$EXTRAS] into .venv (torch $TORCH_VERSION CPU)"
  .venv/bin/pip install -q --upgrade pip 2>&1 | grep -v "^WARNING: Location" || true
  # The package accepts torch>=2.6,<3 (pyproject.toml); the quick start installs the version the project is tested
  # with, first, so that the editable install below finds it satisfied and keeps it.
  .venv/bin/pip install -q "torch==$TORCH_VERSION" 2>&1 | grep -v "^WARNING: Location" || true
  # torch is named again here: with moto, boto3 and s3fs together pip's resolver backtracks and, left free,
  # takes the newest torch the range allows (a CUDA build) over the one just installed.
  .venv/bin/pip install -q -e ".[$EXTRAS]" "torch==$TORCH_VERSION" 2>&1 | grep -v "^WARNING: Location" || true
  .venv/bin/python -c "import torch, simplejpeg, redis, psutil" \
    || { echo "setup: the install failed (see above)" >&2; exit 1; }
  echo "$EXTRAS" > "$stamp"
fi
# A clone named coordl hides the package from Python started in the clone's parent folder; this start-up hook turns
# the resulting "module 'coordl' has no attribute ..." into an ImportError that says so (scripts/coordl_import_guard.py).
site_dir="$(.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if ! cmp -s scripts/coordl_import_guard.py "$site_dir/_coordl_import_guard.py"; then
  cp scripts/coordl_import_guard.py "$site_dir/_coordl_import_guard.py"
  echo "import _coordl_import_guard" > "$site_dir/_coordl_import_guard.pth"
fi
echo "setup: ready (.venv, $(.venv/bin/python -c 'import torch; print("torch", torch.__version__)'))"
