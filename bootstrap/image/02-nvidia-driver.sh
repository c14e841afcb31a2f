#!/usr/bin/env bash
# Step 2: the NVIDIA R580 driver with its open kernel modules, from Ubuntu's archive: the prebuilt,
# signed modules for the running kernel, which step 1 holds on the LTS track (no DKMS, no compiler
# on the node), and the headless server userspace. The open modules drive every GPU in
# stacks/instance_types.py (T4, A10G, A100, H100, H200: Turing and later) and carry GPUDirect RDMA
# over EFA on p4d and p5, through efa_nv_peermem, which step 3 builds against them and requires
# (why DMA-BUF is no fallback there: 03-efa.sh). The modules are the per-kernel package: the LTS
# track's meta-package of them is named in no stored source, and the held kernel never changes
# under it (pins.env). The fabric manager must be of the driver's exact version, or it does not
# bring an NVSwitch system's GPUs up. Then the driver is held.
#   https://documentation.ubuntu.com/server/how-to/graphics/install-nvidia-drivers/
#   https://docs.nvidia.com/datacenter/tesla/driver-installation-guide/kernel-modules.html
#   https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/index.html
#   https://github.com/NVIDIA/gpu-driver-container/blob/main/ubuntu24.04/precompiled/local-repo.sh
# shellcheck source=step.sh
source "$(dirname "${BASH_SOURCE[0]}")/step.sh"
step_mode "$@"
branch=${NVIDIA_DRIVER_BRANCH}-server
kernel=$(uname -r)
fabric_manager=nvidia-fabricmanager-$NVIDIA_DRIVER_BRANCH
packages=(
	"linux-modules-nvidia-$branch-open-$kernel"
	"nvidia-headless-no-dkms-$branch-open"
	"nvidia-utils-$branch"
	"$fabric_manager"
)

if [[ $MODE == run ]]; then
	# The rolling track's kernels stay installed after step 1's reboot into the held one. DKMS
	# (the EFA installer, step 3) would build for them too, with no NVIDIA driver for them, and an
	# upgrade by hand could make GRUB boot one: only the running kernel stays.
	mapfile -t stale < <(dpkg-query -W -f '${Package} ${db:Status-Abbrev}\n' 'linux-image-[0-9]*' \
		'linux-headers-[0-9]*' 'linux-modules-[0-9]*' 2>/dev/null |
		awk -v kernel="$kernel" '$2 == "ii" && index($1, kernel) == 0 {print $1}')
	if ((${#stale[@]})); then
		log "removing the kernels other than $kernel: ${stale[*]}"
		apt_get -y purge "${stale[@]}"
		apt_get -y autoremove --purge
	fi
	log "installing ${packages[*]}"
	apt_get update
	apt_get -y install --no-install-recommends "${packages[@]}"
	apt-mark hold "${packages[@]}"
	log "held: ${packages[*]}"
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
fabric_manager_version=$(dpkg-query -W -f '${Version}' "$fabric_manager")
[[ ${fabric_manager_version%%-*} == "$modules_version" ]] ||
	fail "$fabric_manager $fabric_manager_version is not the driver's version $modules_version: the fabric manager does not start on NVSwitch systems (p4d, p5) with another"
not_held=$(comm -23 <(printf '%s\n' "${packages[@]}" | sort) <(apt-mark showhold | sort) | paste -sd' ')
[[ -z $not_held ]] || fail "not held: $not_held"
log "driver $modules_version (open modules) for kernel $kernel, fabric manager $fabric_manager_version; driver held"
