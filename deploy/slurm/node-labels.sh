#!/bin/bash
# Prints this node's Ray label option, `--labels=gpu-arch=sm_<major><minor>`, from its GPUs' compute capability as
# the driver reports it (nvidia-smi --query-gpu=compute_cap: "9.0" on H100/H200, "12.0" on RTX PRO 6000), or
# nothing on a node without NVIDIA GPUs. specsweep places a server on nodes whose label is the sweep's
# `cluster.accelerator` (docs/cluster.md, "Placement"); the key is `cluster.accelerator_label`, `gpu-arch` unless
# SPECSWEEP_ACCELERATOR_LABEL says otherwise.
set -euo pipefail
key=${SPECSWEEP_ACCELERATOR_LABEL:-gpu-arch}
command -v nvidia-smi >/dev/null 2>&1 || exit 0
if ! caps=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null); then
    echo "node-labels.sh: $(hostname): nvidia-smi failed; this node gets no ${key} label" >&2
    exit 0
fi
caps=$(sort -u <<<"$caps" | tr -d ' ')
[ -n "$caps" ] || exit 0
if [ "$(wc -l <<<"$caps")" -ne 1 ]; then
    echo "node-labels.sh: $(hostname) has GPUs of several compute capabilities ($(tr '\n' ' ' <<<"$caps")); a Ray node carries one ${key} label" >&2
    exit 1
fi
echo "--labels=${key}=sm_${caps/./}"
