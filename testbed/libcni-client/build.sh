#!/usr/bin/env bash
# Builds the libcni client offline from Debian's golang-go + golang-github-appc-cni-dev
# (libcni 1.1.2 under /usr/share/gocode) in GOPATH mode: no module proxy, no network.
# usage: build.sh OUTPUT_BINARY
set -euo pipefail
out=${1:?usage: build.sh OUTPUT_BINARY}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$(dirname "$out")"
out=$(cd "$(dirname "$out")" && pwd)/$(basename "$out")
export GOPATH=/usr/share/gocode GO111MODULE=off GOPROXY=off GOFLAGS= CGO_ENABLED=0
export GOCACHE=${GOCACHE:-$(dirname "$out")/go-build-cache}
cd "$here"
# Build to a private name and rename: parallel builders never expose a half-written binary.
go build -o "$out.tmp.$$" .
mv -f "$out.tmp.$$" "$out"
