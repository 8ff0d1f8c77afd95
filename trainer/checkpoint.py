"""The optimiser's state beside an adapter: saved with it, continued by the next training run.

Engines read only ``adapter_config.json`` and ``adapter_model.safetensors``; the content hash
covers only those, so this file changes neither what is served nor a version's identity.
"""

from __future__ import annotations

from pathlib import Path

import torch

OPTIMIZER_FILE = "optimizer.pt"


def save_optimizer(optimizer: torch.optim.Optimizer, folder: Path) -> None:
    torch.save(optimizer.state_dict(), folder / OPTIMIZER_FILE)


def resume_optimizer(optimizer: torch.optim.Optimizer, parent: Path, lr: float) -> bool:
    """Load the AdamW moments saved with ``parent`` (if any and if they fit); this run's ``lr`` wins.

    A fresh AdamW's first step moves every weight by ``lr`` whatever its gradient's size
    (the bias-corrected m/√v is ±1); continuing the moments keeps step sizes proportional
    across training runs, which matter when each run takes only a step or two.
    """
    path = parent / OPTIMIZER_FILE
    if not path.is_file():
        return False
    state = torch.load(path, map_location="cpu", weights_only=True)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    saved = state.get("state", {})
    fits = len(state.get("param_groups", [{}])[0].get("params", [])) == len(params) and all(
        saved[i]["exp_avg"].shape == p.shape for i, p in enumerate(params) if i in saved
    )
    if not fits:
        return False  # another rank or target set: start fresh rather than misapply moments
    optimizer.load_state_dict(state)
    for group in optimizer.param_groups:
        group["lr"] = lr
    return True
