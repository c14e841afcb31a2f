#!/usr/bin/env bash
# The bootstrap of a training fleet's instance, a node or the head (user-data runs it as root; it
# reruns at every boot). It boots from the training image ImageStack baked and proved, so it
# installs nothing: it checks the image (/opt/horovod-fleet/image.json against node.json's
# `image`); a node then mounts the instance store, brings up NVSwitch fabric where there is one
# and writes its JIT settings; both start the baked CloudWatch agent, then
# `python3 -m bootstrap train-node`: a node's GPUs and EFA, data pull + verification, rendezvous
# and heartbeat; the head's rendezvous, fleet check, CloudFormation signal, horovodrun, uploads
# and DONE.json. Every step logs when it starts (seconds since boot) and how long it took.
#   NODE_JSON=/etc/horovod-fleet/node.json /opt/horovod-fleet/bootstrap/train_node.sh
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

step "read node.json"
role=$(config role)
[[ $role == train || $role == head ]] || {
	log "node.json role is '$role', this script is for 'train' and 'head'"
	false
}
start_log
record_step_times "$(config state_dir)/shell-steps.tsv"
if [[ $role == head ]]; then
	log "the head of $(config nodes) node(s), run $(config run)"
else
	# A replacement node's node.json names no index: it learns it from S3 in the bootstrap.
	index=$(config node_index)
	log "node ${index:-"(named by its launch assignment)"} of $(config nodes), run $(config run)"
fi

step "training image"
# The system python3: the check needs only the standard library, and runs before anything else.
python3 -m bootstrap.image.manifest check-node --node-json "$NODE_JSON"

if [[ $(config install) == true ]]; then
	step "boot service"
	install_boot_service "$APP_DIR/bootstrap/train_node.sh"
	hand_over_to_boot_service && exit 0
	use_venv
	# The EFA installer's Open MPI and libfabric and its aws-ofi-nccl plugin, which NCCL loads
	# from LD_LIBRARY_PATH; the head's horovodrun exports this environment to every rank (the
	# same image: the same directories).
	for dir in /opt/amazon/openmpi /opt/amazon/efa /opt/amazon/ofi-nccl; do
		[[ -d $dir/bin ]] && PATH="$dir/bin:$PATH"
		[[ -d $dir/lib ]] && LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	done
	export PATH LD_LIBRARY_PATH
else
	log "install=false: using $(command -v python3) and $(command -v horovodrun)"
fi

step "instance store"
if [[ $role == head ]]; then
	log "the head holds no dataset: $(config mount_point) is a plain directory on its root"
	mkdir -p "$(config mount_point)"
elif [[ $(config instance_store) == true ]]; then
	bash "$APP_DIR/bootstrap/node/mount_instance_store.sh" "$(config mount_point)"
else
	log "instance_store=false: using $(config mount_point) as a plain directory"
	mkdir -p "$(config mount_point)"
fi

if [[ $role == train ]]; then
	step "gpu fabric"
	# p4d and p5 connect their GPUs through NVSwitch (PCI class 0680), which the fabric manager
	# baked beside the driver must bring up before CUDA can use them.
	if [[ $(config install) == true ]] && lspci -d 10de: -n | awk '{print $2}' | grep -q '^0680:'; then
		systemctl start nvidia-fabricmanager
		log "NVSwitch fabric: nvidia-fabricmanager started"
	else
		log "no NVSwitch: no fabric manager needed"
	fi
	if [[ $(config install) == true ]]; then
		# The JIT caches the image baked for these GPUs and this driver (H100/H200: TensorFlow
		# 2.15.1 has no native code for them), from image.json: into this node's own environment
		# file, which its ranks read over the head's (bootstrap/fleet/rank.py).
		python3 -m bootstrap.image.jit_env >"$(config mount_point)/node.env"
	fi
fi

step "cloudwatch agent"
start_cloudwatch_agent

step "train node"
exec python3 -m bootstrap --node-json "$NODE_JSON" train-node
