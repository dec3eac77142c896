#!/bin/sh
# Assembles boot.S into boot.bin (GNU binutils), which is committed: the tests
# compare the two where binutils is installed.
set -eu
cd "$(dirname "$0")"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
as --64 -o "$tmp/boot.o" boot.S
ld -m elf_x86_64 -Ttext 0x7c00 --oformat binary -o boot.bin "$tmp/boot.o"
