#!/usr/bin/env bash
# tests/install/check.sh BUILD_DIR: installs BUILD_DIR into a temporary prefix
# (cmake --install --prefix) and checks what a user gets there: the headers,
# libstowage.so with its soname, libstowage.a, the stowage tool, the CMake
# package and stowage.pc. Then builds tests/install/consumer.c against that
# prefix alone, through find_package(Stowage) (shared and static) and through
# pkg-config, and runs each build. Prints one line per check; exits 1 on the
# first failure. (ctest: install_consumer.)
set -euo pipefail
build=$(cd "${1:-build}" && pwd)
src=$(cd "$(dirname "$0")/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
die() { echo "install: $*" >&2; exit 1; }

cmake --install "$build" --prefix "$prefix" >"$tmp/install.log" || { cat "$tmp/install.log"; die "cmake --install failed"; }
version=$(sed -n 's/^project(stowage VERSION \([0-9.]*\).*/\1/p' "$src/CMakeLists.txt")
major=${version%%.*}
libdir=$(dirname "$(find "$prefix" -name "libstowage.so.$version" | head -1)")
[ -n "$libdir" ] && [ "$libdir" != . ] || die "no libstowage.so.$version under $prefix"
for f in "$prefix/include/stowage.h" "$prefix/include/stowage/torch.h" "$libdir/libstowage.a" \
         "$libdir/cmake/Stowage/StowageConfig.cmake" "$libdir/cmake/Stowage/StowageConfigVersion.cmake" \
         "$libdir/pkgconfig/stowage.pc" "$prefix/share/doc/stowage/LICENSE"; do
    [ -f "$f" ] || die "missing ${f#$prefix/}"
done
[ "$(readlink "$libdir/libstowage.so")" = "libstowage.so.$major" ] || die "libstowage.so is not a link to libstowage.so.$major"
soname=$(readelf -d "$libdir/libstowage.so.$version" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "libstowage.so.$major" ] || die "soname '$soname', expected libstowage.so.$major"
# Every public header compiles alone from the installed tree.
for h in "$prefix"/include/stowage.h "$prefix"/include/stowage/*.h; do
    echo "#include <${h#$prefix/include/}>" | cc -std=c11 -fsyntax-only -I"$prefix/include" -x c - \
        || die "${h#$prefix/} does not compile alone"
done
echo "install: files ok ($(find "$prefix" -type f | wc -l) files, soname $soname)"
if [ -x "$build/stowage" ]; then
    [ "$("$prefix/bin/stowage" version)" = "stowage $version" ] || die "installed stowage tool: wrong version"
    echo "install: bin/stowage ok"
fi

# find_package, both libraries. Nothing from the source or build tree is visible to it.
cmake -S "$src/tests/install" -B "$tmp/cm" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_BUILD_TYPE=Release \
    >"$tmp/cm.log" 2>&1 || { cat "$tmp/cm.log"; die "find_package(Stowage) configure failed"; }
cmake --build "$tmp/cm" >>"$tmp/cm.log" 2>&1 || { cat "$tmp/cm.log"; die "find_package build failed"; }
for kind in shared static; do
    out=$("$tmp/cm/consumer_$kind") || die "consumer_$kind failed"
    [ "$out" = "consumer ok $version" ] || die "consumer_$kind printed '$out'"
done
# (ldd's output captured first: with pipefail, grep -q leaving early would fail ldd.)
deps_shared=$(ldd "$tmp/cm/consumer_shared")
deps_static=$(ldd "$tmp/cm/consumer_static")
grep -q "$libdir/libstowage.so.$major" <<<"$deps_shared" \
    || die "consumer_shared does not load the installed library"
if grep -q libstowage <<<"$deps_static"; then die "consumer_static loads libstowage.so"; fi
echo "install: find_package(Stowage) ok (Stowage::stowage, Stowage::stowage_static)"

# libstowage.a with another compiler than the one that built it (no GCC LTO plugin there).
if command -v clang >/dev/null; then
    clang -std=c11 "$src/tests/install/consumer.c" -I"$prefix/include" "$libdir/libstowage.a" \
        -lpthread -ldl -lm -o "$tmp/consumer_clang" || die "clang cannot link the installed libstowage.a"
    out=$("$tmp/consumer_clang") || die "consumer_clang failed"
    [ "$out" = "consumer ok $version" ] || die "consumer_clang printed '$out'"
    echo "install: libstowage.a links with clang"
fi

# pkg-config, from another directory, with the prefix known only through PKG_CONFIG_PATH.
export PKG_CONFIG_PATH="$libdir/pkgconfig"
[ "$(pkg-config --modversion stowage)" = "$version" ] || die "pkg-config --modversion stowage"
[ "$(pkg-config --variable=libdir stowage)" -ef "$libdir" ] || die "stowage.pc: libdir is not $libdir"
(cd "$tmp" && cc -std=c11 "$src/tests/install/consumer.c" -o consumer_pc $(pkg-config --cflags --libs stowage) \
    -Wl,-rpath,"$(pkg-config --variable=libdir stowage)") || die "pkg-config build failed"
out=$("$tmp/consumer_pc") || die "consumer_pc failed"
[ "$out" = "consumer ok $version" ] || die "consumer_pc printed '$out'"
echo "install: pkg-config ok ($(pkg-config --cflags --libs stowage))"
