#!/usr/bin/env bash
# Step 6: the training venv at $VENV on Python 3.11 (TensorFlow 2.15.1 has no wheels for noble's
# 3.12): python-build-standalone's CPython at the pinned version, installed by uv, which checks
# its sha256 (pins.env says why not a PPA). Then TensorFlow 2.15.1 with its CUDA 12 wheels and
# everything trainer/ and bootstrap/ import, at the exact versions of requirements.lock, and
# Horovod 0.28.1 compiled with gcc-12 (0.28.1 does not build with noble's gcc 13) with NCCL (the
# static /opt/nccl of step 5, for every architecture of the fleet), MPI (the EFA installer's
# Open MPI 4) and Gloo. `horovodrun --check-build` and the compilers CMake identified (the build
# record) are kept in the image beside image.json. Horovod's setup.py finds cmake through
# HOROVOD_CMAKE or PATH only; without build isolation the lock's cmake (3.x: cmake 4 rejects the
# Gloo it vendors) is in the venv, not on PATH.
#   https://horovod.readthedocs.io/en/stable/install_include.html
#   https://horovod.readthedocs.io/en/stable/gpus_include.html
#   https://docs.astral.sh/uv/concepts/python-versions/
# shellcheck source=step.sh
source "$(dirname "${BASH_SOURCE[0]}")/step.sh"
step_mode "$@"
CHECK_BUILD=$IMAGE_DIR/horovod-check-build.txt
BUILD_RECORD=$IMAGE_DIR/horovod-build.txt
BUILD_LOG=$IMAGE_DIR/horovod-build.log
python_home=$ROOT$PYTHON_HOME

if [[ $MODE == run ]]; then
	apt_get -y install --no-install-recommends python3-venv build-essential "$BUILD_CC" "$BUILD_CXX"
	tools=$(mktemp -d)
	python3 -m venv "$tools/venv"
	printf 'uv==%s --hash=sha256:%s\n' "$UV_VERSION" "$UV_WHEEL_SHA256" >"$tools/uv.txt"
	"$tools/venv/bin/pip" install --quiet --no-cache-dir --require-hashes -r "$tools/uv.txt"
	export UV_PYTHON_INSTALL_DIR=$python_home
	"$tools/venv/bin/uv" python install --no-bin "$PYTHON_VERSION"
	python=$("$tools/venv/bin/uv" python find --managed-python "$PYTHON_VERSION")
	rm -rf "$VENV"
	"$python" -m venv "$VENV"
	rm -rf "$tools"
	pip=("$VENV/bin/pip" install --quiet --no-cache-dir)
	"${pip[@]}" --upgrade pip
	"${pip[@]}" --requirement "$RECIPE_DIR/requirements.lock"
	cc_list=${CUDA_ARCHITECTURES// /,}
	log "building horovod==$HOROVOD_VERSION with $BUILD_CXX (NCCL static from /opt/nccl, CUDA ${CUDA_VERSION} for $cc_list)"
	mkdir -p "$IMAGE_DIR"
	# --verbose: CMake's compiler identification lines are the build record.
	PATH=$ROOT/opt/amazon/openmpi/bin:$PATH CC=$BUILD_CC CXX=$BUILD_CXX \
		HOROVOD_GPU_OPERATIONS=NCCL HOROVOD_NCCL_HOME=$ROOT/opt/nccl HOROVOD_NCCL_LINK=STATIC \
		HOROVOD_CUDA_HOME=$ROOT/usr/local/cuda-$CUDA_VERSION HOROVOD_BUILD_CUDA_CC_LIST=$cc_list \
		HOROVOD_WITH_TENSORFLOW=1 HOROVOD_WITH_MPI=1 HOROVOD_WITH_GLOO=1 \
		HOROVOD_WITHOUT_PYTORCH=1 HOROVOD_WITHOUT_MXNET=1 MAKEFLAGS=-j"$(nproc)" \
		HOROVOD_CMAKE="$VENV/bin/cmake" \
		"$VENV/bin/pip" install --verbose --no-cache-dir --no-build-isolation \
		"horovod==$HOROVOD_VERSION" >"$BUILD_LOG" 2>&1 ||
		fail "pip could not build horovod==$HOROVOD_VERSION: $(grep -i error "$BUILD_LOG" | tail -1)"
	grep -E 'The (C|CXX|CUDA) compiler identification is' "$BUILD_LOG" >"$BUILD_RECORD" || true
	PATH=$VENV/bin:$ROOT/opt/amazon/openmpi/bin:$PATH horovodrun --check-build >"$CHECK_BUILD"
fi

version=$("$VENV/bin/python" --version 2>&1)
[[ $version == "Python $PYTHON_VERSION" ]] ||
	fail "the venv's Python is '${version#Python }', not $PYTHON_VERSION: TensorFlow $TENSORFLOW_VERSION has wheels up to Python 3.11"
compiler=$(sed -n 's/.*The CXX compiler identification is GNU \([0-9.]*\).*/\1/p' "$BUILD_RECORD" 2>/dev/null | head -1)
[[ -n $compiler ]] || fail "no C++ compiler identification in $BUILD_RECORD: which compiler built Horovod is unknown"
[[ ${compiler%%.*} == "$BUILD_GCC_MAJOR" ]] ||
	fail "Horovod was built with GCC $compiler ($BUILD_RECORD), not $BUILD_CXX: Horovod $HOROVOD_VERSION does not build with gcc 13 (horovod/horovod#3957 came after it)"
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
log "Python $PYTHON_VERSION, TensorFlow $TENSORFLOW_VERSION + Horovod $HOROVOD_VERSION (GCC $compiler; NCCL, MPI, Gloo) in $VENV"
