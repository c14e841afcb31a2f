#!/usr/bin/env bash
# Mount the NVMe instance-store drives at MOUNT_POINT: one drive directly, two or more as RAID0
# (mdadm). Instance store survives a reboot but not a stop (recreated blank): after a reboot (the
# run controller's way of bringing a healthy node back in place) the array is assembled again
# from the superblocks on its drives and its file system found by blkid, so nothing is created or
# formatted and the dataset on it is kept; only blank drives get a new array and a new xfs.
#   bootstrap/node/mount_instance_store.sh MOUNT_POINT
set -euo pipefail
mount_point=$1
md=${HOROVOD_FLEET_MD:-/dev/md/horovod-fleet} # the array's device (a test points it elsewhere)
log() { printf '%s [mount_instance_store] %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"; }
trap 'log "failed (exit $? at line $LINENO)"' ERR

if mountpoint -q "$mount_point"; then
	log "$mount_point already mounted"
	exit 0
fi
# Not `lsblk -r`: raw output escapes the model's spaces (Amazon\x20EC2\x20NVMe...).
mapfile -t drives < <(lsblk -dpn -o NAME,MODEL | awk '/Amazon EC2 NVMe Instance Storage/ {print $1}')
if [[ ${#drives[@]} -eq 0 ]]; then
	log "no NVMe instance store on this instance type"
	exit 1
fi

if [[ ${#drives[@]} -eq 1 ]]; then
	device=${drives[0]}
else
	mdadm --assemble --scan >/dev/null 2>&1 || true
	if [[ ! -e $md ]]; then
		log "creating RAID0 over ${drives[*]}"
		mdadm --create "$md" --run --level=0 --name=horovod-fleet \
			--raid-devices="${#drives[@]}" "${drives[@]}"
	fi
	device=$(readlink -f "$md")
fi

if ! blkid "$device" >/dev/null; then
	log "formatting $device (xfs)"
	mkfs.xfs -q -f "$device"
fi
mkdir -p "$mount_point"
mount -o noatime "$device" "$mount_point"
log "mounted $device (${#drives[@]} drive(s)) at $mount_point: $(df -h --output=size "$mount_point" | tail -1)"
