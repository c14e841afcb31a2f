#!/usr/bin/env bash
# Step 1: the Ubuntu 24.04 base, fully upgraded, on the held LTS kernel track linux-aws-lts-24.04
# (6.8) instead of the rolling linux-aws that Canonical's image boots, and no unattended upgrades:
# nothing on a node may move the kernel away from the NVIDIA and EFA modules built for it.
# The rolling kernel is newer than the LTS one, and GRUB boots the highest version it finds, so
# the rolling meta-packages are removed (no upgrade brings that series back) and GRUB_DEFAULT
# names the LTS kernel's entry; the recipe reboots after this step, and the step's validate
# fails unless the kernel then running is the held one (step 2 then removes the others).
#   https://documentation.ubuntu.com/public-cloud/all-clouds-explanation/kernels-on-the-cloud/
#   https://www.gnu.org/software/grub/manual/grub/html_node/default.html (submenu>entry titles)
#   https://help.ubuntu.com/community/AutomaticSecurityUpdates
# shellcheck source=step.sh
source "$(dirname "${BASH_SOURCE[0]}")/step.sh"
step_mode "$@"
NO_AUTO_UPGRADES=$ROOT/etc/apt/apt.conf.d/99-horovod-fleet-no-auto-upgrades
GRUB_KERNEL=$ROOT/etc/default/grub.d/99-horovod-fleet-kernel.cfg
# linux-aws-lts-24.04 depends on these two, which name the kernel of the track.
track_image=${KERNEL_TRACK/linux-/linux-image-}
track_headers=${KERNEL_TRACK/linux-/linux-headers-}
rolling=(linux-aws linux-image-aws linux-headers-aws linux-aws-edge)

# The kernel release the track's image meta-package depends on (linux-image-6.8.0-1064-aws).
track_kernel() {
	dpkg-query -W -f '${Depends}' "$track_image" 2>/dev/null |
		grep -oE 'linux-image-[0-9][^ ,]*' | head -1 | sed 's/^linux-image-//'
}

installed() { [[ $(dpkg-query -W -f '${db:Status-Abbrev}' "$1" 2>/dev/null) == ii* ]]; }

if [[ $MODE == run ]]; then
	log "switching off unattended upgrades"
	mkdir -p "$(dirname "$NO_AUTO_UPGRADES")"
	cat >"$NO_AUTO_UPGRADES" <<'APT'
APT::Periodic::Update-Package-Lists "0";
APT::Periodic::Unattended-Upgrade "0";
APT::Periodic::Download-Upgradeable-Packages "0";
APT
	systemctl disable --now unattended-upgrades.service apt-daily.timer apt-daily-upgrade.timer
	apt_get update
	log "full upgrade"
	apt_get -y full-upgrade
	apt_get -y install "$KERNEL_TRACK"
	kernel=$(track_kernel)
	[[ $kernel == "$KERNEL_SERIES".* ]] ||
		fail "$track_image depends on kernel '$kernel', not the $KERNEL_SERIES series"
	for package in "${rolling[@]}"; do
		if installed "$package"; then apt_get -y purge "$package"; fi
	done
	mkdir -p "$(dirname "$GRUB_KERNEL")"
	printf 'GRUB_DEFAULT="Advanced options for Ubuntu>Ubuntu, with Linux %s"\n' "$kernel" >"$GRUB_KERNEL"
	update-grub
	grep -q "menuentry 'Ubuntu, with Linux $kernel'" "$ROOT/boot/grub/grub.cfg" ||
		fail "GRUB has no entry for kernel $kernel: the reboot would not start the $KERNEL_TRACK kernel"
	apt-mark hold "$KERNEL_TRACK" "$track_image" "$track_headers" "linux-image-$kernel"
	log "upgraded; the recipe reboots into $KERNEL_TRACK's kernel $kernel next"
	exit 0
fi

[[ -r $ROOT/etc/os-release ]] || fail "no $ROOT/etc/os-release"
release=$(sed -n 's/^VERSION_ID="\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$ROOT/etc/os-release")
[[ $release == "$UBUNTU_RELEASE" ]] ||
	fail "the base is Ubuntu $release (/etc/os-release VERSION_ID), not $UBUNTU_RELEASE: check the SSM parameter of the recipe's parent image"
grep -q 'Unattended-Upgrade "0"' "$NO_AUTO_UPGRADES" || fail "unattended upgrades are on"
kernel=$(track_kernel)
[[ -n $kernel ]] || fail "$track_image is not installed: the $KERNEL_TRACK kernel track is missing"
running=$(uname -r)
[[ $running == "$kernel" ]] ||
	fail "running kernel $running is not $KERNEL_TRACK's kernel $kernel (a rolling linux-aws kernel?): check $GRUB_KERNEL"
[[ $kernel == "$KERNEL_SERIES".* ]] || fail "kernel $kernel is not of the $KERNEL_SERIES series"
for package in "${rolling[@]}"; do
	! installed "$package" ||
		fail "the rolling kernel meta-package $package is installed: an upgrade would bring a newer kernel series"
done
not_held=$(comm -23 <(printf '%s\n' "$KERNEL_TRACK" "$track_image" "linux-image-$kernel" | sort) \
	<(apt-mark showhold | sort) | paste -sd' ')
[[ -z $not_held ]] || fail "not held: $not_held"
log "Ubuntu $release, kernel $running from $KERNEL_TRACK, held"
