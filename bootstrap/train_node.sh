#!/usr/bin/env bash
# A training node's bootstrap (user-data runs it as root; it reruns at every boot): instance store
# at mount_point, training environment (baked into the AMI or installed), CloudWatch agent with GPU
# metrics, then `python3 -m bootstrap train-node`: health check, data pull + verification,
# CloudFormation signal, rendezvous, and on node 0 horovodrun, uploads and DONE.json.
#   NODE_JSON=/etc/horovod-fleet/node.json /opt/horovod-fleet/bootstrap/train_node.sh
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

step "read node.json"
role=$(config role)
[[ $role == train ]] || { log "node.json role is '$role', this script is for 'train'"; false; }
start_log
log "node $(config node_index) of $(config nodes), run $(config run)"

if [[ $(config install) == true ]]; then
	step "boot service"
	install_boot_service "$APP_DIR/bootstrap/train_node.sh"
fi

step "instance store"
if [[ $(config instance_store) == true ]]; then
	"$APP_DIR/bootstrap/mount_instance_store.sh" "$(config mount_point)"
else
	log "instance_store=false: using $(config mount_point) as a plain directory"
	mkdir -p "$(config mount_point)"
fi

step "training environment"
if [[ $(config install) == true ]]; then
	"$APP_DIR/bootstrap/install_training_env.sh" "$VENV"
	use_venv
	# The EFA installer's OpenMPI and libfabric, and the DLAMI's aws-ofi-nccl plugin; horovodrun
	# exports this environment to every rank.
	for dir in /opt/amazon/openmpi /opt/amazon/efa /opt/aws-ofi-nccl; do
		[[ -d $dir/bin ]] && PATH="$dir/bin:$PATH"
		[[ -d $dir/lib ]] && LD_LIBRARY_PATH="$dir/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
	done
	export PATH LD_LIBRARY_PATH
else
	log "install=false: using $(command -v python3) and $(command -v horovodrun)"
fi

step "cloudwatch agent"
start_cloudwatch_agent

step "train node"
exec python3 -m bootstrap --node-json "$NODE_JSON" train-node
