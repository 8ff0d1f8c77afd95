"""What the SDPO teacher costs (issue 35): the snapshot swap against a second PEFT adapter.

``python -m bench.sdpo_teacher [tiny|default]`` loads the policy as ``--objective sdpo``
does, then prints the memory of the base, the LoRA and the teacher's snapshot, the time
of one swap in and out beside one no-grad forward, and the same for PEFT's second adapter
(``add_adapter`` + ``set_adapter``), which ``save_pretrained`` would also publish.
"""

from __future__ import annotations

import sys
import time

import torch

from trainer.objective import ObjectiveConfig
from trainer.policy import TrainConfig, load_policy
from trainer.teacher import attached

TRIES = 200


def mib(tensors: object) -> float:
    return sum(t.numel() * t.element_size() for t in tensors) / 2**20  # type: ignore[attr-defined]


def main(model: str = "tiny") -> None:
    p = load_policy(TrainConfig(model=model, threads=1, objective=ObjectiveConfig(name="sdpo")))
    teacher = attached(p.model)
    assert teacher is not None
    frozen = [x for x in p.model.parameters() if not x.requires_grad]
    print(
        f"{p.info.name}: base {mib(frozen):.1f} MiB, LoRA {mib(p.parameters()):.2f} MiB, "
        f"snapshot {teacher.bytes() / 2**20:.2f} MiB"
    )
    started = time.perf_counter()
    for _ in range(TRIES):
        with teacher.swapped(p.model):
            pass
    swap = (time.perf_counter() - started) / TRIES
    ids = torch.randint(0, 100, (1, 256))
    with torch.no_grad():
        p.model(input_ids=ids)
        started = time.perf_counter()
        for _ in range(5):
            p.model(input_ids=ids)
        forward = (time.perf_counter() - started) / 5
    print(f"snapshot swap in and out: {swap * 1e3:.2f} ms; one no-grad forward over 256 tokens: {forward * 1e3:.1f} ms")
    before = mib(p.model.parameters())
    p.model.add_adapter("teacher", p.model.peft_config["default"])
    added = mib(p.model.parameters()) - before
    started = time.perf_counter()
    for _ in range(TRIES):
        p.model.set_adapter("teacher", inference_mode=True)
        p.model.set_adapter("default")
    switch = (time.perf_counter() - started) / TRIES
    print(
        f"PEFT second adapter: +{added:.2f} MiB; set_adapter there and back: {switch * 1e3:.2f} ms; "
        f"save_pretrained would write {sorted(p.model.peft_config)}"
    )


if __name__ == "__main__":
    main(*sys.argv[1:2])
