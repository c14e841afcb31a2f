#!/usr/bin/env bash
# Step 1: full upgrade of the Ubuntu 22.04 base on the AWS kernel, and no unattended upgrades, so
# nothing on a node can move the kernel away from the NVIDIA and EFA modules built for it. The
# recipe reboots after this step: the driver step then builds against the kernel the image boots.
#   https://help.ubuntu.com/community/AutomaticSecurityUpdates
# shellcheck source=step.sh
source "$(dirname "${BASH_SOURCE[0]}")/step.sh"
step_mode "$@"
NO_AUTO_UPGRADES=$ROOT/etc/apt/apt.conf.d/99-horovod-fleet-no-auto-upgrades

if [[ $MODE == run ]]; then
	log "switching off unattended upgrades"
	cat >"$NO_AUTO_UPGRADES" <<'APT'
APT::Periodic::Update-Package-Lists "0";
APT::Periodic::Unattended-Upgrade "0";
APT::Periodic::Download-Upgradeable-Packages "0";
APT
	systemctl disable --now unattended-upgrades.service apt-daily.timer apt-daily-upgrade.timer
	apt_get update
	log "full upgrade"
	apt_get -y full-upgrade
	apt_get -y install linux-aws
	log "upgraded; the recipe reboots into the newest kernel next"
	exit 0
fi

grep -q 'Unattended-Upgrade "0"' "$NO_AUTO_UPGRADES" || fail "unattended upgrades are on"
newest=$(dpkg-query -W -f '${Version}\n' linux-image-aws)
log "running kernel $(uname -r), linux-image-aws $newest"
[[ $(uname -r) == *-aws ]] || fail "running kernel $(uname -r) is not Ubuntu's AWS kernel"
