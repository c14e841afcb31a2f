#!/usr/bin/env bash
# Step 6: the training venv at $VENV: TensorFlow 2.15.1 with its CUDA 12 wheels and
# everything trainer/ and bootstrap/ import, at the exact versions of requirements.lock, then
# Horovod 0.28.1 compiled with NCCL (the static /opt/nccl of step 5, for every architecture of
# the fleet), MPI (the EFA installer's Open MPI 4) and Gloo. `horovodrun --check-build` is kept
# in the image beside image.json. Horovod's setup.py finds cmake through HOROVOD_CMAKE or PATH
# only; without build isolation the lock's cmake (3.x: cmake 4 rejects the Gloo it vendors) is in
# the venv, not on PATH.
#   https://horovod.readthedocs.io/en/stable/install_include.html
#   https://horovod.readthedocs.io/en/stable/gpus_include.html
# shellcheck source=step.sh
source "$(dirname "${BASH_SOURCE[0]}")/step.sh"
step_mode "$@"
CHECK_BUILD=$IMAGE_DIR/horovod-check-build.txt

if [[ $MODE == run ]]; then
	apt_get -y install --no-install-recommends python3-venv python3-dev build-essential
	rm -rf "$VENV"
	python3 -m venv "$VENV"
	pip=("$VENV/bin/pip" install --quiet --no-cache-dir)
	"${pip[@]}" --upgrade pip
	"${pip[@]}" --requirement "$RECIPE_DIR/requirements.lock"
	cc_list=${CUDA_ARCHITECTURES// /,}
	log "building horovod==$HOROVOD_VERSION (NCCL static from /opt/nccl, CUDA ${CUDA_VERSION} for $cc_list)"
	PATH=$ROOT/opt/amazon/openmpi/bin:$PATH \
		HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME=$ROOT/opt/nccl HOROVOD_NCCL_LINK=STATIC \
		HOROVOD_CUDA_HOME=$ROOT/usr/local/cuda-$CUDA_VERSION HOROVOD_BUILD_CUDA_CC_LIST=$cc_list \
		HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
		HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j"$(nproc)" \
		HOROVOD_CMAKE="$VENV/bin/cmake" \
		"${pip[@]}" --no-build-isolation "horovod==$HOROVOD_VERSION"
	mkdir -p "$IMAGE_DIR"
	PATH=$VENV/bin:$ROOT/opt/amazon/openmpi/bin:$PATH horovodrun --check-build >"$CHECK_BUILD"
fi

"$VENV/bin/python" - "$TENSORFLOW_VERSION" "$HOROVOD_VERSION" <<'PY' || fail "the venv does not import the pinned TensorFlow and Horovod"
import sys
import horovod.tensorflow as hvd
import tensorflow as tf
assert tf.__version__ == sys.argv[1], f"tensorflow {tf.__version__}"
assert hvd.__version__ == sys.argv[2], f"horovod {hvd.__version__}"
assert hvd.nccl_built() and hvd.mpi_built() and hvd.gloo_built(), "Horovod without NCCL, MPI or Gloo"
PY
for framework in TensorFlow MPI Gloo NCCL; do
	grep -Eq "^\s*\[X\] $framework\s*$" "$CHECK_BUILD" ||
		fail "horovodrun --check-build does not list $framework as built: $(tr '\n' ' ' <"$CHECK_BUILD")"
done
log "TensorFlow $TENSORFLOW_VERSION + Horovod $HOROVOD_VERSION (NCCL, MPI, Gloo) in $VENV"
