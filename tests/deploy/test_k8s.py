"""deploy/k8s without a cluster: the base and both overlays rendered by ``kubectl kustomize``, every
manifest checked against the Kubernetes API schemas (kubernetes-validate, offline, strict), and every
command line run through the parser of the program it starts (onthejob's own, torchrun's)."""

from __future__ import annotations

import copy
import inspect
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from onthejob.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy" / "k8s"
BUILDS = {
    "base": K8S / "base",
    "single-node-cpu": K8S / "overlays" / "single-node-cpu",
    "gpu-cluster": K8S / "overlays" / "gpu-cluster",
}
GPU_BUILDS = ("base", "gpu-cluster")
# preStop.sleep needs 1.30; the newest schemas kubernetes-validate ships.
KUBERNETES_VERSIONS = ("1.30.0", kubernetes_validate.latest_version())
WORKLOADS = {"Deployment", "StatefulSet", "Job"}
SECRET_ENV = {"DATABASE_URL", "ONTHEJOB_ADMIN_KEY", "ONTHEJOB_JUDGE_KEY", "POSTGRES_PASSWORD"}
_REF = re.compile(r"\$\((\w+)\)")
_COMPOSE_VAR = re.compile(r"\$\{(\w+)(?::?[-?]([^}]*))?\}")

Doc = dict[str, Any]


def kustomize(folder: Path) -> str:
    """The operator's command, ``kubectl kustomize FOLDER`` (or the standalone ``kustomize build``)."""
    if kubectl := shutil.which("kubectl"):
        argv = [kubectl, "kustomize", str(folder)]
    elif standalone := shutil.which("kustomize"):
        argv = [standalone, "build", str(folder)]
    elif os.environ.get("CI"):
        pytest.fail("neither kubectl nor kustomize is on PATH: CI renders deploy/k8s with one of them")
    else:
        pytest.skip("neither kubectl nor kustomize is on PATH")
    return subprocess.run(argv, check=True, capture_output=True, text=True, timeout=60).stdout


@pytest.fixture(scope="module")
def rendered() -> dict[str, list[Doc]]:
    return {name: [d for d in yaml.safe_load_all(kustomize(path)) if d] for name, path in BUILDS.items()}


def one(docs: list[Doc], kind: str, name: str) -> Doc:
    (doc,) = [d for d in docs if d["kind"] == kind and d["metadata"]["name"] == name]
    return doc


