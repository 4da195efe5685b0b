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

log = logging.getLogger(__name__)

# What a diverging run can change: the config keys (``training.`` prefixed in the upgrade job).
HINT = "lower optim.lr or set optim.clip_grad_norm"


class NonFiniteError(DataError, FloatingPointError):
    """NaN or inf in a training step: the features, a loss term or the gradient norm.

    The message names the epoch, the step and what was hit. The failure is deterministic (the
    same step from the same checkpoint hits it again), so the Ray layer stops the run at once
    instead of retrying it (``raycompat.cluster.train.guard``).
    """


def _kind(value: torch.Tensor) -> str:
    """``nan``, ``inf`` or ``-inf``: the first non-finite kind found in ``value``."""
    if bool(torch.isnan(value).any()):
        return "nan"
    return "inf" if bool((value == math.inf).any()) else "-inf"


class StepGuard:
    """Checks every training step for NaN/inf, and clips the gradient norm if asked to.

    Within :meth:`watch`, every training forward of the model has its outputs (features, and
    logits when asked for both) checked by a forward hook, and every optimizer step is preceded
    by the total gradient 2-norm (clipped to ``clip_grad_norm`` when set) through a step
    pre-hook, so a strategy's own ``backward_step`` is guarded too. :meth:`check_terms` checks
    the loss terms. Each check is one host synchronisation. The first non-finite value raises
    :class:`NonFiniteError`: ``non-finite loss term 'nce' (nan) at epoch 2, step 37 (global
    183); lower optim.lr or set optim.clip_grad_norm``.

    Args:
        clip_grad_norm: max total gradient 2-norm (``torch.nn.utils.clip_grad_norm_``); None:
            measured, not clipped.
        global_step: steps already taken (a resumed run).
        where: prefix of the messages (the scenario step's name).
        hint: what the messages suggest.
    """

    def __init__(
        self,
        clip_grad_norm: float | None = None,
        global_step: int = 0,
        where: str = "",
        hint: str = HINT,
    ) -> None:
        self.clip_grad_norm = clip_grad_norm
        self.where, self.hint = where, hint
        self.epoch, self.step, self.global_step = 0, 0, global_step
        self.grad_norm: float | None = None  # the last step's, before clipping

    def steps(self, batches: Iterable, epoch: int) -> Iterator:
        """Yield ``batches``, keeping the position the messages name up to date."""
        self.epoch = epoch
        for self.step, batch in enumerate(batches):
            yield batch
            self.global_step += 1

    def error(self, what: str, value: str) -> NonFiniteError:
        where = f"{self.where}: " if self.where else ""
        return NonFiniteError(
            f"{where}non-finite {what} ({value}) at epoch {self.epoch}, step {self.step} "
            f"(global {self.global_step}); {self.hint}"
        )

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
        """Raise, naming the first, if any of the named ``tensors`` holds a NaN or inf."""
        if not tensors:
            return
        finite = torch.stack([torch.isfinite(t.detach()).all() for t in tensors.values()])
        for (name, tensor), ok in zip(tensors.items(), finite.tolist(), strict=True):
            if not ok:
                raise self.error(name, _kind(tensor.detach()))

    def _check_outputs(self, module: nn.Module, args, output) -> None:
        if not (module.training and torch.is_grad_enabled()):
            return  # extraction
        if isinstance(output, tuple):  # CompatModel(x, output="both")
            self.check_tensors(dict(zip(("features", "logits"), output, strict=False)))
        else:
            self.check_tensors({"model output": output})

    def check_terms(self, terms: dict[str, torch.Tensor]) -> dict[str, float]:
        """``{name: value}`` of the scalar loss terms, after checking they are all finite.

        A NaN term makes ``loss`` NaN too; the message names the term, not the sum.
        """
        names = list(terms)
        values = torch.stack([terms[n].detach().float().reshape(()) for n in names]).tolist()
        bad = [n for n, v in zip(names, values, strict=True) if not math.isfinite(v)]
        if bad:
            name = next((n for n in bad if n != "loss"), bad[0])
            raise self.error(f"loss term {name!r}", str(values[names.index(name)]))
        return dict(zip(names, values, strict=True))

    def check_gradients(self, parameters: Iterable[torch.Tensor]) -> float:
        """Total 2-norm of the gradients (after backward, before the step), clipped in place
        to ``clip_grad_norm`` when set; raises if it is not finite."""
        parameters = [p for p in parameters if p.grad is not None]
        if self.clip_grad_norm is None:
            norm = torch.nn.utils.get_total_norm([p.grad for p in parameters])
        else:
            norm = torch.nn.utils.clip_grad_norm_(parameters, self.clip_grad_norm)
        full = getattr(norm, "full_tensor", None)  # FSDP2: a DTensor, reduced over the ranks
        self.grad_norm = float(full() if full is not None else norm)
        if not math.isfinite(self.grad_norm):
            raise self.error("gradient norm", str(self.grad_norm))
        return self.grad_norm

    def _before_step(self, optimizer: torch.optim.Optimizer, args, kwargs) -> None:
        self.check_gradients(p for group in optimizer.param_groups for p in group["params"])


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
    sums: dict[str, float] = {}
    steps = 0
    with guard.watch(model, optimizer):
        for batch in guard.steps(batches, epoch):
            terms = method(model, batch)
            values = guard.check_terms(terms)
            optimizer.zero_grad(set_to_none=True)
            terms["loss"].backward()
            optimizer.step()  # after the guard's gradient check (and clip)
            values["grad_norm"] = guard.grad_norm
            for name, value in values.items():
                sums[name] = sums.get(name, 0.0) + value
            steps += 1
    if steps == 0:
        raise ValueError("train_epoch got no batches: the training split is empty")
    return {name: total / steps for name, total in sums.items()}


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
