"""Every compatibility method: forward/backward, gradient flow, maths of the special terms."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F

from raycompat.methods import METHODS, Batch, OldModel, create_method
from raycompat.methods.dsimplex import higher_order_nce
from raycompat.methods.nifcl import random_walk_closed_form, random_walk_iterative
from raycompat.nn.models import create_model
from raycompat.registry import UnknownNameError

K = 5
OLD_CLASSES = [0, 1, 2]


def _model(method_cls, seed):
    torch.manual_seed(seed)
    if method_cls.fixed_head:
        return create_model("lenetpp", "dsimplex", num_classes=K)
    return create_model("lenetpp", "linear", num_classes=K, embed_dim=4)


def _batch(seed=0, n=8):
    g = torch.Generator().manual_seed(seed)
    images = torch.rand(n, 1, 28, 28, generator=g)
    targets = torch.arange(n) % K
    replay = targets < 3
    return Batch(images=images, targets=targets, replay=replay)


def _old(method_cls):
    old = _model(method_cls, seed=1)
    return OldModel.from_model(old, classes=OLD_CLASSES)


@pytest.mark.parametrize("name", METHODS.names())
def test_forward_backward_every_method(name):
    cls = METHODS.get(name)
    model = _model(cls, seed=0)
    old = _old(cls)
    method = create_method(name, old=old)
    method.check_model(model)
    batch = _batch()
    method.prepare(model, [batch, _batch(seed=1)])
    model.train()
    terms = method(model, batch)
    assert "loss" in terms and all(torch.isfinite(v) for v in terms.values())
    terms["loss"].backward()
    for pname, p in model.named_parameters():
        assert p.grad is not None, f"{name}: no gradient reaches {pname}"
        assert torch.isfinite(p.grad).all(), f"{name}: non-finite gradient in {pname}"
    assert all(not b.requires_grad for b in model.head.buffers()), "fixed prototypes must not learn"


@pytest.mark.parametrize(
    "name", ["nifcl_avg", "nifcl_rw", "l2", "dsimplex_hoc", "dsimplex_fd", "ift"]
)
def test_methods_run_with_black_box_old_model(name):
    cls = METHODS.get(name)
    frozen = _model(cls, seed=1).eval()
    old = OldModel.black_box(lambda x: frozen.forward_features(x), embed_dim=frozen.embed_dim)
    method = create_method(name, old=old)
    model = _model(cls, seed=0)
    batch = _batch()
    method.prepare(model, [batch])
    method(model, batch)["loss"].backward()


def test_precomputed_old_features_are_used():
    model = _model(METHODS.get("l2"), seed=0)
    old = OldModel.black_box(lambda x: pytest.fail("extractor must not be called"), embed_dim=4)
    batch = _batch()
    batch.old_features = model.forward_features(batch.images).detach()
    terms = create_method("l2", old=old)(model, batch)
    assert float(terms["l2"].detach()) == pytest.approx(0.0, abs=1e-10)


@pytest.mark.parametrize("name", ["lwf", "lwf_ft"])
def test_lwf_distillation_is_zero_against_itself(name):
    model = _model(METHODS.get(name), seed=0)
    old = OldModel.from_model(copy.deepcopy(model), classes=OLD_CLASSES)
    terms = create_method(name, old=old)(model.eval(), _batch())
    assert float(terms["distill"].detach()) == pytest.approx(0.0, abs=1e-6)


def test_lwf_applies_the_frozen_old_head_to_the_new_features():
    # CoReS's LwF (openBCT --lwf): KL at T = 1 between old_head(new features) and
    # old_head(old features) on the old classes; a fresh initialisation.
    cls = METHODS.get("lwf")
    assert (cls.init, METHODS.get("lwf_ft").init) == ("random", "old")
    model, old_net = _model(cls, 0), _model(cls, 1)
    old = OldModel.from_model(old_net, classes=OLD_CLASSES)
    batch = _batch()
    terms = create_method("lwf", old=old)(model, batch)
    with torch.no_grad():
        student = old_net.head(model.forward_features(batch.images))[:, OLD_CLASSES]
        teacher = old_net.head(old_net.forward_features(batch.images))[:, OLD_CLASSES]
        p = F.softmax(teacher, dim=1)
        expected = (p * (p.log() - F.log_softmax(student, dim=1))).sum(dim=1).mean()
    # two fresh nets' logits are small, so the KL is about 5e-5, a difference of float32 logs
    # of order 1: its rounding (about 1e-8 here, 2e-4 of it relative) is what abs allows
    assert float(terms["distill"].detach()) == pytest.approx(float(expected), rel=1e-4, abs=1e-7)
    assert float(expected) > 1e-6  # not the trivial zero of identical nets
    terms["loss"].backward()
    assert all(p.grad is None for p in old_net.parameters()), "the old head must stay frozen"


def test_bct_synthesises_rows_as_means_of_normalised_old_features():
    cls = METHODS.get("bct")
    model, old_net = _model(cls, 0), _model(cls, 1)
    old = OldModel.from_model(old_net, classes=OLD_CLASSES)
    method = create_method("bct", old=old)
    batches = [_batch(0), _batch(1)]
    method.prepare(model, batches)
    images = torch.cat([b.images for b in batches])
    targets = torch.cat([b.targets for b in batches])
    feats = F.normalize(old_net.forward_features(images), dim=1)
    for c in range(K):
        if c in OLD_CLASSES:
            expected = old_net.head.weight_matrix()[c]
        else:
            expected = feats[targets == c].mean(dim=0)
        torch.testing.assert_close(method.influence_classifier[c], expected, atol=1e-5, rtol=1e-5)


class _ScaledFeatures(torch.nn.Module):
    """A hand-made old model: ``features = x[:, :2]`` of a flat 2-pixel image."""

    embed_dim = 2

    def forward_features(self, x):
        return x.flatten(1)[:, :2]


def test_bct_synthesised_row_by_hand():
    # Class 1 (new to the old model) has the old features (30, 40) and (0, 2): raw mean (15, 21)
    # with norm ~25.8; the normalised features (0.6, 0.8) and (0, 1) average to (0.3, 0.9).
    images = torch.tensor([[30.0, 40.0], [0.0, 2.0], [1.0, 0.0]]).reshape(3, 1, 1, 2)
    batch = Batch(images=images, targets=torch.tensor([1, 1, 0]))
    net = _ScaledFeatures()
    old = OldModel(net.forward_features, 2, classifier=torch.tensor([[0.5, 0.0]]), classes=[0])
    model = create_model("lenetpp", "linear", num_classes=2, embed_dim=2)
    method = create_method("bct", old=old)
    method.prepare(model, [batch])
    torch.testing.assert_close(method.influence_classifier[1], torch.tensor([0.3, 0.9]))
    torch.testing.assert_close(method.influence_classifier[0], torch.tensor([0.5, 0.0]))
    unit = create_method("bct", old=old, normalize_synthesized=True)
    unit.prepare(model, [batch])
    torch.testing.assert_close(
        unit.influence_classifier[1], F.normalize(torch.tensor([0.3, 0.9]), dim=0)
    )


def test_bct_normalises_synthesised_rows_for_a_cosine_classifier():
    torch.manual_seed(0)
    model = create_model("lenetpp", "linear", num_classes=K, embed_dim=4)
    old_net = create_model(
        "lenetpp",
        "linear",
        num_classes=K,
        embed_dim=4,
        head_kwargs={"bias": False, "normalize_weight": True},
    )
    batch = _batch()
    auto = create_method("bct", old=OldModel.from_model(old_net, classes=OLD_CLASSES))
    auto.prepare(model, [batch])
    torch.testing.assert_close(auto.influence_classifier.norm(dim=1), torch.ones(K))
    mean = create_method(
        "bct", old=OldModel.from_model(old_net, classes=OLD_CLASSES), normalize_synthesized=False
    )
    mean.prepare(model, [batch])
    feats = F.normalize(old_net.forward_features(batch.images), dim=1)
    expected = feats[batch.targets == 4].mean(dim=0)
    torch.testing.assert_close(mean.influence_classifier[4], expected, atol=1e-5, rtol=1e-5)


def test_nifcl_avg_rows_are_normalised_means():
    cls = METHODS.get("nifcl_avg")
    model, old_net = _model(cls, 0), _model(cls, 1).eval()
    old = OldModel.black_box(old_net.forward_features, embed_dim=4)
    method = create_method("nifcl_avg", old=old)
    batch = _batch()
    method.prepare(model, [batch])
    feats = old_net.forward_features(batch.images)
    for c in range(K):
        expected = F.normalize(feats[batch.targets == c].mean(dim=0), dim=0)
        torch.testing.assert_close(method.pseudo_classifier[c], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("m,d,t,lam", [(6, 4, 0.05, 0.9), (20, 8, 0.5, 0.5), (3, 2, 1.0, 0.99)])
def test_random_walk_closed_form_equals_iteration(m, d, t, lam):
    f = torch.randn(m, d, generator=torch.Generator().manual_seed(m), dtype=torch.float64)
    torch.testing.assert_close(
        random_walk_closed_form(f, t, lam),
        random_walk_iterative(f, t, lam, 500),
        atol=1e-8,
        rtol=1e-8,
    )


def test_higher_order_nce_by_hand():
    # Two samples, orthogonal unit features; old == new so s_ii = rho, s_ij = 0.
    rho = 2.0
    feats = torch.eye(2)
    targets = torch.tensor([0, 1])

    def nce(old, new, labels, mask):
        return float(higher_order_nce(old, new, labels, rho, mask))

    # none: log(e^rho + e^0) - rho.
    assert nce(feats, feats, targets, "none") == pytest.approx(math.log(math.exp(rho) + 1) - rho)
    # exclude (the paper, eq. 4): the denominator is only the negative, e^0 -> loss = -rho.
    assert nce(feats, feats, targets, "exclude") == pytest.approx(-rho)
    # zero (the reference code): the positive is same-class, so it is zeroed in the
    # denominator too: log(e^0 + e^0) - rho.
    assert nce(feats, feats, targets, "zero") == pytest.approx(math.log(2.0) - rho)
    # Same class, a 60-degree angle: s_00 = s_11 = rho, s_01 = s_10 = rho / 2.
    old = torch.tensor([[1.0, 0.0], [0.5, math.sqrt(3) / 2]])
    same = torch.tensor([0, 0])
    s01 = rho * 0.5
    assert nce(old, old, same, "none") == pytest.approx(
        math.log(math.exp(rho) + math.exp(s01)) - rho
    )
    assert nce(old, old, same, "exclude") == pytest.approx(s01 - rho)
    # zero: both entries of each row are same-class -> log(2 e^0) - rho.
    assert nce(old, old, same, "zero") == pytest.approx(math.log(2.0) - rho)
    # Three samples, two classes, old != new: a naive loop over the reference's formula.
    old3 = F.normalize(torch.tensor([[1.0, 0.2], [0.3, 1.0], [-1.0, 0.4]]), dim=1)
    new3 = F.normalize(torch.tensor([[0.9, -0.1], [0.2, 0.8], [-0.5, 1.0]]), dim=1)
    labels3 = torch.tensor([0, 0, 1])
    s = rho * old3 @ new3.T
    expected = {"zero": 0.0, "exclude": 0.0}
    for i in range(3):
        zeroed = [0.0 if labels3[i] == labels3[j] else float(s[i, j]) for j in range(3)]
        expected["zero"] += math.log(sum(math.exp(v) for v in zeroed)) - float(s[i, i])
        others = [float(s[i, j]) for j in range(3) if j != i]
        expected["exclude"] += math.log(sum(math.exp(v) for v in others)) - float(s[i, i])
    for mask, total in expected.items():
        assert nce(old3, new3, labels3, mask) == pytest.approx(total / 3, rel=1e-6)


def test_hoc_defaults_to_the_papers_denominator():
    assert create_method("dsimplex_hoc").nce_mask == "exclude"


def test_hoc_lambda_one_is_plain_cross_entropy():
    cls = METHODS.get("dsimplex_hoc")
    model = _model(cls, 0)
    method = create_method("dsimplex_hoc", old=_old(cls), lam=1.0)
    terms = method(model, _batch())
    torch.testing.assert_close(terms["loss"], terms["ce"])


def test_bad_inputs_are_clear_errors():
    with pytest.raises(UnknownNameError, match="valid names: adapter, affine, bct, cores"):
        create_method("bogus")
    with pytest.raises(ValueError, match="needs an old model"):
        create_method("bct")
    black_box = OldModel.black_box(lambda x: x.flatten(1)[:, :4], embed_dim=4)
    with pytest.raises(ValueError, match="nifcl_avg/nifcl_rw"):
        create_method("bct", old=black_box)
    with pytest.raises(ValueError, match="fixed"):
        create_method("cores").check_model(
            create_model("lenetpp", "linear", num_classes=3, embed_dim=2)
        )
    with pytest.raises(ValueError, match="nce_mask"):
        create_method("dsimplex_hoc", nce_mask="half")
    with pytest.raises(ValueError, match="lam"):
        create_method("dsimplex_hoc", lam=1.5)
    with pytest.raises(RuntimeError, match="prepare"):
        create_method("bct", old=_old(METHODS.get("bct")))(_model(METHODS.get("bct"), 0), _batch())


def test_nan_features_raise():
    model = _model(METHODS.get("independent"), 0)
    batch = _batch()
    batch.images[0, 0, 0, 0] = float("nan")
    with pytest.raises(FloatingPointError, match="non-finite"):
        create_method("independent")(model, batch)


def test_narrow_new_features_rejected_for_influence_loss():
    old_net = create_model("lenetpp", "linear", num_classes=K, embed_dim=8)
    method = create_method("bct", old=OldModel.from_model(old_net, classes=OLD_CLASSES))
    model = create_model("lenetpp", "linear", num_classes=K, embed_dim=4)
    method.prepare(model, [_batch()])
    with pytest.raises(ValueError, match="d_new >= d_old"):
        method(model, _batch())


def test_forward_outputs_match_the_two_step_interface():
    from raycompat.nn.models import create_model

    torch.manual_seed(0)
    model = create_model("lenetpp", "dsimplex", num_classes=5).eval()
    x = torch.randn(3, 1, 28, 28)
    features, logits = model(x, output="both")
    torch.testing.assert_close(features, model.forward_features(x))
    torch.testing.assert_close(logits, model.forward_head(model.forward_features(x)))
    torch.testing.assert_close(model(x), logits)
    torch.testing.assert_close(model(x, output="features"), features)
    with pytest.raises(ValueError, match="output must be"):
        model(x, output="embedding")


def test_unknown_method_options_are_rejected_by_name():
    from raycompat.methods.catalog import check_method_options

    check_method_options("dsimplex_hoc", {"lam": 0.5, "rho": 5.0})
    with pytest.raises(ValueError, match="takes no option.*lamda.*valid: lam, rho, nce_mask"):
        check_method_options("dsimplex_hoc", {"lamda": 0.5})
