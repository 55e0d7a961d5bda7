#!/usr/bin/env bash
# `make gpu-dali`: NVIDIA DALI for the accelerator machine, in parts that each fit a device call.
#
# DALI's CUDA wheel and the libraries it loads are 256 MB as wheels, four times the 64 MiB a device call carries,
# and the machine has no network. But a machine stays warm for 30 s after a call, and files outside the tree
# survive between calls there. So this script unpacks the wheels here (cp312, manylinux x86-64: the machine's
# Python), keeps only the cp312 extension modules (a wheel carries one per Python version), and packs the result
# as one tar.xz (xz -9 shrinks the CUDA kernels far better than a wheel's deflate: 495 MB -> ~150 MB), split into
# parts of at most 52 MB under .dali/p0, .dali/p1, ... (ignored by git). Each device call carries one part
# (carry: [".dali/p0"]) and runs `python3 scripts/gpu_check.py --stash-dali`, which copies it to
# /tmp/coordl-dali-parts; the last call carries the last part with `.whl` and runs the check, which joins the
# parts, checks their SHA-256 (.dali/SHA256, in every part's folder) and unpacks them into the interpreter's
# site-packages (a file already there is kept: the image's own packages win). docs/gpu.md has the calls.
#
#   bash scripts/gpu_dali.sh         # ~3-4 minutes here (xz on 2 cores)
#
# What travels: nvidia-dali-cuda130 (DALI itself), nvidia-nvimgcodec-cu13 (its image decoders: DALI dlopens
# them), nvidia-nvjpeg (nvJPEG, which nvimgcodec's GPU JPEG decoder dlopens) and DALI's pure-Python needs
# (astunparse, gast, optree, nvtx, makefun, libcst). Not nvidia-libnvcomp-cu13: DALI loads it only for its
# decompression operators (no NEEDED entry in libdali*.so), which coordl does not use.
set -euo pipefail
cd "$(dirname "$0")/.."

DEST=.dali
PART_MB=52
PY=python3
[ -x .venv/bin/python ] && PY=.venv/bin/python
SPECS=(nvidia-dali-cuda130==2.4.0 nvidia-nvimgcodec-cu13==0.9.0.20 nvidia-nvjpeg==13.3.2.43 astunparse==1.6.3
       gast==0.7.0 optree==0.20.0 nvtx==0.2.17 makefun==1.16.0 libcst==1.9.0)
PLATFORMS=(--platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64
           --platform manylinux2014_x86_64)

tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "gpu-dali: downloading ${SPECS[*]} (cp312, manylinux x86-64)"
"$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  "${PLATFORMS[@]}" -d "$tmp/wheels" "${SPECS[@]}"
mkdir "$tmp/site"
for w in "$tmp"/wheels/*.whl; do
  "$PY" -c 'import sys, zipfile; zipfile.ZipFile(sys.argv[1]).extractall(sys.argv[2])' "$w" "$tmp/site"
done
# one extension module per Python version in each wheel: the machine runs 3.12
find "$tmp/site" -name '*.cpython-3*' ! -name '*.cpython-312-*' -delete
# the unpacked wheels keep their *.data/ folders and dist-info: harmless, and they name what was installed
echo "gpu-dali: $(du -sh "$tmp/site" | cut -f1) unpacked; packing with xz -9 (a few minutes)"
tar -C "$tmp/site" --sort=name --owner=0 --group=0 --numeric-owner -cf - . | xz -9 -T2 > "$tmp/dali-site.tar.xz"
rm -rf "$DEST"
mkdir -p "$DEST"
sum=$(sha256sum "$tmp/dali-site.tar.xz" | cut -d' ' -f1)
split -b "${PART_MB}M" -d -a 1 "$tmp/dali-site.tar.xz" "$tmp/part."
n=0
for part in "$tmp"/part.*; do
  mkdir -p "$DEST/p$n"
  mv "$part" "$DEST/p$n/dali-site.tar.xz.$n"
  n=$((n + 1))
done
for d in "$DEST"/p*; do echo "$sum  dali-site.tar.xz ($n parts) ${SPECS[*]}" > "$d/SHA256"; done
ls -l "$DEST"/p*/dali-site.tar.xz.* | awk '{printf "  %-40s %6.1f MB\n", $9, $5 / 1e6}'
echo "gpu-dali: $n parts; carry each in its own device call (docs/gpu.md, 'DALI in parts')"
