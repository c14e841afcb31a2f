# shellcheck shell=bash
# Sourced by the image recipe (step.sh) and by the nodes (bootstrap/lib.sh, for the preprocessing
# node's CloudWatch agent): one way to fetch a file AWS signs. The sourcer defines fail MESSAGE.
#
# signed_download DIR URL KEY_URL FINGERPRINT BAD [KEY_NAME]
# Downloads URL into DIR (under its own name), its detached signature URL.sig beside it, and the
# signer's public key from KEY_URL, then fails with "<name>: BAD" unless gpg, with only
# that key in a keyring of its own (GNUPGHOME=DIR/gnupg), reports a valid signature by
# FINGERPRINT, a pin of pins.env. With KEY_NAME, the key as downloaded must carry FINGERPRINT
# too, checked before the signature ("the KEY_NAME is not AWS's").
signed_download() {
	local dir=$1 url=$2 key_url=$3 fingerprint=$4 bad=$5 key_name=${6:-}
	local name=${url##*/} fingerprints
	curl -fsSL --retry 5 -o "$dir/$name" "$url"
	curl -fsSL --retry 5 -o "$dir/$name.sig" "$url.sig"
	curl -fsSL --retry 5 -o "$dir/${key_url##*/}" "$key_url"
	export GNUPGHOME=$dir/gnupg
	mkdir -m 700 "$GNUPGHOME"
	gpg --batch --quiet --import "$dir/${key_url##*/}"
	if [[ -n $key_name ]]; then
		fingerprints=$(gpg --batch --with-colons --fingerprint | awk -F: '$1 == "fpr" {print $10}')
		grep -qx "$fingerprint" <<<"$fingerprints" ||
			fail "the $key_name is not AWS's (fingerprints: ${fingerprints//$'\n'/ })"
	fi
	gpg --batch --status-fd 1 --verify "$dir/$name.sig" "$dir/$name" |
		grep -q "^\[GNUPG:\] VALIDSIG $fingerprint " ||
		fail "$name: $bad"
}
