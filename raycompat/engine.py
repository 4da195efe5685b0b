"""Plain-PyTorch training and extraction loops shared by the demo and the Ray Train workers.

Nothing here knows about Ray: the demo calls :func:`train_epoch`; a Ray worker steps its own
strategy-wrapped model under the same :class:`StepGuard` (``raycompat.cluster.train.worker``).
:func:`embed` is the one feature extraction of the package.
"""

from __future__ import annotations

import contextlib
import logging
import math
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from raycompat.errors import DataError
from raycompat.methods import Batch, CompatibilityMethod

__all__ = [
    "NonFiniteError",
    "StepGuard",
    "embed",
    "extract_features",
    "tensor_batches",
    "train_epoch",
]

log = logging.getLogger(__name__)

# What a diverging run can change: the config keys (``training.`` prefixed in the upgrade job).
HINT = "lower optim.lr or set optim.clip_grad_norm"
# Steps between reads of a GPU run's NaN/inf checks (StepGuard.sync_every)
GPU_SYNC_EVERY = 50


def sync_every(device: torch.device) -> int:
    """:class:`StepGuard`'s ``sync_every`` on ``device``: every step on CPU (reading costs
    nothing there), every :data:`GPU_SYNC_EVERY` steps on an accelerator."""
    return 1 if device.type == "cpu" else GPU_SYNC_EVERY


class NonFiniteError(DataError, FloatingPointError):
    """NaN or inf in a training step: the features, a loss term or the gradient norm.

    The message names the epoch, the step and what was hit. The failure is deterministic (the
    same step from the same checkpoint hits it again), so the Ray layer stops the run at once
    instead of retrying it (``raycompat.cluster.train.guard``).
    """


_KINDS = ("nan", "inf", "-inf")


def _kinds(value: torch.Tensor) -> torch.Tensor:
    """``(3,)`` bools on ``value``'s device: holds a NaN, an inf, a -inf (no host sync)."""
    value = value.detach()
    return torch.stack([value.isnan().any(), (value == math.inf).any(), (value == -math.inf).any()])


