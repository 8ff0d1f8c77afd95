"""`onthejob export`: JSONL that datasets loads and TRL's SFT and DPO trainers accept for a step."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session

from onthejob.cli import main
from storage.db import sync_engine
from tests.storage.rows import GEN, NL, feedback_row, insert, msg, new_project, row
from tests.storage.test_trajectories import P1

SYSTEM = {"role": "system", "content": "Answer with the number only."}
USER = {"role": "user", "content": "What is 2+3?"}
TOOL_CALL = [{"id": "call-1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]


def reply(content: str, **extra: Any) -> dict[str, Any]:
    return {"role": "assistant", "content": content, **extra}


def answer(ids: list[int], content: str, **extra: Any) -> dict[str, Any]:
    return {
        "index": 0,
        "token_ids": ids,
        "logprobs": [-0.25] * len(ids),
        "finish_reason": "stop",
        "message": reply(content, **extra),
    }


@dataclass
class Data:
    db_url: str
    project: str


@pytest.fixture(scope="module")
def data(pg_url: str) -> Iterator[Data]:
    """Task "add": four graded attempts (one uses a tool over two calls), plus an eval and an ungraded one."""
    eng = sync_engine(pg_url)
    with Session(eng) as db:
        p = new_project(db)
        add = {"project": p, "task": "add"}
        cid = {name: f"cmpl-{name}-{uuid.uuid4().hex[:8]}" for name in ("good", "meh", "bad", "t1", "t2", "ev", "un")}
        first = [SYSTEM, USER]
        after_tool = [
            *first,
            reply("", tool_calls=TOOL_CALL),
            {"role": "tool", "content": "5", "tool_call_id": "call-1"},
        ]
        insert(
            db,
            row(cid["good"], P1, [answer([53, 2], "5")], messages=first, session="good", adapter=1, **add),
            row(cid["meh"], P1, [answer([54, 2], "5, I think")], messages=first, session="meh", project=p, task="add"),
            row(cid["bad"], P1, [answer([55, 2], "six")], messages=first, session="bad", project=p, task="add"),
            row(
                cid["t1"],
                P1,
                [answer([56, 2], "", tool_calls=TOOL_CALL)],
                messages=first,
                session="tool",
                project=p,
                task="add",
            ),
            row(
                cid["t2"],
                P1 + [56, 2, NL, *msg("tool", 53), *GEN],
                [answer([53, 2], "5")],
                messages=after_tool,
                session="tool",
                project=p,
                task="add",
                parent=cid["t1"],
                at=1,
            ),
            row(cid["ev"], P1, [answer([53, 2], "5")], messages=first, session="ev", tags=["eval"], **add),
            row(cid["un"], P1, [answer([53, 2], "5")], messages=first, session="un", project=p, task="add"),
        )
        db.add_all(
            [
                feedback_row(p, "outcome", "success", session="good"),
                feedback_row(p, "reward", 0.2, session="meh"),
                feedback_row(p, "outcome", "failure", session="bad"),
                feedback_row(p, "thumbs", True, session="tool"),
                feedback_row(p, "thumbs", True, session="ev"),
            ]
        )
        db.commit()
    eng.dispose()
    yield Data(pg_url, p)


def export(data: Data, fmt: str, out: Path, *extra: str) -> list[dict[str, Any]]:
    assert (
        main(["export", "--format", fmt, "--project", data.project, "--db", data.db_url, "-o", str(out), *extra]) == 0
    )
    return [json.loads(line) for line in out.read_text().splitlines()]


def load(path: Path, tmp_path: Path) -> Any:
    import datasets

    return datasets.load_dataset("json", data_files=str(path), split="train", cache_dir=str(tmp_path / "hf"))


def test_sft_rows_are_whole_conversations_over_the_threshold(data: Data, tmp_path: Path, capsys: Any) -> None:
    rows = export(data, "sft", tmp_path / "sft.jsonl", "--min-reward", "0.5")
    assert "excluded: below_min_reward 2, eval 1, ungraded 1" in capsys.readouterr().err
    convs = sorted(rows, key=lambda r: len(r["messages"]))
    assert convs[0]["messages"] == [SYSTEM, USER, reply("5")]
    assert [m["role"] for m in convs[1]["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    assert convs[1]["messages"][2]["tool_calls"] == TOOL_CALL
    assert load(tmp_path / "sft.jsonl", tmp_path).num_rows == 2


def test_dpo_pairs_better_against_worse_within_a_group(data: Data, tmp_path: Path) -> None:
    rows = export(data, "dpo", tmp_path / "dpo.jsonl")
    assert [(r["prompt"], r["chosen"], r["rejected"]) for r in rows][0] == (
        [SYSTEM, USER],
        [reply("5")],
        [reply("six")],
    )
    assert [m["role"] for m in rows[1]["chosen"]] == ["assistant", "tool", "assistant"]  # tool run vs 0.2
    assert rows[1]["rejected"] == [reply("5, I think")]
    assert load(tmp_path / "dpo.jsonl", tmp_path).column_names == ["prompt", "chosen", "rejected"]


def test_rl_rows_carry_tokens_mask_logprobs_reward_adapters_group(data: Data, tmp_path: Path) -> None:
    rows = export(data, "rl", tmp_path / "rl.jsonl")
    by_session = {r["session_id"]: r for r in rows}
    assert set(by_session) == {"good", "meh", "bad", "tool"}
    good = by_session["good"]
    assert (good["token_ids"], good["mask"], good["reward"], good["adapters"], good["group"]) == (
        P1 + [53, 2],
        [0] * 9 + [1, 1],
        1.0,
        [1],
        "add",
    )
    assert good["logprobs"] == [None] * 9 + [-0.25, -0.25]
    assert json.loads(good["reward_detail"])["name"] == "outcome"
    assert sum(by_session["tool"]["mask"]) == 4
    ds = load(tmp_path / "rl.jsonl", tmp_path)
    assert ds.num_rows == 4 and {"token_ids", "mask", "logprobs", "reward", "adapters", "group"} <= set(ds.column_names)


def test_since_and_alias_filter(data: Data, tmp_path: Path) -> None:
    assert export(data, "rl", tmp_path / "none.jsonl", "--since", "2030-01-01") == []
    assert export(data, "rl", tmp_path / "other.jsonl", "--alias", "someone-else") == []
    assert (
        main(["export", "--format", "rl", "--db", data.db_url, "--since", "yesterday", "-o", str(tmp_path / "x")]) == 2
    )


@pytest.mark.slow
def test_trl_trainers_take_a_step_on_the_exports(data: Data, tmp_path: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import DPOConfig, DPOTrainer, SFTConfig, SFTTrainer

    from engine.weights import resolve_model

    path = resolve_model("tiny").path
    tokenizer = AutoTokenizer.from_pretrained(path)
    common = {
        "max_steps": 1,
        "per_device_train_batch_size": 2,
        "report_to": "none",
        "save_strategy": "no",
        "use_cpu": True,
        "max_length": 256,
        "dataloader_num_workers": 0,
    }
    export(data, "sft", tmp_path / "sft.jsonl")
    export(data, "dpo", tmp_path / "dpo.jsonl")

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    sft = SFTTrainer(
        model=model,
        args=SFTConfig(output_dir=str(tmp_path / "sft"), **common),
        train_dataset=load(tmp_path / "sft.jsonl", tmp_path),
        processing_class=tokenizer,
    )
    assert sft.train().global_step == 1

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    dpo = DPOTrainer(
        model=model,
        args=DPOConfig(output_dir=str(tmp_path / "dpo"), **common),
        train_dataset=load(tmp_path / "dpo.jsonl", tmp_path),
        processing_class=tokenizer,
    )
    assert dpo.train().global_step == 1
