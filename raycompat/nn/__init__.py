"""The networks: backbones, heads, side-information models, and the model factory (no Ray).

Each family has its registry and factory (``create_backbone``, ``create_head``,
``create_side_info``); :func:`create_model` puts a backbone and a head together as a
:class:`CompatModel`. Everything here imports torch, so the names load at their first use.
"""

from raycompat._lazy import lazy_exports

__getattr__, __dir__, __all__ = lazy_exports(
    __name__,
    {
        "models": ("CompatModel", "create_model"),
        "backbones": ("BACKBONES", "create_backbone", "list_backbones"),
        "heads": ("HEADS", "create_head", "list_heads"),
        "side_info": ("SIDE_INFO", "create_side_info", "nt_xent_loss", "simclr_views"),
    },
)
