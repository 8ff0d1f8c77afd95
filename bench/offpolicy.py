"""Off-policy toy: does the trainer's objective survive stale, partly graded, timeout-prone traffic?

A synthetic task small enough for 2 cores, trained with the trainer's *own*
functions (``trainer.advantages.compute_advantages`` + ``TaskBaseline``,
``trainer.objective.tis_loss`` / ``reinforce_loss`` / ``bc_loss`` /
``sequence_ratio`` / ``in_band`` / ``RatioStats``), not a re-implementation.

Task: 16 tasks, each with a hidden 4-token answer over 7 content tokens. The
policy is a small shared-parameter model (task embedding → MLP → per-position
logits), so updates on one task move the others, as in a real network. An 8th
token, ``THINK``, is "work longer on this part": if the attempt survives, that
part counts as right, but each ``THINK`` times the attempt out with
probability 1/2 (a policy-caused timeout). Reward is the share of correct
parts (0 on timeout); success is producing the whole answer without timing out.
When timeouts are dropped from the data, the surviving ``THINK`` attempts look
perfect, so dropping them rewards exactly the behaviour that causes them.

Logged traffic: every update trains on 64 attempts (4 per task) sampled by the
policy as it was ``lag`` updates earlier, recording μ per token; 30% of the
rewards never arrive (excluded, never treated as 0). Timeouts are either
counted as failures (reward 0, the rule onthejob applies) or dropped (the
trajectory silently vanishes, the failure mode docs/architecture.md's reward rule guards against).

Methods: ``tis`` (the default objective: truncated weights, C = 2, sequence
rejection outside [0.5, 2]), ``naive`` (REINFORCE, no correction), ``bc``
(behaviour cloning of rewards ≥ the default threshold 0.5).

    .venv/bin/python bench/offpolicy.py [--seeds 4] [--updates 300] [--plot out.png]
"""

from __future__ import annotations

import argparse
import statistics
import time
from dataclasses import dataclass

import torch

from trainer.advantages import TaskBaseline, compute_advantages
from trainer.objective import ObjectiveConfig, RatioStats, bc_loss, in_band, reinforce_loss, sequence_ratio, tis_loss

TASKS, LENGTH, CONTENT = 16, 3, 5
THINK = CONTENT  # right if the attempt survives; times it out with probability TIMEOUT_P
TIMEOUT_P = 0.5
VOCAB = CONTENT + 1
ATTEMPTS = 8  # per task and update: 128 trajectories a batch
MISSING = 0.3  # share of rewards that never arrive
LAGS = (0, 8, 32, 64)
METHODS = ("tis", "naive", "bc")


