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
# built with meson against the libfuse of those sources, with io_uring (liburing-dev: setup.sh).
hp_source="$bench/build/libfuse"
hp="$hp_source/build/example/passthrough_hp"
if [ ! -x "$hp" ] || [ ! -e "$hp_source/.with-io-uring" ]; then
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
  (cd "$hp_source" && meson setup build --buildtype=release -Dexamples=true -Dutils=false -Dtests=false \
     -Denable-io-uring=true >/dev/null && ninja -C build example/passthrough_hp >/dev/null)
  touch "$hp_source/.with-io-uring"
fi
libfuse_version="libfuse $(git -C "$hp_source" describe --tags --always 2>/dev/null || echo unknown)"

# Scratch space: by default a fresh ext4 (mkfs's defaults: a journal) in an image on the host's disk,
# behind a loop device with direct I/O, so that every run starts from the same filesystem whatever
# the host has. ext4 without a journal (this project's VMs) scans the inodes freed in the last 30 s at
# every inode it allocates: whoever created files after another column's deletions paid up to 20x.
# BENCH_DIR measures a directory of the host's instead (not tmpfs).
image="" loop="" disk="" work="" uring_was=""
uring=/sys/module/fuse/parameters/enable_uring
cleanup() {
  status=$?
  trap - EXIT INT TERM
  # The fuse module's io_uring as it was before the run (mounts made meanwhile keep theirs).
  if [ -n "$uring_was" ]; then
    echo "$uring_was" | $sudo tee "$uring" >/dev/null || echo "bench: could not set $uring back to $uring_was" >&2
  fi
  if [ -n "$work" ] && [ -f "$work/started.mounts" ]; then
    while read -r mount_point; do
      if mountpoint -q "$mount_point" 2>/dev/null; then
        fusermount3 -u "$mount_point" 2>/dev/null || fusermount3 -uz "$mount_point" 2>/dev/null || true
      fi
    done < "$work/started.mounts"
  fi
  if [ -n "$work" ] && [ -f "$work/started.pids" ]; then
    while read -r pid; do
      # Only our daemons: the pid may have been reused after they exited.
      if [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' < "/proc/$pid/cmdline" | grep -qF "$work"; then
        kill "$pid" 2>/dev/null || true
      fi
    done < "$work/started.pids"
  fi
  if [ -n "${BENCH_KEEP:-}" ] && [ -n "$work" ]; then
    echo "bench: scratch directory kept at $work${image:+ (in $image, mounted at $disk)}" >&2
  else
    [ -n "$work" ] && rm -rf "$work"
    if [ -n "$disk" ]; then
      # The daemons may take a moment to let go of the disk.
      for _ in 1 2 3 4 5 6 7 8 9 10; do
        mountpoint -q "$disk" || break
        $sudo umount "$disk" 2>/dev/null || sleep 1
      done
      if mountpoint -q "$disk"; then echo "bench: could not unmount $disk" >&2; else rmdir "$disk"; fi
    fi
    [ -n "$loop" ] && { $sudo losetup -d "$loop" || echo "bench: could not detach $loop" >&2; }
    [ -n "$image" ] && rm -f "$image"
  fi
  exit "$status"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if [ -n "${BENCH_DIR:-}" ]; then
  work="$(mktemp -d "$BENCH_DIR/containerfs-bench.XXXXXX")"
  scratch="a directory of the host: $BENCH_DIR"
else
  image="$(mktemp "${BENCH_IMAGE_DIR:-/var/tmp}/containerfs-bench.XXXXXX.img")"
  truncate -s "${BENCH_DISK_SIZE:-16G}" "$image"
  mkfs.ext4 -q -F "$image"
  loop="$($sudo losetup --find --show --direct-io=on "$image")" || {
    echo "bench: cannot attach a loop device for the scratch disk; BENCH_DIR=DIR measures a directory of the host instead" >&2
    exit 1
  }
  disk="$(mktemp -d /tmp/containerfs-bench-disk.XXXXXX)"
  $sudo mount "$loop" "$disk"
  work="$disk/work"
  mkdir "$work"
  scratch="a fresh ext4 made for the run in a ${BENCH_DISK_SIZE:-16G} image on the host's $(findmnt -no FSTYPE -T "$image"), through a loop device with direct I/O"
fi

# FUSE over io_uring (Linux 6.14 and later), off in the fuse module unless turned on: on for the
# run, so that ContainerFS takes its requests through it as it does wherever an administrator turned
# it on, and passthrough_hp gets a column with `-o io_uring` (docs/io-uring.md). BENCH_IO_URING=0
# leaves the module as it is.
io_uring_argument=()
if [ ! -e "$uring" ]; then
  echo "bench: this kernel's fuse module has no io_uring (Linux 6.14 and later, CONFIG_FUSE_IO_URING): no io_uring column"
elif [ "$(cat "$uring")" != Y ] && [ "${BENCH_IO_URING:-1}" != 0 ]; then
  uring_was="$(cat "$uring")"
  if echo 1 | $sudo tee "$uring" >/dev/null 2>&1; then
    echo "bench: the fuse module's enable_uring is on for the run (it was $uring_was)"
  else
    echo "bench: could not turn on the fuse module's enable_uring: no io_uring column" >&2
    uring_was=""
  fi
fi
if [ -e "$uring" ] && [ "$(cat "$uring")" = Y ]; then io_uring_argument=(--io-uring); fi

python3 "$bench/bench.py" "${io_uring_argument[@]}" --containerfs "$containerfs" --passthrough "$bench/build/passthrough_ll" \
  --passthrough-hp "$hp" --libfuse-version "$libfuse_version" \
  --work "$work" --scratch "$scratch" --results "${BENCH_RESULTS:-$bench/results}" --command "bench/run.sh"
