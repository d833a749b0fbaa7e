#!/usr/bin/env bash
# Here (PyPI reachable): llama.cpp's source as the PyPI sdist of llama-cpp-python vendors it
# (0.3.36: llama.cpp 0c1e570, the version issue 16 measures against), trimmed to what its CUDA
# build needs (no docs, models, media, tests, web assets) and packed into .lcp/llama.cpp.tgz
# (git-ignored, ~10 MB), to be carried to the GPU machine for tools/gpu/bench_vs_llamacpp.sh.
set -euo pipefail
cd "$(dirname "$0")/../.."
VER=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
pip download --quiet --no-deps --no-binary=:all: "llama-cpp-python==$VER" -d "$tmp"
tar xzf "$tmp"/llama_cpp_python-"$VER".tar.gz -C "$tmp"
src="$tmp/llama_cpp_python-$VER/vendor/llama.cpp"
rm -rf "$src"/{docs,models,media,examples,tests,benches,.git,.github} "$src"/tools/server/public* "$src"/tools/server/webui
mkdir -p .lcp
tar czf .lcp/llama.cpp.tgz -C "$(dirname "$src")" llama.cpp
ls -la .lcp/llama.cpp.tgz
