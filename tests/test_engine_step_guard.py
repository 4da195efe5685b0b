"""The training-step guard (no Ray): NaN/inf in a loss term, the features or the gradients stops
training with an error naming the epoch, the step and what was hit; the gradient-norm clip."""

from __future__ import annotations

import math
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from raycompat.engine import NonFiniteError, StepGuard, train_epoch
from raycompat.methods import Batch


class Tiny(nn.Module):
    """``CompatModel``'s calling convention at toy size: ``(B, 4) -> (features, logits)``."""

    def __init__(self) -> None:
        super().__init__()
        self.backbone = nn.Linear(4, 3)
        self.head = nn.Linear(3, 2)

    def forward(self, x, output="logits"):
        features = self.backbone(x)
        return features, self.head(features)


class TwoTerms:
    """``ce`` + ``nce`` (a made-up second term), ``nce`` turned NaN from global step ``poison``."""

    def __init__(self, poison: int | None = None) -> None:
        self.poison, self.calls = poison, 0

    def __call__(self, model, batch):
        features, logits = model(batch.images, output="both")
        terms = {"ce": F.cross_entropy(logits, batch.targets), "nce": features.pow(2).mean()}
        if self.calls == self.poison:
            terms["nce"] = terms["nce"] * float("nan")
        self.calls += 1
        return {**terms, "loss": terms["ce"] + 0.1 * terms["nce"]}


def batches(n: int, nan_at: int | None = None) -> list[Batch]:
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(n):
        images = torch.randn(8, 4, generator=gen)
        if i == nan_at:
            images[3, 1] = float("nan")
        out.append(Batch(images=images, targets=torch.arange(8) % 2))
    return out


