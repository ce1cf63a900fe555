"""Moved: the bridge backend's TransformerLens hooks are `dysco_interp.decoding.backends.bridge_hooks`.
This path goes in the next release."""

import warnings

from dysco_interp.decoding.backends.bridge_hooks import AttentionTemperature, BiasWriter, LogitScale, RelevanceReader

warnings.warn("dysco_interp.decoding.interventions moved to dysco_interp.decoding.backends.bridge_hooks; the old path "
              "goes in the next release", DeprecationWarning, stacklevel=2)

__all__ = ["AttentionTemperature", "BiasWriter", "LogitScale", "RelevanceReader"]
