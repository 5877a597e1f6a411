"""The model presets, re-exported from their home llmrs.model.presets (shared by the engine and the toolkit)."""

from llmrs.model.presets import PRESETS, preset_config, preset_names, preset_repo

__all__ = ["PRESETS", "preset_config", "preset_names", "preset_repo"]
