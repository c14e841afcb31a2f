# shellcheck shell=bash
# Sourced by every step of the training-image recipe: strict mode, the pins, timestamped log
# lines, and one line naming the step and the failed command when a step fails, so the Image
# Builder log (and a person running a step by hand) sees which step stopped the bake and why.
#   sudo bash bootstrap/image/<step>.sh [run|validate]
set -Eeuo pipefail
RECIPE_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
STEP=$(basename "$0" .sh)
# shellcheck source=pins.env
source "$RECIPE_DIR/pins.env"
# Every path the recipe writes or checks is under ROOT: empty on a build instance; the tests point
# it at a scratch directory and put stub commands first on PATH.
ROOT=${IMAGE_ROOT:-}
export IMAGE_DIR=$ROOT/opt/horovod-fleet
export VENV=$ROOT$PYTHON_VENV
export DEBIAN_FRONTEND=noninteractive

log() { printf '%s [image %s] %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$STEP" "$*"; }

on_step_error() {
	local code=$1 line=$2 command=$3
	trap - ERR
	log "FAILED: image step '$STEP' stopped the bake (exit $code at line $line: ${command%%$'\n'*})"
	exit "$code"
}
trap 'on_step_error $? $LINENO "$BASH_COMMAND"' ERR

fail() {
	log "FAILED: image step '$STEP': $*"
	exit 1
}

# shellcheck source=signed_download.sh
source "$RECIPE_DIR/signed_download.sh"

# apt waits for cloud-init's own apt run at first boot instead of failing on the lock.
apt_get() { apt-get -o DPkg::Lock::Timeout=900 -o Dpkg::Options::=--force-confold -q "$@"; }

# `run` (the build phase) or `validate` (the validate and test phases: the step's result is
# checked on the build instance, then again on an instance booted from the finished image).
step_mode() {
	MODE=${1:-run}
	[[ $MODE == run || $MODE == validate ]] || fail "unknown mode '$MODE'; allowed: run, validate"
}

# The recipe's content hash, as the stacks compute it for the component versions (and the asset
# key): sha256 over the sorted `sha256sum` lines of every file in this directory.
recipe_sha256() {
	(cd "$RECIPE_DIR" && find . -type f ! -path '*/__pycache__/*' ! -name '*.pyc' -print0 |
		LC_ALL=C sort -z | xargs -0 sha256sum) | sha256sum | cut -d' ' -f1
}
