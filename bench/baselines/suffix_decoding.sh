#!/usr/bin/env bash
# Build SuffixDecoding (ArcticInference 0.3.0's suffix trees, the peer of issue 19's drafting
# benchmark) from its pinned sdist and print the folder to put on PYTHONPATH.
#
# Only `csrc/suffix_decoding` is built: cmake + nanobind 2.9.2 (from the package index, in
# a build venv of their own, handed to cmake as nanobind_DIR: the interpreter the module
# is built for needs neither) and the machine's C++20 compiler, 15-40 s on 2 cores. The
# package's own build needs torch and vLLM's toolchain and is never run. Nothing here is
# imported by the library or by `make test`; the drafting benchmark calls this script.
#
# Cached under ${SPECDEC_CACHE:-${XDG_CACHE_HOME:-~/.cache}/specdec-kernels}/arctic-inference-0.3.0:
# the sdist (checked against its sha256 before it is kept), and per Python version the
# build venv and the unpacked package with the built module; a marker written last makes
# later calls for that version return at once.
set -euo pipefail

VERSION=0.3.0
SHA256=7f22e3e1b1071c6061c0d6951be17c0fb50b08d06d6e543144c8f52faba60a36
PYTHON=${PYTHON:-python3}
CACHE=${SPECDEC_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/specdec-kernels}
DIR=$CACHE/arctic-inference-$VERSION
PYVER=$("$PYTHON" -c 'import sys; print("py%d.%d" % sys.version_info[:2])')
WORK=$DIR/$PYVER
SRC=$WORK/arctic_inference-$VERSION
MARKER=$WORK/.built

mkdir -p "$DIR"
exec 9>"$DIR.lock"
flock 9

if [ ! -f "$MARKER" ]; then
    {
        echo "suffix_decoding: building ArcticInference $VERSION's suffix trees in $WORK"
        tarball=$DIR/arctic_inference-$VERSION.tar.gz
        if [ ! -f "$tarball" ]; then
            # the simple index names the sdist's URL (pip download would run its build)
            url=$(curl -fsSL "https://pypi.org/simple/arctic-inference/" \
                | grep -o "https://files.pythonhosted.org[^\"#]*arctic_inference-$VERSION.tar.gz" \
                | head -1)
            curl -fsSL -o "$tarball.part" "$url"
            echo "$SHA256  $tarball.part" | sha256sum -c --quiet -
            mv "$tarball.part" "$tarball"
        fi
        rm -rf "$WORK"
        mkdir -p "$WORK"
        tar -xzf "$tarball" -C "$WORK"
        "$PYTHON" -m venv "$WORK/build-venv"
        "$WORK/build-venv/bin/pip" install -q "nanobind==2.9.2" "cmake==4.4.5"
        build=$SRC/csrc/suffix_decoding/build
        trap 'echo "suffix_decoding: the build failed, see $build.log" >&2' ERR
        mkdir -p "$build"
        PATH=$WORK/build-venv/bin:$PATH cmake -S "$SRC/csrc/suffix_decoding" -B "$build" \
            -DPython_EXECUTABLE="$("$PYTHON" -c 'import sys; print(sys.executable)')" \
            -Dnanobind_DIR="$("$WORK/build-venv/bin/python" -m nanobind --cmake_dir)" \
            -DCMAKE_BUILD_TYPE=Release > "$build.log" 2>&1
        PATH=$WORK/build-venv/bin:$PATH cmake --build "$build" -j "$(nproc)" >> "$build.log" 2>&1
        cp "$build"/_C*.so "$SRC/arctic_inference/suffix_decoding/"
        touch "$MARKER"
    } >&2
fi
echo "$SRC"
