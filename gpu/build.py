"""Build the kernel with nvcc and cache the cubin.

    nvcc -gencode arch=compute_90a,code=sm_90a -rdc=true -c moe.cu -I<nvshmem>/include -DTILE_M=.. -o moe.o
    nvcc -gencode arch=compute_90a,code=sm_90a -dlink --cubin moe.o <nvshmem>/lib/libnvshmem_device.a -o moe.cubin

The device library must be the NVSHMEM version of the host library that will run it (the pip
package `nvidia-nvshmem-cu13`, 3.4.5 on the GPU machines). Cubins are cached under
$MOELAB_CACHE (default ~/.cache/moelab/cubins) by a key of the kernel sources, the compile-time
options (the config's tile shape) and the constants Python owns (layout.kernel_constants), the
nvcc command lines, the architecture, nvcc's version and NVSHMEM's version.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import struct
import subprocess
from dataclasses import dataclass
from pathlib import Path

from .layout import KERNEL_DIR, MIN_BLOCKS_PER_SM, block_threads, kernel_constants

ARCH = "sm_90a"  # wgmma (the bf16 tile GEMM) exists on sm_90a only: H100, H200


class BuildError(RuntimeError):
    """nvcc or the NVSHMEM device library is missing, or the kernel did not compile."""


def nvcc_path() -> str | None:
    return shutil.which("nvcc") or (str(Path(os.environ["CUDA_HOME"]) / "bin" / "nvcc")
                                    if "CUDA_HOME" in os.environ else None)


def nvshmem_dir() -> Path:
    """The installed nvidia-nvshmem-cu13 package (include/ and lib/libnvshmem_device.a)."""
    try:
        import nvidia.nvshmem as pkg
    except ImportError as e:
        raise BuildError("the NVSHMEM device library is missing: pip install nvidia-nvshmem-cu13==3.4.5") from e
    root = Path(list(pkg.__path__)[0])
    if not (root / "lib" / "libnvshmem_device.a").is_file():
        raise BuildError(f"{root}/lib/libnvshmem_device.a not found: reinstall nvidia-nvshmem-cu13")
    return root


def nvshmem_version(root: Path) -> str:
    text = (root / "include" / "non_abi" / "nvshmem_version.h").read_text()
    parts = [line.split()[-1] for line in text.splitlines()
             if line.startswith("#define NVSHMEM_VENDOR_MAJOR_VERSION")
             or line.startswith("#define NVSHMEM_VENDOR_MINOR_VERSION")
             or line.startswith("#define NVSHMEM_VENDOR_PATCH_VERSION")]
    return ".".join(parts) or "unknown"


def nvcc_version(nvcc: str) -> str:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    return out.strip().splitlines()[-1]


def source_files() -> list[Path]:
    return sorted(p for p in KERNEL_DIR.iterdir() if p.suffix in (".cu", ".cuh"))


def cache_key(options: dict[str, int], arch: str, nvcc_ver: str, nvshmem_ver: str,
              sources: list[tuple[str, bytes]]) -> str:
    """Hex key of everything that determines the cubin."""
    h = hashlib.sha256()
    for name, data in sorted(sources):
        h.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    h.update(repr(sorted(options.items())).encode())
    h.update(f"{arch}|{nvcc_ver}|{nvshmem_ver}".encode())
    return h.hexdigest()[:24]


def cache_dir() -> Path:
    return Path(os.environ.get("MOELAB_CACHE", Path.home() / ".cache" / "moelab")) / "cubins"


@dataclass(frozen=True)
class Built:
    cubin: Path
    key: str
    cached: bool


def arch_flags(arch: str) -> list[str]:
    """nvcc's flags for SASS of `arch` alone: nvcc 13's -arch=sm_90a also assembles compute_90 PTX,
    which has no wgmma."""
    return ["-gencode", f"arch=compute_{arch.removeprefix('sm_')},code={arch}"]


def register_cap(options: dict[str, int]) -> list[str]:
    """-maxrregcount where the launch bounds allow fewer than 255 registers a thread: they bind
    the kernel itself, not the functions it calls (the bf16 task's GEMM is one, gemm_task), which
    ptxas would otherwise give more than the kernel may have (a block of 384 threads: 168)."""
    per_thread = 65536 // (block_threads(options) * options.get("MIN_BLOCKS_PER_SM", MIN_BLOCKS_PER_SM)) // 8 * 8
    return [f"-maxrregcount={per_thread}"] if per_thread < 255 else []


def defines(options: dict[str, int]) -> list[str]:
    """-D flags of a build: the config's compile-time options and the constants Python owns."""
    return [f"-D{k}={v}" for k, v in sorted({**kernel_constants(), **options}.items())]


def nvcc_commands(nvcc: str, arch: str, options: dict[str, int], nvshmem: Path, obj: Path,
                  cubin: Path, unit: str = "moe.cu") -> list[list[str]]:
    target = arch_flags(arch)
    compile_cmd = [nvcc, *target, "-rdc=true", "-O3", "-std=c++17", *register_cap(options), "-c",
                   str(KERNEL_DIR / unit), f"-I{nvshmem / 'include'}", *defines(options), "-o", str(obj)]
    link_cmd = [nvcc, *target, "-dlink", "--cubin", str(obj), str(nvshmem / "lib" / "libnvshmem_device.a"),
                "-o", str(cubin)]
    return [compile_cmd, link_cmd]


def build(options: dict[str, int], arch: str = ARCH, cache: Path | None = None, unit: str = "moe.cu") -> Built:
    """The cubin of kernels/`unit` (the megakernel, or the calibration microbenchmarks) for
    `options` (compile-time config fields), built now or taken from the cache."""
    nvcc = nvcc_path()
    if nvcc is None:
        raise BuildError("nvcc not found on PATH (or $CUDA_HOME/bin): install the CUDA toolkit 13")
    root = nvshmem_dir()
    sources = [(p.name, p.read_bytes()) for p in source_files()]
    keyed = {**kernel_constants(), **options, **({unit: 1} if unit != "moe.cu" else {})}
    # the commands themselves (flags, register cap) are keyed too: a changed build line rebuilds
    commands = nvcc_commands("nvcc", arch, options, root, Path("k.o"), Path("k.cubin"), unit)
    key = cache_key(keyed, arch, nvcc_version(nvcc), nvshmem_version(root),
                    [*sources, ("nvcc commands", repr(commands).encode())])
    out_dir = cache or cache_dir()
    cubin = out_dir / f"{Path(unit).stem}-{arch}-{key}.cubin"
    if cubin.is_file():
        return Built(cubin, key, True)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp_obj, tmp_cubin = cubin.with_suffix(f".{os.getpid()}.o"), cubin.with_suffix(f".{os.getpid()}.tmp")
    try:
        for cmd in nvcc_commands(nvcc, arch, options, root, tmp_obj, tmp_cubin, unit):
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                raise BuildError(f"{' '.join(cmd)}\nfailed ({done.returncode}):\n{done.stderr[-4000:]}")
        tmp_cubin.replace(cubin)  # atomic: concurrent builders of one key agree
    finally:
        tmp_obj.unlink(missing_ok=True)
        tmp_cubin.unlink(missing_ok=True)
    return Built(cubin, key, False)


def cubin_constant(cubin: Path, name: str) -> int:
    """The value of the 4-byte constant `name` (extern "C" __constant__) in a linked cubin, read
    from its ELF64 symbol table: sizes the kernel fixes at compile time reach the launcher
    without a GPU."""
    data = cubin.read_bytes()
    (shoff,) = struct.unpack_from("<Q", data, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", data, 0x3A)
    # (name, type, flags, addr, offset, size, link, info, addralign, entsize)
    sections = [struct.unpack_from("<IIQQQQIIQQ", data, shoff + i * shentsize) for i in range(shnum)]
    for _, kind, _, _, offset, size, link, *_ in sections:
        if kind != 2:  # SHT_SYMTAB
            continue
        strings = sections[link][4]
        for at in range(offset, offset + size, 24):
            st_name, _, _, shndx, value, nbytes = struct.unpack_from("<IBBHQQ", data, at)
            if data[strings + st_name: data.index(b"\0", strings + st_name)] != name.encode():
                continue
            home = sections[shndx]
            if nbytes != 4 or home[1] != 1:  # SHT_PROGBITS: the initial value is in the file
                raise BuildError(f"{cubin}: {name} is not a 4-byte initialized constant")
            return struct.unpack_from("<i", data, home[4] + value - home[3])[0]
    raise BuildError(f"{cubin} has no constant {name}")
