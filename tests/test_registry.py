"""The family registries: the exporter's (families/*.py) and the runtime's light one agree, every
name users write resolves to one family (no prefix matching), and every registered family has a
tiny reference model and parity tests."""
import pytest

import exporter
from exporter.families import FAMILIES as EXPORT_FAMILIES
from lite_runtime import InputOfInfer
from lite_runtime.contract.errors import UnsupportedError
from lite_runtime.contract.families import FAMILIES, get_family
from support.hf_models import BUILDERS
from support.numpy_references import CASES as NUMPY_CASES
from support.family_cases import FAMILIES as PARITY_TESTED
from support.tiny_models import KNOWN_FAMILIES

pytestmark = pytest.mark.fast      # no export, no graph, no Lite, no model process: `make test-fast`



def test_exporter_families_are_the_runtimes_declared_once():
    """Each exporter family carries the runtime's spec (its names are written there only), and every
    runtime family has an exporter family; a family class without a spec of its own cannot register."""
    from exporter.families import Family, register_family
    assert set(EXPORT_FAMILIES) == set(FAMILIES)
    assert all(f.spec is FAMILIES[n] and f.aliases == FAMILIES[n].aliases for n, f in EXPORT_FAMILIES.items())
    with pytest.raises(TypeError, match="has no spec"):
        register_family(type("Stray", (EXPORT_FAMILIES["llama"],), {}))
    with pytest.raises(ValueError, match="registered twice"):
        register_family(type("Again", (Family,), {"spec": FAMILIES["llama"]}))


def test_every_family_has_a_tiny_reference_model_and_parity_tests():
    assert set(EXPORT_FAMILIES) <= set(BUILDERS) | set(NUMPY_CASES.values()), \
        "a registered family has no tiny model in tests/support/hf_models.py nor a numpy reference (numpy_references.py)"
    assert set(EXPORT_FAMILIES) <= set(PARITY_TESTED), "a registered family is not in tests/test_families.py"


def test_input_maps_cover_every_name_and_alias():
    names = {n for s in FAMILIES.values() for n in (s.name,) + s.aliases}
    assert set(exporter.PREFILL_MODEL_INPUT_MAP) == set(exporter.INCREMENT_MODEL_INPUT_MAP) == names
    assert set(InputOfInfer.MAPPING) == names
    for name in names:
        spec = get_family(name)
        assert exporter.PREFILL_MODEL_INPUT_MAP[name] == spec.input_names("prefill")
        assert InputOfInfer.MAPPING[name].spec is spec
        assert isinstance(InputOfInfer.get_inputs(f"{name}_7b"), InputOfInfer.MAPPING[name])


def test_aliases_are_one_family():
    assert get_family("llama2") is get_family("codellama") is get_family("llama")
    assert InputOfInfer.get_inputs("codellama_34b").spec is get_family("llama")


@pytest.mark.parametrize("name", ["glm4", "gpt5", "llama2x", "llam", "Llama", "", "bloom560m"])
def test_unknown_family_names_are_refused(name):
    with pytest.raises(UnsupportedError) as info:
        get_family(name)
    assert repr(name) in str(info.value) and KNOWN_FAMILIES in str(info.value)
    with pytest.raises(UnsupportedError, match="known families"):
        InputOfInfer.get_inputs(f"{name}_7b")
