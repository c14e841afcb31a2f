# shellcheck shell=bash
# Sourced by the node scripts: timestamped log lines, named steps, and one failure report per
# failed step (ERR trap -> `python3 -m bootstrap fail`: CloudFormation FAILURE signal, DONE.json on
# the head, stop of a preprocessing node).

APP_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export PYTHONPATH="$APP_DIR${PYTHONPATH:+:$PYTHONPATH}"
# The packages bootstrap/ imports from beside it (contract/) come inside its asset, as user-data
# unzips each asset into a folder of its own (stacks/node_code.py): each is linked next to
# bootstrap/, where every Python process started from $APP_DIR finds it. A checkout has none
# there: its packages are in place.
for shipped in "$APP_DIR"/bootstrap/packages/*/; do
	[[ -d $shipped ]] || continue
	ln -sfn "bootstrap/packages/$(basename "$shipped")" "$APP_DIR/$(basename "$shipped")"
done
NODE_JSON=${NODE_JSON:-/etc/horovod-fleet/node.json}
# The instances' Python environment (baked into the training image by
# bootstrap/image/06-python-env.sh, made by ensure_venv on the preprocessing node); the rehearsal
# sets install=false and brings its own python3 on PATH.
VENV=${HOROVOD_FLEET_VENV:-/opt/horovod-fleet/venv}
SCRIPT=$(basename "$0" .sh)
STEP="start"
STEP_STARTED=$SECONDS

log() { printf '%s [%s] %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$SCRIPT" "$*"; }

# A check that failed, named in the log; the ERR trap then reports the step.
fail() {
	log "FAILED: $*"
	return 1
}

# shellcheck source=image/signed_download.sh
source "$APP_DIR/bootstrap/image/signed_download.sh"

# Each step logs when it starts, in seconds since boot (a node's launch-to-healthy time), and
# how long the one before it took. Once a script names a file (record_step_times), each finished
# step is also a line `<name>\t<start>\t<end>` there (epoch seconds): the Python bootstrap reads
# the start-up's shell phases from it (docs/contracts.md, "Start-up, resets and goodput").
STEP_TIMES=""
STEP_STARTED_AT=""
step() {
	local now=${EPOCHREALTIME/,/.} # bash >= 5.0; a locale's decimal comma made a point
	if [[ $STEP != start ]]; then
		log "step '$STEP': done in $((SECONDS - STEP_STARTED)) s"
		[[ -z $STEP_TIMES ]] || printf '%s\t%s\t%s\n' "$STEP" "$STEP_STARTED_AT" "$now" >>"$STEP_TIMES"
	fi
	STEP=$1
	STEP_STARTED=$SECONDS
	STEP_STARTED_AT=$now
	local uptime=0
	[[ -r /proc/uptime ]] && read -r uptime _ </proc/uptime
	log "step '$STEP': start, ${uptime%.*} s after boot"
}

# Appended to, never emptied: a reboot's steps follow the last boot's, and the reader takes the
# newest of each step since the kernel's start.
record_step_times() {
	mkdir -p "$(dirname "$1")"
	STEP_TIMES=$1
}

on_error() {
	local code=$1 line=$2
	trap - ERR
	log "step '$STEP' failed (exit $code at line $line)"
	# Without a valid node.json there is nobody to tell: the error line above names the key.
	[[ $STEP == "read node.json" ]] && exit "$code"
	python3 -m bootstrap --node-json "$NODE_JSON" fail "$STEP" "exit $code at line $line of $SCRIPT.sh" ||
		log "could not report the failure (python3 -m bootstrap fail)"
	exit "$code"
}
# The ERR trap (this one, or a script's own) also fires inside functions (ensure_venv,
# start_cloudwatch_agent, install_boot_service): without errtrace a failure there exits through
# set -e and reports nothing.
set -o errtrace
trap 'on_error $? $LINENO' ERR

# One validated node.json value; a bad node.json stops here with the key named.
config() { python3 -m bootstrap.node_config --node-json "$NODE_JSON" "$1"; }

# Everything after this line also goes to <log_dir>/bootstrap.log (shipped to CloudWatch Logs).
start_log() {
	local log_dir
	log_dir=$(config log_dir)
	mkdir -p "$log_dir"
	exec > >(tee -a "$log_dir/bootstrap.log") 2>&1
	log "node.json: $NODE_JSON, code: $APP_DIR"
}

use_venv() {
	export PATH="$VENV/bin:$PATH"
}

# A venv with the given requirement files, for nodes that need no GPU stack. Ubuntu's python3
# runs `-m venv --help` without the python3-venv package but cannot create a venv (no ensurepip
# wheels), so the package itself is what is checked; a venv without pip is made again.
ensure_venv() {
	if command -v dpkg-query >/dev/null && ! dpkg-query -W -f='${Status}' python3-venv 2>/dev/null | grep -q 'ok installed'; then
		log "installing python3-venv"
		# A fresh instance's unattended upgrades may hold the dpkg lock: wait for it.
		apt-get -o DPkg::Lock::Timeout=600 update -q
		DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q python3-venv
	fi
	if [[ ! -x $VENV/bin/pip ]]; then
		rm -rf "$VENV"
		python3 -m venv "$VENV"
	fi
	local req
	for req in "$@"; do "$VENV/bin/pip" install -q -r "$req"; done
	use_venv
}

start_cloudwatch_agent() {
	local ctl=/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl
	if [[ -z $(config log_group) ]]; then
		log "no log_group: CloudWatch agent not started"
		return 0
	fi
	if [[ ! -x $ctl ]]; then
		if command -v dnf >/dev/null; then
			dnf install -y -q amazon-cloudwatch-agent
		else
			# The same signature check as the image's 07-agents step, with its pinned key.
			local base=https://amazoncloudwatch-agent.s3.amazonaws.com fingerprint work
			fingerprint=$(sed -n 's/^CLOUDWATCH_AGENT_GPG_FINGERPRINT=//p' "$APP_DIR/bootstrap/image/pins.env")
			work=$(mktemp -d)
			signed_download "$work" "$base/ubuntu/amd64/latest/amazon-cloudwatch-agent.deb" \
				"$base/assets/amazon-cloudwatch-agent.gpg" "$fingerprint" \
				"no valid signature by $fingerprint"
			unset GNUPGHOME
			dpkg -i -E "$work/amazon-cloudwatch-agent.deb"
		fi
	fi
	local conf=/opt/aws/amazon-cloudwatch-agent/etc/horovod-fleet.json
	python3 -m bootstrap --node-json "$NODE_JSON" cloudwatch-config "$conf"
	"$ctl" -a fetch-config -m ec2 -s -c "file:$conf"
	log "CloudWatch agent shipping $(config log_dir)/*.log to $(config log_group)"
}

# User-data runs once per instance; this unit runs the node script again at every later boot,
# which is how a rebooted node resumes (each step skips what is already done). Scripts always run
# through bash: user-data unpacks the code with `python3 -m zipfile`, which keeps no file modes.
# Restart=on-abnormal: a bootstrap killed by a signal (SIGKILL, SIGSEGV; not SIGTERM, which is a
# stop) reported nothing, so systemd starts it again and it resumes the run from S3; a failure it
# reported (exit status 1, DONE.json written) is final. At most 5 restarts an hour, so a crash
# loop ends and the members' heartbeat watch and the run controller take over.
# https://www.freedesktop.org/software/systemd/man/latest/systemd.service.html (Restart=,
# RestartSec=), https://www.freedesktop.org/software/systemd/man/latest/systemd.unit.html
# (StartLimitIntervalSec=, StartLimitBurst=)
BOOT_SERVICE=horovod-fleet-node.service
install_boot_service() {
	local script=$1 unit=${SYSTEMD_UNIT_DIR:-/etc/systemd/system}/$BOOT_SERVICE
	command -v systemctl >/dev/null || return 0
	[[ -f $unit ]] && return 0
	cat >"$unit" <<UNIT
[Unit]
Description=horovod-fleet node bootstrap ($script)
Wants=network-online.target
After=network-online.target cloud-final.service
StartLimitIntervalSec=3600
StartLimitBurst=5

[Service]
Type=simple
Environment=NODE_JSON=$NODE_JSON
Environment=HOROVOD_FLEET_SERVICE=1
ExecStart=/bin/bash $script
Restart=on-abnormal
RestartSec=5

[Install]
WantedBy=multi-user.target
UNIT
	systemctl daemon-reload
	systemctl enable "$BOOT_SERVICE"
	log "enabled $BOOT_SERVICE: the bootstrap reruns at every boot and restarts if it is killed"
}

# At the first boot user-data (cloud-final.service) runs the node script, where nothing would
# restart a killed bootstrap: it hands over to the unit instead and returns 0 (the unit then runs
# the script from the top once cloud-final has finished: --no-block, as the unit is ordered after
# it). Returns 1 when the script is already running under the unit, or there is no systemd.
hand_over_to_boot_service() {
	command -v systemctl >/dev/null || return 1
	[[ -z ${HOROVOD_FLEET_SERVICE:-} ]] || return 1
	if ! systemctl start --no-block "$BOOT_SERVICE"; then
		log "could not start $BOOT_SERVICE: the bootstrap runs here, and nothing restarts it if it is killed"
		return 1
	fi
	log "handed over to $BOOT_SERVICE (systemd restarts a killed bootstrap); its log continues in $(config log_dir)/bootstrap.log and journalctl -u $BOOT_SERVICE"
}
