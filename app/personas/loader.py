"""Load persona YAML files from the shipped ``personas/`` directory."""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import ValidationError

from app.personas.models import Persona

SHIPPED_DIR = Path(__file__).resolve().parents[2] / "personas"


class PersonaError(Exception):
    """A persona file that cannot be used; the message names the file and the problem."""


def load_persona_file(path: Path) -> Persona:
    """Parse and validate one persona file; its name must match the file name."""
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise PersonaError(f"{path}: cannot read persona: {exc}") from exc
    if not isinstance(raw, dict):
        raise PersonaError(f"{path}: a persona file must be a YAML mapping")
    try:
        persona = Persona.model_validate(raw)
    except ValidationError as exc:
        raise PersonaError(f"{path}: invalid persona:\n{exc}") from exc
    if persona.name != path.stem:
        raise PersonaError(f"{path}: name {persona.name!r} does not match the file name")
    return persona


def load_personas(directory: Path = SHIPPED_DIR) -> dict[str, Persona]:
    """Every ``*.yaml`` persona in ``directory``, by name."""
    personas = {}
    for path in sorted(directory.glob("*.yaml")):
        persona = load_persona_file(path)
        personas[persona.name] = persona
    if "default" not in personas:
        raise PersonaError(f"{directory}: the 'default' persona is missing")
    return personas
