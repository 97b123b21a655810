# shellcheck shell=bash
# A local CA and a serving certificate signed by it, for the host processes
# the local cluster's scripts start (hack/kueue.sh's webhooks,
# hack/registry.sh's registry). Sourced, not run.

# make_serving_certs DIR CA-SUBJECT SERVER-CN SAN DAYS WHO writes DIR/ca.key,
# DIR/ca.crt, DIR/tls.key and DIR/tls.crt: a CA named CA-SUBJECT and a
# certificate for SERVER-CN with subjectAltName SAN ("IP:127.0.0.1"), each
# valid for DAYS. ca.crt is written last, so a folder holding it holds the
# whole set. On failure it prints openssl's output, naming WHO, and exits.
make_serving_certs() {
	local dir=$1 ca_subject=$2 cn=$3 san=$4 days=$5 who=$6 out
	mkdir -p "$dir"
	if ! out=$({
		openssl req -x509 -newkey rsa:2048 -nodes -days "$days" -subj "$ca_subject" \
			-keyout "$dir/ca.key" -out "$dir/ca.crt.tmp" \
			-addext "basicConstraints=critical,CA:TRUE" -addext "keyUsage=critical,keyCertSign,cRLSign" &&
			openssl req -new -newkey rsa:2048 -nodes -subj "/CN=$cn" \
				-keyout "$dir/tls.key" -out "$dir/tls.csr" &&
			openssl x509 -req -in "$dir/tls.csr" -CA "$dir/ca.crt.tmp" -CAkey "$dir/ca.key" \
				-set_serial "0x$(openssl rand -hex 16)" -days "$days" -out "$dir/tls.crt" -extfile <(printf '%s\n' \
				"subjectAltName=$san" "basicConstraints=critical,CA:FALSE" \
				"keyUsage=critical,digitalSignature,keyEncipherment" "extendedKeyUsage=serverAuth")
	} 2>&1); then
		echo "$who: making the certificates in $dir with openssl failed:" >&2
		echo "$out" >&2
		exit 1
	fi
	rm -f "$dir/tls.csr"
	chmod 600 "$dir"/*.key
	mv "$dir/ca.crt.tmp" "$dir/ca.crt"
}
