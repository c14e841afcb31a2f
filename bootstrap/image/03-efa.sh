#!/usr/bin/env bash
# Step 3: the EFA installer, signature verified against AWS's published key fingerprint: the EFA
# kernel module, libfabric (/opt/amazon/efa), Open MPI 4 (/opt/amazon/openmpi) and the
# aws-ofi-nccl plugin (/opt/amazon/ofi-nccl). --no-verify: the build instance has no EFA device.
# It runs after the driver (step 2) so that it builds efa_nv_peermem against it: GPUDirect RDMA
# over EFA on p4d and p5 goes through that module or DMA-BUF. The module is not loaded at boot by
# itself (https://github.com/awslabs/amazon-eks-ami/issues/2672), so a modules-load.d entry does.
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
if modinfo -k "$(uname -r)" efa_nv_peermem >/dev/null 2>&1; then
	if [[ $MODE == run ]]; then
		mkdir -p "$(dirname "$peermem_conf")"
		echo efa_nv_peermem >"$peermem_conf"
	fi
	[[ -s $peermem_conf ]] || fail "efa_nv_peermem is built but $peermem_conf does not load it at boot"
	log "GPUDirect RDMA: efa_nv_peermem for $(uname -r), loaded at boot"
else
	# Not fatal here: DMA-BUF may carry GPUDirect, and the fleet's allreduce check fails loudly on
	# p4d and p5 unless NCCL's connections say GDRDMA (bootstrap/health.py).
	log "GPUDirect RDMA: no efa_nv_peermem for $(uname -r); only DMA-BUF can carry it"
fi
plugin=$(find "$ROOT/opt/amazon/ofi-nccl" -name 'libnccl-net*.so' -print -quit 2>/dev/null || true)
[[ -n $plugin ]] || fail "no aws-ofi-nccl plugin (libnccl-net*.so) under $ROOT/opt/amazon/ofi-nccl"
log "EFA installer $EFA_INSTALLER_VERSION: $("$ROOT/opt/amazon/efa/bin/fi_info" --version | head -1), $plugin"
