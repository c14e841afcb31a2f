#!/usr/bin/env bash
# Step 3: the EFA installer, signature verified against AWS's published key fingerprint: the EFA
# kernel module, libfabric (/opt/amazon/efa), Open MPI 4 (/opt/amazon/openmpi) and the
# aws-ofi-nccl plugin (/opt/amazon/ofi-nccl). --no-verify: the build instance has no EFA device.
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
	curl -fsSL --retry 5 -o "$tarball" "$base_url/$tarball"
	curl -fsSL --retry 5 -o "$tarball.sig" "$base_url/$tarball.sig"
	curl -fsSL --retry 5 -o aws-efa-installer.key "$base_url/aws-efa-installer.key"
	export GNUPGHOME=$work/gnupg
	mkdir -m 700 "$GNUPGHOME"
	gpg --batch --quiet --import aws-efa-installer.key
	fingerprints=$(gpg --batch --with-colons --fingerprint | awk -F: '$1 == "fpr" {print $10}')
	grep -qx "$EFA_INSTALLER_GPG_FINGERPRINT" <<<"$fingerprints" ||
		fail "the EFA installer key is not AWS's (fingerprints: ${fingerprints//$'\n'/ })"
	gpg --batch --status-fd 1 --verify "$tarball.sig" "$tarball" |
		grep -q "^\[GNUPG:\] VALIDSIG $EFA_INSTALLER_GPG_FINGERPRINT " ||
		fail "$tarball: bad signature"
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
plugin=$(find "$ROOT/opt/amazon/ofi-nccl" -name 'libnccl-net*.so' -print -quit 2>/dev/null || true)
[[ -n $plugin ]] || fail "no aws-ofi-nccl plugin (libnccl-net*.so) under $ROOT/opt/amazon/ofi-nccl"
log "EFA installer $EFA_INSTALLER_VERSION: $("$ROOT/opt/amazon/efa/bin/fi_info" --version | head -1), $plugin"
