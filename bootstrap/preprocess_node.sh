#!/usr/bin/env bash
# The preprocessing instance's bootstrap (user-data runs it as root; it reruns at every boot):
# data volume at mount_point, Python environment, CloudWatch agent, a SUCCESS signal to
# PreprocessStack's wait condition, then `python3 -m bootstrap preprocess-node` converts
# s3://<bucket>/raw/ (or the download URL in Secrets Manager) to s3://<bucket>/<output_prefix>,
# checks the manifest and stops the instance.
#   NODE_JSON=/etc/horovod-fleet/node.json /opt/horovod-fleet/bootstrap/preprocess_node.sh
set -euo pipefail
# shellcheck source=lib.sh
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

# Until its environment is ready, `cdk deploy PreprocessStack` waits for this node: a failed step
# signals FAILURE with its name, which CloudFormation prints as the reason the deploy failed.
signal_failure() {
	local code=$1 line=$2 file=$3
	trap - ERR
	python3 -m bootstrap.preprocess.ready_signal --node-json "$NODE_JSON" FAILURE \
		"preprocessing node: step '$STEP' failed (exit $code at line $line of $file); its log: /var/log/horovod-fleet/bootstrap.log on the node" ||
		log "could not signal FAILURE to CloudFormation"
	on_error "$code" "$line"
}
trap 'signal_failure $? $LINENO "${BASH_SOURCE[0]##*/}"' ERR

step "read node.json"
role=$(config role)
[[ $role == preprocess ]] || { log "node.json role is '$role', this script is for 'preprocess'"; false; }
start_log

if [[ $(config install) == true ]]; then
	step "boot service"
	install_boot_service "$APP_DIR/bootstrap/preprocess_node.sh"
fi

step "data volume"
volume_id=$(config volume_id)
if [[ -n $volume_id ]]; then
	bash "$APP_DIR/bootstrap/preprocess/mount_ebs_volume.sh" "$volume_id" "$(config mount_point)"
else
	log "no volume_id: using $(config mount_point) as a plain directory"
	mkdir -p "$(config mount_point)"
fi

step "python environment"
if [[ $(config install) == true ]]; then
	ensure_venv "$APP_DIR/bootstrap/requirements.txt" "$APP_DIR/trainer/requirements.txt"
else
	log "install=false: using $(command -v python3)"
fi

step "cloudwatch agent"
start_cloudwatch_agent

step "ready signal"
python3 -m bootstrap.preprocess.ready_signal --node-json "$NODE_JSON" SUCCESS \
	"environment ready; converting once the raw archives are in s3://$(config bucket)/$(config raw_prefix)"

step "preprocess node"
exec python3 -m bootstrap --node-json "$NODE_JSON" preprocess-node
