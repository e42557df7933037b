"""sparkfold's settings: typed fields (model), where their values come from (sources), the rules (rules)."""

from operations.settings.model import PASSTHROUGH_PREFIXES, PROJECT_ROOT, SETTING_NAMES, Rail, Settings, pair
from operations.settings.rules import (
           MAX_CONTEXT,
           PAIR_SETTINGS,
           PREBUILT_REFERENCE,
           placed_paths,
           resolved_path_problems,
           validate,
           validate_all,
           validate_pair,
)
from operations.settings.sources import Layers, env_names, load, meanings, passthrough_note

__all__ = ["MAX_CONTEXT", "PAIR_SETTINGS", "PASSTHROUGH_PREFIXES", "PREBUILT_REFERENCE", "PROJECT_ROOT",
           "SETTING_NAMES", "Layers", "Rail", "Settings", "env_names", "pair", "load", "meanings", "passthrough_note",
           "placed_paths", "resolved_path_problems", "validate", "validate_all", "validate_pair"]
