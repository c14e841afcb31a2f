#!/usr/bin/env bash
# Step 7: the agents a node runs: the CloudWatch agent (package signature verified; each node
# configures it at boot for its run's log group and GPU metrics), the SSM agent (Session Manager,
# already a snap in Canonical's image) and the AWS CLI (user-data downloads the node's code with
# it). Nothing is installed on a node at boot.
#   https://docs.aws.amazon.com/AmazonCloudWatch/latest/monitoring/verify-CloudWatch-Agent-Package-Signature.html
#   https://docs.aws.amazon.com/systems-manager/latest/userguide/agent-install-ubuntu.html
# shellcheck source=step.sh
source "$(dirname "${BASH_SOURCE[0]}")/step.sh"
step_mode "$@"
base_url=https://amazoncloudwatch-agent.s3.amazonaws.com
ctl=$ROOT/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl

if [[ $MODE == run ]]; then
	work=$(mktemp -d)
	signed_download "$work" "$base_url/ubuntu/amd64/latest/amazon-cloudwatch-agent.deb" \
		"$base_url/assets/amazon-cloudwatch-agent.gpg" "$CLOUDWATCH_AGENT_GPG_FINGERPRINT" \
		"no valid signature by $CLOUDWATCH_AGENT_GPG_FINGERPRINT"
	dpkg -i -E "$work/amazon-cloudwatch-agent.deb"
	rm -rf "$work"
	snap wait system seed.loaded
	snap list amazon-ssm-agent >/dev/null 2>&1 || snap install amazon-ssm-agent --classic
	snap list aws-cli >/dev/null 2>&1 || snap install aws-cli --classic
fi

[[ -x $ctl ]] || fail "no CloudWatch agent at $ctl"
snap list amazon-ssm-agent >/dev/null || fail "no SSM agent snap"
command -v aws >/dev/null || [[ -x /snap/bin/aws ]] || fail "no AWS CLI"
log "CloudWatch agent $(cat "$ROOT/opt/aws/amazon-cloudwatch-agent/bin/CWAGENT_VERSION" 2>/dev/null || echo '?'), SSM agent and AWS CLI present"
