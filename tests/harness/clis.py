"""The two coding-agent CLIs, from npm into a cache folder, and how each is pointed at the proxy with nothing else.

``.ci/run`` installs them (:data:`PACKAGES`, pinned) into ``.cache/npm-cli``; a test installs
them itself when the folder lacks them. Each run gets a fresh home folder, so no user
setting or login leaks in, and only the documented settings below:

* Claude Code: ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY``; every model slot (main, the
  haiku-class side calls) named as the engine's model; ``DISABLE_TELEMETRY``,
  ``DISABLE_AUTOUPDATER``, ``DISABLE_ERROR_REPORTING``, ``DISABLE_BUG_COMMAND`` and
  ``CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC``; output capped by ``CLAUDE_CODE_MAX_OUTPUT_TOKENS``.
* Codex: a ``config.toml`` in a temporary ``CODEX_HOME`` whose model provider's ``base_url`` is
  the proxy's ``/v1`` with ``wire_api = "responses"``; ``check_for_update_on_startup = false``,
  ``[analytics]`` and ``[feedback]`` off, ``[otel] exporter = "none"``, and ``[features] plugins = false``
  (by default it syncs its plugin marketplace: git to github.com, api.github.com, chatgpt.com). Codex 0.171 has no
  setting that caps a reply's tokens (it sends no ``max_output_tokens``); the model ends its
  turns after about ten tokens (engine/tiny_long.py).

Both also get ``HTTP_PROXY``/``HTTPS_PROXY`` pointing at a trap (tests/harness/tap.py) with
``NO_PROXY`` for 127.0.0.1 only, so an attempt to reach any other address is seen.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CLI_DIR = Path(os.environ.get("ONTHEJOB_NPM_CLI", ROOT / ".cache" / "npm-cli"))
PACKAGES = {"@anthropic-ai/claude-code": "2.1.197", "@openai/codex": "0.171.0"}
MAX_OUTPUT_TOKENS = 256


class NpmUnavailable(Exception):
    """npm (or its registry) could not provide the CLIs."""


def installed() -> bool:
    for name, version in PACKAGES.items():
        manifest = CLI_DIR / "node_modules" / name / "package.json"
        if not manifest.is_file() or json.loads(manifest.read_text()).get("version") != version:
            return False
    return all((CLI_DIR / "node_modules" / ".bin" / b).exists() for b in ("claude", "codex"))


def ensure_installed() -> Path:
    """The folder of the CLIs' executables, installing the pinned versions first when they are missing."""
    if not installed():
        npm = shutil.which("npm")
        if npm is None:
            raise NpmUnavailable("npm is not on PATH")
        CLI_DIR.mkdir(parents=True, exist_ok=True)
        specs = [f"{name}@{version}" for name, version in PACKAGES.items()]
        cmd = [npm, "install", "--prefix", str(CLI_DIR), "--no-audit", "--no-fund", "--no-save", *specs]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600, check=False)
        if done.returncode != 0 or not installed():
            raise NpmUnavailable(f"npm install failed ({done.returncode}): {done.stderr[-2000:]}")
    return CLI_DIR / "node_modules" / ".bin"


def _base_env(home: Path, trap: str) -> dict[str, str]:
    return {
        "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "HTTP_PROXY": trap,
        "HTTPS_PROXY": trap,
        "http_proxy": trap,
        "https_proxy": trap,
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
    }


def claude_env(home: Path, proxy_url: str, model: str, trap: str) -> dict[str, str]:
    """Claude Code's environment: the proxy as its API, the engine's model in every slot, nothing outbound."""
    return {
        **_base_env(home, trap),
        "CLAUDE_CONFIG_DIR": str(home / ".claude"),
        "ANTHROPIC_BASE_URL": proxy_url,
        "ANTHROPIC_API_KEY": "sk-onthejob-test",
        "ANTHROPIC_MODEL": model,
        "ANTHROPIC_DEFAULT_OPUS_MODEL": model,
        "ANTHROPIC_DEFAULT_SONNET_MODEL": model,
        "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
        "ANTHROPIC_SMALL_FAST_MODEL": model,
        "DISABLE_TELEMETRY": "1",
        "DISABLE_AUTOUPDATER": "1",
        "DISABLE_ERROR_REPORTING": "1",
        "DISABLE_BUG_COMMAND": "1",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "CLAUDE_CODE_MAX_OUTPUT_TOKENS": str(MAX_OUTPUT_TOKENS),
    }


def codex_env(home: Path, proxy_v1: str, model: str, trap: str) -> dict[str, str]:
    """Codex's environment, with its config.toml written into a fresh CODEX_HOME."""
    codex_home = home / ".codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        f"""model = "{model}"
model_provider = "onthejob"
check_for_update_on_startup = false
model_context_window = 60000

[analytics]
enabled = false

[feedback]
enabled = false

[otel]
exporter = "none"

[features]
plugins = false

[model_providers.onthejob]
name = "onthejob"
base_url = "{proxy_v1}"
env_key = "ONTHEJOB_API_KEY"
wire_api = "responses"
request_max_retries = 0
stream_max_retries = 0
"""
    )
    return {**_base_env(home, trap), "CODEX_HOME": str(codex_home), "ONTHEJOB_API_KEY": "unused"}
