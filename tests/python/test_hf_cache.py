"""use_cache in training against real transformers 4.47 on PyTorch 1.13's CPU: the zoo's small
configs with and without use_cache, measured by a loop that holds the model's whole output
(hf_config_check --use-cache) and estimated by `memest --hf-config --hold-outputs`
(docs/hf-config.md, "use_cache in training").
"""
import pathlib
import sys

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
STEP = ("training", "steady", "peak.OPTIMIZER_STEP")


def _step_peak(name, use_cache):
    """(memest's estimate - the measurement, the measurement) of the steady step's optimizer-step
    peak, where what the loop holds of the forward is all that is left of it."""
    sys.path.insert(0, str(REPO / "tests" / "conformance"))
    import hf_config_check
    import run as suite
    result = hf_config_check.run_one(name, suite.find_memest(None), suite.onednn_isa(), None,
                                     use_cache=use_cache)
    return hf_config_check.offsets(result)[STEP]


@pytest.mark.parametrize("name", ["llama", "gpt2", "t5"])
def test_the_held_cache_is_what_transformers_keeps(name):
    """Llama's DynamicCache (the key after the rotary, v_proj's output), GPT-2's presents (views
    of c_attn's whole output), T5's decoder caches (self- and cross-attention) and encoder
    output: memest's offset from the measurement is the one it has without the cache, to the
    byte, while the cache moves the measured peak."""
    pytest.importorskip("transformers")
    with_offset, with_measured = _step_peak(name, True)
    without_offset, without_measured = _step_peak(name, False)
    assert with_measured > without_measured
    assert with_offset == without_offset, (name, with_offset, without_offset)
