"""`make setup-sglang`: SGLang's own interpreter beside ours, to serve on this machine's CPU.

    python -m tools.setup_sglang [--venv .venv-sglang] [--src PATH_OR_URL]

What it makes (each step logged with its time; a second run finds everything in place and takes seconds):

1. `.venv-sglang/`: a virtual environment of its own, as SGLang has on a GPU node.
2. torch 2.13.0 and torchvision 0.28.0 from the package index, spelled `===` so that a local `+cpu` build of torch
   is not taken: SGLang 0.5.18 pins torch==2.13.0 and imports torchvision unconditionally
   (`sglang/srt/utils/common.py:95`), and the index's torchvision is built against the index's torch (a CUDA
   build, which runs on a machine without a GPU). A CPU-only torch with that torchvision fails at import
   ("operator torchvision::nms does not exist"); torchvision's CPU builds are only on PyTorch's own index.
3. SGLang 0.5.18's wheel with `--no-deps`, then the dependency list of SGLang's CPU build at the same tag
   (`python/pyproject_cpu.toml` of the source) under the wheel's own pins: the wheel's list names CUDA packages
   (flashinfer, sglang-kernel, deep-gemm, ...) that a CPU server never imports.
4. SGLang's CPU kernels (`sgl_kernel`, the `sglang-kernel-cpu` wheel) built from the tagged source with SGLang's
   documented command (`cp pyproject_cpu.toml pyproject.toml`, `pip install --no-build-isolation .`), by our
   interpreter (its torch 2.13.0 must be a CPU build: the CMake config of a CUDA torch needs the CUDA toolkit),
   and cached outside the checkout by (SGLang version, torch version, CPU ISA). SGLang's CMake builds x86_64 with
   `-march=x86-64-v4 -mamx-*` (`csrc/cpu/CMakeLists.txt`), for Xeons with AMX; on an x86 CPU without AVX-512 that
   library dies with SIGILL when imported, and SGLang imports it unconditionally
   (`sglang/kernels/ops/kvcache/cache_move.py:10`). There the build takes its CMake's other branch
   (`-march=native`, chosen by CMAKE_SYSTEM_PROCESSOR): the sources guard every AVX-512/AMX path with
   `CPU_CAPABILITY_AVX512` and fall back to ATen's vectorised code.
5. Upstream fixes SGLang released after 0.5.18, applied to the installed copy (`workers/sglang/backports.py`).
6. The default model as a Hugging Face directory (`workers/reference/hf_export.py`), its logits checked against
   the reference engine's.
7. `.venv-sglang/specsweep-sglang.json`: what was installed, for `engine=sglang_cpu` (`workers/sglang/cpu.py`).

The source comes from --src / $SGLANG_SRC: a .tar.gz of the tag (a `git archive` or GitHub's tag archive) or an
unpacked directory; default GitHub's archive of tag v0.5.18.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import logging
import os
import platform
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]
import urllib.request
from pathlib import Path

from workers.sglang import backports
from workers.sglang.cpu import MANIFEST_NAME, SGLANG_CPU_MODELS, cpu_isa

logger = logging.getLogger("setup-sglang")

SGLANG_VERSION = backports.SGLANG_CPU_VERSION
TORCH_VERSION = "2.13.0"  # sglang 0.5.18's wheel: Requires-Dist torch==2.13.0
TORCHVISION_VERSION = "0.28.0"  # torchvision's release for torch 2.13
DEFAULT_SRC = f"https://github.com/sgl-project/sglang/archive/refs/tags/v{SGLANG_VERSION}.tar.gz"
KERNEL_DIR = "python/sglang/kernels/aot"
# installed by torch's own step or not used by a text-only CPU server: torchaudio (the CPU list pins 2.11.0, which
# would pull torch 2.11), triton (torch 2.13.0 brings its own)
NOT_FROM_CPU_LIST = {"torch", "torchvision", "torchaudio", "triton"}
# the wheel requires it and the CPU list lacks it, but the server imports it at start
# (`sglang/srt/entrypoints/ssl_utils.py:8`)
WHEEL_ONLY_NEEDED = ("watchfiles",)
ROOT = Path(__file__).resolve().parent.parent


class SetupError(RuntimeError):
    pass


class Steps:
    def __init__(self, total: int):
        self.total, self.n, self.t0 = total, 0, time.monotonic()
        self.times: list[tuple[str, float]] = []

    def run(self, title: str, fn, *args):
        self.n += 1
        logger.info("[%d/%d] %s ...", self.n, self.total, title)
        t = time.monotonic()
        out = fn(*args)
        took = time.monotonic() - t
        self.times.append((title, took))
        logger.info("[%d/%d] %s: done in %.1f s", self.n, self.total, title, took)
        return out


def sh(argv: list[str], *, env: dict[str, str] | None = None, cwd: Path | None = None, quiet: bool = True) -> str:
    logger.debug("$ %s", " ".join(argv))
    proc = subprocess.run(argv, env=env, cwd=cwd, text=True, capture_output=True)
    if proc.returncode:
        tail = "\n".join((proc.stdout + proc.stderr).strip().splitlines()[-40:])
        raise SetupError(f"command failed (exit {proc.returncode}): {' '.join(argv)}\n{tail}")
    if not quiet:
        logger.info(proc.stdout.strip())
    return proc.stdout


def pip(python: Path, *args: str) -> str:
    return sh([str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *args])


def cache_root() -> Path:
    from workers.reference.gguf_checkpoint import cache_dir

    return cache_dir() / "sglang-cpu"


def check_prerequisites() -> None:
    missing = [tool for tool in ("g++", "cmake") if shutil.which(tool) is None]
    if not Path("/usr/include/numa.h").is_file():
        missing.append("libnuma headers (/usr/include/numa.h)")
    if missing:
        raise SetupError(f"missing: {', '.join(missing)}. On Debian/Ubuntu: apt-get install g++ cmake libnuma-dev")
    if platform.machine() not in ("x86_64", "AMD64"):
        raise SetupError(f"this setup builds SGLang's x86_64 CPU kernels; this machine is {platform.machine()}")
    import torch

    if torch.__version__.split("+")[0] != TORCH_VERSION or torch.version.cuda is not None:
        raise SetupError(f"SGLang's CPU kernels are built by this interpreter ({sys.executable}), whose torch is "
                         f"{torch.__version__}; they need torch {TORCH_VERSION} built for CPU (make setup installs it)")


def make_venv(venv: Path) -> Path:
    python = venv / "bin" / "python"
    if not python.is_file():
        sh([sys.executable, "-m", "venv", str(venv)])
        pip(python, "--upgrade", "pip")
    return python


def installed(python: Path, dist: str) -> str | None:
    out = subprocess.run([str(python), "-c", f"import importlib.metadata as m; print(m.version({dist!r}))"],
                         text=True, capture_output=True)
    return out.stdout.strip() if out.returncode == 0 else None


def install_torch(python: Path) -> None:
    if installed(python, "torch") == TORCH_VERSION and installed(python, "torchvision") == TORCHVISION_VERSION:
        return
    pip(python, f"torch==={TORCH_VERSION}", f"torchvision==={TORCHVISION_VERSION}")


def fetch_wheel(cache: Path) -> Path:
    wheels = sorted(cache.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    if wheels:
        return wheels[-1]
    cache.mkdir(parents=True, exist_ok=True)
    sh([sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary", ":all:",
        "--python-version", "3.11", "-d", str(cache), f"sglang=={SGLANG_VERSION}"])
    wheels = sorted(cache.glob(f"sglang-{SGLANG_VERSION}-*.whl"))
    if not wheels:
        raise SetupError(f"pip download sglang=={SGLANG_VERSION} left no wheel in {cache}")
    return wheels[-1]


def unpack_source(src: str, into: Path) -> Path:
    """The tag's tree (the directory holding python/), from a directory, a .tar.gz path or a URL."""
    path = Path(src)
    if path.is_dir():
        return path
    if not path.is_file():
        if not re.match(r"https?://", src):
            raise SetupError(f"SGLANG_SRC={src!r}: not a directory, not a file, not a URL")
        path = into / "sglang-src.tar.gz"
        logger.info("downloading %s", src)
        urllib.request.urlretrieve(src, path)  # noqa: S310 (a URL the user gave, or the tag archive)
    with tarfile.open(path) as tar:
        tar.extractall(into, filter="data")
    tops = [p for p in into.iterdir() if p.is_dir() and (p / KERNEL_DIR).is_dir()]
    if len(tops) != 1:
        raise SetupError(f"{src}: expected one top directory holding {KERNEL_DIR}, found {[p.name for p in tops]}")
    return tops[0]


