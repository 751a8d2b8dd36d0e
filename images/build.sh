#!/usr/bin/env bash
# Builds pagoda-runtime and pagoda-operator from images/*.Dockerfile without a Docker engine or a
# registry: buildah builds them on a base image made locally from a Debian root filesystem
# (debootstrap), passed as the Dockerfiles' BASE build argument, and each image is written as an
# OCI archive that `ctr images import` (or `kind load image-archive`) takes.
#
# Everything is cached by content under ${PAGODA_IMAGES_CACHE:-$HOME/.cache/pagoda-images}: the
# base by its Debian suite and package list, each image by its Dockerfile, the files it copies and
# the base. A warm run with nothing changed builds nothing; a source change reuses the dependency
# layer (buildah --layers) and a persistent pip cache.
#
# Usage: images/build.sh            prints one line per image: NAME REF ARCHIVE
# Needs root, buildah and debootstrap (e2e/node/install.sh installs them on Debian).
set -euo pipefail
cd "$(dirname "$0")/.."

cache="${PAGODA_IMAGES_CACHE:-$HOME/.cache/pagoda-images}"
suite=bookworm
mirror="${DEBIAN_MIRROR:-http://deb.debian.org/debian}"
packages=python3,python3-venv,ca-certificates
mkdir -p "$cache"
exec 9>"$cache/.build.lock"
flock 9

log() { echo "images: $*" >&2; }
digest() { sha256sum | cut -c1-16; }

# The base: a minimal Debian with python3, as a local image (no registry has to answer).
base_key=$(printf '%s\n' "$suite" "$mirror" "$packages" | digest)
base_ref="localhost/pagoda-base:$suite-$base_key"
if ! buildah inspect --type image "$base_ref" >/dev/null 2>&1; then
    rootfs="$cache/rootfs-$suite-$base_key.tar"
    if [[ ! -f $rootfs ]]; then
        t=$SECONDS
        tmp=$(mktemp -d "$cache/.debootstrap.XXXXXX")
        log "debootstrap $suite ($packages) from $mirror"
        debootstrap --variant=minbase --include="$packages" "$suite" "$tmp/root" "$mirror" >"$tmp/log" 2>&1 \
            || { tail -20 "$tmp/log" >&2; rm -rf "$tmp"; exit 1; }
        rm -rf "$tmp"/root/var/cache/apt/archives/*.deb "$tmp"/root/var/lib/apt/lists/*
        tar -C "$tmp/root" -cf "$rootfs.tmp" . && mv "$rootfs.tmp" "$rootfs"
        rm -rf "$tmp"
        log "debootstrap: $((SECONDS - t))s"
    fi
    container=$(buildah from scratch)
    buildah add "$container" "$rootfs" / >/dev/null
    buildah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
        --cmd /bin/bash "$container"
    buildah commit --rm -q "$container" "$base_ref" >/dev/null
    log "made $base_ref"
fi
base_id=$(buildah inspect --type image --format '{{.FromImageID}}' "$base_ref")

# pip in the build trusts what the host trusts (a TLS-intercepting proxy's CA, say).
ca="${PIP_CERT:-${SSL_CERT_FILE:-/etc/ssl/certs/ca-certificates.crt}}"
secret=()
[[ -f $ca ]] && secret=(--secret "id=ca,src=$ca")

build() {  # build NAME: the image from images/NAME.Dockerfile, unless its content key is cached
    local name=$1 dockerfile=images/$1.Dockerfile key ref archive t sources=(runtime operator)
    # The operator image holds the runtime's contract alone: other runtime changes keep its cache.
    [[ $name == operator ]] && sources=(runtime/pagoda_runtime/__init__.py runtime/pagoda_runtime/contract operator)
    key=$( { echo "$base_id"; cat "$dockerfile" constraints.txt pyproject.toml;
             git ls-files -co --exclude-standard "${sources[@]}" | sort \
                 | xargs sha256sum; } | digest)
    ref="localhost/pagoda-$name:$key"
    archive="$cache/pagoda-$name-$key.oci.tar"
    if [[ ! -f $archive ]]; then
        t=$SECONDS
        log "building $ref from $dockerfile"
        buildah build --layers --pull=never --network=host -q -f "$dockerfile" "${secret[@]}" \
            --build-arg "BASE=$base_ref" -t "$ref" . >/dev/null
        # Uncompressed: gzip of a multi-gigabyte torch layer costs minutes and saves nothing here.
        buildah push -q --disable-compression "$ref" "oci-archive:$archive.tmp:$ref" >/dev/null
        mv "$archive.tmp" "$archive"
        # Keep only the newest image and archive of each name (gigabytes apiece); the layers the
        # newest shares with older builds stay in buildah's cache.
        find "$cache" -maxdepth 1 -name "pagoda-$name-*.oci.tar" ! -name "${archive##*/}" -delete
        buildah images --format '{{.Name}}:{{.Tag}}' | grep -x "localhost/pagoda-$name:.*" | grep -vx "$ref" \
            | xargs -r buildah rmi >/dev/null || true
        buildah rmi --prune >/dev/null 2>&1 || true
        log "$name: $((SECONDS - t))s"
    fi
    echo "pagoda-$name $ref $archive"
}

build operator
[[ ${1:-} == operator ]] || build runtime
