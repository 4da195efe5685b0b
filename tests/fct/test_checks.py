"""Pre-run checks of the FCT configs (raycompat/fct/checks.py) that need no data."""

from __future__ import annotations

import pytest

from raycompat.config.fct import FCTOptimSpec
from raycompat.fct.checks import check_optim


def test_fct_runs_refuse_gradient_clipping():
    check_optim(FCTOptimSpec())
    with pytest.raises(ValueError, match="optim.clip_grad_norm: FCT training runs"):
        check_optim(FCTOptimSpec(clip_grad_norm=1.0))
