"""The peers we measure against (FLA, FlashQLA, FlashInfer) on a GPU machine that has no package registry.

Workflow: on a machine with PyPI, ``download`` the pinned wheels for the GPU machine's Python and ``bundle`` them
into one xz-compressed tree (z3's duplicate library and CLI dropped: ~30 MB instead of ~82 MB of wheels; FlashInfer's
JIT sources, which its CuTe-DSL GDN prefill does not read, dropped too); carry the bundle to the GPU machine and
``install`` it there (an extraction, no pip needed), then put the printed directories on ``PYTHONPATH``. A bundle
larger than what one transfer may carry is written in parts (``--part-mib``) that ``install`` joins again.
``fla_chunk_gated_delta_rule`` / ``flashqla_chunk_gated_delta_rule`` / ``flashinfer_chunk_gated_delta_rule`` return
the peers' ops (FlashInfer's wrapped to FLA's conventions) or None; :func:`load_peer` says why one is missing.

    python -m longsparse.bench.peers download .whl
    python -m longsparse.bench.peers bundle .whl .peers/peers-py312.tar.xz
    python -m longsparse.bench.peers install .peers/peers-py312.tar.xz /tmp/peers   # on the GPU machine
    python -m longsparse.bench.peers download --set flashinfer .whl/flashinfer
    python -m longsparse.bench.peers bundle .whl/flashinfer .peers/flashinfer-py312.tar.xz --part-mib 40
    python -m longsparse.bench.peers install .peers/flashinfer-py312.tar.xz.part* /tmp/flashinfer
"""

from __future__ import annotations

import argparse
import functools
import importlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

PINNED = (
    "fla-core==0.6.0",
    "flash-linear-attention==0.6.0",
    "flash-qla==0.1.3",
    "tilelang==0.1.15",
    "apache-tvm-ffi==0.1.12",
    "torch-c-dlpack-ext==0.1.5",
    "z3-solver==4.15.4.0",
)
FLASHINFER = (
    "flashinfer-python==0.7.2.post1",
    "nvidia-cutlass-dsl==4.8.1",
    "nvidia-cutlass-dsl-libs-base==4.8.1",
    "nvidia-cutlass-dsl-libs-core==4.8.1",
    "nvidia-cutlass-dsl-libs-cu13==4.8.1",
)
"""FlashInfer's GDN prefill and the CuTe DSL it is written in (CUDA 13 build, as the H200 image's torch). Its other
dependencies are on the H200 image already (cuda-bindings, numpy, einops, ninja, nvidia-ml-py, requests, tabulate,
tqdm, click, packaging, protobuf) or in :data:`PINNED` (apache-tvm-ffi); cuda-tile, nccl4py, nccl-extensions and
nvidia-cudnn-frontend are imported only by other FlashInfer ops, lazily."""
SETS = {"peers": PINNED, "flashinfer": FLASHINFER}
PRUNED = ("flashinfer/data/csrc", "flashinfer/data/cutlass", "flashinfer/data/cccl", "flashinfer/data/include",
          "flashinfer/data/spdlog")  # fmt: skip
"""Folders a bundle leaves out: FlashInfer's sources and headers for its C++ JIT (329 MB of its 426), which the
CuTe-DSL GDN prefill never compiles."""
PLATFORMS = (
    "manylinux_2_17_x86_64",
    "manylinux2014_x86_64",
    "manylinux_2_24_x86_64",
    "manylinux_2_27_x86_64",
    "manylinux_2_28_x86_64",
    "manylinux_2_31_x86_64",
    "manylinux_2_34_x86_64",
    "manylinux1_x86_64",
)


