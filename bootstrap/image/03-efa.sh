#!/usr/bin/env bash
# Step 3: the EFA installer, signature verified against AWS's published key fingerprint: the EFA
# kernel module, libfabric (/opt/amazon/efa), Open MPI 4 (/opt/amazon/openmpi) and the
# aws-ofi-nccl plugin (/opt/amazon/ofi-nccl). --no-verify: the build instance has no EFA device.
# It runs after the driver (step 2) so that it builds efa_nv_peermem against it, and a build
# without that module stops the bake here instead of every p4d or p5 fleet at its allreduce check.
# GPUDirect RDMA over EFA has no DMA-BUF fallback on p4d, nor on p5 if its EFA is of the
# generations below (p5's device id is not checked against a source):
# - libfabric registers CUDA memory with plain ibv_reg_mr, which reaches the GPU through the EFA
#   driver's peer-memory provider; only an FI_MR_DMABUF registration takes the DMA-BUF path
#   (efa_mr_reg_ibv_mr in https://github.com/ofiwg/libfabric/blob/v2.4.0/prov/efa/src/efa_mr.c);
# - aws-ofi-nccl 1.14.2 to 1.19.1 (1.18.0 here) never asks for DMA-BUF on EFA devices 0xefa0 to
#   0xefa2, "generations 1-3", for a firmware issue
#   (https://github.com/aws/aws-ofi-nccl/blob/v1.18.0/src/nccl_ofi_dmabuf.cpp); p4d's EFA is
#   0xefa0 (https://github.com/aws/aws-ofi-nccl/blob/v1.18.0/topology/p4d-24xl-topo.xml).
# That provider takes efa_nv_peermem's wrappers of nvidia_p2p_* first and the nvidia module's own
# exports otherwise (nvmem_get_fp in
# https://github.com/amzn/amzn-drivers/blob/master/kernel/linux/efa/src/efa_nvmem_impl.h). The
# image requires the module rather than rest a fleet on that fallback, which no public source
# shows working with Ubuntu's R580 open modules on p4d or p5. EFA driver r2.17.3 added "Support P2P
# with NVIDIA 580 drivers"
# (https://github.com/amzn/amzn-drivers/blob/master/kernel/linux/efa/RELEASENOTES.md). The module
# is not loaded at boot by itself (https://github.com/awslabs/amazon-eks-ami/issues/2672), so a
# modules-load.d entry does; the GPU proof checks that it is loaded beside nvidia after boot.
#   https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start-nccl.html
#   https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-verify.html
# shellcheck source=step.sh
source "$(dirname "${BASH_SOURCE[0]}")/step.sh"
step_mode "$@"
base_url=https://efa-installer.amazonaws.com
tarball=aws-efa-installer-$EFA_INSTALLER_VERSION.tar.gz

if [[ $MODE == run ]]; then
	work=$(mktemp -d)
	cd "$work"
	signed_download "$work" "$base_url/$tarball" "$base_url/aws-efa-installer.key" \
		"$EFA_INSTALLER_GPG_FINGERPRINT" "bad signature" "EFA installer key"
	log "$tarball: good signature from $EFA_INSTALLER_GPG_FINGERPRINT"
	tar -xzf "$tarball"
	cd aws-efa-installer
	./efa_installer.sh -y --mpi=openmpi4 --no-verify
	cd /
	rm -rf "$work"
fi

for path in $ROOT/opt/amazon/efa/bin/fi_info $ROOT/opt/amazon/openmpi/bin/mpirun; do
	[[ -x $path ]] || fail "$path is missing after the EFA installer"
done
peermem_conf=$ROOT/etc/modules-load.d/horovod-fleet-gpudirect.conf
kernel=$(uname -r)
driver=$(modinfo -k "$kernel" -F version nvidia 2>/dev/null) || driver=none
modinfo -k "$kernel" efa_nv_peermem >/dev/null 2>&1 ||
	fail "no efa_nv_peermem for kernel $kernel and nvidia driver $driver: the EFA installer did not build it, and GPUDirect RDMA over EFA (p4d, p5) needs it"
if [[ $MODE == run ]]; then
	mkdir -p "$(dirname "$peermem_conf")"
	echo efa_nv_peermem >"$peermem_conf"
fi
[[ -s $peermem_conf ]] || fail "efa_nv_peermem is built but $peermem_conf does not load it at boot"
log "GPUDirect RDMA: efa_nv_peermem for kernel $kernel and nvidia driver $driver, loaded at boot"
plugin=$(find "$ROOT/opt/amazon/ofi-nccl" -name 'libnccl-net*.so' -print -quit 2>/dev/null || true)
[[ -n $plugin ]] || fail "no aws-ofi-nccl plugin (libnccl-net*.so) under $ROOT/opt/amazon/ofi-nccl"
log "EFA installer $EFA_INSTALLER_VERSION: $("$ROOT/opt/amazon/efa/bin/fi_info" --version | head -1), $plugin"
