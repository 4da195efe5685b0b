"""FastFill partial backfill: the uncertainty-weighted loss, h's uncertainty head, the training
loop, backfill orders, accuracy-vs-fraction curves and budgets (raycompat.backfill)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from raycompat.backfill import (
    BackfillCurve,
    backfill_curve,
    backfill_order,
    budget_to_reach,
    check_budget,
    compare_orders,
    fit_uncertain_transformation,
    oracle_order,
    random_order,
    value_at_budget,
)
from raycompat.errors import ConfigError
from raycompat.evaluation import EvalSet, score
from raycompat.fct.losses import transformation_loss, uncertain_transformation_loss
from raycompat.metrics.retrieval import cmc, mean_average_precision
from raycompat.transformations import FCTTransformation


@pytest.fixture(autouse=True)
def one_torch_thread():
    # The fits are tiny; several threads on a shared CPU are ~100x slower than one.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# ---- the loss -------------------------------------------------------------------------------


def test_uncertain_loss_hand_worked():
    predicted = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    target = torch.tensor([[0.0, 0.0], [0.0, 2.0]])  # L = [1, 4]
    sigma = torch.tensor([0.0, math.log(4.0)])
    terms = uncertain_transformation_loss(predicted, sigma, target)
    # row 0: 0.5 * 1 * 1 + 0; row 1: 0.5 * (1/4) * 4 + 0.5 * ln 4
    expected = (0.5 + (0.5 + 0.5 * math.log(4.0))) / 2
    assert float(terms["loss"]) == pytest.approx(expected, rel=1e-6)
    assert float(terms["mse"]) == pytest.approx(2.5)
    assert float(terms["mse"]) == pytest.approx(
        float(transformation_loss(predicted, target)["mse"])
    )
    assert float(terms["sigma"]) == pytest.approx(math.log(4.0) / 2)
    assert set(terms) == {"mse", "sigma", "loss"}


def test_uncertain_loss_with_discriminative_term_hand_worked():
    predicted = torch.tensor([[1.0, 0.0], [0.0, 0.0]])
    target = torch.tensor([[0.0, 0.0], [0.0, 2.0]])
    sigma = torch.tensor([0.0, math.log(4.0)])
    logits = torch.zeros(2, 2)  # CE = ln 2 for either label
    labels = torch.tensor([0, 1])
    terms = uncertain_transformation_loss(
        predicted, sigma, target, logits=logits, labels=labels, discriminative_weight=2.0
    )
    ln2 = math.log(2.0)
    row0 = 0.5 * (1 + 2 * ln2)
    row1 = 0.5 * 0.25 * (4 + 2 * ln2) + 0.5 * math.log(4.0)
    assert float(terms["loss"]) == pytest.approx((row0 + row1) / 2, rel=1e-6)
    assert float(terms["discriminative"]) == pytest.approx(ln2)
    with pytest.raises(ValueError, match="both logits and labels"):
        uncertain_transformation_loss(predicted, sigma, target, logits=logits)
    with pytest.raises(ValueError, match="sigma must have shape"):
        uncertain_transformation_loss(predicted, sigma[:1], target)


def test_uncertain_loss_is_minimised_at_sigma_log_error():
    predicted, target = torch.randn(5, 3), torch.randn(5, 3)
    per_row = (predicted - target).pow(2).sum(dim=1)
    sigma = per_row.log().clone().requires_grad_(True)
    uncertain_transformation_loss(predicted, sigma, target)["loss"].backward()
    torch.testing.assert_close(sigma.grad, torch.zeros(5), atol=1e-6, rtol=0)


def test_uncertain_loss_cosine_error_hand_worked():
    """``error="cosine"``: the error sigma estimates is measured between unit vectors."""
    predicted = torch.tensor([[1.0, 0.0], [0.0, 2.0]])
    target = torch.tensor([[1.0, 1.0], [0.0, 1.0]])  # row 1: same direction, other norm
    sigma = torch.tensor([0.0, math.log(2.0)])
    cosine = uncertain_transformation_loss(predicted, sigma, target, error="cosine")
    # unit rows: [1, 0] vs [1/sqrt2, 1/sqrt2] -> e = 2 - sqrt2; [0, 1] vs [0, 1] -> e = 0
    e0 = 2.0 - math.sqrt(2.0)
    assert float(cosine["loss"]) == pytest.approx((0.5 * e0 + 0.5 * math.log(2.0)) / 2, rel=1e-6)
    assert float(cosine["error"]) == pytest.approx(e0 / 2, rel=1e-6)
    assert float(cosine["mse"]) == pytest.approx(1.0)  # the raw ||h - new||^2, logged as before
    l2 = uncertain_transformation_loss(predicted, sigma, target)  # raw errors [1, 1]
    assert float(l2["loss"]) == pytest.approx((0.5 + 0.25 + 0.5 * math.log(2.0)) / 2, rel=1e-6)
    assert "error" not in l2
    # Only the directions count: rescaling the targets' rows changes l2, not cosine.
    scaled = target * torch.tensor([[3.0], [0.5]])
    again = uncertain_transformation_loss(predicted, sigma, scaled, error="cosine")
    assert float(again["loss"]) == pytest.approx(float(cosine["loss"]), rel=1e-6)
    assert float(uncertain_transformation_loss(predicted, sigma, scaled)["loss"]) != (
        pytest.approx(float(l2["loss"]))
    )
    with pytest.raises(KeyError, match="uncertainty error 'dot'.*cosine, l2"):
        uncertain_transformation_loss(predicted, sigma, target, error="dot")


# ---- the model: FCT's h, unchanged without the head --------------------------------------------

PLAIN_KEYS = [
    f"{part}.{layer}.{name}"
    for part in ("old_projection", "mixer.0")
    for layer, names in ((0, ("weight", "bias")), (3, ("weight", "bias")), (1, "BN"), (4, "BN"))
    for name in (
        ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
        if names == "BN"
        else names
    )
] + ["mixer.1.weight", "mixer.1.bias"]


def test_transformation_without_head_is_unchanged():
    torch.manual_seed(0)
    plain = FCTTransformation(5, 0, 3, width=8)
    torch.manual_seed(0)
    with_head = FCTTransformation(5, 0, 3, width=8, uncertainty=True)
    assert sorted(plain.state_dict()) == sorted(PLAIN_KEYS)
    assert sorted(with_head.state_dict()) == sorted(
        PLAIN_KEYS + ["uncertainty_head.weight", "uncertainty_head.bias"]
    )
    # A plain checkpoint loads strictly into a plain model, and into the shared layers of one
    # with the head; the head is built last, so the shared layers start identical.
    FCTTransformation(5, 0, 3, width=8).load_state_dict(plain.state_dict())
    missing = with_head.load_state_dict(plain.state_dict(), strict=False).missing_keys
    assert sorted(missing) == ["uncertainty_head.bias", "uncertainty_head.weight"]
    x = torch.randn(6, 5)
    for model in (plain, with_head):
        model.eval()
    torch.testing.assert_close(with_head(x), plain(x), rtol=0, atol=0)
    emb, sigma = with_head.forward_with_uncertainty(x)
    torch.testing.assert_close(emb, plain(x), rtol=0, atol=0)
    assert sigma.shape == (6,)
    assert with_head.forward_with_uncertainty(x[:1])[1].shape == (1,)  # no squeeze to ()
    with pytest.raises(ValueError, match="uncertainty=True"):
        plain.forward_with_uncertainty(x)


def test_head_with_side_information_and_normalized_output():
    h = FCTTransformation(4, 2, 3, width=8, normalize_output=True, uncertainty=True)
    emb, sigma = h.forward_with_uncertainty(torch.randn(5, 4), torch.randn(5, 2))
    torch.testing.assert_close(emb.norm(dim=1), torch.ones(5))
    (emb.sum() + sigma.sum()).backward()
    assert all(p.grad is not None for p in h.parameters())
    with pytest.raises(ValueError, match="side-information"):
        h.forward_with_uncertainty(torch.randn(5, 4))


# ---- fitting ------------------------------------------------------------------------------------


def _small_problem(n=96, seed=0):
    rng = np.random.default_rng(seed)
    old = rng.standard_normal((n, 5)).astype(np.float32)
    new = (old @ rng.standard_normal((5, 4))).astype(np.float32)
    return old, new


def test_fit_is_deterministic():
    old, new = _small_problem()
    options = dict(epochs=3, width=16, batch_size=32, lr=1e-2, warmup_epochs=1)
    a = fit_uncertain_transformation(old, new, seed=3, **options).transform(old)
    b = fit_uncertain_transformation(old, new, seed=3, **options).transform(old)
    c = fit_uncertain_transformation(old, new, seed=4, **options).transform(old)
    assert a[0].dtype == np.float32 and a[1].dtype == np.float32
    assert a[0].shape == (96, 4) and a[1].shape == (96,)
    assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])
    assert not np.array_equal(a[0], c[0])


def test_fit_leaves_the_global_rng_alone_and_learns():
    old, new = _small_problem()
    torch.manual_seed(123)
    expected = torch.rand(3)
    torch.manual_seed(123)
    fit = fit_uncertain_transformation(
        old, new, epochs=30, width=32, batch_size=32, lr=1e-2, warmup_epochs=1
    )
    torch.testing.assert_close(torch.rand(3), expected)
    assert len(fit.history) == 30
    assert fit.history[-1]["mse"] < 0.2 * fit.history[0]["mse"]


@pytest.mark.parametrize(
    "option, value",
    [
        ("epochs", 0),
        ("epochs", 2.5),
        ("width", -1),
        ("lr", 0.0),
        ("lr", float("nan")),
        ("lr", float("inf")),
        ("weight_decay", "0"),
        ("batch_size", 1),
        ("batch_size", 97),  # more than the 96 rows
        ("weight_decay", -1e-4),
        ("warmup_epochs", -1),
        ("discriminative_weight", -1.0),
    ],
)
def test_fit_refuses_bad_options(option, value):
    old, new = _small_problem()
    with pytest.raises(ConfigError, match=option):
        fit_uncertain_transformation(old, new, **{option: value})


def test_fit_refuses_bad_inputs():
    old, new = _small_problem()
    with pytest.raises(ValueError, match="same 96 images"):
        fit_uncertain_transformation(old, new[:50], batch_size=8)
    with pytest.raises(ConfigError, match="labels and classifier"):
        fit_uncertain_transformation(old, new, labels=np.zeros(96, dtype=np.int64))
    with pytest.raises(ConfigError, match="labels must have shape"):
        fit_uncertain_transformation(
            old, new, labels=np.zeros(5, dtype=np.int64), classifier=torch.nn.Linear(4, 2)
        )
    old[3, 1] = np.nan
    with pytest.raises(ValueError, match="row 3"):
        fit_uncertain_transformation(old, new, batch_size=8)


def test_discriminative_term_trains_h_not_the_classifier():
    old, new = _small_problem()
    labels = (new[:, 0] > 0).astype(np.int64)
    classifier = torch.nn.Linear(4, 2)
    before = {k: v.clone() for k, v in classifier.state_dict().items()}
    fit = fit_uncertain_transformation(
        old,
        new,
        epochs=2,
        width=16,
        batch_size=32,
        warmup_epochs=0,
        labels=labels,
        classifier=classifier,
        discriminative_weight=0.5,
    )
    assert set(fit.history[0]) == {"mse", "error", "discriminative", "sigma", "loss"}
    for key, value in classifier.state_dict().items():
        assert torch.equal(value, before[key])
    assert all(p.requires_grad and p.grad is None for p in classifier.parameters())


# ---- orders -------------------------------------------------------------------------------------


def test_backfill_order_most_uncertain_first_ties_by_row():
    u = np.array([0.5, 2.0, 0.5, 2.0, -np.inf, 0.5, np.inf], dtype=np.float32)
    order = backfill_order(u)
    assert order.dtype == np.int64
    assert order.tolist() == [6, 1, 3, 0, 2, 5, 4]
    assert backfill_order(np.zeros(4)).tolist() == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="NaN value.*row 2"):
        backfill_order(np.array([0.1, 0.2, np.nan, np.nan]))
    with pytest.raises(ValueError, match=r"shape \(N,\)"):
        backfill_order(np.zeros((2, 2)))


def test_random_and_oracle_orders():
    assert sorted(random_order(10, seed=1).tolist()) == list(range(10))
    assert np.array_equal(random_order(10, seed=1), random_order(10, seed=1))
    new = np.eye(4, dtype=np.float32)
    transformed = new.copy()
    transformed[2] = [0, 1, 0, 0]  # orthogonal to its target: the largest error
    transformed[0] = [1, 0.5, 0, 0]  # off by a smaller angle
    assert oracle_order(transformed, new).tolist() == [2, 0, 1, 3]
    # L2: raw features, so scale counts
    transformed[3] = [0, 0, 0, 5]
    assert oracle_order(transformed, new, "l2").tolist() == [3, 2, 0, 1]


# ---- curves -------------------------------------------------------------------------------------


def _retrieval_problem(n=60, classes=6, seed=0):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, classes, n)
    centers = rng.standard_normal((classes, 8))
    new = (centers[labels] + 0.6 * rng.standard_normal((n, 8))).astype(np.float32)
    transformed = (new + 1.2 * rng.standard_normal((n, 8))).astype(np.float32)
    return new, transformed, labels, rng


def _naive_top1(query, gallery, query_labels, gallery_labels, exclude_self):
    hits = []
    for i, q in enumerate(query):
        cos = [
            float(q @ g / np.linalg.norm(q) / np.linalg.norm(g))
            if not (exclude_self and j == i)
            else -np.inf
            for j, g in enumerate(gallery)
        ]
        hits.append(gallery_labels[int(np.argmax(cos))] == query_labels[i])
    return float(np.mean(hits))


@pytest.mark.parametrize("exclude_self", [True, False])
def test_curve_endpoints_are_the_cross_and_self_tests(exclude_self):
    new, transformed, labels, rng = _retrieval_problem()
    if exclude_self:  # the project's same-set identification protocol
        query, query_labels = new, labels
    else:  # a separate query set
        query, query_labels = new[:20] + 0.1, labels[:20]
    order = rng.permutation(len(new))
    curve = backfill_curve(
        query, new, transformed, query_labels, labels, order, exclude_self=exclude_self
    )
    assert curve.fractions.tolist() == pytest.approx(np.linspace(0, 1, 11).tolist())
    assert curve.counts.tolist() == [0, 6, 12, 18, 24, 30, 36, 42, 48, 54, 60]
    for index, gallery in ((0, transformed), (-1, new)):
        args = (query, gallery, query_labels, labels)
        top1 = cmc(*args, topk=(1,), exclude_self=exclude_self)[1]
        assert curve.top1[index] == top1
        assert curve.mean_ap[index] == mean_average_precision(*args, exclude_self=exclude_self)
        if exclude_self:
            assert curve.top1[index] == score("identification", new, gallery, EvalSet(labels))
    assert curve.top1[0] < curve.top1[-1]  # the problem is not degenerate
    # A middle point against a naive loop over a gallery mixed by hand.
    mixed = transformed.copy()
    mixed[order[:24]] = new[order[:24]]
    assert curve.top1[4] == pytest.approx(
        _naive_top1(query, mixed, query_labels, labels, exclude_self)
    )


def test_curve_refuses_bad_inputs():
    new, transformed, labels, _ = _retrieval_problem(n=10)
    order = np.arange(10)
    with pytest.raises(ValueError, match="permutation"):
        backfill_curve(new, new, transformed, labels, labels, np.array([0] * 10))
    with pytest.raises(ValueError, match="permutation"):
        backfill_curve(new, new, transformed, labels, labels, order[:9])
    with pytest.raises(ValueError, match="strictly increasing"):
        backfill_curve(new, new, transformed, labels, labels, order, [0.0, 0.5, 0.5])
    with pytest.raises(ConfigError, match=r"fractions\[1\]"):
        backfill_curve(new, new, transformed, labels, labels, order, [0.0, 1.5])
    with pytest.raises(ValueError, match="same images"):
        backfill_curve(new, new, transformed[:9], labels, labels, order)


def _hand_curve():
    return BackfillCurve(
        fractions=np.array([0.0, 0.5, 1.0]),
        counts=np.array([0, 5, 10]),
        top1=np.array([0.5, 0.9, 1.0]),
        mean_ap=np.array([0.2, 0.6, 0.8]),
    )


def test_auc_and_mean_hand_worked():
    curve = _hand_curve()
    assert curve.auc() == pytest.approx(0.5 * (0.2 + 0.6) / 2 + 0.5 * (0.6 + 0.8) / 2)
    assert curve.mean() == pytest.approx((0.2 + 0.6 + 0.8) / 3)
    assert curve.auc("top1") == pytest.approx(0.5 * 1.4 / 2 + 0.5 * 1.9 / 2)
    # on a sub-interval the area is divided by the span: a flat curve's area is its value
    flat = BackfillCurve(np.array([0.2, 0.4]), np.array([2, 4]), np.ones(2), np.full(2, 0.3))
    assert flat.auc() == pytest.approx(0.3)
    with pytest.raises(ValueError, match="top1, mean_ap"):
        curve.values("map")


# ---- budgets ------------------------------------------------------------------------------------


def test_budget_helpers_at_0_and_1_and_between():
    curve = _hand_curve()
    assert value_at_budget(curve, 0) == 0.2
    assert value_at_budget(curve, 1.0) == 0.8
    assert value_at_budget(curve, 0.25) == pytest.approx(0.4)
    assert value_at_budget(curve, 0.75, "top1") == pytest.approx(0.95)
    assert budget_to_reach(curve, 0.1) == 0.0
    assert budget_to_reach(curve, 0.6) == 0.5
    assert budget_to_reach(curve, 0.95 * 0.8) == 1.0  # 95% of new/new
    assert budget_to_reach(curve, 0.81) is None
    assert budget_to_reach(curve, 0.95, "top1") == 1.0
    with pytest.raises(ValueError, match="outside the curve's grid"):
        value_at_budget(BackfillCurve(*[np.array([0.0, 0.5])] * 4), 0.75)


@pytest.mark.parametrize("bad", [-0.1, 1.0001, float("nan"), float("inf"), "0.5", None, True])
def test_check_budget_refuses(bad):
    with pytest.raises(ConfigError, match="budget") as info:
        check_budget(bad)
    assert isinstance(info.value, ValueError)


def test_check_budget_accepts_fractions():
    assert check_budget(0) == 0.0
    assert check_budget(1) == 1.0
    assert check_budget(np.float32(0.5)) == 0.5
    with pytest.raises(ConfigError, match="policy.budget"):
        check_budget(2, name="policy.budget")


# ---- end to end: the uncertainty finds the hard rows -------------------------------------------


def _hard_rows_problem(n, rng, centers, rotation):
    """new = class centre + small noise. old = rotated new, except that the rows whose
    "quality" coordinate (also in old) is > 0.7 get large noise first: h cannot recover new
    there, and the old embedding tells which rows those are."""
    labels = rng.integers(0, len(centers), n)
    new = centers[labels] + 0.3 * rng.standard_normal((n, centers.shape[1]))
    quality = rng.uniform(0, 1, n)
    hard = quality > 0.7
    noisy = new + hard[:, None] * 3.0 * rng.standard_normal(new.shape)
    old = np.concatenate([noisy @ rotation, quality[:, None]], axis=1)
    return old.astype(np.float32), new.astype(np.float32), labels, hard


def test_uncertainty_order_beats_random_on_hard_rows():
    rng = np.random.default_rng(0)
    centers = 1.5 * rng.standard_normal((16, 8))
    rotation = np.linalg.qr(rng.standard_normal((8, 8)))[0]
    old, new, _, _ = _hard_rows_problem(1024, rng, centers, rotation)
    old_test, new_test, labels, hard = _hard_rows_problem(300, rng, centers, rotation)
    fit = fit_uncertain_transformation(
        old, new, epochs=30, width=64, batch_size=128, lr=1e-2, warmup_epochs=1
    )
    transformed, uncertainty = fit.transform(old_test)

    def unit(x):
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    # The error a cosine search sees (the fit's default error, and the oracle's).
    error = ((unit(transformed) - unit(new_test)) ** 2).sum(axis=1)
    # The uncertainty ranks the hard rows above the easy ones (AUROC) and follows the error.
    ranks = np.argsort(np.argsort(uncertainty))
    auroc = (ranks[hard].mean() - (hard.sum() - 1) / 2) / (~hard).sum()
    assert auroc > 0.95
    assert np.corrcoef(np.argsort(np.argsort(error)), ranks)[0, 1] > 0.6  # Spearman
    curves = compare_orders(
        new_test,
        new_test,
        transformed,
        labels,
        labels,
        uncertainty,
        random_seeds=(0, 1, 2),
        exclude_self=True,
    )
    auc = {name: curve.auc() for name, curve in curves.items()}
    print("backfill mAP AUC:", {k: round(v, 4) for k, v in auc.items()})
    assert auc["uncertainty"] > auc["random"] + 0.02
    assert auc["oracle"] > auc["random"] + 0.02
    for name in ("uncertainty", "oracle"):  # all orders share the endpoints
        assert curves[name].mean_ap[[0, -1]] == pytest.approx(curves["random"].mean_ap[[0, -1]])
        assert curves[name].mean_ap[-1] == curves["uncertainty"].mean_ap[-1]
    new_new = curves["random"].mean_ap[-1]
    assert budget_to_reach(curves["uncertainty"], 0.95 * new_new) <= 0.4
    assert budget_to_reach(curves["random"], 0.95 * new_new) >= 0.6


def _norm_noise_problem(n, rng, centers):
    """new = class centre + small noise, then two kinds of noisy rows, both flagged in old:
    ``hard`` rows get their DIRECTION scrambled before old is made (h cannot recover it: the
    error a cosine search sees), ``stretched`` rows get their NORM multiplied by a random factor
    in [0.2, 5] after (h cannot predict it, but cosine search never sees it)."""
    labels = rng.integers(0, len(centers), n)
    new = centers[labels] + 0.3 * rng.standard_normal((n, centers.shape[1]))
    hard, stretched = rng.uniform(0, 1, n) > 0.7, rng.uniform(0, 1, n) > 0.5
    noisy = new + hard[:, None] * 3.0 * rng.standard_normal(new.shape)
    old = np.concatenate([noisy, hard[:, None], stretched[:, None]], axis=1)
    new = new * np.where(stretched, rng.uniform(0.2, 5.0, n), 1.0)[:, None]
    return old.astype(np.float32), new.astype(np.float32), labels, hard


def test_cosine_error_ranks_what_cosine_search_sees_not_the_norm():
    """The deviation fixed: with the raw (l2) error, sigma learns the rows whose norm h cannot
    predict, which a cosine gallery never sees; measured on unit vectors it learns the rows
    whose direction h cannot recover, and its order backfills those first."""
    rng = np.random.default_rng(1)
    centers = 1.5 * rng.standard_normal((12, 8))
    old, new, _, _ = _norm_noise_problem(768, rng, centers)
    old_test, new_test, labels, hard = _norm_noise_problem(240, rng, centers)
    options = dict(epochs=20, width=48, batch_size=128, lr=1e-2, warmup_epochs=1)
    auroc, auc = {}, {}
    for error in ("l2", "cosine"):
        fit = fit_uncertain_transformation(old, new, error=error, **options)
        transformed, uncertainty = fit.transform(old_test)
        ranks = np.argsort(np.argsort(uncertainty))
        auroc[error] = (ranks[hard].mean() - (hard.sum() - 1) / 2) / (~hard).sum()
        curve = backfill_curve(
            new_test,
            new_test,
            transformed,
            labels,
            labels,
            backfill_order(uncertainty),
            exclude_self=True,
        )
        auc[error] = curve.auc()
    print("AUROC of hard rows:", auroc, "mAP AUC:", auc)
    assert auroc["cosine"] > 0.9 > 0.7 > auroc["l2"]
    assert auc["cosine"] > auc["l2"]
    with pytest.raises(ConfigError, match="error must be one of cosine, l2, got 'dot'"):
        fit_uncertain_transformation(old, new, batch_size=128, error="dot")
