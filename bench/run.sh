#!/usr/bin/env bash
# The ContainerFS benchmark, in one command: installs fio and hyperfine if missing, builds the release
# binary and libfuse's passthrough_ll, runs every workload on a plain directory, passthrough_ll and
# ContainerFS, and writes bench/results/latest.md and latest.json. Sizes: see bench/README.md.
# Whatever happens, the trap unmounts what the run mounted and stops the daemons it started.
set -euo pipefail

bench="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(dirname "$bench")"
export PATH="/opt/swift/usr/bin:$PATH"

sudo=""
if [ "$(id -u)" != 0 ]; then
  sudo="sudo"
  echo "bench: not root: caches cannot be dropped between write and read, so reads may be served from memory" >&2
fi

# Tools: the project's own set-up (libfuse3, fuse3, ...), then fio and hyperfine.
"$root/scripts/setup.sh"
missing=()
for tool in fio hyperfine; do command -v "$tool" >/dev/null || missing+=("$tool"); done
if ((${#missing[@]})); then
  echo "bench: installing ${missing[*]}"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Builds.
echo "bench: building containerfs (release)"
containerfs="$("$root/scripts/build.sh" --release)"
examples=/usr/share/doc/libfuse3-dev/examples
mkdir -p "$bench/build"
if [ ! -x "$bench/build/passthrough_ll" ] || [ "$examples/passthrough_ll.c" -nt "$bench/build/passthrough_ll" ]; then
  echo "bench: building passthrough_ll"
  gcc -O2 -I"$examples" "$examples/passthrough_ll.c" -o "$bench/build/passthrough_ll" \
    $(pkg-config --cflags --libs fuse3)
fi

# libfuse's passthrough_hp, from its current public sources (LIBFUSE_SOURCE: another clone or URL),
# built with meson against the libfuse of those sources.
hp_source="$bench/build/libfuse"
hp="$hp_source/build/example/passthrough_hp"
if [ ! -x "$hp" ]; then
  missing=()
  for tool in meson:meson ninja:ninja-build g++:g++ git:git; do command -v "${tool%%:*}" >/dev/null || missing+=("${tool##*:}"); done
  if ((${#missing[@]})); then
    echo "bench: installing ${missing[*]}"
    $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  fi
  echo "bench: building passthrough_hp from ${LIBFUSE_SOURCE:-https://github.com/libfuse/libfuse}"
  rm -rf "$hp_source"
  git clone -q "${LIBFUSE_SOURCE:-https://github.com/libfuse/libfuse}" "$hp_source"
  (cd "$hp_source" && meson setup build --buildtype=release -Dexamples=true -Dutils=false -Dtests=false >/dev/null &&
     ninja -C build example/passthrough_hp >/dev/null)
fi
libfuse_version="libfuse $(git -C "$hp_source" describe --tags --always 2>/dev/null || echo unknown)"

# Scratch space on the disk being measured (not tmpfs); BENCH_DIR picks another place.
parent="${BENCH_DIR:-/tmp}"
work="$(mktemp -d "$parent/containerfs-bench.XXXXXX")"

cleanup() {
  status=$?
  trap - EXIT INT TERM
  if [ -f "$work/started.mounts" ]; then
    while read -r mount_point; do
      if mountpoint -q "$mount_point" 2>/dev/null; then
        fusermount3 -u "$mount_point" 2>/dev/null || fusermount3 -uz "$mount_point" 2>/dev/null || true
      fi
    done < "$work/started.mounts"
  fi
  if [ -f "$work/started.pids" ]; then
    while read -r pid; do
      # Only our daemons: the pid may have been reused after they exited.
      if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -qF "$work"; then
        kill "$pid" 2>/dev/null || true
      fi
    done < "$work/started.pids"
  fi
  if [ -n "${BENCH_KEEP:-}" ]; then
    echo "bench: scratch directory kept at $work" >&2
  else
    rm -rf "$work"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

python3 "$bench/bench.py" --containerfs "$containerfs" --passthrough "$bench/build/passthrough_ll" \
  --passthrough-hp "$hp" --libfuse-version "$libfuse_version" \
  --work "$work" --results "${BENCH_RESULTS:-$bench/results}" --command "bench/run.sh"
