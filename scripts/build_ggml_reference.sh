#!/usr/bin/env bash
# Build llama.cpp's reference quantizers (ggml-quants.c alone) as a shared library, the judge of cogexport's K types
# in tests/test_quantize_kquants.py (which skips without it). The source is the llama.cpp that the llama-cpp-python
# sdist on PyPI vendors; only ggml-quants.c is compiled (a few seconds), as a release build (-O3 -DNDEBUG, so its
# asserts are off as in llama-quantize) with -ffp-contract=off so that no
# multiply-add is fused: the reference's float32 arithmetic exactly as written.
#     scripts/build_ggml_reference.sh [OUT_DIR]      (default tests/.fixtures/ggml-reference)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-tests/.fixtures/ggml-reference}
version=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
python=${PYTHON:-.venv/bin/python}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip download --quiet --no-deps --no-binary :all: "llama-cpp-python==$version" -d "$work"
tar -xzf "$work"/llama_cpp_python-"$version".tar.gz -C "$work" --wildcards \
    '*/vendor/llama.cpp/ggml/src/ggml-quants.*' '*/vendor/llama.cpp/ggml/src/ggml-common.h' \
    '*/vendor/llama.cpp/ggml/src/ggml-impl.h' '*/vendor/llama.cpp/ggml/include/*' \
    '*/vendor/llama.cpp/ggml/src/ggml-cpu/ggml-cpu-impl.h'
ggml="$work/llama_cpp_python-$version/vendor/llama.cpp/ggml"
# ggml-quants.c names four functions of ggml.c on paths the reference quantizers never take; these stand in.
cat > "$work/stubs.c" <<'C'
#include <stdlib.h>
#include <stddef.h>
#include <stdint.h>
void ggml_abort(const char *file, int line, const char *fmt, ...) { (void)file; (void)line; (void)fmt; abort(); }
size_t ggml_row_size(int type, int64_t ne) { (void)type; (void)ne; abort(); }
const char *ggml_type_name(int type) { (void)type; abort(); }
size_t ggml_type_size(int type) { (void)type; abort(); }
C
mkdir -p "$out"
gcc -O3 -DNDEBUG -ffp-contract=off -fPIC -shared -I"$ggml/include" -I"$ggml/src" -o "$out/libggml_quants_ref.so" \
    "$ggml/src/ggml-quants.c" "$work/stubs.c" -lm
echo "llama-cpp-python==$version" > "$out/SOURCE"
echo "built $out/libggml_quants_ref.so from llama-cpp-python $version's vendored llama.cpp"
