"""Search spaces: YAML -> Optuna distributions, known constraints, rendering to vLLM flags."""

from autotune.space.constraints import notes, speculative_method, violations
from autotune.flags import flag_names, flags_to_mapping, mapping_to_flags
from autotune.space.params import ParamSpec
from autotune.space.space import SPACES_DIR, SearchSpace

__all__ = ["SPACES_DIR", "ParamSpec", "SearchSpace", "flag_names", "flags_to_mapping", "mapping_to_flags",
           "notes", "speculative_method", "violations"]
