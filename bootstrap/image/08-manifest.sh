#!/usr/bin/env bash
# Step 8: the image describes itself. /opt/horovod-fleet/image.json records every version the
# recipe installed, read back from the system, Horovod's build flags and the recipe's hash; the
# recipe itself stays in the image beside it. Then the bake's leftovers are removed.
# shellcheck source=step.sh
source "$(dirname "${BASH_SOURCE[0]}")/step.sh"
step_mode "$@"
manifest=$IMAGE_DIR/image.json

if [[ $MODE == run ]]; then
	python3 "$RECIPE_DIR/manifest.py" write --output "$manifest" --recipe-sha256 "$(recipe_sha256)" --root "${ROOT:-/}" \
		--check-build "$IMAGE_DIR/horovod-check-build.txt" --build-record "$IMAGE_DIR/horovod-build.txt"
	apt_get clean
	rm -rf "$ROOT/root/.cache/pip" "$ROOT"/var/lib/apt/lists/*
fi

python3 "$RECIPE_DIR/manifest.py" validate "$manifest"