def pod(doc: Doc) -> Doc:
    return doc["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def containers(docs: list[Doc]) -> list[tuple[Doc, Doc]]:
    return [(d, c) for d in docs if d["kind"] in WORKLOADS for c in pod(d)["containers"]]


def env(container: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in container.get("env", [])}


def argv(container: Doc, **extra: str) -> list[str]:
    """command + args as the kubelet runs them: ``$(VAR)`` expanded from the container's own env."""
    values = {k: e["value"] for k, e in env(container).items() if "value" in e} | extra
    out = []
    for arg in [*container.get("command", []), *container.get("args", [])]:
        for ref in _REF.findall(arg):
            assert ref in values, f"{container['name']}: $({ref}) names no variable of the container"
        out.append(_REF.sub(lambda m: values[m.group(1)], arg))
    return out


def onthejob_argv(container: Doc) -> list[str] | None:
    """The ``onthejob`` arguments a container runs (directly, or under torchrun -m onthejob.cli)."""
    args = argv(container, JOB_COMPLETION_INDEX="0")
    if not args:  # the image's own entrypoint (vLLM's, Postgres's)
        return None
    if args[0] == "onthejob":
        return args[1:]
    if args[0] == "torchrun":
        from torch.distributed.run import get_args_parser

        run = get_args_parser().parse_args(args[1:])
        assert run.module and run.training_script == "onthejob.cli"
        return list(run.training_script_args)
    return None


def flag(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


def engines(docs: list[Doc]) -> list[Doc]:
    return [
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["labels"]["app.kubernetes.io/name"] == "engine"
    ]


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("build", BUILDS)
def test_every_manifest_is_valid_against_the_api_schemas(
    rendered: dict[str, list[Doc]], build: str, version: str
) -> None:
    assert rendered[build]
    for doc in rendered[build]:
        kubernetes_validate.validate(doc, version, strict=True)


def test_the_schema_check_rejects_a_misspelt_field_and_a_wrong_type(rendered: dict[str, list[Doc]]) -> None:
    proxy = one(rendered["base"], "StatefulSet", "proxy")
    misspelt, wrong = copy.deepcopy(proxy), copy.deepcopy(proxy)
    misspelt["spec"]["volumeClaimTemplate"] = misspelt["spec"].pop("volumeClaimTemplates")
    wrong["spec"]["template"]["spec"]["terminationGracePeriodSeconds"] = "ninety"
    for doc in (misspelt, wrong):
        with pytest.raises(kubernetes_validate.ValidationError):
            kubernetes_validate.validate(doc, KUBERNETES_VERSIONS[-1], strict=True)


@pytest.mark.parametrize("build", BUILDS)
def test_every_onthejob_command_is_accepted_by_the_cli_parser(rendered: dict[str, list[Doc]], build: str) -> None:
    parsed = {}
    for doc, container in containers(rendered[build]):
        args = onthejob_argv(container)
        if args is None:
            continue
        parsed[doc["metadata"]["name"]] = build_parser().parse_args(args).command
        assert container["image"].split(":")[0].endswith("onthejob"), doc["metadata"]["name"]
    want = {
        "migrate": "db",
        "proxy": "serve",
        "trainer": "train",
        "judge": "judge",
        "housekeep": "housekeep",
        "monitor": "monitor",
    }
    if build == "single-node-cpu":
        want["engine-0"] = "engine"
    assert parsed == want
    prepare = one(rendered[build], "Job", "model-prepare")["spec"]["template"]["spec"]["containers"][0]
    assert prepare["command"][:2] == ["python", "-c"]
    compile(prepare["command"][2], "model-prepare", "exec")
    assert prepare["command"][2] == "from engine.weights import resolve_model; print(resolve_model('default').path)"


@pytest.mark.parametrize("build", BUILDS)
def test_proxy_is_a_statefulset_with_a_spool_volume_per_replica_probes_and_a_budget(
    rendered: dict[str, list[Doc]], build: str
) -> None:
    docs = rendered[build]
    sts = one(docs, "StatefulSet", "proxy")
    (container,) = pod(sts)["containers"]
    args = build_parser().parse_args(onthejob_argv(container))
    assert args.host == "0.0.0.0" and args.no_housekeep and not args.no_auth
    (template,) = sts["spec"]["volumeClaimTemplates"]
    assert template["spec"]["accessModes"] == ["ReadWriteOnce"]
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    assert mounts[args.spool] == template["metadata"]["name"]
    assert not [v for v in pod(sts).get("volumes", []) if "emptyDir" in v]
    assert sts["spec"]["persistentVolumeClaimRetentionPolicy"]["whenScaled"] == "Retain"
    port = {p["name"]: p["containerPort"] for p in container["ports"]}["http"]
    assert port == args.port
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    pdb = one(docs, "PodDisruptionBudget", "proxy")
    assert selects(pdb["spec"]["selector"]["matchLabels"], sts["spec"]["template"]["metadata"]["labels"])
    assert pdb["spec"]["maxUnavailable"] == 1
    service = one(docs, "Service", "proxy")
    assert selects(service["spec"]["selector"], sts["spec"]["template"]["metadata"]["labels"])
    assert service["spec"]["sessionAffinity"] == "ClientIP"
    assert one(docs, "Service", sts["spec"]["serviceName"])["spec"]["clusterIP"] == "None"
    # Every engine by its own Service URL, and nothing else.
    services = [s for s in docs if s["kind"] == "Service"]
    to_engines = [s for s in services if any(selects(s["spec"]["selector"], pod_labels(e)) for e in engines(docs))]
    urls = {f"http://{s['metadata']['name']}:{s['spec']['ports'][0]['port']}" for s in to_engines}
    assert sorted(args.upstream) == sorted(urls) and len(urls) == len(engines(docs)) >= 1
    assert {"base": 2, "single-node-cpu": 1, "gpu-cluster": 3}[build] == sts["spec"]["replicas"]


def test_the_grace_period_covers_what_serve_does_on_sigterm(rendered: dict[str, list[Doc]]) -> None:
    """preStop, uvicorn's graceful shutdown, the app's wait for calls in flight, its background tasks'
    cancels, the housekeeping job under way and the final spool drain, each at its bound."""
    import proxy.main
    import proxy.state as st

    uvicorn_s = int(re.search(r'"timeout_graceful_shutdown": (\d+)', inspect.getsource(proxy.main)).group(1))  # type: ignore[union-attr]
    inflight_s = inspect.signature(st.AppState.stop).parameters["grace_s"].default
    app_s = inflight_s + st.STOP_CANCEL_WAIT_S * st.STOP_CANCEL_TRIES + st.STOP_HOUSEKEEPER_S + st.STOP_DRAIN_S
    for build in BUILDS:
        spec = pod(one(rendered[build], "StatefulSet", "proxy"))
        pre_stop = spec["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
        assert spec["terminationGracePeriodSeconds"] >= pre_stop + uvicorn_s + app_s, build


@pytest.mark.parametrize("build", BUILDS)
def test_engines_load_adapters_read_only_and_the_trainers_model(rendered: dict[str, list[Doc]], build: str) -> None:
    docs = rendered[build]
    assert len(engines(docs)) == (2 if build == "gpu-cluster" else 1)
    train = build_parser().parse_args(onthejob_argv(pod(one(docs, "Job", "trainer"))["containers"][0]))
    claims = {p["metadata"]["name"] for p in docs if p["kind"] == "PersistentVolumeClaim"}
    for deployment in engines(docs):
        assert deployment["spec"]["replicas"] == 1
        spec = pod(deployment)
        (container,) = spec["containers"]
        volumes = {v["name"]: v for v in spec["volumes"]}
        for mount in container["volumeMounts"]:
            if mount["mountPath"] in ("/adapters", "/cache"):
                assert mount["readOnly"] is True
                assert volumes[mount["name"]]["persistentVolumeClaim"]["readOnly"] is True
                assert volumes[mount["name"]]["persistentVolumeClaim"]["claimName"] in claims
        assert {m["mountPath"] for m in container["volumeMounts"]} >= {"/adapters", "/cache"}
        if build in GPU_BUILDS:
            args = container["args"]
            assert container["image"].startswith("vllm/vllm-openai:")
            assert "--enable-lora" in args and flag(args, "--logprobs-mode") == "processed_logprobs"
            assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
            assert env(container)["VLLM_ALLOW_RUNTIME_LORA_UPDATING"]["value"] == "True"
            assert flag(args, "--served-model-name") == train.alias
            model = flag(args, "--model")
        else:
            engine = build_parser().parse_args(onthejob_argv(container))
            assert engine.host == "0.0.0.0" and "nvidia.com/gpu" not in str(container["resources"])
            model = engine.model
        assert model == train.model and model.startswith("/cache/")
    for a in engines(docs):  # each engine's Service reaches its own pod only
        (service,) = [s for s in docs if s["kind"] == "Service" and s["metadata"]["name"] == a["metadata"]["name"]]
        for b in engines(docs):
            assert selects(service["spec"]["selector"], pod_labels(b)) == (a is b)


def pod_labels(doc: Doc) -> dict[str, str]:
    return doc["spec"]["template"]["metadata"]["labels"]  # type: ignore[no-any-return]


def test_the_engine_arguments_are_docker_composes() -> None:
    """The same vLLM command line as docker-compose.yml's, its ${VAR:-default} filled from .env.example."""
    lines = (ROOT / ".env.example").read_text().splitlines()
    values = dict(line.split("=", 1) for line in lines if "=" in line and not line.lstrip().startswith("#"))
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    want = [
        _COMPOSE_VAR.sub(lambda m: values.get(m.group(1), m.group(2) or ""), str(a))
        for a in compose["services"]["vllm"]["command"]
    ]
    engine = yaml.safe_load((K8S / "engine" / "engine.yaml").read_text().split("---")[1])
    assert pod(engine)["containers"][0]["args"] == want


@pytest.mark.parametrize("build", BUILDS)
def test_trainer_is_an_indexed_job_under_torchrun_across_its_pods(rendered: dict[str, list[Doc]], build: str) -> None:
    from torch.distributed.run import get_args_parser

    docs = rendered[build]
    job = one(docs, "Job", "trainer")
    spec = pod(job)
    (container,) = spec["containers"]
    run = get_args_parser().parse_args(argv(container, JOB_COMPLETION_INDEX="1")[1:])
    nodes = int(run.nnodes)
    assert job["spec"]["completionMode"] == "Indexed"
    assert job["spec"]["completions"] == job["spec"]["parallelism"] == nodes == (2 if build == "gpu-cluster" else 1)
    assert run.node_rank == 1  # each pod's rank is its completion index
    fieldpath = env(container)["JOB_COMPLETION_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
    assert fieldpath == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    # Pod 0 of the Job is the rendezvous, reached by its name in the headless Service.
    assert run.master_addr == f"{job['metadata']['name']}-0.{spec['subdomain']}"
    service = one(docs, "Service", spec["subdomain"])
    assert service["spec"]["clusterIP"] == "None" and selects(service["spec"]["selector"], pod_labels(job))
    assert int(run.master_port) in {p["port"] for p in service["spec"]["ports"]}
    gpus = container["resources"].get("limits", {}).get("nvidia.com/gpu")
    assert gpus == (int(run.nproc_per_node) if build in GPU_BUILDS else None)
    train = build_parser().parse_args(onthejob_argv(container))
    assert train.watch and not train.no_deploy and train.adapters == "/adapters"
    serve = build_parser().parse_args(onthejob_argv(pod(one(docs, "StatefulSet", "proxy"))["containers"][0]))
    assert train.proxy == f"http://proxy:{serve.port}"
    adapters = [m for m in container["volumeMounts"] if m["mountPath"] == "/adapters"]
    assert adapters and not adapters[0].get("readOnly")


@pytest.mark.parametrize("build", BUILDS)
def test_judge_and_housekeep_are_deployments(rendered: dict[str, list[Doc]], build: str) -> None:
    docs = rendered[build]
    judge = build_parser().parse_args(onthejob_argv(pod(one(docs, "Deployment", "judge"))["containers"][0]))
    assert judge.watch and judge.proxy == "http://proxy:8000"
    housekeep = build_parser().parse_args(onthejob_argv(pod(one(docs, "Deployment", "housekeep"))["containers"][0]))
    assert housekeep.command == "housekeep" and not housekeep.once
    migrate = build_parser().parse_args(onthejob_argv(pod(one(docs, "Job", "migrate"))["containers"][0]))
    assert (migrate.command, migrate.db_command, migrate.revision) == ("db", "upgrade", "head")


@pytest.mark.parametrize("build", BUILDS)
def test_secrets_come_only_from_secret_references(rendered: dict[str, list[Doc]], build: str) -> None:
    docs = rendered[build]
    assert not [d for d in docs if d["kind"] == "Secret"]  # the operator creates them (docs/kubernetes.md)
    assert not re.search(r"://[^/\s:@]+:[^/\s@]+@", yaml.safe_dump_all(docs))  # no URL with a password
    refs = set()
    for doc, container in containers(docs):
        for name, item in env(container).items():
            if name in SECRET_ENV:
                assert "value" not in item, (doc["metadata"]["name"], name)
                ref = item["valueFrom"]["secretKeyRef"]
                refs.add((ref["name"], ref["key"]))
        if onthejob_argv(container) is not None and doc["metadata"]["name"] != "engine-0":
            assert "DATABASE_URL" in env(container), doc["metadata"]["name"]
    want = {("onthejob-database", "url"), ("onthejob-admin", "key")}
    assert refs == want | ({("onthejob-postgres", "password")} if build == "single-node-cpu" else set())


@pytest.mark.parametrize("build", BUILDS)
def test_postgres_is_external_unless_the_component_is_included(rendered: dict[str, list[Doc]], build: str) -> None:
    docs = rendered[build]
    postgres = [d for d in docs if d["metadata"]["name"] == "postgres"]
    if build == "single-node-cpu":
        assert {d["kind"] for d in postgres} == {"StatefulSet", "Service"}
        sts = one(docs, "StatefulSet", "postgres")
        assert sts["spec"]["volumeClaimTemplates"][0]["metadata"]["name"] == "pgdata"
    else:
        assert postgres == []


@pytest.mark.parametrize("build", BUILDS)
def test_shared_volumes_are_read_write_many_on_a_cluster(rendered: dict[str, list[Doc]], build: str) -> None:
    docs = rendered[build]
    claims = {d["metadata"]["name"]: d["spec"]["accessModes"] for d in docs if d["kind"] == "PersistentVolumeClaim"}
    want = ["ReadWriteOnce"] if build == "single-node-cpu" else ["ReadWriteMany"]
    assert claims == {"adapters": want, "models": want}
    for doc in docs:  # every claim a pod names is rendered (or comes from its StatefulSet's templates)
        if doc["kind"] in WORKLOADS:
            templates = {t["metadata"]["name"] for t in doc["spec"].get("volumeClaimTemplates", [])}
            for volume in pod(doc).get("volumes", []):
                if "persistentVolumeClaim" in volume:
                    assert volume["persistentVolumeClaim"]["claimName"] in claims, doc["metadata"]["name"]
            mounts = {m["name"] for c in pod(doc)["containers"] for m in c.get("volumeMounts", [])}
            assert mounts <= {v["name"] for v in pod(doc).get("volumes", [])} | templates, doc["metadata"]["name"]
