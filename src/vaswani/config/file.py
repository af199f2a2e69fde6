"""A whole config file ([model], [data], [train], [decode], [finetune]) and ``--set``
overrides."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .base import ConfigBase, dump_toml, load_toml, parse_text, unknown_key_error
from .finetune import FinetuneConfig
from .model import Fixed, ModelConfig
from .parts import FLAT, nest
from .sections import DataConfig, DecodeConfig, TrainConfig

SECTIONS: dict[str, type[ConfigBase]] = {
    "model": ModelConfig, "data": DataConfig, "train": TrainConfig, "decode": DecodeConfig,
    "finetune": FinetuneConfig,
}


@dataclass(frozen=True)
class RunConfig:
    """All the sections of a config file."""

    model: ModelConfig
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    train: TrainConfig = dataclasses.field(default_factory=TrainConfig)
    decode: DecodeConfig = dataclasses.field(default_factory=DecodeConfig)
    finetune: FinetuneConfig = dataclasses.field(default_factory=FinetuneConfig)

    def __post_init__(self) -> None:
        self.finetune.check_with(self.train)

    @classmethod
    def from_dict(cls, data: dict[str, Any], fixed: Fixed | None = None) -> RunConfig:
        """The sections of ``data``; ``fixed``: see :meth:`ModelConfig.from_dict`."""
        _check_sections(data)
        return cls(model=ModelConfig.from_dict(data.get("model", {}), fixed),
                   **{name: kind.from_dict(data.get(name, {}))
                      for name, kind in SECTIONS.items() if name != "model"})

    def to_dict(self, fixed: Fixed | None = None) -> dict[str, dict[str, Any]]:
        """Every section's values; ``fixed``: see :meth:`ModelConfig.to_dict`."""
        return {name: self.model.to_dict(fixed) if name == "model"
                else getattr(self, name).to_dict() for name in SECTIONS}

    def to_toml(self, fixed: Fixed | None = None) -> str:
        return dump_toml(self.to_dict(fixed))

    def replace(self, **sections) -> RunConfig:
        """A copy with some sections replaced: ``cfg.replace(model=cfg.model.replace(...))``."""
        return dataclasses.replace(self, **sections)


def parse_value(section: str, key: str, text: str) -> Any:
    """Parse the text of ``--set section.key=TEXT`` by the type of that field; ``key`` may
    name a field of a section's own section (``model.rope.base``)."""
    kind: type[ConfigBase] = SECTIONS[section]
    *within, key = key.split(".")
    for name in within:  # down to [model.rope]
        if name not in kind.parts():
            raise unknown_key_error(kind.SECTION, name, kind.parts())
        kind = kind.parts()[name]
    fields = {f.name for f in dataclasses.fields(kind)}
    if key not in fields:
        raise unknown_key_error(kind.SECTION, key, fields)
    try:
        return parse_text(text, typing.get_type_hints(kind)[key])
    except ValueError as e:
        raise ValueError(f"--set {'.'.join([section, *within, key])}={text}: {e}") from None


def _check_sections(data: dict[str, Any]) -> None:
    for section, values in data.items():
        if section not in SECTIONS:
            raise unknown_key_error("", section, SECTIONS)
        if not isinstance(values, dict):
            raise ValueError(f"[{section}] must be a section of key = value lines, but the "
                             f"file sets {section} = {values!r}")


def apply_overrides(data: dict[str, Any], overrides: typing.Iterable[str]) -> dict[str, Any]:
    """Apply ``section.key=value`` strings to a config dict (a new dict is returned)."""
    _check_sections(data)
    out = {name: dict(values) for name, values in data.items()}
    if "model" in out:
        out["model"] = nest(out["model"])  # an older file's flat keys, where --set puts them
    for item in overrides:
        name, sep, text = item.partition("=")
        section, dot, key = name.strip().partition(".")
        if not sep or not dot:
            raise ValueError(f"--set {item!r}: expected section.key=value, e.g. train.lr=3e-4")
        if section not in SECTIONS:
            raise unknown_key_error("", section, SECTIONS)
        if section == "model" and key in FLAT:  # its name before [model.rope] and the others
            key = ".".join(FLAT[key])
        value = parse_value(section, key, text.strip())
        *within, key = key.split(".")
        place = out.setdefault(section, {})
        for part in within:
            place[part] = dict(place.get(part) or {})
            place = place[part]
        place[key] = value
    return out


def load_run_config(path: str | Path, overrides: typing.Iterable[str] = (),
                    fixed: Fixed | None = None) -> RunConfig:
    """Read a config file, apply ``--set`` overrides, validate; errors name the file.
    ``fixed``: what a named architecture fixes (:meth:`ModelConfig.from_dict`)."""
    data = apply_overrides(load_toml(path), overrides)
    try:
        return RunConfig.from_dict(data, fixed)
    except (ValueError, TypeError) as e:
        raise ValueError(f"{path}: {e}") from None