def setup():
    torch.manual_seed(0)
    model = Tiny()
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def snapshot(model: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def assert_unchanged(model: nn.Module, before: list[torch.Tensor]) -> None:
    for p, q in zip(model.parameters(), before, strict=True):
        assert torch.equal(p.detach(), q)


def test_finite_run_reports_terms_and_gradient_norm():
    model, optimizer = setup()
    guard = StepGuard()
    means = train_epoch(model, TwoTerms(), batches(3), optimizer, guard)
    assert set(means) == {"ce", "nce", "loss", "grad_norm"} and means["grad_norm"] > 0
    assert (guard.epoch, guard.step, guard.global_step) == (0, 2, 3)


def test_nan_loss_term_names_the_term_epoch_and_step():
    model, optimizer = setup()
    guard = StepGuard(where="step_2")
    method = TwoTerms(poison=5)  # epoch 1 (3 batches an epoch), its third step
    train_epoch(model, method, batches(3), optimizer, guard, epoch=0)
    with pytest.raises(NonFiniteError) as caught:
        train_epoch(model, method, batches(3), optimizer, guard, epoch=1)
    message = str(caught.value)
    expected = (
        "step_2: non-finite loss term 'nce' (nan) at epoch 1, step 2 (global 5); "
        "lower optim.lr or set optim.clip_grad_norm"
    )
    assert message == expected  # the term, not the sum 'loss' it also made NaN
    assert isinstance(caught.value, FloatingPointError)


def test_only_the_sum_non_finite_names_loss_and_inf():
    guard = StepGuard()
    with pytest.raises(NonFiniteError, match=re.escape("non-finite loss term 'loss' (inf)")):
        guard.check_terms({"ce": torch.tensor(1.0), "loss": torch.tensor(float("inf"))})
    assert guard.check_terms({"ce": torch.tensor(0.5), "loss": torch.tensor(1.5)}) == {
        "ce": 0.5,
        "loss": 1.5,
    }


def test_nan_input_is_caught_in_the_features_before_any_update():
    model, optimizer = setup()
    with pytest.raises(
        NonFiniteError, match=re.escape("non-finite features (nan) at epoch 0, step 1 (global 1)")
    ):
        train_epoch(model, TwoTerms(), batches(3, nan_at=1), optimizer)
    assert all(torch.isfinite(p).all() for p in model.parameters())  # no NaN step was taken


def test_inf_gradient_stops_before_the_optimizer_step():
    model, optimizer = setup()
    train_epoch(model, TwoTerms(), batches(2), optimizer)  # a good epoch first
    before = snapshot(model)
    model.head.weight.register_hook(lambda grad: torch.full_like(grad, float("inf")))
    guard = StepGuard(global_step=2)
    with pytest.raises(
        NonFiniteError,
        match=re.escape("non-finite gradient norm (inf) at epoch 1, step 0 (global 2)"),
    ):
        train_epoch(model, TwoTerms(), batches(2), optimizer, guard, epoch=1)
    assert_unchanged(model, before)  # the last good weights are kept


def test_hooks_are_removed_and_eval_forwards_are_not_checked():
    model, optimizer = setup()
    guard = StepGuard()
    with guard.watch(model, optimizer):
        model.eval()
        model(torch.full((2, 4), float("nan")))  # extraction in eval mode: not a training step
        model.train()
        with pytest.raises(NonFiniteError, match="non-finite features"):
            model(torch.full((2, 4), float("nan")))
    model(torch.full((2, 4), float("nan")))  # outside watch(): no hook left behind


class Linear2:
    """loss = w . (3, 4): the gradient is (3, 4) whatever w is, its norm 5."""

    def __call__(self, model, batch):
        return {"loss": model.w @ torch.tensor([3.0, 4.0])}


def test_clip_grad_norm_bounds_the_step_to_the_clipped_gradient():
    model = nn.Module()
    model.w = nn.Parameter(torch.zeros(2))
    optimizer = torch.optim.SGD([model.w], lr=1.0)
    guard = StepGuard(clip_grad_norm=1.0)
    out = train_epoch(model, Linear2(), batches(1), optimizer, guard)
    assert out["grad_norm"] == pytest.approx(5.0)  # measured before the clip
    # clipped to norm 1: (3, 4) / 5, and SGD with lr 1 steps by exactly that
    torch.testing.assert_close(model.w.detach(), torch.tensor([-0.6, -0.8]))
    unclipped = nn.Module()
    unclipped.w = nn.Parameter(torch.zeros(2))
    train_epoch(unclipped, Linear2(), batches(1), torch.optim.SGD([unclipped.w], lr=1.0))
    torch.testing.assert_close(unclipped.w.detach(), torch.tensor([-3.0, -4.0]))


def test_check_gradients_with_no_gradient_is_zero():
    assert StepGuard().check_gradients([nn.Parameter(torch.zeros(3))]) == 0.0


def test_deferred_checks_are_read_every_n_steps_and_name_the_first_bad_step():
    model, optimizer = setup()
    guard = StepGuard(sync_every=4)
    method = TwoTerms(poison=1)
    seen = []
    with pytest.raises(NonFiniteError) as caught:
        for batch in guard.steps(batches(6), epoch=3):
            seen.append(guard.step)
            with guard.watch(model, optimizer):
                terms = method(model, batch)
                guard.watch_terms(terms)
                optimizer.zero_grad()
                terms["loss"].backward()
                optimizer.step()
    assert seen == [0, 1, 2, 3]  # read after the fourth step, not at the second
    assert str(caught.value).startswith("non-finite loss term 'nce' (nan) at epoch 3, step 1 ")


def test_deferred_checks_are_read_at_the_end_of_the_batches():
    guard = StepGuard(sync_every=100)
    with pytest.raises(NonFiniteError, match=re.escape("'loss' (-inf) at epoch 0, step 2")):
        for step in guard.steps(range(3), epoch=0):
            guard.watch_terms({"loss": torch.tensor(-math.inf if step == 2 else 1.0)})


def test_epoch_means_match_with_deferred_and_immediate_checks():
    means = []
    for every in (1, 50):
        model, optimizer = setup()
        means.append(
            train_epoch(model, TwoTerms(), batches(5), optimizer, StepGuard(sync_every=every))
        )
    assert means[0] == means[1]
