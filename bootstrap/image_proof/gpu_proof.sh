#!/usr/bin/env bash
# The GPU proof of the training image, on one GPU instance (ImageStack's second stage):
#   run       every check of proof.py, recorded in image.json (the build phase, before the snapshot)
#   validate  image.json holds a passed proof
#   tag       on an instance booted from the finished AMI: the GPUs are up again, and the AMI gets
#             the proof's figures as tags (and the JIT proof's, where it ran)
#   jit       the JIT proof of the optional third stage (jit_cache.py): ResNet-50 started cold
#             and warm on an H100/H200, the caches that made it faster kept, recorded in image.json
#   jit-validate  image.json holds a JIT proof, and every cache it says was baked is there
#   sudo bash bootstrap/image_proof/gpu_proof.sh run GPUS INSTANCE_TYPE efa|no-efa
#   sudo bash bootstrap/image_proof/gpu_proof.sh jit GPUS INSTANCE_TYPE
set -Eeuo pipefail
src=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
image_json=/opt/horovod-fleet/image.json
log() { printf '%s [image gpu-proof] %s\n' "$(date -u +%Y-%m-%dT%H:%M:%SZ)" "$*"; }
trap 'log "FAILED: the GPU proof stopped the bake (exit $? at line $LINENO: $BASH_COMMAND)"' ERR
proof() { PYTHONPATH=$src python3 -m bootstrap.image_proof.proof "$@" --image-json "$image_json"; }
jit() { PYTHONPATH=$src python3 -m bootstrap.image_proof.jit_cache "$@" --image-json "$image_json"; }

imds() {
	local token
	token=$(curl -sSf -X PUT -H 'X-aws-ec2-metadata-token-ttl-seconds: 60' http://169.254.169.254/latest/api/token)
	curl -sSf -H "X-aws-ec2-metadata-token: $token" "http://169.254.169.254/latest/$1"
}

case ${1:-} in
run)
	efa=()
	[[ ${4:-no-efa} == efa ]] && efa=(--efa)
	proof run --gpus "$2" --instance-type "$3" "${efa[@]}"
	;;
validate)
	proof validate
	;;
jit)
	jit run --gpus "$2" --instance-type "$3"
	;;
jit-validate)
	jit validate
	;;
tag)
	nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
	mapfile -t tags < <(proof tags)
	ami=$(imds meta-data/ami-id)
	region=$(imds meta-data/placement/region)
	/snap/bin/aws ec2 create-tags --region "$region" --resources "$ami" --tags "${tags[@]}"
	log "tagged $ami: ${tags[*]}"
	;;
*)
	log "usage: gpu_proof.sh run GPUS INSTANCE_TYPE efa|no-efa | validate | tag | jit GPUS INSTANCE_TYPE | jit-validate"
	exit 2
	;;
esac
