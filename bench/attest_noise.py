"""Attestation under load: false alerts and caught swaps of the calibrated fingerprint (proxy/attest.py).

On a real engine (the tiny model by default, ``--model default`` for the demo's), a few LoRA versions
are made the way consecutive training steps make them: v1 small, each next version v1's weights plus a
small random step, and another alias's adapter of the same size. Each version's fingerprint is recorded
as the proxy records it (:func:`proxy.fingerprint.calibrate`: serial and concurrent repeats, noise,
tolerance, separation from the base and the previous version). Then, ``--tries`` times, every model is
probed (all at once) while ``--load`` calls are in flight, and each probe is compared with every fingerprint:

- false alert: vN's own probe found different from vN's fingerprint;
- caught: the previous version, the base model, or the other alias's adapter, served under vN's name
  (a swap), found different from vN's fingerprint.

With ``--adapters DIR`` the versions are a trained alias's own (``DIR/v1`` … ``DIR/vN``, as the trainer
files them; the demo's are ``demo-out/adapters/<project>/<alias>``) instead of made-up steps.

Run: ``python -m bench.attest_noise --tries 20`` (``--model default`` for SmolLM2-135M;
``--model default --adapters demo-out/adapters/demo/math`` for the demo's own v1 … v6).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from engine.launcher import Engine, EngineConfig
from engine.weights import ModelInfo, resolve_model
from proxy.fingerprint import calibrate, distance, parse_probe, probe_body, repeats, same
from tests.adapters import light_adapter


def trained_versions(folder: Path) -> list[Path]:
    """``folder``'s version folders ``v1`` … ``vN`` in version order (the trainer's names)."""
    found = sorted(
        (int(p.name[1:]), p) for p in folder.iterdir() if p.is_dir() and p.name[:1] == "v" and p.name[1:].isdigit()
    )
    if not found:
        raise SystemExit(f"{folder} holds no version folders v1 ... vN")
    return [p for _, p in found]


def like(first: Path) -> dict[str, Any]:
    """``light_adapter``'s arguments for another alias's adapter of ``first``'s rank, targets and B's spread."""
    import numpy as np
    from safetensors.numpy import load_file

    config = json.loads((first / "adapter_config.json").read_text())
    bs = [t for name, t in load_file(str(first / "adapter_model.safetensors")).items() if "lora_B" in name]
    scale = float(np.sqrt(np.mean([np.mean(np.square(t.astype(np.float64))) for t in bs])))
    return {"rank": int(config["r"]), "targets": sorted(config["target_modules"]), "scale": scale}


def stepped_versions(model: ModelInfo, out: Path, n: int, scale: float, step: float, seed: int) -> list[Path]:
    """v1 … vN: v1 with B ~ N(0, scale), each next one the previous plus a step of B ~ N(0, step)."""
    import numpy as np
    from safetensors.numpy import load_file, save_file

    first = light_adapter(model, out / "v1", seed=seed, scale=scale)
    paths, rng = [first], np.random.default_rng(seed + 1)
    for v in range(2, n + 1):
        tensors = load_file(str(paths[-1] / "adapter_model.safetensors"))
        for name, t in tensors.items():
            if "lora_B" in name:
                tensors[name] = (t + rng.normal(0, step, t.shape)).astype(np.float32)
        folder = out / f"v{v}"
        folder.mkdir(parents=True)
        save_file(tensors, str(folder / "adapter_model.safetensors"))
        (folder / "adapter_config.json").write_text((first / "adapter_config.json").read_text())
        paths.append(folder)
    return paths


async def probe(client: httpx.AsyncClient, url: str, model: str) -> dict[str, Any]:
    reply = await client.post(f"{url}/v1/completions", json=probe_body(model), timeout=600)
    reply.raise_for_status()
    return parse_probe(reply.json())


async def record(
    client: httpx.AsyncClient, url: str, model: str, base: str, others: dict[str, str], known_noise: float
) -> dict[str, Any]:
    """A fingerprint as the proxy records it (serial repeats, then concurrent ones beside filler calls to the
    version and ``base``, separation from ``others``, the noise measured before on the engine, ``known_noise``,
    as proxy/attest.py passes it)."""
    samples = await repeats(
        lambda: probe(client, url, model),
        lambda body: client.post(f"{url}/v1/completions", json=body, timeout=600),
        [model, base],
    )
    assert samples is not None  # probe() raises rather than answer None
    measured = {label: await probe(client, url, name) for label, name in others.items()}
    return calibrate(samples, measured, known_noise)


async def load(client: httpx.AsyncClient, url: str, models: list[str], stop: asyncio.Event, calls: list[int]) -> None:
    """One of the concurrent callers: chat-like completions to random models until ``stop``."""
    rng = random.Random(id(calls) + len(calls))
    while not stop.is_set():
        body = {
            "model": rng.choice(models),
            "prompt": f"Question {rng.randint(1, 10**6)}: what is 12 + 30?",
            "max_tokens": 32,
            "temperature": 0.8,
        }
        try:
            await client.post(f"{url}/v1/completions", json=body, timeout=600)
        finally:
            calls.append(1)


async def bench(
    url: str, model: ModelInfo, names: list[str], other: str, tries: int, concurrency: int
) -> dict[str, Any]:
    limits = httpx.Limits(max_connections=concurrency + 16, max_keepalive_connections=concurrency + 16)
    async with httpx.AsyncClient(limits=limits) as client:
        fps: dict[str, dict[str, Any]] = {}
        for i, name in enumerate(names):
            others = {"base": model.name, **({f"v{i}": names[i - 1]} if i else {})}
            known = max((fp["noise"] for fp in fps.values() if fp["noise"] != float("inf")), default=0.0)
            fps[name] = await record(client, url, name, model.name, others, known)
            fp = fps[name]
            print(
                f"recorded {name}: noise {fp['noise']:.4f} tolerance {fp['tolerance']:.4f} verdict {fp['verdict']}",
                flush=True,
            )
        stop, calls = asyncio.Event(), []
        served = [*names, other, model.name]
        callers = [asyncio.create_task(load(client, url, served, stop, calls)) for _ in range(concurrency)]
        counts = {name: {"false": 0, "prev": 0, "base": 0, "other": 0, "dist": []} for name in names}
        started = time.monotonic()
        try:
            await asyncio.sleep(2)  # the callers' first calls are in flight
            for k in range(tries):
                # every model at once, while `concurrency` calls run
                probes = dict(zip(served, await asyncio.gather(*(probe(client, url, m) for m in served)), strict=True))
                for i, name in enumerate(names):
                    c, fp = counts[name], fps[name]
                    c["false"] += not same(fp, probes[name])
                    c["dist"].append(distance(fp, probes[name]))
                    c["prev"] += i > 0 and not same(fp, probes[names[i - 1]])
                    c["base"] += not same(fp, probes[model.name])
                    c["other"] += not same(fp, probes[other])
                false = sum(c["false"] for c in counts.values())
                swaps = (k + 1) * (2 * len(names) + len(names) - 1)  # base and other for each, prev after v1
                missed = swaps - sum(c["prev"] + c["base"] + c["other"] for c in counts.values())
                print(
                    f"try {k + 1}/{tries}: {time.monotonic() - started:.0f} s, {len(calls)} load calls; so far "
                    f"{false} false alerts, {missed} swaps missed",
                    flush=True,
                )
        finally:
            stop.set()
            await asyncio.gather(*callers, return_exceptions=True)
        return {
            "fingerprints": fps,
            "counts": counts,
            "load_calls": len(calls),
            "seconds": round(time.monotonic() - started, 1),
        }


def table(result: dict[str, Any], names: list[str], tries: int) -> str:
    rows = [
        f"{'version':>8} {'noise':>8} {'tol':>8} {'d(prev)':>8} {'d(base)':>8} {'verdict':>12} "
        f"{'max d(self)':>11} {'false alerts':>12} {'prev caught':>11} {'base caught':>11} {'other caught':>12}"
    ]
    for i, name in enumerate(names):
        fp, c = result["fingerprints"][name], result["counts"][name]
        sep = fp["separation"]
        prev, base = (_nats(sep.get(key)) for key in (f"v{i}", "base"))
        rows.append(
            f"{'v' + str(i + 1):>8} {fp['noise']:>8.4f} {fp['tolerance']:>8.4f} {prev if i else '-':>8} {base:>8} "
            f"{fp['verdict']:>12} {max(c['dist']):>11.4f} {c['false']:>9}/{tries:<2} "
            f"{(str(c['prev']) + '/' + str(tries)) if i else '-':>11} {c['base']:>8}/{tries:<2} "
            f"{c['other']:>9}/{tries:<2}"
        )
    return "\n".join(rows)


def _nats(value: float | None) -> str:
    """A stored separation (None: infinite, the probes could not be compared)."""
    return "inf" if value is None else f"{value:.4f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="tiny")
    parser.add_argument("--versions", type=int, default=3)
    parser.add_argument("--tries", type=int, default=20)
    parser.add_argument("--load", type=int, default=48, help="calls in flight during every probe")
    parser.add_argument("--scale", type=float, default=0.02, help="std of v1's LoRA B")
    parser.add_argument("--step", type=float, default=0.005, help="std of each next version's step in LoRA B")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--adapters", type=Path, help="a trained alias's folder (v1 ... vN in it): its own versions")
    parser.add_argument("--url", help="an engine already serving --model (else one is started)")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args()
    # A SIGTERM (timeout, kill) ends through the `finally` below, so the engine this started stops with it.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    model = resolve_model(args.model)
    tmp = Path(tempfile.mkdtemp(prefix="attest-noise-"))
    trained = trained_versions(args.adapters.resolve()) if args.adapters else None
    versions = len(trained) if trained else args.versions
    engine = None
    if args.url is None:  # max_loras: every version and the other alias's adapter at once, in one batch
        cfg = EngineConfig(port=_free_port(), threads=1, kv_cache_gib=1, max_loras=versions + 1)
        engine = Engine(model, cfg, log=tmp / "engine.log").start()
    url = args.url or engine.url  # type: ignore[union-attr]
    try:
        paths = trained or stepped_versions(model, tmp / "adapters", versions, args.scale, args.step, args.seed)
        shape = like(trained[0]) if trained else {"scale": args.scale}
        other = light_adapter(model, tmp / "adapters" / "other", seed=args.seed + 100, **shape)
        names = [f"bench@v{i + 1}" for i in range(versions)]
        for name, path in [*zip(names, paths, strict=True), ("otheralias@v1", other)]:
            httpx.post(
                f"{url}/v1/load_lora_adapter", json={"lora_name": name, "lora_path": str(path)}, timeout=300
            ).raise_for_status()
        result = asyncio.run(bench(url, model, names, "otheralias@v1", args.tries, args.load))
    finally:
        if engine is not None:
            engine.stop()
    made = f"v1 B~N(0,{args.scale}), steps N(0,{args.step})"
    print(
        f"model {model.name}; {versions} versions ({f'trained, {args.adapters}' if trained else made}); "
        f"{args.tries} tries, each model probed with {args.load} calls in flight; {result['load_calls']} load "
        f"calls in {result['seconds']} s"
    )
    print(table(result, names, args.tries))
    if args.json:
        counts = {n: {k: v for k, v in c.items() if k != "dist"} for n, c in result["counts"].items()}
        fps = {
            n: {k: v for k, v in fp.items() if k not in ("tokens", "logprobs")}
            for n, fp in result["fingerprints"].items()
        }
        args.json.write_text(json.dumps({"counts": counts, "fingerprints": fps}, indent=2))


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


if __name__ == "__main__":
    main()
