"""docker-compose.yml without a Docker engine: services, ports, volumes, env wiring, and every
onthejob command line run through the CLI's own argument parser."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
from typing import Any

import pytest
import yaml

from onthejob.cli import build_parser
from storage.keys import check_chosen_secret

ROOT = Path(__file__).resolve().parents[1]
_VAR = re.compile(r"\$\{(\w+)(?::?[-?]([^}]*))?\}")


def dotenv(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def docker_compose(*args: str) -> subprocess.CompletedProcess[str]:
    """Debian's docker-compose 1.29 (no engine needed to read a file); under CI=true a missing one fails."""
    exe = shutil.which("docker-compose")
    if exe is None:
        if os.environ.get("CI") == "true":
            pytest.fail("docker-compose is not installed (.ci/run installs Debian's docker-compose)")
        pytest.skip("docker-compose is not installed (apt-get install docker-compose)")
    return subprocess.run(
        [exe, "--env-file", str(ROOT / ".env.example"), "-f", str(ROOT / "docker-compose.yml"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_docker_compose_accepts_the_file() -> None:
    done = docker_compose("config", "-q")
    assert done.returncode == 0, done.stderr


@pytest.fixture(scope="module")
def env() -> dict[str, str]:
    return dotenv(ROOT / ".env.example")


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    """The file as docker-compose itself resolves it with .env.example (interpolated, normalised)."""
    done = docker_compose("config")
    assert done.returncode == 0, done.stderr
    return yaml.safe_load(done.stdout)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, Any]:
    return compose["services"]  # type: ignore[no-any-return]


def env_of(service: dict[str, Any]) -> dict[str, str]:
    raw = service.get("environment") or {}
    if isinstance(raw, list):
        raw = dict(item.split("=", 1) for item in raw)
    return {k: str(v) for k, v in raw.items()}


def volumes_of(service: dict[str, Any]) -> dict[str, str]:
    """Container path → 'volume:path:ro|rw' for every mount (docker-compose's normalised short form)."""
    return {v.split(":")[1]: v for v in service.get("volumes", [])}


def onthejob_commands(service: dict[str, Any]) -> list[list[str]]:
    """The onthejob command lines a service runs (also inside ``sh -c 'a && exec b'``)."""
    command = service["command"]
    argv = shlex.split(command) if isinstance(command, str) else [str(c) for c in command]
    if argv[:2] == ["sh", "-c"]:
        parts = [shlex.split(part) for part in argv[2].split("&&")]
        argv_list = [p[1:] if p[:1] == ["exec"] else p for p in parts]
    else:
        argv_list = [argv]
    return [a for a in argv_list if a and a[0] == "onthejob"]


def test_housekeeping_is_its_own_service_and_not_the_proxys(services: dict[str, Any]) -> None:
    (argv,) = onthejob_commands(services["housekeep"])
    args = build_parser().parse_args(argv[1:])
    assert args.command == "housekeep" and not args.once
    serve = build_parser().parse_args(onthejob_commands(services["proxy"])[-1][1:])
    assert serve.no_housekeep
    assert services["housekeep"]["depends_on"]["proxy"]["condition"] == "service_healthy"  # migrated by then
    assert "deploy" not in services["housekeep"]


def test_the_monitor_watches_the_database_and_probes_the_engine(services: dict[str, Any]) -> None:
    (argv,) = onthejob_commands(services["monitor"])
    args = build_parser().parse_args(argv[1:])
    assert (args.command, args.watch, args.drift_engine) == ("monitor", True, "http://vllm:8000")
    assert "deploy" not in services["monitor"]


def test_the_judge_watches_and_posts_through_the_proxy(services: dict[str, Any]) -> None:
    (argv,) = onthejob_commands(services["judge"])
    args = build_parser().parse_args(argv[1:])
    assert (args.command, args.watch, args.proxy) == ("judge", True, "http://proxy:8000")
    assert services["judge"]["depends_on"]["proxy"]["condition"] == "service_healthy"
    assert "deploy" not in services["judge"]  # no GPU: it asks the served model through the proxy


def test_postgres_has_a_volume_and_a_healthcheck(services: dict[str, Any]) -> None:
    pg = services["postgres"]
    assert "/var/lib/postgresql/data" in volumes_of(pg)
    assert "pg_isready" in " ".join(pg["healthcheck"]["test"])
    assert env_of(pg)["POSTGRES_PASSWORD"], ".env.example must give the password a value"


def test_database_url_points_every_onthejob_service_at_postgres(services: dict[str, Any]) -> None:
    pg = env_of(services["postgres"])
    want = f"postgresql://{pg['POSTGRES_USER']}:{pg['POSTGRES_PASSWORD']}@postgres:5432/{pg['POSTGRES_DB']}"
    for name in ("proxy", "housekeep", "trainer", "judge", "monitor"):
        assert env_of(services[name])["DATABASE_URL"] == want, name
    assert services["proxy"]["depends_on"]["postgres"]["condition"] == "service_healthy"


def test_vllm_is_the_gpu_image_with_runtime_lora_and_processed_logprobs(services: dict[str, Any]) -> None:
    vllm = services["vllm"]
    args = [str(a) for a in vllm["command"]]
    assert "--enable-lora" in args  # runtime loading: the proxy hot-loads each published version
    assert args[args.index("--logprobs-mode") + 1] == "processed_logprobs"  # what TIS's ratio is taken against
    assert env_of(vllm)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"] == "True"
    serve = build_parser().parse_args(onthejob_commands(services["proxy"])[-1][1:])
    assert serve.upstream == [f"http://vllm:{args[args.index('--port') + 1]}"]
    gpus = vllm["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d["capabilities"] for d in gpus)


def test_adapters_are_shared_read_only_by_the_engine_at_the_same_path(services: dict[str, Any]) -> None:
    # The proxy asks vLLM to load the path the trainer recorded, so both must see /adapters.
    engine, trainer = volumes_of(services["vllm"])["/adapters"], volumes_of(services["trainer"])["/adapters"]
    assert engine == "adapters:/adapters:ro"
    assert trainer == "adapters:/adapters:rw"


def test_engine_and_trainer_load_the_same_model_folder(services: dict[str, Any]) -> None:
    engine_args = [str(a) for a in services["vllm"]["command"]]
    train_argv = onthejob_commands(services["trainer"])[0]
    model_dir = engine_args[engine_args.index("--model") + 1]
    assert train_argv[train_argv.index("--model") + 1] == model_dir
    assert model_dir.startswith("/cache/")
    for name in ("vllm", "trainer"):
        assert volumes_of(services[name])["/cache"] == "models:/cache:ro", name
    assert volumes_of(services["model"])["/cache"] == "models:/cache:rw"
    assert env_of(services["model"])["ONTHEJOB_CACHE"] == "/cache"
    assert services["vllm"]["depends_on"]["model"]["condition"] == "service_completed_successfully"


def test_trainer_alias_is_the_served_model_name(services: dict[str, Any]) -> None:
    engine_args = [str(a) for a in services["vllm"]["command"]]
    served = engine_args[engine_args.index("--served-model-name") + 1]
    args = build_parser().parse_args(onthejob_commands(services["trainer"])[0][1:])
    assert args.alias == served


def test_proxy_migrates_then_serves_the_engine_on_all_interfaces(services: dict[str, Any]) -> None:
    proxy = services["proxy"]
    upgrade, serve = (build_parser().parse_args(argv[1:]) for argv in onthejob_commands(proxy))
    assert (upgrade.command, upgrade.db_command) == ("db", "upgrade")
    assert serve.command == "serve"
    assert serve.upstream == ["http://vllm:8000"]
    assert serve.host == "0.0.0.0"
    assert serve.port == proxy["ports"][0]["target"]
    assert serve.spool in volumes_of(proxy)
    assert not serve.no_auth


def test_trainer_watches_and_deploys_through_the_proxy(services: dict[str, Any]) -> None:
    (argv,) = onthejob_commands(services["trainer"])
    args = build_parser().parse_args(argv[1:])
    assert args.command == "train" and args.watch and not args.no_deploy
    serve = build_parser().parse_args(onthejob_commands(services["proxy"])[-1][1:])
    assert args.proxy == f"http://proxy:{serve.port}"
    assert args.adapters == "/adapters"
    # One .env value is the proxy's bootstrap admin key and the trainer's deploy key: no manual step.
    key = env_of(services["trainer"])["ONTHEJOB_ADMIN_KEY"]
    assert key == env_of(services["proxy"])["ONTHEJOB_ADMIN_KEY"]
    with pytest.raises(ValueError, match="still the placeholder"):
        check_chosen_secret(key)  # the proxy refuses .env.example's value: an operator must choose one
    check_chosen_secret("otj-" + "x" * 40)
    gpus = services["trainer"]["deploy"]["resources"]["reservations"]["devices"]
    assert any("gpu" in d["capabilities"] for d in gpus)


def test_every_named_volume_is_declared(compose: dict[str, Any]) -> None:
    declared = set(compose["volumes"])
    used = {v.split(":")[0] for svc in compose["services"].values() for v in svc.get("volumes", [])}
    assert used == declared


def test_dockerfile_installs_the_way_run_does() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "./run bootstrap" in text
    # Every package pyproject installs (read from it, so a new package cannot be forgotten) and migrations.
    include = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    for folder in [p.removesuffix("*") for p in include] + ["migrations"]:
        assert f"COPY {folder} " in text, folder


def test_env_example_names_every_variable_compose_reads(env: dict[str, str]) -> None:
    used = set(m.group(1) for m in _VAR.finditer((ROOT / "docker-compose.yml").read_text()))
    assert used <= set(env), sorted(used - set(env))
