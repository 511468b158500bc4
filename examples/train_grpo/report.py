"""The run's record: reward_curve.csv (one row per seed and step), reward_curve.png, and the summary figures."""

from __future__ import annotations

import csv
import statistics
from dataclasses import asdict, dataclass, fields
from pathlib import Path


@dataclass
class StepRow:
    seed: int
    step: int
    policy_version: str  # the version loaded before the step's batch was submitted
    versions_seen: str  # every policy version the step's completed trajectories recorded, ";"-joined
    mean_reward: float  # over every launched group's samples: trained, DAPO-filtered and late
    tool_rate: float  # share of those episodes that called the python tool
    samples: int
    informative_groups: int
    filtered_groups: int
    failed_groups: int
    trained_samples: int
    loss: float
    clip_fraction: float
    approx_kl: float
    logprob_gap: float
    rollout_s: float
    train_s: float


def write_csv(rows: list[StepRow], path: Path) -> None:
    with path.open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=[f.name for f in fields(StepRow)])
        writer.writeheader()
        for row in rows:
            writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in asdict(row).items()})


@dataclass
class SeedSummary:
    seed: int
    first: float  # mean reward over the first 20% of steps
    last: float  # ... and over the last 20%
    first_tool: float  # share of episodes calling python, first 20% of steps
    last_tool: float


def summarise(rows: list[StepRow]) -> list[SeedSummary]:
    out = []
    for seed in sorted({r.seed for r in rows}):
        mine = [r for r in sorted(rows, key=lambda r: r.step) if r.seed == seed]
        k = max(1, round(len(mine) * 0.2))
        head, tail = mine[:k], mine[-k:]
        out.append(
            SeedSummary(
                seed,
                statistics.fmean(r.mean_reward for r in head),
                statistics.fmean(r.mean_reward for r in tail),
                statistics.fmean(r.tool_rate for r in head),
                statistics.fmean(r.tool_rate for r in tail),
            )
        )
    return out


def spread(values: list[float]) -> str:
    """mean ± sample std (n-1), or the single value."""
    if len(values) < 2:
        return f"{values[0]:.3f}"
    return f"{statistics.fmean(values):.3f} ± {statistics.stdev(values):.3f}"


def summary_text(rows: list[StepRow]) -> str:
    seeds = summarise(rows)
    lines = [
        f"seed {s.seed}: reward first 20% {s.first:.3f}  last 20% {s.last:.3f}   "
        f"(python used {s.first_tool:.2f} -> {s.last_tool:.2f})"
        for s in seeds
    ]
    lines.append(
        f"all seeds (mean ± std over {len(seeds)}): reward first 20% {spread([s.first for s in seeds])}  "
        f"last 20% {spread([s.last for s in seeds])}"
    )
    lines.append(
        f"python used: first 20% {spread([s.first_tool for s in seeds])}  "
        f"last 20% {spread([s.last_tool for s in seeds])}"
    )
    return "\n".join(lines)


def plot(rows: list[StepRow], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for seed in sorted({r.seed for r in rows}):
        mine = sorted((r for r in rows if r.seed == seed), key=lambda r: r.step)
        (line,) = axis.plot(
            [r.step for r in mine],
            [r.mean_reward for r in mine],
            marker="o",
            markersize=3,
            label=f"seed {seed}: reward",
        )
        axis.plot(
            [r.step for r in mine],
            [r.tool_rate for r in mine],
            linestyle="--",
            color=line.get_color(),
            alpha=0.6,
            label=f"seed {seed}: python used",
        )
    axis.set_xlabel("generation (TRL's GRPOTrainer, two optimizer steps each; 0: the warm-up policy)")
    axis.set_ylabel("share of the step's rollouts")
    axis.set_ylim(-0.02, 1.02)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=7)
    axis.set_title(
        "arith with the python tool: TRL's GRPOTrainer through the rollout service (CPU)\nsolid: reward, dashed: share of episodes calling the python tool",
        fontsize=9,
    )
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)
