#!/usr/bin/env bash
# Step 4: the CUDA 12.2 compiler and runtime headers from NVIDIA's apt repository, for NCCL and
# Horovod's CUDA kernels. An apt pin forbids every driver package from that repository: the
# driver is Ubuntu's R580 (step 2), and a second driver would break it.
#   https://docs.nvidia.com/cuda/cuda-installation-guide-linux/#network-repo-installation-for-ubuntu
#   https://docs.nvidia.com/cuda/cuda-installation-guide-linux/#meta-packages
# shellcheck source=step.sh
source "$(dirname "${BASH_SOURCE[0]}")/step.sh"
step_mode "$@"
cuda_home=$ROOT/usr/local/cuda-$CUDA_VERSION
suffix=${CUDA_VERSION/./-}
packages=("cuda-nvcc-$suffix" "cuda-cudart-dev-$suffix" "cuda-nvml-dev-$suffix" "cuda-nvtx-$suffix")
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
release=$("$cuda_home/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\),.*/\1/p')
[[ $release == "$CUDA_VERSION" ]] || fail "nvcc at $cuda_home is release '$release', not $CUDA_VERSION"
[[ -f $cuda_home/include/cuda_runtime.h ]] || fail "no CUDA runtime headers in $cuda_home"
# Horovod and aws-ofi-nccl load the toolkit's libcudart through the loader's cache, which the
# toolkit's packages extend with /etc/ld.so.conf.d.
ldconfig -p | grep -q "libcudart.so.${CUDA_VERSION%%.*} " ||
	fail "the loader cannot find libcudart.so.${CUDA_VERSION%%.*} (ldconfig -p)"
log "CUDA $release at $cuda_home"
