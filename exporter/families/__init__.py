"""The family registry: one module per family, registered by `@register_family` on import."""
from exporter.families.base import (FAMILIES, Family, describe_families, family_by_hf_type, family_by_mindformers_type,
                   family_by_name, family_table, register_family)
from exporter.families import baichuan2, bloom, glm, glm2, gpt2, internlm, llama, pangualpha, qwen  # noqa: F401

__all__ = ["FAMILIES", "Family", "register_family", "family_by_name", "family_by_hf_type",
           "family_by_mindformers_type", "describe_families", "family_table"]
