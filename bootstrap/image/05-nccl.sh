#!/usr/bin/env bash
# Step 5: NCCL built from NVIDIA's source at a pinned tag and commit, for every GPU architecture
# of stacks/instance_types.py, into /opt/nccl, with the image's one compiler as nvcc's host
# compiler (-ccbin $(CXX) in NCCL's makefiles/common.mk). Horovod links it statically (step 6), so
# the gradients never use the NCCL 2.16.5 that tensorflow[and-cuda]==2.15.1 brings, which is older
# than the 2.17.1 the EFA installer's aws-ofi-nccl requires. The check reads the architectures the
# library holds code for (cuobjdump --list-elf): an NCCL without sm_90 fails H100 and H200 fleets.
#   https://github.com/NVIDIA/nccl#build
#   https://docs.nvidia.com/cuda/cuda-binary-utilities/index.html#cuobjdump
# shellcheck source=step.sh
source "$(dirname "${BASH_SOURCE[0]}")/step.sh"
step_mode "$@"
prefix=$ROOT/opt/nccl
cuda_home=$ROOT/usr/local/cuda-$CUDA_VERSION

if [[ $MODE == run ]]; then
	apt_get -y install --no-install-recommends build-essential git "$BUILD_CXX"
	src=$(mktemp -d)
	git clone --quiet --depth 1 --branch "v$NCCL_VERSION" https://github.com/NVIDIA/nccl.git "$src"
	commit=$(git -C "$src" rev-parse HEAD)
	[[ $commit == "$NCCL_COMMIT" ]] || fail "tag v$NCCL_VERSION is commit $commit, pinned $NCCL_COMMIT"
	gencode=""
	for arch in $CUDA_ARCHITECTURES; do
		gencode+=" -gencode=arch=compute_$arch,code=sm_$arch"
	done
	log "building NCCL $NCCL_VERSION for sm ${CUDA_ARCHITECTURES}"
	make -C "$src" -j "$(nproc)" src.build CUDA_HOME="$cuda_home" NVCC_GENCODE="${gencode# }" \
		CXX="$BUILD_CXX" BUILDDIR="$src/build"
	rm -rf "$prefix"
	mkdir -p "$prefix"
	cp -a "$src/build/include" "$src/build/lib" "$prefix/"
	rm -rf "$src"
fi

for file in include/nccl.h lib/libnccl_static.a lib/libnccl.so; do
	[[ -e $prefix/$file ]] || fail "$prefix/$file is missing"
done
built=$(sed -n 's/^#define NCCL_\(MAJOR\|MINOR\|PATCH\) *\([0-9]*\).*/\2/p' "$prefix/include/nccl.h" | paste -sd.)
[[ $NCCL_VERSION == "$built"-* ]] || fail "$prefix holds NCCL $built, pinned $NCCL_VERSION"
# Horovod links the static library, so its code is what the fleet runs.
elf=$("$cuda_home/bin/cuobjdump" --list-elf "$prefix/lib/libnccl_static.a")
listed=$(grep -oE 'sm_[0-9]+' <<<"$elf" | sort -u | paste -sd' ' || true)
for arch in $CUDA_ARCHITECTURES; do
	[[ " $listed " == *" sm_$arch "* ]] ||
		fail "NCCL at $prefix has no code for sm_$arch (cuobjdump lists: ${listed:-none}); the fleet's GPUs need ${CUDA_ARCHITECTURES// /, }"
done
log "NCCL $built at $prefix for $listed"
