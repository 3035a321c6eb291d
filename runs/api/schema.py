"""OpenAPI post-processing: say in the schema what the API enforces."""

from __future__ import annotations


def refuse_additional_properties(result, generator, request, public):
    """Request bodies refuse unknown fields (StrictSerializer): mark them so."""
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name.endswith("Request") and component.get("type") == "object":
            component.setdefault("additionalProperties", False)
    return result
