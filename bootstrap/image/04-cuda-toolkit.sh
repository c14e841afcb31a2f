#!/usr/bin/env bash
# Step 4: the CUDA 12.6 compiler, runtime headers and cuobjdump from NVIDIA's ubuntu2404 apt
# repository, to build NCCL (step 5) and Horovod's CUDA kernels (step 6), and nothing else.
# The toolkit need not match TensorFlow's CUDA 12.2: TensorFlow runs on its own pip CUDA wheels,
# and Horovod 0.28.x links the CUDA runtime and NCCL statically, so no process loads this
# toolkit's libraries beside TensorFlow's (the sources are in pins.env). An apt pin forbids every
# driver package from that repository and step 2's driver stays held: the driver is Ubuntu's
# R580, and a second one would break it.
#   https://docs.nvidia.com/cuda/cuda-installation-guide-linux/#network-repo-installation-for-ubuntu
#   https://docs.nvidia.com/cuda/cuda-installation-guide-linux/#meta-packages
# shellcheck source=step.sh
source "$(dirname "${BASH_SOURCE[0]}")/step.sh"
step_mode "$@"
cuda_home=$ROOT/usr/local/cuda-$CUDA_VERSION
suffix=${CUDA_VERSION/./-}
packages=("cuda-nvcc-$suffix" "cuda-cudart-dev-$suffix" "cuda-nvml-dev-$suffix" "cuda-nvtx-$suffix"
	"cuda-cuobjdump-$suffix")
NO_NVIDIA_DRIVERS=$ROOT/etc/apt/preferences.d/horovod-fleet-no-cuda-repo-drivers

if [[ $MODE == run ]]; then
	cat >"$NO_NVIDIA_DRIVERS" <<'PIN'
Package: cuda-drivers* nvidia-* libnvidia-* xserver-xorg-video-nvidia* nvidia-kernel-*
Pin: origin developer.download.nvidia.com
Pin-Priority: -1
PIN
	keyring=$(mktemp --suffix=.deb)
	curl -fsSL --retry 5 -o "$keyring" "$CUDA_KEYRING_URL"
	dpkg -i "$keyring"
	rm -f "$keyring"
	apt_get update
	apt_get -y install --no-install-recommends "${packages[@]}"
	apt-mark hold "${packages[@]}"
fi

[[ -f $NO_NVIDIA_DRIVERS ]] || fail "the pin that keeps NVIDIA's repository drivers out is missing"
driver_held=$(apt-mark showhold | grep -c "^nvidia-utils-$NVIDIA_DRIVER_BRANCH-server$" || true)
[[ $driver_held == 1 ]] || fail "nvidia-utils-$NVIDIA_DRIVER_BRANCH-server is not held: the CUDA repository could replace the driver"
release=$("$cuda_home/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
[[ $release == "$CUDA_VERSION" ]] || fail "nvcc at $cuda_home is release '$release', not $CUDA_VERSION"
[[ -f $cuda_home/include/cuda_runtime.h ]] || fail "no CUDA runtime headers in $cuda_home"
[[ -x $cuda_home/bin/cuobjdump ]] || fail "no cuobjdump in $cuda_home/bin"
# Horovod and aws-ofi-nccl load the toolkit's libcudart through the loader's cache, which the
# toolkit's packages extend with /etc/ld.so.conf.d.
ldconfig -p | grep -q "libcudart.so.${CUDA_VERSION%%.*} " ||
	fail "the loader cannot find libcudart.so.${CUDA_VERSION%%.*} (ldconfig -p)"
log "CUDA $release at $cuda_home"