def download(dest: str | Path, python_version: str = "3.12", packages: tuple[str, ...] = PINNED) -> list[Path]:
    """Download ``packages`` (pinned wheels, no dependencies) for ``python_version`` on x86-64 Linux into ``dest``."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable,
        "-m",
        "pip",
        "download",
        "--no-deps",
        "--only-binary=:all:",
        "--python-version",
        python_version,
        "--implementation",
        "cp",
        "-d",
        str(dest),
    ]
    for p in PLATFORMS:
        cmd += ["--platform", p]
    subprocess.run(cmd + list(packages), check=True)
    return sorted(dest.glob("*.whl"))


def bundle(wheel_dir: str | Path, out: str | Path, part_bytes: int | None = None) -> list[Path]:
    """Unpack the wheels in ``wheel_dir`` into one importable tree (without :data:`PRUNED`) and write it as ``out``
    (.tar.xz); with ``part_bytes``, as ``out.part00``, ``out.part01``, ... of at most that size each (``install``
    takes them in that order). Returns the files written."""
    wheels = sorted(Path(wheel_dir).glob("*.whl"))
    if not wheels:
        raise FileNotFoundError(f"no wheels in {wheel_dir}; run 'download' first")
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        site = Path(tmp) / "site"
        for whl in wheels:  # a wheel is a zip of the installed tree; its .data/ holds scripts we do not need
            shutil.unpack_archive(str(whl), str(site), format="zip")
        for data in site.glob("*.data"):
            shutil.rmtree(data)
        for pruned in PRUNED:
            shutil.rmtree(site / pruned, ignore_errors=True)
        lib = site / "z3" / "lib"
        if (lib / "libz3.so").exists() and any(lib.glob("libz3.so.*")):
            versioned = sorted(lib.glob("libz3.so.*"))[0]
            (lib / "libz3.so").unlink()
            (lib / "libz3.so").symlink_to(versioned.name)
        with tarfile.open(out, "w:xz", preset=9) as tar:
            tar.add(site, arcname=".")
    if part_bytes is None:
        return [out]
    return _split(out, part_bytes)


def _split(path: Path, part_bytes: int) -> list[Path]:
    """``path`` -> ``path.part00``, ``path.part01``, ... of at most ``part_bytes`` each (``path`` removed)."""
    if part_bytes < 1:
        raise ValueError(f"part size must be at least 1 byte, got {part_bytes}")
    parts = []
    with open(path, "rb") as src:
        while chunk := src.read(part_bytes):
            part = path.with_name(f"{path.name}.part{len(parts):02d}")
            part.write_bytes(chunk)
            parts.append(part)
    path.unlink()
    return parts


class _Joined(io.RawIOBase):
    """The files ``paths`` read as one stream, in order (a bundle's parts)."""

    def __init__(self, paths: list[Path]):
        self._files = [open(p, "rb") for p in paths]

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self._files:
            n = self._files[0].readinto(buffer)
            if n:
                return n
            self._files.pop(0).close()
        return 0

    def close(self) -> None:
        for f in self._files:
            f.close()
        super().close()


def install(bundle_paths: str | Path | list, target: str | Path) -> Path:
    """Extract a bundle (one file, or its parts in order) into ``target``; :func:`import_paths` says what to put on
    PYTHONPATH to import the peers."""
    paths = [Path(p) for p in (bundle_paths if isinstance(bundle_paths, list | tuple) else [bundle_paths])]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"bundle file(s) not found: {', '.join(missing)}")
    target = Path(target)
    target.mkdir(parents=True, exist_ok=True)
    with _Joined(paths) as stream, tarfile.open(fileobj=io.BufferedReader(stream), mode="r|xz") as tar:
        tar.extractall(target, filter="fully_trusted" if sys.version_info >= (3, 12) else None)
    return target


def import_paths(target: str | Path) -> list[Path]:
    """``target`` and the folders its ``.pth`` files add (the CuTe DSL's ``dsl_packages``): what an installed
    site-packages folder would put on ``sys.path``, which a folder on PYTHONPATH does not do by itself."""
    target = Path(target)
    paths = [target]
    for pth in sorted(target.glob("*.pth")):
        for line in pth.read_text().splitlines():
            if line.startswith("import ") and "nvidia_cutlass_dsl" in line and (target / "nvidia_cutlass_dsl").is_dir():
                paths.append(target / "nvidia_cutlass_dsl" / "dsl_packages")
            elif line.strip() and not line.startswith(("#", "import ")):
                paths.append(target / line.strip())
    return [p for p in dict.fromkeys(paths) if p.is_dir()]


def load_peer(name: str):
    """``(op, None)`` for a peer that imports, ``(None, reason)`` otherwise: ``name`` is "fla", "flashqla" or
    "flashinfer"; the reason is the import error, so that a result file can say why a peer did not run."""
    modules = {"fla": "fla.ops.gated_delta_rule", "flashqla": "flash_qla", "flashinfer": "flashinfer.gdn_prefill"}
    if name == "fla":
        os.environ["FLA_FLASH_QLA"] = "0"
    try:
        mod = importlib.import_module(modules[name])
    except Exception as exc:  # ImportError, or a broken install's OSError / RuntimeError
        return None, f"import {modules[name]} failed: {type(exc).__name__}: {str(exc)[:300]}"
    if name == "flashinfer":
        return functools.partial(_flashinfer_gdn, mod.chunk_gated_delta_rule), None
    return mod.chunk_gated_delta_rule, None