def wheel_requirements(wheel: Path) -> list[str]:
    import zipfile

    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        text = z.read(meta).decode()
    return [line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Requires-Dist:")]


def _name(req: str) -> str:
    return re.split(r"[\s\[<>=!~;]", req, maxsplit=1)[0].lower().replace("_", "-")


def install_sglang(python: Path, wheel: Path, source: Path) -> None:
    if installed(python, "sglang") == SGLANG_VERSION and installed(python, "watchfiles"):
        return
    cpu = tomllib.loads((source / "python" / "pyproject_cpu.toml").read_text())["project"]["dependencies"]
    reqs = [r for r in cpu if _name(r) not in NOT_FROM_CPU_LIST] + list(WHEEL_ONLY_NEEDED)
    pins = [r.split(";")[0].strip() for r in wheel_requirements(wheel) if "==" in r and "extra ==" not in r]
    pins = [re.sub(r"\[.*?\]", "", p) for p in pins if _name(p) not in NOT_FROM_CPU_LIST]
    with tempfile.TemporaryDirectory() as tmp:
        (Path(tmp) / "req.txt").write_text("\n".join(reqs) + "\n")
        (Path(tmp) / "pins.txt").write_text("\n".join(pins) + "\n")
        pip(python, "--no-deps", str(wheel))
        pip(python, "-r", str(Path(tmp) / "req.txt"), "-c", str(Path(tmp) / "pins.txt"),
            f"torch==={TORCH_VERSION}")


def kernel_cache_key() -> str:
    import torch

    return f"sglang-{SGLANG_VERSION}-torch-{torch.__version__.split('+')[0]}-{cpu_isa().key}"


def build_kernels(source: Path, cache: Path) -> Path:
    """The sglang-kernel-cpu wheel: from the cache, else built (minutes) and cached (write, then rename)."""
    target = cache / kernel_cache_key()
    wheels = sorted(target.glob("sglang_kernel_cpu-*.whl"))
    if wheels:
        logger.info("CPU kernels from the cache: %s", wheels[-1])
        return wheels[-1]
    pip(Path(sys.executable), "scikit-build-core>=0.10", "wheel")
    isa = cpu_isa()
    env = dict(os.environ)
    if not isa.sglang_x86_build:
        env["CMAKE_ARGS"] = (env.get("CMAKE_ARGS", "") + " -DCMAKE_SYSTEM_NAME=Linux"
                             " -DCMAKE_SYSTEM_PROCESSOR=generic").strip()
        logger.info("this CPU lacks %s: SGLang's CMake builds its portable branch (-march=native)",
                    ", ".join(isa.missing))
    env.setdefault("MAX_JOBS", str(os.cpu_count() or 1))
    env.setdefault("CMAKE_BUILD_PARALLEL_LEVEL", env["MAX_JOBS"])
    with tempfile.TemporaryDirectory(dir=cache.parent if cache.parent.is_dir() else None) as tmp:
        work = Path(tmp) / "aot"
        shutil.copytree(source / KERNEL_DIR, work)
        shutil.copyfile(work / "pyproject_cpu.toml", work / "pyproject.toml")  # SGLang's documented CPU step
        out = Path(tmp) / "dist"
        logger.info("building SGLang's CPU kernels with %s jobs (about 10 minutes on 2 cores)", env["MAX_JOBS"])
        sh([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps", "-w", str(out), str(work)],
           env=env)
        built = sorted(out.glob("sglang_kernel_cpu-*.whl"))
        if not built:
            raise SetupError(f"the kernel build left no wheel in {out}")
        staging = Path(tmp) / target.name
        staging.mkdir()
        shutil.copy2(built[-1], staging / built[-1].name)
        (staging / "build.json").write_text(json.dumps({"isa": isa.key, "cmake_args": env.get("CMAKE_ARGS", ""),
                                                        "source": str(source)}, indent=1))
        target.parent.mkdir(parents=True, exist_ok=True)
        try:
            staging.rename(target)
        except OSError:
            if not any(target.glob("sglang_kernel_cpu-*.whl")):
                raise
    return sorted(target.glob("sglang_kernel_cpu-*.whl"))[-1]


def install_kernels(python: Path, wheel: Path) -> None:
    if installed(python, "sglang-kernel-cpu") and _recorded(python).get("kernel_wheel") == str(wheel):
        return
    pip(python, "--no-deps", "--force-reinstall", str(wheel))
    # import it in SGLang's interpreter: a library built for another CPU dies here (SIGILL), not in the first sweep
    sh([str(python), "-c", "import sgl_kernel, torch; assert hasattr(torch.ops.sgl_kernel, 'rmsnorm_cpu')"])


def _site_packages(python: Path) -> Path:
    return Path(sh([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).strip())


def apply_backports(python: Path, wheel: Path) -> list[str]:
    lines = backports.apply_backports(_site_packages(python) / "sglang", wheel)
    for line in lines:
        logger.info("  %s", line)
    return lines


def export_models() -> dict[str, str]:
    from workers.reference.hf_export import check_against_reference, hf_checkpoint_dir

    out = {}
    for name, context in SGLANG_CPU_MODELS.items():
        directory = hf_checkpoint_dir(name, context)
        err = check_against_reference(name, directory)
        logger.info("  %s -> %s (logits vs the reference engine: max |diff| %.2e)", name, directory, err)
        out[name] = str(directory)
    return out


def _recorded(python: Path) -> dict:
    path = python.parent.parent / MANIFEST_NAME
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def write_manifest(venv: Path, python: Path, sglang_wheel: Path, kernel_wheel: Path, backported: list[str],
                   models: dict[str, str]) -> Path:
    import torch

    manifest = {"sglang": SGLANG_VERSION, "python": str(python), "torch": installed(python, "torch"),
                "torchvision": installed(python, "torchvision"), "kernel_built_with_torch": torch.__version__,
                "isa": cpu_isa().key, "sglang_wheel": str(sglang_wheel), "kernel_wheel": str(kernel_wheel),
                "wheel_sha256": hashlib.sha256(sglang_wheel.read_bytes()).hexdigest(),
                "backports": backported, "models": models}
    path = venv / MANIFEST_NAME
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(manifest, indent=1))
    tmp.rename(path)
    return path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="make setup-sglang", description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", default=str(ROOT / ".venv-sglang"))
    parser.add_argument("--src", default=os.environ.get("SGLANG_SRC") or DEFAULT_SRC,
                        help="SGLang's tagged source: a .tar.gz, a directory or a URL (default: %(default)s)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    venv = Path(args.venv).resolve()
    steps = Steps(8)
    try:
        steps.run("checking the build tools and this interpreter's torch", check_prerequisites)
        python = steps.run(f"SGLang's interpreter {venv}", make_venv, venv)
        steps.run(f"torch {TORCH_VERSION} + torchvision {TORCHVISION_VERSION}", install_torch, python)
        cache = cache_root()
        sglang_wheel = fetch_wheel(cache / "wheels")
        with tempfile.TemporaryDirectory() as tmp:
            kernel_ready = any((cache / kernel_cache_key()).glob("sglang_kernel_cpu-*.whl"))
            need_source = not kernel_ready or installed(python, "sglang") != SGLANG_VERSION
            source = unpack_source(args.src, Path(tmp)) if need_source else None
            if source is not None:
                steps.run(f"SGLang {SGLANG_VERSION} and its CPU dependencies", install_sglang, python, sglang_wheel,
                          source)
                kernel_wheel = steps.run("SGLang's CPU kernels", build_kernels, source, cache)
            else:
                steps.run(f"SGLang {SGLANG_VERSION} and its CPU dependencies (installed)", lambda: None)
                kernel_wheel = steps.run("SGLang's CPU kernels (cached)", build_kernels, Path(), cache)
        steps.run("installing the kernels into SGLang's interpreter", install_kernels, python, kernel_wheel)
        backported = steps.run("backports of SGLang's later fixes", apply_backports, python, sglang_wheel)
        models = steps.run("the default model as a Hugging Face directory", export_models)
        path = write_manifest(venv, python, sglang_wheel, kernel_wheel, backported, models)
    except (SetupError, backports.BackportError) as e:
        logger.error("setup-sglang failed: %s", e)
        return 1
    logger.info("SGLang %s on CPU ready in %.0f s: %s (manifest %s)", SGLANG_VERSION,
                time.monotonic() - steps.t0, python, path)
    for title, took in steps.times:
        logger.info("  %6.1f s  %s", took, title)
    return 0


if __name__ == "__main__":
    sys.exit(main())
