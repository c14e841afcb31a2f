#!/usr/bin/env bash
# Step 2: the NVIDIA R580 driver with its open kernel modules, from Ubuntu's archive: the prebuilt,
# signed modules for the running AWS kernel (no DKMS, no compiler on the node) and the headless
# server userspace. The open modules drive every GPU in stacks/instance_types.py (T4, A10G,
# A100, H100, H200: Turing and later) and carry GPUDirect RDMA over EFA on p4d and p5, through
# efa_nv_peermem, which step 3 builds against them and requires (why DMA-BUF is no fallback there:
# 03-efa.sh). Then the kernel and the driver are held.
#   https://documentation.ubuntu.com/server/how-to/graphics/install-nvidia-drivers/
#   https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/kernel-modules.html
#   https://packages.ubuntu.com/jammy/nvidia-headless (nvidia-headless-no-dkms-580-server-open)
source "$(dirname "${BASH_SOURCE[0]}")/step.sh"
step_mode "$@"
branch=${NVIDIA_DRIVER_BRANCH}-server
kernel=$(uname -r)
# NVSwitch systems (p4d, p5) need the fabric manager of exactly the driver's version to bring
# their GPUs up; it is part of the branch in Ubuntu's archive.
packages=(
	"linux-modules-nvidia-$branch-open-aws"
	"linux-modules-nvidia-$branch-open-$kernel"
	"nvidia-headless-no-dkms-$branch-open"
	"nvidia-utils-$branch"
	"nvidia-fabricmanager-$NVIDIA_DRIVER_BRANCH"
)
held=(linux-aws linux-image-aws linux-headers-aws "linux-image-$kernel" "${packages[@]}")

if [[ $MODE == run ]]; then
	log "installing ${packages[*]}"
	apt_get update
	apt_get -y install --no-install-recommends "${packages[@]}"
	apt-mark hold "${held[@]}"
	log "held: ${held[*]}"
fi

modules_version=$(modinfo -k "$kernel" -F version nvidia) ||
	fail "no nvidia kernel module for the running kernel $kernel"
utils_version=$(dpkg-query -W -f '${Version}' "nvidia-utils-$branch")
[[ $modules_version == "$NVIDIA_DRIVER_BRANCH".* ]] ||
	fail "nvidia module $modules_version is not branch $NVIDIA_DRIVER_BRANCH"
[[ $utils_version == "$modules_version"-* ]] ||
	fail "nvidia-utils $utils_version does not match the kernel module $modules_version"
license=$(modinfo -k "$kernel" -F license nvidia)
[[ $license == "Dual MIT/GPL" ]] ||
	fail "the nvidia module for $kernel is the closed one (license $license): GPUDirect RDMA over EFA needs the open one"
not_held=$(comm -23 <(printf '%s\n' "${held[@]}" | sort) <(apt-mark showhold | sort))
[[ -z $not_held ]] || fail "not held: $not_held"
log "driver $modules_version (open modules) for kernel $kernel; kernel and driver held"