class StepGuard:
    """Checks every training step for NaN/inf, and clips the gradient norm if asked to.

    Within :meth:`watch`, every training forward of the model has its outputs (features, and
    logits when asked for both) checked by a forward hook, and every optimizer step is preceded
    by the total gradient 2-norm (clipped to ``clip_grad_norm`` when set) through a step
    pre-hook, so a strategy's own ``backward_step`` is guarded too. :meth:`watch_terms` checks
    the loss terms. The first non-finite value raises :class:`NonFiniteError`: ``non-finite
    loss term 'nce' (nan) at epoch 2, step 37 (global 183); lower optim.lr or set
    optim.clip_grad_norm``.

    ``sync_every`` steps between reads: 1 reads every check as it is made (a host
    synchronisation each; on CPU they cost nothing), so no step is ever taken on a non-finite
    gradient. N > 1 (on a GPU) keeps the checks on the device and reads them all at once every
    N steps, at the end of :meth:`steps` and at :meth:`flush`: the host never waits for the
    device inside a step. The error still names the first bad step, but up to N - 1 steps may
    have run after it; they are never reported (the epoch fails before its checkpoint).

    Args:
        clip_grad_norm: max total gradient 2-norm (``torch.nn.utils.clip_grad_norm_``); None:
            measured, not clipped.
        global_step: steps already taken (a resumed run).
        where: prefix of the messages (the scenario step's name).
        hint: what the messages suggest.
        sync_every: steps between reads of the checks (see above).
    """

    def __init__(
        self,
        clip_grad_norm: float | None = None,
        global_step: int = 0,
        where: str = "",
        hint: str = HINT,
        sync_every: int = 1,
    ) -> None:
        self.clip_grad_norm = clip_grad_norm
        self.where, self.hint, self.sync_every = where, hint, sync_every
        self.epoch, self.step, self.global_step = 0, 0, global_step
        self.grad_norm: torch.Tensor | None = None  # the last step's, before clipping
        # unread checks: ((epoch, step, global step), names, (n, 3) kinds on the device)
        self._pending: list[tuple[tuple[int, int, int], list[str], torch.Tensor]] = []
        self._steps_unread = 0

    def steps(self, batches: Iterable, epoch: int) -> Iterator:
        """Yield ``batches``, keeping the position the messages name up to date; reads the
        checks every ``sync_every`` steps and after the last batch."""
        self.epoch = epoch
        for self.step, batch in enumerate(batches):
            yield batch
            self.global_step += 1
            self._steps_unread += 1
            if self._steps_unread >= self.sync_every:
                self.flush()
        self.flush()

    def error(self, what: str, value: str, where: tuple[int, int, int] | None = None):
        epoch, step, global_step = where or (self.epoch, self.step, self.global_step)
        prefix = f"{self.where}: " if self.where else ""
        return NonFiniteError(
            f"{prefix}non-finite {what} ({value}) at epoch {epoch}, step {step} "
            f"(global {global_step}); {self.hint}"
        )

    def _record(self, names: list[str], tensors: Iterable[torch.Tensor]) -> None:
        kinds = torch.stack([_kinds(t) for t in tensors])
        self._pending.append(((self.epoch, self.step, self.global_step), names, kinds))
        if self.sync_every <= 1:
            self.flush()

    def flush(self) -> None:
        """Read every unread check (one host synchronisation); raise for the first bad one.

        Within one check of loss terms, a bad term is named before ``loss`` (a NaN term makes
        the sum NaN too)."""
        pending, self._pending, self._steps_unread = self._pending, [], 0
        if not pending:
            return
        flags = torch.cat([kinds for _, _, kinds in pending]).tolist()
        for where, names, kinds in pending:
            rows, flags = flags[: len(kinds)], flags[len(kinds) :]
            bad = [(name, row) for name, row in zip(names, rows, strict=True) if any(row)]
            if bad:
                name, row = next(((n, r) for n, r in bad if n != "loss term 'loss'"), bad[0])
                raise self.error(name, _KINDS[row.index(True)], where)

    @contextlib.contextmanager
    def watch(self, model: nn.Module, optimizer: torch.optim.Optimizer | None):
        """Check ``model``'s training forwards and ``optimizer``'s steps until the block ends.

        ``optimizer``: a torch optimizer, or None where the strategy's engine owns the step
        (DeepSpeed: it clips with its ``gradient_clipping`` option).
        """
        handles = [model.register_forward_hook(self._check_outputs)]
        if optimizer is not None:
            handles.append(optimizer.register_step_pre_hook(self._before_step))
        try:
            yield self
        finally:
            for handle in handles:
                handle.remove()

    def check_tensors(self, tensors: dict[str, torch.Tensor]) -> None:
        """Raise now, naming the first, if any of the named ``tensors`` holds a NaN or inf."""
        if tensors:
            self._record(list(tensors), tensors.values())
            self.flush()

    def _check_outputs(self, module: nn.Module, args, output) -> None:
        if not (module.training and torch.is_grad_enabled()):
            return  # extraction
        if isinstance(output, tuple):  # CompatModel(x, output="both")
            named = dict(zip(("features", "logits"), output, strict=False))
        else:
            named = {"model output": output}
        self._record(list(named), named.values())

    def watch_terms(self, terms: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """The scalar loss terms, detached as float32 on their device, their check recorded
        (read as ``sync_every`` says)."""
        values = {name: term.detach().float().reshape(()) for name, term in terms.items()}
        self._record([f"loss term {name!r}" for name in values], values.values())
        return values

    def check_terms(self, terms: dict[str, torch.Tensor]) -> dict[str, float]:
        """``{name: value}`` of the scalar loss terms, after checking now that they are all
        finite (the message names a bad term rather than ``loss``)."""
        values = self.watch_terms(terms)
        self.flush()
        return dict(zip(values, torch.stack(list(values.values())).tolist(), strict=True))

    def check_gradients(self, parameters: Iterable[torch.Tensor]) -> torch.Tensor:
        """Total 2-norm of the gradients (after backward, before the step; a scalar tensor),
        clipped in place to ``clip_grad_norm`` when set; its check recorded."""
        parameters = [p for p in parameters if p.grad is not None]
        if self.clip_grad_norm is None:
            norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
        else:
            norm = torch.nn.utils.clip_grad_norm_(parameters, self.clip_grad_norm)
        full = getattr(norm, "full_tensor", None)  # FSDP2: a DTensor, reduced over the ranks
        self.grad_norm = (full() if full is not None else norm).detach().float()
        self._record(["gradient norm"], [self.grad_norm])
        return self.grad_norm

    def _before_step(self, optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        self.check_gradients(p for group in optimizer.param_groups for p in group["params"])


def mean_values(sums: dict[str, torch.Tensor | float], steps: int) -> dict[str, float]:
    """``{name: sum / steps}`` as floats, read from the device in one synchronisation."""
    if not sums:
        return {}
    totals = torch.stack([torch.as_tensor(v, dtype=torch.float32).cpu() for v in sums.values()])
    return {name: total / max(steps, 1) for name, total in zip(sums, totals.tolist(), strict=True)}


def train_epoch(
    model: nn.Module,
    method: CompatibilityMethod,
    batches: Iterable[Batch],
    optimizer: torch.optim.Optimizer,
    guard: StepGuard | None = None,
    epoch: int = 0,
) -> dict[str, float]:
    """One pass over ``batches``, every step checked by ``guard`` (a new :class:`StepGuard`
    if None; pass one guard for the whole run so that its messages count global steps).

    Returns the mean of every loss term, and of the gradient norm (``grad_norm``).
    """
    guard = guard or StepGuard()
    model.train()
    sums: dict[str, torch.Tensor] = {}
    steps = 0
    with guard.watch(model, optimizer):
        for batch in guard.steps(batches, epoch):
            terms = method(model, batch)
            values = guard.watch_terms(terms)
            optimizer.zero_grad(set_to_none=True)
            terms["loss"].backward()
            optimizer.step()  # after the guard's gradient check (and clip)
            values["grad_norm"] = guard.grad_norm
            for name, value in values.items():
                sums[name] = sums[name] + value if name in sums else value
            steps += 1
    if steps == 0:
        raise ValueError("train_epoch got no batches: the training split is empty")
    return mean_values(sums, steps)


def embed(
    forward: Callable[[torch.Tensor], torch.Tensor],
    images: torch.Tensor,
    *,
    normalize: bool,
    autocast: torch.dtype | None = None,
) -> torch.Tensor:
    """``(B, C, H, W)`` -> float32 ``(B, d)`` features of one batch, without gradients.

    Every extraction goes through here: the store's pipelines, FCT's triples, the training
    workers' validation features, the demo and the CLI.

    Args:
        forward: ``images -> features``, e.g. ``model.forward_features`` (in eval mode).
        normalize: L2-normalise each row (cosine galleries); False: the raw features.
        autocast: run ``forward`` under autocast to this dtype (bf16 on GPU); None: as the
            caller's context has it.
    """
    cast = contextlib.nullcontext()
    if autocast is not None:
        cast = torch.autocast(images.device.type, autocast)
    with torch.no_grad(), cast:
        features = forward(images).float()
    return F.normalize(features, dim=1) if normalize else features


def extract_features(model: nn.Module, images: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
    """``(N, C, H, W)`` -> ``(N, embed_dim)`` features in eval mode, in batches (:func:`embed`,
    not normalised)."""
    was_training = model.training
    model.eval()
    parts = [
        embed(model.forward_features, images[i : i + batch_size], normalize=False)
        for i in range(0, len(images), batch_size)
    ]
    model.train(was_training)
    return torch.cat(parts) if parts else images.new_zeros(0, model.embed_dim)


def tensor_batches(
    images: torch.Tensor,
    targets: torch.Tensor,
    batch_size: int,
    generator: torch.Generator | None = None,
    shuffle: bool = True,
    replay: torch.Tensor | None = None,
) -> Iterator[Batch]:
    """Mini-batches over in-memory tensors (small datasets such as MNIST-5k)."""
    n = len(images)
    order = torch.randperm(n, generator=generator) if shuffle else torch.arange(n)
    for start in range(0, n, batch_size):
        idx = order[start : start + batch_size]
        yield Batch(
            images=images[idx], targets=targets[idx], replay=None if replay is None else replay[idx]
        )
