"""The registry of compatibility methods: one entry per method, readable without torch.

Each entry names the class that implements the method (imported at its first use) and the two
facts a config check needs before any training starts: whether the method learns a
transformation ``h`` (an FCT upgrade) and the option names its constructor takes
(``method_options``, in signature order). A config typo (``method: bctx``, an option the method
does not take) is then one line in well under a second, without importing torch (about 2 s).
``tests/methods/test_catalog.py`` checks each entry's options against its class's constructor.
"""

from __future__ import annotations

from dataclasses import dataclass

from raycompat.errors import ConfigError
from raycompat.registry import Registry, did_you_mean


@dataclass(frozen=True)
class MethodEntry:
    """One compatibility method.

    Attributes:
        target: ``"module:Class"`` of its implementation.
        needs_transformation: the method upgrades by transforming the gallery (FCT).
        options: the keyword arguments of its constructor other than ``old``, in order.
        fits_map: an upgrade without compatible training: the new model is trained on its own
            (``independent``, standing for an off-the-shelf model) and a map of this kind
            (``raycompat.transformations``) is fitted from its space into the gallery's on
            paired rows; its queries search the stored gallery through the map.
    """

    target: str
    needs_transformation: bool = False
    options: tuple[str, ...] = ()
    fits_map: bool = False


_M = "raycompat.methods."
METHOD_CATALOG: dict[str, MethodEntry] = {
    "independent": MethodEntry(_M + "baselines:Independent"),
    "ift": MethodEntry(_M + "baselines:IncrementalFineTuning"),
    "er": MethodEntry(_M + "baselines:ExperienceReplay"),
    "l2": MethodEntry(_M + "baselines:L2ToOldFeatures", options=("weight",)),
    "lwf": MethodEntry(
        _M + "baselines:LearningWithoutForgetting", options=("weight", "temperature")
    ),
    "lwf_ft": MethodEntry(
        _M + "baselines:FineTunedLearningWithoutForgetting", options=("weight", "temperature")
    ),
    "bct": MethodEntry(
        _M + "bct:BackwardCompatibleTraining", options=("weight", "normalize_synthesized")
    ),
    "cores": MethodEntry(_M + "dsimplex:CoReS"),
    "dsimplex_hoc": MethodEntry(_M + "dsimplex:DSimplexHOC", options=("lam", "rho", "nce_mask")),
    "dsimplex_fd": MethodEntry(_M + "dsimplex:DSimplexFD", options=("weight", "distance")),
    "fct": MethodEntry(_M + "fct:ForwardCompatibleTraining", needs_transformation=True),
    "nifcl_avg": MethodEntry(_M + "nifcl:NIFCLAverage", options=("weight", "temperature", "lam")),
    "nifcl_rw": MethodEntry(_M + "nifcl:NIFCLRandomWalk", options=("weight", "temperature", "lam")),
    # Upgrades without retraining (docs/transformations.md): trained as independent models.
    "procrustes": MethodEntry(_M + "baselines:Independent", fits_map=True),
    "affine": MethodEntry(_M + "baselines:Independent", fits_map=True),
    "adapter": MethodEntry(_M + "baselines:Independent", fits_map=True),
    "slerp": MethodEntry(_M + "baselines:Independent", fits_map=True),
}

METHODS: Registry = Registry("compatibility method")
for _name, _entry in METHOD_CATALOG.items():
    METHODS.register_path(_name, _entry.target)


def method_entry(name: str) -> MethodEntry:
    """The entry of ``name``; an unknown name raises
    :class:`~raycompat.registry.UnknownNameError` listing the valid names."""
    if name not in METHOD_CATALOG:
        METHODS.get(name)  # raises the registry's own message
    return METHOD_CATALOG[name]


def list_methods() -> list[str]:
    """The registered method names, sorted."""
    return METHODS.names()


def check_method_options(name: str, options: dict, key: str = "method_options") -> None:
    """Reject option names the method does not take (a :class:`ConfigError` naming ``key`` and
    the nearest valid option), without importing or constructing the method."""
    valid = method_entry(name).options
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ConfigError(
            f"{key}: {name!r} takes no option(s) {', '.join(unknown)}; "
            f"valid: {', '.join(valid) or 'none'}{did_you_mean(unknown, valid)}"
        )
