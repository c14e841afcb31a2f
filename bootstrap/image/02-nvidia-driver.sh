#!/usr/bin/env bash
# Step 2: the NVIDIA R580 driver with closed kernel modules, from Ubuntu's archive: the prebuilt,
# signed modules for the running AWS kernel (no DKMS, no compiler on the node) and the headless
# server userspace. The open modules do not drive Volta; the closed ones drive every GPU in
# stacks/instance_types.py (V100, T4, A10G, A100, H100). Then the kernel and the driver are held.
#   https://documentation.ubuntu.com/server/how-to/graphics/install-nvidia-drivers/
# shellcheck source=step.sh
source "$(dirname "${BASH_SOURCE[0]}")/step.sh"
step_mode "$@"
branch=${NVIDIA_DRIVER_BRANCH}-server
kernel=$(uname -r)
# NVSwitch systems (p4d, p5) need the fabric manager of exactly the driver's version to bring
# their GPUs up; it is part of the branch in Ubuntu's archive.
packages=(
	"linux-modules-nvidia-$branch-aws"
	"linux-modules-nvidia-$branch-$kernel"
	"nvidia-headless-no-dkms-$branch"
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
[[ $license != "Dual MIT/GPL" ]] ||
	fail "the nvidia module for $kernel is the open one (license $license), which cannot drive Volta"
not_held=$(comm -23 <(printf '%s\n' "${held[@]}" | sort) <(apt-mark showhold | sort))
[[ -z $not_held ]] || fail "not held: $not_held"
log "driver $modules_version (closed modules) for kernel $kernel; kernel and driver held"
