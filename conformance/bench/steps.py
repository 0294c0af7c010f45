"""The bench's steps, run for one plugin or, in rounds taking turns, for two (--versus).

Order matters: the idle window follows every load phase; kubelet restarts and plugin restarts
come last because they replace the plugin's server (and so every stream on it).
"""

from __future__ import annotations

import asyncio
import traceback
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from hvconform.bench import procfs
from hvconform.bench.figures_alloc import allocate_load
from hvconform.bench.figures_cdi import cdi_recovery
from hvconform.bench.figures_grpc import health_propagation, reregistration
from hvconform.bench.figures_host import RssSampler, idle_footprint, memory_figures
from hvconform.bench.figures_start import refusal, startup
from hvconform.bench.figures_storm import read_storm
from hvconform.bench.harness import Bench
from hvconform.bench.report import Figure
from hvconform.bench.versus import merge, share
from hvconform.bench.waits import Plan

FRESH_S = 3.0


class Lacks(Exception):
    """The plugin lacks what a step needs (e.g. a CDI spec); the message says what."""


@dataclass
class Subject:
    """One plugin in the run: its node, its samples by step and round, what went wrong."""

    label: str  # "ours" or "theirs"
    bench: Bench
    rss: RssSampler
    rounds: dict[str, list[list[Figure]]] = field(default_factory=dict)
    threads: list[dict[str, Any]] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)
    lacks: dict[str, str] = field(default_factory=dict)  # figure key prefix -> reason

    def figures(self) -> list[Figure]:
        merged = [
            merge(rounds) for per_step in self.rounds.values() for rounds in _by_key(per_step)
        ]
        return merged + memory_figures(self.rss)


def _by_key(per_round: list[list[Figure]]) -> list[list[Figure]]:
    keys: dict[str, list[Figure]] = {}
    for figs in per_round:
        for fig in figs:
            keys.setdefault(fig.key, []).append(fig)
    return list(keys.values())


StepFn = Callable[[Subject, Plan], Awaitable[list[Figure]]]


@dataclass(frozen=True)
class Step:
    name: str
    run: StepFn
    prefixes: tuple[str, ...]  # the keys of its figures start with one of these
    once: bool = False  # runs in the first round only (it measures a moment, not a series)


def _needs_cdi(subject: Subject) -> None:
    if not subject.bench.spec_name:
        raise Lacks(f"{subject.bench.name} writes no CDI spec (its Allocate names no CDI device)")


async def _fresh(subject: Subject, plan: Plan) -> list[Figure]:
    async with subject.rss.sampling("fresh"):
        await asyncio.sleep(FRESH_S)
    return []


async def _cdi(subject: Subject, plan: Plan) -> list[Figure]:
    _needs_cdi(subject)
    return await cdi_recovery(subject.bench, plan)


async def _storm(subject: Subject, plan: Plan) -> list[Figure]:
    _needs_cdi(subject)
    return await read_storm(subject.bench, plan)


async def _idle(subject: Subject, plan: Plan) -> list[Figure]:
    figs, rows = await idle_footprint(subject.bench, plan, subject.rss)
    subject.threads.extend(rows)
    if not subject.bench.python:
        subject.lacks["idle.thread_rate.grpc"] = (
            "no grpc core threads to tell apart (not a Python grpc plugin): its threads all "
            "count as its own"
        )
    return figs


STEPS = [
    Step("memory after start", _fresh, ("memory.fresh",), once=True),
    Step("CDI recovery", _cdi, ("cdi.",)),
    Step("allocation-triggered repair under a read storm", _storm, ("repair.", "storm.")),
    Step(
        "Allocate load",
        lambda s, p: allocate_load(s.bench, p, s.rss),
        ("allocate.",),
    ),
    Step(
        "health propagation",
        lambda s, p: health_propagation(s.bench, p, s.rss),
        ("health.",),
    ),
    Step("refusal on an unusable device", lambda s, p: refusal(s.bench, p), ("refusal.",)),
    Step("idle footprint", _idle, ("idle.",)),
    Step(
        "re-registration after kubelet restarts",
        lambda s, p: reregistration(s.bench, p),
        ("reregister.",),
    ),
    Step("plugin start-up", lambda s, p: startup(s.bench, p), ("start.",)),
]


def announce(name: str) -> None:
    print(f"hvconform bench: {name} (load {procfs.loadavg()[0]:.2f})", flush=True)


async def measure(
    subjects: list[Subject], plan: Plan, summary: Callable[[list[Figure]], str]
) -> None:
    """Every step; with two subjects, each step in plan.rounds rounds taking turns."""
    rounds = plan.rounds if len(subjects) > 1 else 1
    part = share(plan, rounds)
    for step in STEPS:
        for r in range(1 if step.once else rounds):
            for subject in subjects:
                if any(p in subject.lacks for p in step.prefixes):
                    continue
                tag = f" [{subject.label}: {subject.bench.name}, round {r + 1}/{rounds}]"
                announce(step.name + (tag if len(subjects) > 1 else ""))
                try:
                    new = await step.run(subject, part)
                except Lacks as exc:
                    subject.lacks.update(dict.fromkeys(step.prefixes, str(exc)))
                    print(f"  not applicable: {exc}", flush=True)
                    continue
                except Exception as exc:
                    traceback.print_exc()
                    subject.failures.append(f"{step.name}: {type(exc).__name__}: {exc}")
                    continue
                subject.rounds.setdefault(step.name, []).append(new)
                print(summary(new), flush=True)
