import os

# Tests never reach a model hub; set before transformers is imported anywhere.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("WANDB_MODE", "disabled")

import pytest  # noqa: E402
import torch  # noqa: E402

from dysco_interp.models.tiny import STYLES, tiny_model  # noqa: E402

torch.set_num_threads(1)

_TINY_CACHE: dict = {}


def get_tiny(style: str):
    # Models are read-only in tests (hooks are removed after each run), so share them.
    if style not in _TINY_CACHE:
        _TINY_CACHE[style] = tiny_model(style)
    return _TINY_CACHE[style]


@pytest.fixture
def tiny_of():
    """The shared tiny model of a style, by name: tiny_of("gemma3")."""
    return get_tiny


@pytest.fixture(params=STYLES)
def tiny(request):
    return get_tiny(request.param)


@pytest.fixture
def tiny_llama():
    return get_tiny("llama")


@pytest.fixture(scope="session")
def real_model():
    from dysco_interp import load_model

    return load_model("smollm2-135m", progress=False)
