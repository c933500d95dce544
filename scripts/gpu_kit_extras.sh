#!/usr/bin/env bash
# After `VLLM_VERSION=0.32.0 TORCH=2.13.0 ... bash ../shared/gpu-kit/build.sh` (the pinned stack):
#   bash scripts/gpu_kit_extras.sh
# 1. re-cuts the kit's archive (/tmp/gpusite.tar.xz) into .gpu/c00, c01, ... of PART_MB (54) MiB:
#    a call carries the working tree too (~8 MiB), and 58 MiB parts plus the tree passed 64 MiB;
# 2. cuts the wheels torch 2.13 needs beside the lent image's torch 2.11 set into .gpu/wN_K parts:
#    NCCL 2.29 (`ncclCommResume`), cuDNN 9.20 (torch 2.13 refuses 9.19) and torchvision 0.28 /
#    torchaudio 2.11 (the image's torchvision breaks `import transformers` beside torch 2.13).
# On the device, after the kit's own unpack (`SMOKE_ONLY=1 bash .gpu/sh/a.sh`),
# `bash benchmarks/gpu_session.sh smoke` joins and unpacks each wheel into /tmp/site. Seen on an
# H100, 2026-12-06: torch 2.13.0+cu130, cuDNN 9.20.0, NCCL 2.29.7, vLLM 0.32.0 (docs/gpu-quickstart.md).
set -euo pipefail
PROJ=$(git rev-parse --show-toplevel)
GPU_DIR=${GPU_DIR:-$PROJ/.gpu}
ARCHIVE=${ARCHIVE:-/tmp/gpusite.tar.xz}
WORK=${WORK:-/tmp/gpukit-extras}
PART_MB=${PART_MB:-54}
WHEELS=${WHEELS:-"nvidia-nccl-cu13==2.29.7 nvidia-cudnn-cu13==9.20.0.48 torchvision==0.28.0 torchaudio==2.11.0"}
rm -rf "$WORK" && mkdir -p "$WORK/split" "$WORK/wheels"

rm -rf "$GPU_DIR"/c[0-9]*
split -b "${PART_MB}M" -d -a 2 "$ARCHIVE" "$WORK/split/c"
for f in "$WORK"/split/c*; do k=$(basename "$f"); mkdir -p "$GPU_DIR/$k" && mv "$f" "$GPU_DIR/$k/$k"; done

PLAT=(--only-binary=:all: --python-version 3.12 --implementation cp)
for p in $(seq -f "manylinux_2_%g_x86_64" 35 -1 17) manylinux2014_x86_64; do PLAT+=(--platform "$p"); done
python3 -m pip --isolated download -q --no-deps "${PLAT[@]}" -d "$WORK/wheels" $WHEELS
rm -rf "$GPU_DIR"/w[0-9]*
i=0
for whl in "$WORK"/wheels/*.whl; do
  mkdir -p "$WORK/w$i" && split -b "${PART_MB}M" -d -a 1 "$whl" "$WORK/w$i/w${i}_"
  for f in "$WORK/w$i"/*; do k=$(basename "$f"); mkdir -p "$GPU_DIR/$k" && mv "$f" "$GPU_DIR/$k/$k"; done
  echo "w$i: $(basename "$whl")"
  i=$((i + 1))
done
du -sh "$GPU_DIR"/c[0-9]* "$GPU_DIR"/w[0-9]* | tr '\n' ' '; echo
