"""Scenarios: a :class:`~raycompat.config.train.TrainConfig` -> the list of models to train.

Each scenario of the papers is a plan builder in :data:`SCENARIOS`; the driver runs the plans in
order and never branches on the scenario's name.

- ``cores`` (CoReS): step t trains on the union of the classes so far, every step from the SAME
  initialisation (the method's ``init`` policy, ``same_seed`` for ``cores``), labels left-to-right.
- ``cl2r`` (d-Simplex-HOC): an initial task, then fine-tuning on each new task's classes with a
  replay buffer of the earlier classes (balanced batches).
- ``iam_cl2r``: as ``cl2r``, fine-tuning labels right-to-left (K-1-y) so that replacement models
  pre-trained left-to-right share the simplex; before a chosen task the model is replaced by one
  trained from scratch (another architecture, more data) and fine-tuning continues from it.
- ``two_model`` (BCT, NI-FCL): the old model (given as a checkpoint or a black box, or trained
  here) and one new model trained against it.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from raycompat.config.train import ModelSpec, OldModelSpec, TrainConfig
from raycompat.methods import METHODS
from raycompat.registry import Registry

SCENARIOS: Registry = Registry("scenario")


@dataclass
class StepPlan:
    """One model to produce.

    Attributes:
        name: stable run name suffix (``step_1``, ``replacement_2``).
        classes: dataset classes whose training rows are this step's new data.
        replay_classes: dataset classes with rows in the replay buffer (CL2R), else empty.
        allocation: ``ltr`` (class y -> output y) or ``rtl`` (y -> K-1-y).
        init: ``random`` | ``same_seed`` | ``previous`` (start from ``parent``'s weights).
        parent: index of the plan whose model is this step's old model (and init source).
        in_matrix: the model is a row of the compatibility matrix (replacements are not).
        label_map: dataset class -> head output, for every class trained up to and including
            this step (a class keeps the output of the task that introduced it).
        given: an existing old model to load instead of training (two-model upgrade).
    """

    name: str
    method: str
    model: ModelSpec
    classes: list[int]
    replay_classes: list[int] = field(default_factory=list)
    allocation: str = "ltr"
    init: str = "random"
    parent: int | None = None
    in_matrix: bool = True
    epochs: int = 0
    label_map: dict[int, int] = field(default_factory=dict)
    given: OldModelSpec | None = None

    @property
    def seen_classes(self) -> list[int]:
        return sorted(self.label_map)

    @property
    def seen_outputs(self) -> list[int]:
        return sorted(set(self.label_map.values()))


def _outputs(classes: list[int], allocation: str, num_outputs: int) -> list[int]:
    return [num_outputs - 1 - c if allocation == "rtl" else c for c in classes]


def _init_for(method: str) -> str:
    return {"old": "previous"}.get(METHODS.get(method).init, METHODS.get(method).init)


def _step(
    cfg: TrainConfig,
    plans: list[StepPlan],
    name: str,
    classes: list[int],
    *,
    method: str | None = None,
    replay: list[int] = (),
    allocation: str = "ltr",
    model: ModelSpec | None = None,
    parent: int | None = None,
    in_matrix: bool = True,
    epochs: int | None = None,
    init: str | None = None,
    inherit: list[int] | None = None,
) -> StepPlan:
    if method is None:
        method = cfg.method if parent is not None else cfg.first_method
    model = model or cfg.model
    # A class keeps the output it was first trained on (replay rows of an earlier task included).
    label_map: dict[int, int] = {}
    for source in inherit if inherit is not None else ([parent] if parent is not None else []):
        label_map.update(plans[source].label_map)
    for c, o in zip(classes, _outputs(classes, allocation, model.num_classes), strict=True):
        label_map.setdefault(c, o)
    return StepPlan(
        name=name,
        method=method,
        model=model,
        classes=list(classes),
        replay_classes=list(replay),
        allocation=allocation,
        init=init or (_init_for(method) if parent is not None else "random"),
        parent=parent,
        in_matrix=in_matrix,
        epochs=cfg.epochs if epochs is None else epochs,
        label_map=label_map,
    )


@SCENARIOS.register("cores")
def cores_plans(cfg: TrainConfig) -> list[StepPlan]:
    plans: list[StepPlan] = []
    for t, count in enumerate(cfg.scenario.tasks):
        plans.append(
            _step(cfg, plans, f"step_{t + 1}", list(range(count)), parent=t - 1 if t else None)
        )
    return plans


def _task_classes(tasks: list[int]) -> list[list[int]]:
    starts = [sum(tasks[:t]) for t in range(len(tasks))]
    return [list(range(s, s + n)) for s, n in zip(starts, tasks, strict=True)]


@SCENARIOS.register("cl2r")
def cl2r_plans(cfg: TrainConfig, fine_tune_allocation: str = "ltr") -> list[StepPlan]:
    replacements = {r.at_task: r for r in cfg.scenario.replacements}
    # A pre-trained initial model (IAM-CL2R CelebA: fine-tuned on CASIA-WebFace) owns the
    # left-to-right outputs already, so even the first task is fine-tuning.
    pretrained = cfg.model.weights is not None
    plans: list[StepPlan] = []
    for t, classes in enumerate(_task_classes(cfg.scenario.tasks)):
        parent = len(plans) - 1 if plans else None
        inherit = None
        if t in replacements:
            spec = replacements[t]
            check_replacement(cfg, spec.model, t)
            plans.append(
                _step(
                    cfg,
                    plans,
                    f"replacement_{t + 1}",
                    spec.pretrain_classes,
                    method=cfg.first_method,
                    model=spec.model,
                    in_matrix=False,
                    epochs=spec.epochs,
                    init="random",
                )
            )
            inherit = [i for i in (parent, len(plans) - 1) if i is not None]
            parent = len(plans) - 1
        earlier = list(range(classes[0]))
        plans.append(
            _step(
                cfg,
                plans,
                f"step_{t + 1}",
                classes,
                parent=parent,
                replay=earlier if t else [],
                allocation=fine_tune_allocation if t or pretrained else "ltr",
                model=plans[parent].model if parent is not None else None,
                inherit=inherit,
            )
        )
    return plans


@SCENARIOS.register("iam_cl2r")
def iam_cl2r_plans(cfg: TrainConfig) -> list[StepPlan]:
    return cl2r_plans(cfg, fine_tune_allocation="rtl")


@SCENARIOS.register("two_model")
def two_model_plans(cfg: TrainConfig) -> list[StepPlan]:
    tasks = cfg.scenario.tasks
    if len(tasks) != 2:
        raise ValueError(f"scenario.tasks: two_model takes [old classes, new classes], got {tasks}")
    old = cfg.scenario.old_model
    plans: list[StepPlan] = []
    first = _step(
        cfg,
        plans,
        "step_1",
        list(range(tasks[0])),
        model=old.model if old else None,
        epochs=0 if old else None,
    )
    first.given = old
    plans.append(first)
    plans.append(_step(cfg, plans, "step_2", list(range(tasks[1])), parent=0))
    return plans


def plan_steps(cfg: TrainConfig) -> list[StepPlan]:
    """The scenario's plans, checked before any training starts."""
    plans = SCENARIOS.get(cfg.scenario.kind)(cfg)
    for plan in plans:
        check_plan(plan, plans)
    return plans


def check_plan(plan: StepPlan, plans: list[StepPlan]) -> None:
    k = plan.model.num_classes
    if len(plan.seen_outputs) < len(plan.seen_classes):
        raise ValueError(
            f"{plan.name}: {len(plan.seen_classes)} classes share {len(plan.seen_outputs)} head "
            f"outputs under {plan.allocation} allocation with K={k}; raise model.num_classes"
        )
    used = _outputs(plan.classes, plan.allocation, k)
    if len(set(plan.seen_outputs)) > k or any(not 0 <= o < k for o in used):
        raise ValueError(
            f"{plan.name}: {len(plan.seen_outputs)} classes (largest label "
            f"{max(plan.classes, default=-1)}) do not fit in K={k} outputs; raise "
            "model.num_classes"
        )


def check_replacement(cfg: TrainConfig, model: ModelSpec, task: int) -> None:
    """A replacement model must share the sequence's fixed classifier (IAM-CL2R)."""
    if (model.head, model.num_classes) != (cfg.model.head, cfg.model.num_classes):
        raise ValueError(
            f"scenario.replacements (task {task}): a replacement model must use the same fixed "
            f"head as the sequence ({cfg.model.head} K={cfg.model.num_classes}), got "
            f"{model.head} K={model.num_classes}"
        )


def describe(plans: list[StepPlan]) -> list[dict]:
    """JSON-able summary (written next to the run's outputs)."""
    return [{k: v for k, v in dataclasses.asdict(p).items() if k != "model"} for p in plans]
