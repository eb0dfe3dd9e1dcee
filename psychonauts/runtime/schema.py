"""A small JSON-schema validator: the subset our tool schemas use (no new dependency).

Supported: type (object, string, integer, number, boolean, array), properties, required,
additionalProperties (false), items, enum, minimum, maximum, minLength, maxLength, minItems, maxItems.
"""

from __future__ import annotations

from typing import Any

from core.safetext import text_problem

_TYPES: dict[str, tuple[type, ...]] = {
    "object": (dict,),
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list,),
}


def schema_errors(value: Any, schema: dict[str, Any], where: str = "") -> list[str]:
    """Every violation, each naming where it is (`agents[0].role: required`)."""
    here = where or "(arguments)"
    expected = schema.get("type")
    if expected:
        kinds = _TYPES[expected]
        is_bool = isinstance(value, bool)
        if not isinstance(value, kinds) or (is_bool and expected in {"integer", "number"}):
            return [f"{here}: expected {expected}, got {type(value).__name__}"]
    errors: list[str] = []
    if "enum" in schema and value not in schema["enum"]:
        errors.append(f"{here}: must be one of {schema['enum']}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if "minimum" in schema and value < schema["minimum"]:
            errors.append(f"{here}: must be at least {schema['minimum']}")
        if "maximum" in schema and value > schema["maximum"]:
            errors.append(f"{here}: must be at most {schema['maximum']}")
    if isinstance(value, str) and len(value) < schema.get("minLength", 0):
        errors.append(f"{here}: must have at least {schema['minLength']} characters")
    if isinstance(value, str) and "maxLength" in schema and len(value) > schema["maxLength"]:
        errors.append(f"{here}: must have at most {schema['maxLength']} characters")
    if isinstance(value, str) and (problem := text_problem(value)) is not None:
        # The tool call is recorded (jsonb refuses a NUL) and may reach a text column.
        errors.append(f"{here}: {problem}")
    if isinstance(value, list):
        if len(value) < schema.get("minItems", 0):
            errors.append(f"{here}: needs at least {schema['minItems']} items")
        if "maxItems" in schema and len(value) > schema["maxItems"]:
            errors.append(f"{here}: at most {schema['maxItems']} items")
        if "items" in schema:
            for i, item in enumerate(value):
                errors += schema_errors(item, schema["items"], f"{where}[{i}]")
    if isinstance(value, dict):
        props: dict[str, Any] = schema.get("properties", {})
        for name in schema.get("required", []):
            if name not in value:
                errors.append(f"{where + '.' if where else ''}{name}: required")
        for name, item in value.items():
            path = f"{where}.{name}" if where else name
            if name in props:
                errors += schema_errors(item, props[name], path)
            elif schema.get("additionalProperties") is False:
                errors.append(f"{path}: unknown argument")
    return errors
