"""How each peer is started: the stub upstream, the bare pass-through, onthejob, LiteLLM's proxy."""

from __future__ import annotations

import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

from bench.harness import PY, ROOT, Server, free_port, start_server

LITELLM_VENV = ROOT / "bench" / ".litellm-venv"
# The version the reference figures were measured with; pinned so runs compare.
LITELLM_REQUIREMENT = "litellm[proxy]==1.108.7"
MODEL = "stub-model"


def stub(logdir: Path, cores: set[int] | None) -> Server:
    port = free_port()
    cmd = [PY, "-m", "bench.stub_upstream", "--port", str(port)]
    return start_server("stub", cmd, port, logdir, ready_path="/v1/models", cores=cores)


def passthrough(
    upstream: str, logdir: Path, cores: set[int] | None, workers: int = 1, client: str = "aiohttp"
) -> Server:
    port = free_port()
    cmd = [
        PY,
        "-m",
        "bench.passthrough",
        "--upstream",
        upstream,
        "--port",
        str(port),
        "--workers",
        str(workers),
        "--client",
        client,
    ]
    return start_server("passthrough", cmd, port, logdir, ready_path="/", cores=cores)


def onthejob(
    upstream: str,
    db_url: str,
    spool: Path,
    logdir: Path,
    cores: set[int] | None,
    *,
    record: bool,
    name: str,
    workers: int = 1,
    checkout: Path = ROOT,
) -> Server:
    """``onthejob serve`` from ``checkout`` (this one, or a worktree of another commit to compare with)."""
    port = free_port()
    cmd = [
        PY,
        "-m",
        "onthejob.cli",
        "serve",
        "--upstream",
        upstream,
        "--db",
        db_url,
        "--port",
        str(port),
        "--spool",
        str(spool),
        "--no-auth",
        "--workers",
        str(workers),
    ]
    env = {"ONTHEJOB_RECORD": "1" if record else "0", "PYTHONPATH": str(checkout)}
    return start_server(name, cmd, port, logdir, env=env, cores=cores, cwd=checkout)


def ensure_litellm_venv() -> Path:
    """``bench/.litellm-venv`` with ``litellm[proxy]`` (kept apart: its pins clash with ours); its python."""
    python = LITELLM_VENV / "bin" / "python"
    if not (LITELLM_VENV / "bin" / "litellm").exists():
        print(f"creating {LITELLM_VENV} and installing litellm[proxy] (a few minutes, once)", file=sys.stderr)
        base = os.environ.get("BENCH_BASE_PYTHON") or sys.base_prefix + "/bin/python3"
        subprocess.run([base, "-m", "venv", str(LITELLM_VENV)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", LITELLM_REQUIREMENT], check=True)
    return python


def litellm(upstream: str, logdir: Path, cores: set[int] | None, workers: int = 1) -> Server:
    """LiteLLM's proxy in front of the stub, no master key (like onthejob --no-auth) and no database.

    Its database layer is Prisma, whose engines come from a download host outside the
    package registries (binaries.prisma.sh), unreachable here, so spend logging is off.
    """
    ensure_litellm_venv()
    port = free_port()
    config = logdir / f"litellm-{port}.yaml"
    config.write_text(
        "model_list:\n"
        f"  - model_name: {MODEL}\n"
        "    litellm_params:\n"
        f"      model: openai/{MODEL}\n"
        f"      api_base: {upstream}/v1\n"
        "      api_key: sk-stub\n"
        "litellm_settings:\n"
        "  set_verbose: false\n"
    )
    cmd = [
        str(LITELLM_VENV / "bin" / "litellm"),
        "--config",
        str(config),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--num_workers",
        str(workers),
    ]
    env = {
        "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
        "LITELLM_LOG": "ERROR",
        "LITELLM_TELEMETRY": "False",
        "NO_DOCS": "True",
    }
    return start_server(
        f"litellm-w{workers}", cmd, port, logdir, ready_path="/health/liveliness", env=env, cores=cores, timeout_s=180
    )


def versions() -> dict[str, str]:
    """Versions of what is measured (LiteLLM's read from its own venv)."""
    out = {p: _version(p) for p in ("starlette", "fastapi", "uvicorn", "aiohttp", "uvloop", "httptools", "orjson")}
    out["onthejob"] = _version("onthejob")
    python = LITELLM_VENV / "bin" / "python"
    if python.exists():
        code = "from importlib.metadata import version as v; print(v('litellm'))"
        out["litellm"] = subprocess.run([str(python), "-c", code], capture_output=True, text=True).stdout.strip()
    return out


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "?"
