"""What every config model shares: unknown keys are errors, and blank names are refused."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict, StringConstraints


def _non_empty(v: str) -> str:
    if not v.strip():
        raise ValueError("must not be empty")
    return v


NonEmptyStr = Annotated[str, AfterValidator(_non_empty)]
"""A path or name that must not be blank (an empty output_dir would write into the cwd)."""

FleetName = Annotated[str, StringConstraints(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")]
"""A warm fleet's name (rlfleet/fleet/): its state file's name, so no path separators."""


class Strict(BaseModel):
    # a CLI override is a TOML literal: `--inference.cpu-threads-bind 0` arrives as the integer 0
    model_config = ConfigDict(extra="forbid", validate_assignment=True, coerce_numbers_to_str=True)