def fla_chunk_gated_delta_rule():
    """FLA's Triton ``chunk_gated_delta_rule`` with its FlashQLA dispatch turned off, or None if FLA is missing."""
    return load_peer("fla")[0]


def flashqla_chunk_gated_delta_rule():
    """FlashQLA's ``chunk_gated_delta_rule`` (TileLang, Hopper), or None if it is missing."""
    return load_peer("flashqla")[0]


def flashinfer_chunk_gated_delta_rule():
    """FlashInfer's GDN prefill (``flashinfer.gdn_prefill.chunk_gated_delta_rule``: on Hopper its CuTe-DSL kernels)
    called with FLA's arguments (:func:`_flashinfer_gdn`), or None if FlashInfer is missing."""
    return load_peer("flashinfer")[0]


@functools.lru_cache(maxsize=16)
def _packed_offsets(batch: int, length: int, device: str):
    """``cu_seqlens [batch + 1]`` (int32) of ``batch`` sequences of ``length`` tokens packed back to back; kept per
    shape, as a serving engine keeps its batch metadata, so that no call pays a host-to-device copy for it."""
    import torch

    return torch.arange(batch + 1, dtype=torch.int32, device=device) * length


def _flashinfer_gdn(fi_op, q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                    cu_seqlens=None):  # fmt: skip
    """FlashInfer's GDN prefill ``fi_op`` with FLA's ``chunk_gated_delta_rule`` arguments and results.

    FLA: ``q, k [B, T, H, K]``, ``v [B, T, HV, V]``, ``g [B, T, HV]`` the natural-log decay, ``beta [B, T, HV]``,
    states ``[N, HV, K, V]``, ``cu_seqlens`` optional (B = 1). FlashInfer: packed ``[B·T, heads, 128]`` tokens and
    ``cu_seqlens`` always; ``g`` the decay factor itself, ``exp(g)``, and ``beta``, both float32 ``[B·T, HV]``;
    states ``[N, HV, V, K]`` float32; the same default scale ``K^-1/2``. The conversion is vLLM's (``exp`` of the
    gate in the call); ``(o [B, T, HV, V], final_state [N, HV, K, V] or None)`` come back in FLA's layout (the state
    as a transposed view).
    """
    B, T = q.shape[:2]
    if cu_seqlens is None:
        cu_seqlens = _packed_offsets(B, T, str(q.device))
        max_seqlen = T
    else:
        max_seqlen = None  # FlashInfer bounds it by the packed length

    def packed(x):
        return x.reshape(B * T, *x.shape[2:])

    state = None if initial_state is None else initial_state.transpose(-1, -2).float().contiguous()
    out = fi_op(packed(q), packed(k), packed(v), g=packed(g).float().exp(), beta=packed(beta).float(), scale=scale,
                initial_state=state, output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                max_seqlen=max_seqlen)  # fmt: skip
    o, final = out if output_final_state else (out, None)
    o = o.reshape(B, T, *o.shape[1:])
    return o, None if final is None else final.transpose(-1, -2)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m longsparse.bench.peers", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("download", help="download the pinned peer wheels (needs PyPI)")
    p.add_argument("dest")
    p.add_argument("--python-version", default="3.12")
    p.add_argument("--set", choices=sorted(SETS), default="peers", help="which wheels (default: %(default)s)")
    p = sub.add_parser("bundle", help="pack downloaded wheels into one .tar.xz tree")
    p.add_argument("wheel_dir")
    p.add_argument("out")
    p.add_argument("--part-mib", type=float, default=None, help="write the bundle in parts of at most this size")
    p = sub.add_parser("install", help="extract a bundle, or its parts in order (no pip, no network)")
    p.add_argument("bundle", nargs="+")
    p.add_argument("target")
    args = parser.parse_args(argv)
    if args.cmd == "download":
        for w in download(args.dest, args.python_version, SETS[args.set]):
            print(w)
    elif args.cmd == "bundle":
        part = None if args.part_mib is None else int(args.part_mib * 2**20)
        for out in bundle(args.wheel_dir, args.out, part):
            print(f"{out} ({out.stat().st_size / 2**20:.1f} MiB)")
    else:
        paths = import_paths(install(args.bundle, args.target))
        print(f"export PYTHONPATH={':'.join(str(p) for p in paths)}:$PYTHONPATH")
    return 0


if __name__ == "__main__":
    sys.exit(main())
