"""Replacing a model's forward so that the libraries around the model still see its own.

Two of them read the forward besides calling it: the Trainer passes only the dataset columns its
signature names (a packed batch's `position_ids` among them), and accelerate's regional compilation
rebinds it to a copy of the model that holds the compiled blocks. A replacement made here keeps the
signature of the forward it replaces and calls that forward on whichever model it is bound to.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any

from transformers import PreTrainedModel

# (self, the replaced forward's function, *args, **kwargs) -> outputs; call it as `own(self, ...)`
Replacement = Callable[..., Any]


def replace_forward(model: PreTrainedModel, replacement: Replacement) -> None:
    own = model.forward.__func__

    @functools.wraps(own)
    def forward(self: PreTrainedModel, *args: Any, **kwargs: Any) -> Any:
        return replacement(self, own, *args, **kwargs)

    model.forward = types.MethodType(forward, model)
