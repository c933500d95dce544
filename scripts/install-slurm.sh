#!/usr/bin/env bash
# Idempotent: install Debian's SLURM (slurm-wlm: slurmctld, slurmd, sbatch, ...) and munge when
# sbatch is missing. tests/test_slurm.py configures and starts them itself on loopback.
set -euo pipefail
if command -v sbatch >/dev/null && [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/munged ]; then
  exit 0
fi
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"
export DEBIAN_FRONTEND=noninteractive
if ! $SUDO apt-get install -y -q slurm-wlm munge; then
  $SUDO apt-get update -q
  $SUDO apt-get install -y -q slurm-wlm munge
fi
command -v sbatch >/dev/null || { echo "install-slurm.sh: sbatch still missing" >&2; exit 1; }