class Policy(torch.nn.Module):
    """task → embedding → MLP → logits [LENGTH, VOCAB]; parameters shared across tasks."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.embed = torch.nn.Parameter(torch.randn(TASKS, 16, generator=g) * 0.5)
        self.hidden = torch.nn.Linear(16, 32)
        self.out = torch.nn.Linear(32, LENGTH * VOCAB)
        with torch.no_grad():
            for p in (self.hidden.weight, self.out.weight):
                p.copy_(torch.randn(p.shape, generator=g) * 0.3)
            self.hidden.bias.zero_()
            self.out.bias.zero_()
            # THINK starts about as likely as any content token.
            self.out.bias.view(LENGTH, VOCAB)[:, THINK] = 0.3

    def forward(self, tasks: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.hidden(self.embed[tasks]))
        return self.out(h).view(-1, LENGTH, VOCAB).log_softmax(-1)


@dataclass
class Outcome:
    success: float
    timeout: float


def evaluate(policy: Policy, answers: torch.Tensor) -> Outcome:
    """Exact expected success (every part right, no timeout) and timeout rate over all tasks."""
    with torch.no_grad():
        p = policy(torch.arange(TASKS)).exp()
        think = p[:, :, THINK]
        right = p.gather(2, answers.unsqueeze(2)).squeeze(2) + (1 - TIMEOUT_P) * think
        survives = (1 - TIMEOUT_P * think).prod(1)
    return Outcome(float(right.prod(1).mean()), float(1 - survives.mean()))


def run(
    method: str,
    lag: int,
    seed: int,
    updates: int,
    drop_timeouts: bool,
    lr: float = 0.01,
    curve: list[tuple[int, Outcome]] | None = None,
    every: int = 25,
) -> tuple[Outcome, dict[str, float]]:
    """Train one policy on lagged logged traffic; returns its final outcome and ratio stats over the run.

    With ``curve``, the exact outcome after every ``every`` updates is appended to it (the training curve).
    """
    torch.manual_seed(seed)
    gen = torch.Generator().manual_seed(1000 + seed)
    answers = torch.randint(0, CONTENT, (TASKS, LENGTH), generator=gen)
    policy = Policy(seed)
    history = [{k: v.clone() for k, v in policy.state_dict().items()}]
    behaviour = Policy(seed)
    opt = torch.optim.Adam(policy.parameters(), lr=lr)
    obj = ObjectiveConfig()
    baseline = TaskBaseline()
    ratios = RatioStats()  # over every update of the run
    rejected = offered = 0
    for update in range(updates):
        if curve is not None and update % every == 0:
            curve.append((update, evaluate(policy, answers)))
        behaviour.load_state_dict(history[max(0, len(history) - 1 - lag)])
        tasks = torch.arange(TASKS).repeat_interleave(ATTEMPTS)
        with torch.no_grad():
            mu_all = behaviour(tasks)
            tokens = torch.distributions.Categorical(logits=mu_all).sample()
            mu = mu_all.gather(2, tokens.unsqueeze(2)).squeeze(2)
        thinks = tokens == THINK
        correct = ((tokens == answers[tasks]) | thinks).float().mean(1)
        timed_out = (thinks & (torch.rand(thinks.shape, generator=gen) < TIMEOUT_P)).any(1)
        graded = torch.rand(len(tasks), generator=gen) >= MISSING
        reward = torch.where(timed_out, torch.zeros_like(correct), correct)
        keep = graded & ~timed_out if drop_timeouts else graded
        if method == "bc":
            keep = keep & (reward >= obj.bc_threshold)
        idx = torch.nonzero(keep).squeeze(1)
        if idx.numel() < 2:
            history.append({k: v.clone() for k, v in policy.state_dict().items()})
            continue
        t, y, r, behav = tasks[idx], tokens[idx], reward[idx], mu[idx]
        logp = policy(t).gather(2, y.unsqueeze(2)).squeeze(2)
        prox = logp.detach()
        mask = torch.ones_like(logp)
        n = int(mask.sum())
        if method == "bc":
            loss = bc_loss(logp, mask, n)
        else:
            adv = torch.tensor(
                compute_advantages(r.tolist(), [f"{int(x)}" for x in t], [f"{int(x)}" for x in t], baseline)
            )
            if method == "tis":
                accepted = in_band(sequence_ratio(prox, behav, mask), obj.band)
                rejected += int((~accepted).sum())
                offered += len(accepted)
                mask = mask * accepted.unsqueeze(1).float()
                loss = tis_loss(logp, prox, behav, mask, adv, n_tokens=max(int(mask.sum()), 1), clip=obj.clip)
            else:
                loss = reinforce_loss(logp, mask, adv, n)
        ratios.add(prox, behav, torch.ones_like(prox), obj.clip)
        opt.zero_grad()
        loss.backward()
        opt.step()
        history.append({k: v.clone() for k, v in policy.state_dict().items()})
        if len(history) > max(LAGS) + 2:
            history.pop(0)
    stats = ratios.summary()
    stats["rejected"] = rejected / offered if offered else 0.0
    final = evaluate(policy, answers)
    if curve is not None:
        curve.append((updates, final))
    return final, stats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--updates", type=int, default=600)
    ap.add_argument("--lr", type=float, default=0.01)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--plot", default=None, help="write a PNG of success per lag per method")
    ap.add_argument("--curves", default=None, help="write a PNG of tis training curves, timeouts dropped vs counted")
    ap.add_argument("--lags", default=",".join(map(str, LAGS)), help="comma-separated policy lags")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    started = time.monotonic()
    seeds = range(args.seeds)

    lags = [int(x) for x in args.lags.split(",")]
    curves: dict[tuple[int, bool], list[list[tuple[int, Outcome]]]] = {}

    def cell(method: str, lag: int, drop: bool) -> tuple[list[Outcome], list[dict[str, float]]]:
        traces: list[list[tuple[int, Outcome]]] = [[] for _ in seeds]
        keep = method == "tis"
        results = [
            run(method, lag, s, args.updates, drop, args.lr, traces[i] if keep else None) for i, s in enumerate(seeds)
        ]
        if keep:
            curves[(lag, drop)] = traces
        return [o for o, _ in results], [st for _, st in results]

    def fmt(values: list[float]) -> str:
        mean = statistics.mean(values)
        spread = statistics.pstdev(values) if len(values) > 1 else 0.0
        return f"{mean:.3f}±{spread:.3f}"

    init = [
        evaluate(
            Policy(s), torch.randint(0, CONTENT, (TASKS, LENGTH), generator=torch.Generator().manual_seed(1000 + s))
        )
        for s in seeds
    ]  # noqa: E501
    print(
        f"offpolicy toy: {TASKS} tasks × {LENGTH} tokens, {ATTEMPTS} attempts/task/update, {args.updates} updates, "
        f"{int(MISSING * 100)}% rewards missing, {args.seeds} seeds (mean±sd)"
    )
    print(f"initial policy: success {fmt([o.success for o in init])}, timeout rate {fmt([o.timeout for o in init])}\n")

    table: dict[tuple[str, int], list[Outcome]] = {}
    print("timeouts counted as failures (onthejob's rule):")
    print(f"{'lag':>4} | " + " | ".join(f"{m + ' success':>15} {m + ' timeout':>15}" for m in METHODS))
    extra: dict[int, list[dict[str, float]]] = {}
    for lag in lags:
        row = []
        for method in METHODS:
            outcomes, stats = cell(method, lag, drop=False)
            table[(method, lag)] = outcomes
            if method == "tis":
                extra[lag] = stats
            row.append(f"{fmt([o.success for o in outcomes]):>15} {fmt([o.timeout for o in outcomes]):>15}")
        print(f"{lag:>4} | " + " | ".join(row))
    print("\ntis, over all updates: π/μ mean and max, share of tokens clipped at C, ESS, KL(μ‖π), sequences rejected")
    for lag, stats in extra.items():
        keys = ("ratio_mean", "ratio_max", "clipped_frac", "ess", "kl_mu_pi", "rejected")
        print(f"{lag:>4} | " + "  ".join(f"{k} {statistics.mean(s.get(k, 0.0) for s in stats):.3f}" for k in keys))

    print("\ntimeouts dropped (the trajectory vanishes) vs counted as failures, default objective:")
    heads = ("dropped success", "dropped timeout", "counted success", "counted timeout")
    print(f"{'lag':>4} | {heads[0]:>15} {heads[1]:>15} | {heads[2]:>15} {heads[3]:>15}")
    for lag in lags:
        dropped, _ = cell("tis", lag, drop=True)
        counted = table[("tis", lag)]
        print(
            f"{lag:>4} | {fmt([o.success for o in dropped]):>15} {fmt([o.timeout for o in dropped]):>15} | "
            f"{fmt([o.success for o in counted]):>15} {fmt([o.timeout for o in counted]):>15}"
        )
    print(f"\n({time.monotonic() - started:.0f} s)")

    if args.plot:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(5, 3.5))
        for method in METHODS:
            means = [statistics.mean(o.success for o in table[(method, lag)]) for lag in lags]
            ax.plot(lags, means, marker="o", label=method)
        ax.set_xlabel("policy lag (updates)")
        ax.set_ylabel("success")
        ax.set_ylim(0, 1.02)
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot: {args.plot}")
    if args.curves:
        plot_curves(curves, lags, args.curves)
        print(f"curves: {args.curves}")


def plot_curves(curves: dict[tuple[int, bool], list[list[tuple[int, Outcome]]]], lags: list[int], path: str) -> None:
    """Timeout rate and success over updates, mean over seeds: one line per lag, dropped dashed, counted solid."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(10, 3.8), sharex=True)
    colours = plt.get_cmap("viridis")(torch.linspace(0, 0.85, len(lags)).tolist())
    for colour, lag in zip(colours, lags, strict=True):
        for drop in (True, False):
            traces = curves.get((lag, drop))
            if not traces:
                continue
            xs = [u for u, _ in traces[0]]
            for ax, field in ((ax_t, "timeout"), (ax_s, "success")):
                ys = [statistics.mean(getattr(tr[i][1], field) for tr in traces) for i in range(len(xs))]
                label = f"lag {lag}, timeouts {'dropped' if drop else 'counted'}"
                ax.plot(xs, ys, color=colour, linestyle="--" if drop else "-", label=label)
    ax_t.set_ylabel("timeout rate (exact, all tasks)")
    ax_s.set_ylabel("success (exact, all tasks)")
    for ax in (ax_t, ax_s):
        ax.set_xlabel("update")
        ax.set_ylim(0, 1.02)
    ax_s.legend(fontsize=7, loc="center right")
    fig.suptitle("tis on the off-policy toy: timed-out rollouts dropped (dashed) vs counted as failures (solid)")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


if __name__ == "__main__":
    main()
