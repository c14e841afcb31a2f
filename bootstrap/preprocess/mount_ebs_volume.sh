#!/usr/bin/env bash
# Mount an attached EBS volume, formatting it only when it holds no filesystem, so a reboot or a
# rerun never wipes it; fstab (by UUID, nofail) remounts it at boot without ever blocking boot.
#   bootstrap/preprocess/mount_ebs_volume.sh VOLUME_ID MOUNT_POINT
set -euo pipefail
volume_id=$1 mount_point=$2
log() { printf '%s [mount_ebs_volume] %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"; }
trap 'log "failed (exit $? at line $LINENO)"' ERR

if mountpoint -q "$mount_point"; then
	log "$mount_point already mounted"
	exit 0
fi

# Nitro instances name the NVMe device after the volume id; Xen ones (t2) give /dev/xvd*: there,
# the volume is the only whole disk without partitions, filesystem mounts or children.
find_device() {
	local by_id=/dev/disk/by-id/nvme-Amazon_Elastic_Block_Store_${volume_id//-/}
	if [[ -e $by_id ]]; then
		readlink -f "$by_id"
		return
	fi
	local name
	while read -r name; do
		if [[ $(lsblk -nro NAME "$name" | wc -l) -eq 1 && -z $(lsblk -nro MOUNTPOINT "$name") ]]; then
			echo "$name"
			return
		fi
	done < <(lsblk -dpnro NAME,TYPE | awk '$2 == "disk" {print $1}')
}

# The volume attachment may land after the instance boots.
device=""
for _ in $(seq 120); do
	device=$(find_device)
	[[ -n $device ]] && break
	sleep 5
done
[[ -n $device ]] || {
	log "volume $volume_id not attached after 10 minutes"
	exit 1
}

if blkid "$device" >/dev/null; then
	log "$device ($volume_id) has a filesystem: keeping it"
else
	log "$device ($volume_id) is blank: formatting xfs"
	mkfs.xfs -q "$device"
fi
uuid=$(blkid -s UUID -o value "$device")
mkdir -p "$mount_point"
if ! grep -q "UUID=$uuid" /etc/fstab; then
	echo "UUID=$uuid $mount_point xfs defaults,nofail,x-systemd.device-timeout=30s 0 2" >>/etc/fstab
fi
mount "$mount_point"
log "mounted $device at $mount_point"
