#!/usr/bin/env bash
# `make gpu-wheels`: download, for the accelerator machine (x86-64, Python 3.12, no network), the wheels of what
# coordl imports and its image lacks, into .whl/ (ignored by git; a device call carries it with carry: [".whl"]),
# and check that the tree plus the wheels fit the 64 MiB a device call carries. docs/gpu.md has the two calls.
#
#   bash scripts/gpu_wheels.sh          # the wheels gpu_check needs (about 2 MB)
#   bash scripts/gpu_wheels.sh --dali   # also re-measure NVIDIA DALI's CUDA wheel (downloads ~255 MB to a temp
#                                       # folder, then deletes it): whether the DALI GPU benchmark could travel
#
# The image already has torch (CUDA), numpy, pillow, psutil, matplotlib, rich, tqdm, fsspec, pytest and
# pytest-timeout (/work/.library/device/KINDS.md); it lacks simplejpeg, redis, hiredis and lmdb (coordl imports
# them) and nvidia-dali. The versions are the ones installed in .venv (what the tests ran with), else the pins below.
set -euo pipefail
cd "$(dirname "$0")/.."

DEST=.whl
LIMIT=$((64 * 1024 * 1024))
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
declare -A PIN=([simplejpeg]=1.9.0 [redis]=8.1.0 [hiredis]=3.5.0 [lmdb]=3.0.0)
# Measured 2026-11-25 with this script's --dali: nvidia-dali-cuda130 2.4.0 and the CUDA libraries it requires.
DALI_MEASURED="nvidia-dali-cuda130 2.4.0: 198.7 MB; with nvidia-nvimgcodec-cu13 0.9.0.20 (25.0 MB), nvidia-libnvcomp-cu13 5.3.0.16 (28.5 MB) and nvidia-nvjpeg 13.3.2.43 (3.8 MB): 256 MB"
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64 --platform manylinux1_x86_64)

download() {  # download DIR SPEC...: cp312 manylinux x86-64 binary wheels, no dependencies
  local dir=$1; shift
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${PLATFORMS[@]}" -d "$dir" "$@" 2>&1 | grep -v "^WARNING: Location" || true
}

version_of() {  # the version installed in .venv, else the pin
  "$PY" -c "from importlib.metadata import version; print(version('$1'))" 2>/dev/null || echo "${PIN[$1]}"
}

specs=()
for name in simplejpeg redis hiredis lmdb; do specs+=("$name==$(version_of "$name")"); done
rm -rf "$DEST"
mkdir -p "$DEST"
echo "gpu-wheels: downloading ${specs[*]} (cp312, manylinux x86-64) into $DEST/"
download "$DEST" "${specs[@]}"
for name in simplejpeg redis hiredis lmdb; do
  ls "$DEST"/"$name"-*.whl >/dev/null 2>&1 || { echo "gpu-wheels: no wheel of $name was downloaded" >&2; exit 1; }
done
# coordl's crop decoder for the machine's Python 3.12, built here against the stable ABI (abi3: it loads in any
# CPython >= 3.11), beside a copy of the libjpeg it links (RUNPATH $ORIGIN: the image has no libjpeg.so.62).
# gpu_check copies both into coordl/prep/ there when the decoder does not import (docs/gpu.md).
mkdir -p "$DEST/cropjpeg" "$DEST/cropjpeg/o"
pyinc=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')
for src in coordl/prep/_jpeg/*.c; do
  gcc -O3 -ffp-contract=off -fPIC -Werror=implicit-function-declaration -DPy_LIMITED_API=0x030B0000 \
    -I"$pyinc" -c "$src" -o "$DEST/cropjpeg/o/$(basename "$src" .c).o"
done
gcc -shared -o "$DEST/cropjpeg/_cropjpeg.abi3.so" "$DEST"/cropjpeg/o/*.o -ljpeg -Wl,-rpath,'$ORIGIN'
rm -rf "$DEST/cropjpeg/o"
libjpeg=$(ldd "$DEST/cropjpeg/_cropjpeg.abi3.so" | awk '/libjpeg/ {print $3}')
cp -L "$libjpeg" "$DEST/cropjpeg/"

# The tree that travels has no .git: record the commit it was at for the report.
{ git describe --always --dirty 2>/dev/null || echo unknown; } > "$DEST/TREE"

# What a device call carries: tracked and untracked-not-ignored files (and shared/ if any), plus .whl/.
tree_bytes=$(git ls-files -z --cached --others --exclude-standard | xargs -0 -r stat -c %s 2>/dev/null \
  | awk '{s += $1} END {print s + 0}')
wheel_bytes=$(du -sb "$DEST" | cut -f1)
total=$((tree_bytes + wheel_bytes))
mib() { awk -v b="$1" 'BEGIN {printf "%.1f MiB", b / 1048576}'; }
ls -l "$DEST" | awk 'NR > 1 {printf "  %-75s %8.2f MB\n", $9, $5 / 1e6}'
echo "gpu-wheels: tree $(mib "$tree_bytes") + wheels $(mib "$wheel_bytes") = $(mib "$total") of the $(mib "$LIMIT") a device call carries"
if [ "$total" -gt "$LIMIT" ]; then
  echo "gpu-wheels: OVER the limit: the device call would be refused; ignore or remove large untracked files" >&2
  exit 1
fi

if [ "${1:-}" = "--dali" ]; then
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' EXIT
  echo "gpu-wheels: measuring NVIDIA DALI's CUDA wheels in $tmp (deleted after)"
  download "$tmp" nvidia-dali-cuda130==2.4.0 "nvidia-nvimgcodec-cu13==0.9.0.20" nvidia-libnvcomp-cu13==5.3.0.16 \
    nvidia-nvjpeg==13.3.2.43
  ls -l "$tmp" | awk 'NR > 1 {printf "  %-75s %8.1f MB\n", $9, $5 / 1e6}'
  DALI_MEASURED="$(du -sb "$tmp" | awk '{printf "%.0f MB in all", $1 / 1e6}')"
fi
echo "gpu-wheels: NVIDIA DALI does not travel in one call: $DALI_MEASURED, over the 64 MiB a device call"
echo "            carries. bash scripts/gpu_dali.sh packs it in parts for consecutive calls (docs/gpu.md)."
